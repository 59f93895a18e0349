// SPDX-License-Identifier: Apache-2.0

package lifecycle

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestGracefulStopWaitsForWork(t *testing.T) {
	g := New(context.Background())
	finished := make(chan bool, 1)
	g.Go(func() {
		<-g.Context().Done()                     // stop fetching...
		finished <- g.HardContext().Err() == nil // ...and finish in-flight work
	})
	if err := g.Stop(context.Background()); err != nil {
		t.Fatalf("a graceful stop reported %v", err)
	}
	if !<-finished {
		t.Fatal("a graceful stop cancelled the hard context before the work returned")
	}
	select {
	case <-g.Done():
	default:
		t.Fatal("Done still open after Stop returned")
	}
	if g.Go(func() { t.Error("ran after Stop") }) {
		t.Fatal("Go accepted work after Stop")
	}
	g.Stop(context.Background()) // idempotent
}

func TestHardStopCancelsWorkInProgress(t *testing.T) {
	g := New(context.Background())
	started := make(chan struct{})
	g.Go(func() {
		close(started)
		<-g.HardContext().Done() // a handler that ignores the soft stop
	})
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	// Stop returns only because the hard context ended the work, and says so.
	if err := g.Stop(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a stop that cancelled work reported %v, want the deadline", err)
	}
	if g.HardContext().Err() == nil {
		t.Fatal("hard context still live after Stop")
	}
}

// A stop whose work finished reports no error even when its context had
// already ended: nothing was cancelled.
func TestStopAfterWorkEndedIsClean(t *testing.T) {
	for range 100 {
		g := New(context.Background())
		g.Go(func() {})
		g.wg.Wait() // the work is done before Stop begins
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := g.Stop(ctx); err != nil {
			t.Fatalf("Stop with its work already done reported %v", err)
		}
	}
}

func TestParentCancellationDoesNotStopTheGroup(t *testing.T) {
	type key struct{}
	parent, cancel := context.WithCancel(context.WithValue(context.Background(), key{}, "v"))
	g := New(parent)
	cancel()
	if g.Context().Err() != nil || g.Context().Value(key{}) != "v" {
		t.Fatal("the group must keep the parent's values but not its cancellation")
	}
	g.Stop(context.Background())
}

func TestEveryRunsUntilTheContextEnds(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	runs := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		Every(ctx, time.Millisecond, true, func() {
			runs++
			if runs == 3 {
				cancel()
			}
		})
	}()
	<-done
	if runs < 3 {
		t.Fatalf("%d runs before the context ended", runs)
	}
	ran := false
	cctx, ccancel := context.WithCancel(context.Background())
	ccancel()
	Every(cctx, time.Hour, false, func() { ran = true })
	if ran {
		t.Fatal("without now, fn ran before the first interval")
	}
}
