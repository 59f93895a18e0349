// SPDX-License-Identifier: Apache-2.0

package conformance

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

const ttl = 30 * time.Second

// fakeClock is an injected clock that a test moves by hand, so that lease
// and visibility tests do not sleep.
type fakeClock struct{ now atomic.Int64 }

func newFakeClock(at time.Time) *fakeClock {
	c := &fakeClock{}
	c.now.Store(at.UnixMicro())
	return c
}

func (c *fakeClock) Now() time.Time          { return time.UnixMicro(c.now.Load()).UTC() }
func (c *fakeClock) Advance(d time.Duration) { c.now.Add(d.Microseconds()) }

// gate holds a handler until the test opens it: the handler calls hold,
// the test waits until a handler is held, acts, and opens.
type gate struct {
	held, opened chan struct{}
	heldOnce     sync.Once
	openOnce     sync.Once
}

func newGate() *gate { return &gate{held: make(chan struct{}), opened: make(chan struct{})} }

// hold marks the gate held and waits until it is opened or ctx ends (the
// handler's context: a hard stop cancels it).
func (g *gate) hold(ctx context.Context) error {
	g.heldOnce.Do(func() { close(g.held) })
	select {
	case <-g.opened:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// waitHeld fails t unless a handler is held within 20 s.
func (g *gate) waitHeld(t *testing.T, what string) {
	t.Helper()
	select {
	case <-g.held:
	case <-time.After(20 * time.Second):
		t.Fatalf("%s: no handler reached the gate", what)
	}
}

// open lets the held handler go; safe to call more than once (tests defer
// it, so that a failed test does not leave a handler waiting).
func (g *gate) open() { g.openOnce.Do(func() { close(g.opened) }) }
