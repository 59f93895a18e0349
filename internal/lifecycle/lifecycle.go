// SPDX-License-Identifier: Apache-2.0

// Package lifecycle is the start/stop primitive of shardq's background
// work (the subscriber's loops and workers, the publish coalescer's
// flushers). A Group runs goroutines under two contexts:
//
//   - Context ends when Stop begins: loops stop taking new work;
//   - HardContext ends when Stop's own context ends first: work in
//     progress (a handler) is cancelled.
//
// Stop returns only when every goroutine started with Go has returned, so
// nothing outlives it.
package lifecycle

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Group is a set of goroutines stopped together.
type Group struct {
	ctx, hard        context.Context
	cancel, hardStop context.CancelFunc
	wg               sync.WaitGroup
	running          atomic.Int64 // goroutines of the group not yet returned
	mu               sync.Mutex
	stopped          bool
	once             sync.Once
	done             chan struct{}
	stopErr          error
}

// New returns a running group whose contexts carry parent's values but not
// its cancellation (the group ends by Stop only).
func New(parent context.Context) *Group {
	base := context.WithoutCancel(parent)
	g := &Group{done: make(chan struct{})}
	g.ctx, g.cancel = context.WithCancel(base)
	g.hard, g.hardStop = context.WithCancel(base)
	return g
}

// Context ends when Stop begins.
func (g *Group) Context() context.Context { return g.ctx }

// HardContext ends when Stop gives up waiting.
func (g *Group) HardContext() context.Context { return g.hard }

// Go runs fn in the group; it reports false (and does not run fn) once
// Stop has begun.
func (g *Group) Go(fn func()) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopped {
		return false
	}
	g.wg.Add(1)
	g.running.Add(1)
	go func() {
		defer g.wg.Done()
		defer g.running.Add(-1)
		fn()
	}()
	return true
}

// Done is closed once Stop has returned: every goroutine of the group
// has.
func (g *Group) Done() <-chan struct{} { return g.done }

// Stop ends Context, waits for the group's goroutines until ctx ends, then
// ends HardContext and waits for them to return. It returns ctx's error
// when it had to end HardContext (work in flight was cancelled), and
// later calls return the same at once.
func (g *Group) Stop(ctx context.Context) error {
	g.once.Do(func() {
		defer close(g.done)
		g.mu.Lock()
		g.stopped = true
		g.mu.Unlock()
		g.cancel()
		done := make(chan struct{})
		go func() { g.wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-ctx.Done():
			if g.running.Load() > 0 { // else nothing is left to cancel
				g.stopErr = ctx.Err()
				g.hardStop()
			}
			<-done
		}
		g.hardStop()
	})
	return g.stopErr
}

// CallTimeout bounds one database call of a background loop, so that a
// hung connection fails a round instead of stalling the loop.
const CallTimeout = 15 * time.Second

// HolderMargin is how long before its lease's (or claim's) expiry a
// holder gives it up: hands nothing more out and cancels its handler.
// Another member may take it at the expiry by its own clock, and a
// cancelled handler needs a moment to return.
func HolderMargin(ttl time.Duration) time.Duration { return min(ttl/10, time.Second) }

// ExpiryRecheck is the shortest wait before a timer set for an expiry by
// an injected clock looks again: such a clock may stand still, and the
// timer must not spin meanwhile.
const ExpiryRecheck = time.Millisecond

// Every runs fn every interval until ctx ends (a loop of a service's
// group: pass its Context); with now, it runs fn once at once too.
func Every(ctx context.Context, interval time.Duration, now bool, fn func()) {
	if now {
		fn()
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		fn()
	}
}

// SleepUntilNext waits for a wake-up (nil: none), poll, or deadline,
// whichever is first; false when the deadline has passed, ctx ended or
// done (nil: never) is closed. A poll that ends at the deadline returns
// true: the caller looks once more.
func SleepUntilNext(ctx context.Context, done, wake <-chan struct{}, deadline time.Time, poll time.Duration) bool {
	left := time.Until(deadline)
	if left <= 0 {
		return false
	}
	t := time.NewTimer(min(poll, left))
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-wake:
		return true
	case <-ctx.Done():
		return false
	case <-done:
		return false
	}
}

// Detached is ctx without its cancellation (a caller gone must not stop
// a give-back that keeps others waiting) but with a bound of its own.
func Detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), ReleaseTimeout)
}

// ReleaseTimeout bounds a give-back that outlives its caller.
const ReleaseTimeout = 10 * time.Second
