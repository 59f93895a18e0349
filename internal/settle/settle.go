// SPDX-License-Identifier: Apache-2.0

// Package settle is the one settle policy of every consumer (partition
// workers, ungrouped claims, group receivers): what a handler's result
// means for its message (ack, retry after a delay, dead-letter), and the
// dead-letter copy of a message.
package settle

import (
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/backoff"
	"github.com/shardq/shardq/internal/ident"
)

// RetryAfterError is a handler result: retry the message after After.
type RetryAfterError struct {
	After time.Duration
	Err   error
}

func (e *RetryAfterError) Error() string { return fmt.Sprintf("retry after %s: %v", e.After, e.Err) }
func (e *RetryAfterError) Unwrap() error { return e.Err }

// DeadLetterError is a handler result: dead-letter the message now.
type DeadLetterError struct{ Err error }

func (e *DeadLetterError) Error() string { return fmt.Sprintf("dead-letter: %v", e.Err) }
func (e *DeadLetterError) Unwrap() error { return e.Err }

// Unlimited as Policy.MaxAttempts never dead-letters for the count.
const Unlimited = -1

// Policy is how a failed message is settled.
type Policy struct {
	MaxAttempts            int // Unlimited: never dead-letter for the count
	BackoffMin, BackoffMax time.Duration
}

// Verdict is what a handler's result means for its message.
type Verdict struct {
	Ack, DeadLetter bool
	Delay           time.Duration // with a retry
	Cause           error         // with a dead-letter: the handler's reason, unwrapped
}

// Decide settles the result err of the attempt-th delivery: nil acks; a
// DeadLetterError, or a failure of the last allowed attempt, dead-letters;
// any other error retries after RetryAfterError's delay or the
// exponential backoff.
func (p Policy) Decide(err error, attempt int) Verdict {
	if err == nil {
		return Verdict{Ack: true}
	}
	var dl *DeadLetterError
	if errors.As(err, &dl) {
		return Verdict{DeadLetter: true, Cause: dl.Err}
	}
	if p.MaxAttempts != Unlimited && attempt >= p.MaxAttempts {
		return Verdict{DeadLetter: true, Cause: err}
	}
	var ra *RetryAfterError
	if errors.As(err, &ra) {
		return Verdict{Delay: ra.After}
	}
	return Verdict{Delay: backoff.Delay(attempt, p.BackoffMin, p.BackoffMax)}
}

// Headers a dead-lettered message carries besides its own.
const (
	HeaderOriginalTopic  = "dlq_original_topic"
	HeaderOriginalOffset = "dlq_original_offset"
	HeaderAttempts       = "dlq_attempts"
	HeaderLastError      = "dlq_last_error"
)

// DeadLetterCopy is m's copy for the dead-letter topic (m's topic +
// suffix): same tenant, partition key and id, with headers saying where it
// came from and why.
func DeadLetterCopy(m driver.Message, suffix string, attempts int, cause error) *driver.InsertMessage {
	headers := make(map[string]string, len(m.Headers)+4)
	maps.Copy(headers, m.Headers)
	headers[HeaderOriginalTopic] = m.Topic
	headers[HeaderOriginalOffset] = strconv.FormatInt(m.Offset, 10)
	headers[HeaderAttempts] = strconv.Itoa(attempts)
	headers[HeaderLastError] = ErrText(cause)
	return &driver.InsertMessage{Tenant: m.Tenant, Topic: m.Topic + suffix, PartitionKey: m.PartitionKey,
		ID: m.ID, Headers: headers, Payload: m.Payload, CreatedAt: m.CreatedAt}
}

// ErrText is an error as a header value: valid UTF-8, within the limit.
func ErrText(err error) string {
	t := strings.ToValidUTF8(err.Error(), "\uFFFD")
	if len(t) > ident.MaxHeaderValueBytes {
		t = strings.ToValidUTF8(t[:ident.MaxHeaderValueBytes], "")
	}
	return t
}
