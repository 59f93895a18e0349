// SPDX-License-Identifier: Apache-2.0

package retry

import (
	"context"
	"errors"
	"testing"
)

var errBusy = errors.New("busy")

func retryable(err error) bool { return errors.Is(err, errBusy) }

func TestDo(t *testing.T) {
	ctx := context.Background()
	// Retryable failures are run again until success.
	runs, heard := 0, 0
	err := Do(ctx, 5, retryable, func(int, error) { heard++ }, func() error {
		runs++
		if runs < 3 {
			return errBusy
		}
		return nil
	})
	if err != nil || runs != 3 || heard != 2 {
		t.Fatalf("err %v, %d runs, %d reruns heard; want nil, 3, 2", err, runs, heard)
	}
	// Other errors are not.
	runs = 0
	other := errors.New("constraint")
	if err := Do(ctx, 5, retryable, nil, func() error { runs++; return other }); !errors.Is(err, other) || runs != 1 {
		t.Fatalf("a non-retryable error: %v after %d runs", err, runs)
	}
	// The reruns are bounded.
	runs = 0
	if err := Do(ctx, 2, retryable, nil, func() error { runs++; return errBusy }); !errors.Is(err, errBusy) || runs != 3 {
		t.Fatalf("bounded: %v after %d runs, want 3", err, runs)
	}
	// An ended context ends the wait.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := Do(cctx, 5, retryable, nil, func() error { return errBusy }); !errors.Is(err, context.Canceled) || !errors.Is(err, errBusy) {
		t.Fatalf("cancelled: %v", err)
	}
}
