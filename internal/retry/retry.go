// SPDX-License-Identifier: Apache-2.0

// Package retry runs a database write again while it fails with an error
// the driver calls retryable (a deadlock InnoDB rolled back, a busy SQLite
// file): the one loop every writer of the runtime uses.
package retry

import (
	"context"
	"errors"
	"time"
)

// SettleReruns bounds the reruns of one settling write of a consumer.
const SettleReruns = 4

// Pause is the wait before the n-th rerun: n × Pause.
const Pause = 5 * time.Millisecond

// Do runs write, and runs it again up to reruns times while it fails with
// an error retryable accepts, waiting n × Pause before the n-th rerun.
// onRetry (may be nil) hears of each rerun and the error that caused it.
// It returns write's last error, joined with ctx's when ctx ended a wait.
func Do(ctx context.Context, reruns int, retryable func(error) bool, onRetry func(rerun int, err error), write func() error) error {
	err := write()
	for n := 1; n <= reruns && err != nil && retryable(err); n++ {
		if onRetry != nil {
			onRetry(n, err)
		}
		t := time.NewTimer(time.Duration(n) * Pause)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return errors.Join(err, ctx.Err())
		}
		err = write()
	}
	return err
}
