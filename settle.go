// SPDX-License-Identifier: Apache-2.0

package shardq

import (
	"errors"
	"time"

	"github.com/shardq/shardq/internal/backoff"
)

// retryPolicy is how a consumer settles a failed message: the same rules
// for partition workers, ungrouped claims and group receivers.
type retryPolicy struct {
	MaxAttempts            int
	BackoffMin, BackoffMax time.Duration
}

// verdict is what a handler's result means for its message.
type verdict struct {
	ack, deadLetter bool
	delay           time.Duration // with a retry
	cause           error         // with a dead-letter: the handler's reason, unwrapped
}

// decide settles the result err of the attempt-th delivery: nil acks; a
// DeadLetter result, or a failure of the last allowed attempt,
// dead-letters; any other error retries after RetryAfter's delay or the
// exponential backoff.
func (p retryPolicy) decide(err error, attempt int) verdict {
	if err == nil {
		return verdict{ack: true}
	}
	var dl *deadLetter
	if errors.As(err, &dl) {
		return verdict{deadLetter: true, cause: dl.err}
	}
	if p.MaxAttempts != UnlimitedAttempts && attempt >= p.MaxAttempts {
		return verdict{deadLetter: true, cause: err}
	}
	var ra *retryAfter
	if errors.As(err, &ra) {
		return verdict{delay: ra.after}
	}
	return verdict{delay: backoff.Delay(attempt, p.BackoffMin, p.BackoffMax)}
}
