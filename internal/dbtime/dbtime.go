// SPDX-License-Identifier: Apache-2.0

// Package dbtime keeps a process on the database's clock. Leases,
// heartbeats and claims are stamped by the member that writes them and
// judged by other members; by each member's own clock, a member whose
// clock is ahead would take leases before they expire, and one behind
// would hold its own after they have (docs/leases.md, "Clocks"). A Clock
// reads the database's time now and then and, between reads, advances it
// by the local clock's elapsed time: with time.Now that is Go's monotonic
// reading, so a step of the system clock does not move it either.
package dbtime

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardq/shardq/internal/lifecycle"
)

// Read returns the database's current time.
type Read func(ctx context.Context) (time.Time, error)

// Clock is the database's time as this process knows it.
type Clock struct {
	local func() time.Time
	read  Read
	every time.Duration
	log   *slog.Logger

	at atomic.Pointer[anchor] // nil before the first read

	reads   sync.Mutex // one read at a time
	mu      sync.Mutex // guards life and stopped; never held across a read
	life    *lifecycle.Group
	stopped bool
}

// anchor is one read: the database's time db, at the local clock's local
// (the middle of the read), which took rtt.
type anchor struct {
	db, local time.Time
	rtt       time.Duration
	reads     int // reads since this anchor was taken
}

// New returns a clock over local that reads the database by read every
// interval once Ensure has succeeded.
func New(local func() time.Time, read Read, every time.Duration, log *slog.Logger) *Clock {
	return &Clock{local: local, read: read, every: every, log: log}
}

// Now is the database's time: the last read advanced by the local clock
// since; the local clock itself before the first read.
func (c *Clock) Now() time.Time {
	l := c.local()
	a := c.at.Load()
	if a == nil {
		return l
	}
	return a.db.Add(l.Sub(a.local))
}

// Offset is how far the local clock is behind the database's (negative:
// ahead), by the last read; 0 before it.
func (c *Clock) Offset() time.Duration {
	if a := c.at.Load(); a != nil {
		return a.db.Sub(a.local)
	}
	return 0
}

// Ensure reads the database's time unless it has been read, and then
// keeps reading it every interval until Stop. Members call it before they
// take their first lease or claim, publishers before their first
// publish. After Stop it does nothing.
func (c *Clock) Ensure(ctx context.Context) error {
	if c.at.Load() != nil {
		return nil
	}
	c.reads.Lock()
	defer c.reads.Unlock()
	if c.at.Load() != nil || c.isStopped() {
		return nil
	}
	if err := c.sync(ctx); err != nil {
		return fmt.Errorf("read the database's clock: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return nil
	}
	life := lifecycle.New(context.Background())
	c.life = life
	life.Go(func() {
		lifecycle.Every(life.Context(), c.every, false, func() {
			ctx, cancel := context.WithTimeout(life.Context(), min(c.every, lifecycle.CallTimeout))
			defer cancel()
			c.reads.Lock()
			err := c.sync(ctx)
			c.reads.Unlock()
			if err != nil && life.Context().Err() == nil {
				c.log.Warn("shardq: reading the database's clock failed; keeping the last reading", "err", err)
			}
		})
	})
	return nil
}

func (c *Clock) isStopped() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stopped
}

// sync reads the database's time once. A read slower than twice the
// anchor's (plus a millisecond) is less exact than the anchor and is
// dropped, unless the anchor is ten reads old: the local clock's rate
// drifts too.
func (c *Clock) sync(ctx context.Context) error {
	before := c.local()
	db, err := c.read(ctx)
	if err != nil {
		return err
	}
	rtt := c.local().Sub(before)
	next := &anchor{db: db, local: before.Add(rtt / 2), rtt: rtt}
	if a := c.at.Load(); a != nil && rtt > 2*a.rtt+time.Millisecond && a.reads < 10 {
		c.at.Store(&anchor{db: a.db, local: a.local, rtt: a.rtt, reads: a.reads + 1})
		return nil
	}
	c.at.Store(next)
	return nil
}

// Stop ends the reads, cancelling one under way; it does not wait for a
// first read that Ensure is making with its caller's context.
func (c *Clock) Stop(ctx context.Context) error {
	c.mu.Lock()
	life := c.life
	c.stopped = true
	c.mu.Unlock()
	if life == nil {
		return nil
	}
	return life.Stop(ctx)
}
