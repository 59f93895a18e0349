// SPDX-License-Identifier: Apache-2.0

// Package wakeup tells a client's consumers that a partition's head moved,
// so that they read at once instead of at their next poll: after a
// Publish of the same client commits, and, across processes, from the
// database's change feed (driver.HeadFeed), which the registry runs once
// for all the client's consumers. Consumers still poll, as a safety net,
// so a wake-up missed, late or repeated costs latency, never a message
// (docs/feed.md).
package wakeup

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/shardq/shardq/driver"
)

// Consumer is what a registered consumer is told.
type Consumer interface {
	// Moved names partitions of its topic and tenants whose head moved.
	Moved(heads []driver.HeadChange)
	// Rescan says any head may have moved: read them again.
	Rescan()
}

// Registry holds a client's consumers by topic and runs the change feed
// from the first registration until Close. The zero value is ready and
// has no feed.
type Registry struct {
	mu      sync.Mutex
	byTopic map[string]map[any]entry

	feed   driver.HeadFeed // nil: no feed
	log    *slog.Logger
	closed bool
	cancel context.CancelFunc // stops the running feed (nil: none runs)
	done   chan struct{}      // closed when the running feed returned

	up    atomic.Bool
	names atomic.Bool // the feed names the partitions that move
}

type entry struct {
	tenants map[string]bool // nil: any tenant
	c       Consumer
}

// UseFeed makes the registry run feed from the first Add until Close,
// logging to log. Call it before the first Add. (The feed outlives the
// consumers that come and go, such as group receivers: restarting it for
// each would cost a reconnect and a rescan.)
func (r *Registry) UseFeed(feed driver.HeadFeed, log *slog.Logger) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.feed, r.log = feed, log
}

// Add registers c under key for the heads of topic in tenants (nil: any).
// The first registration starts the feed.
func (r *Registry) Add(topic string, tenants []string, key any, c Consumer) {
	e := entry{c: c}
	if tenants != nil {
		e.tenants = make(map[string]bool, len(tenants))
		for _, t := range tenants {
			e.tenants[t] = true
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byTopic == nil {
		r.byTopic = map[string]map[any]entry{}
	}
	if r.byTopic[topic] == nil {
		r.byTopic[topic] = map[any]entry{}
	}
	r.byTopic[topic][key] = e
	if r.feed != nil && r.cancel == nil && !r.closed {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		r.cancel, r.done = cancel, done
		go r.runFeed(ctx, done)
	}
}

// Remove unregisters key.
func (r *Registry) Remove(topic string, key any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.byTopic[topic], key)
	if len(r.byTopic[topic]) == 0 {
		delete(r.byTopic, topic)
	}
}

// Close stops the feed and waits for it; the registry starts none again.
func (r *Registry) Close() {
	r.mu.Lock()
	r.closed = true
	cancel, done := r.cancel, r.done
	r.cancel, r.done = nil, nil
	r.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

// Up reports whether the feed streams: consumers then poll at their
// slower safety-net interval.
func (r *Registry) Up() bool { return r.up.Load() }

// Names reports whether the feed streams and names each partition that
// moves: a consumer then knows that whatever committed after its last
// read has woken it, or will.
func (r *Registry) Names() bool { return r.up.Load() && r.names.Load() }

// Committed tells the consumers of the rows' topics (one call, or one
// shared transaction, may span several) that the rows are stored. A
// client with no consumer pays one lock for it.
func (r *Registry) Committed(rows []*driver.InsertMessage) {
	r.mu.Lock()
	none := len(r.byTopic) == 0
	r.mu.Unlock()
	if none {
		return
	}
	heads := make([]driver.HeadChange, 0, len(rows))
	for i, row := range rows {
		if i > 0 && row.Tenant == rows[i-1].Tenant && row.Topic == rows[i-1].Topic && row.PartitionKey == rows[i-1].PartitionKey {
			heads[len(heads)-1].Head = max(heads[len(heads)-1].Head, row.Offset)
			continue
		}
		heads = append(heads, driver.HeadChange{Tenant: row.Tenant, Topic: row.Topic, PartitionKey: row.PartitionKey, Head: row.Offset})
	}
	r.dispatch(heads)
}

// dispatch hands each consumer the heads of its topic and tenants, outside
// the lock. A tenant no consumer serves wakes nothing.
func (r *Registry) dispatch(heads []driver.HeadChange) {
	type call struct {
		c     Consumer
		heads []driver.HeadChange
	}
	var calls []call
	seen := map[string]bool{}
	r.mu.Lock()
	for _, t := range heads {
		if seen[t.Topic] {
			continue
		}
		seen[t.Topic] = true
		for _, e := range r.byTopic[t.Topic] {
			var mine []driver.HeadChange
			for _, h := range heads {
				if h.Topic == t.Topic && (e.tenants == nil || e.tenants[h.Tenant]) {
					mine = append(mine, h)
				}
			}
			if len(mine) > 0 {
				calls = append(calls, call{e.c, mine})
			}
		}
	}
	r.mu.Unlock()
	for _, c := range calls {
		c.c.Moved(c.heads)
	}
}

// rescan tells every consumer to read its heads again.
func (r *Registry) rescan() {
	var cs []Consumer
	r.mu.Lock()
	for _, es := range r.byTopic {
		for _, e := range es {
			cs = append(cs, e.c)
		}
	}
	r.mu.Unlock()
	for _, c := range cs {
		c.Rescan()
	}
}

// runFeed runs the feed until Close. A database that cannot feed is said
// once; the consumers keep polling at their PollInterval.
func (r *Registry) runFeed(ctx context.Context, done chan struct{}) {
	defer close(done)
	defer r.up.Store(false)
	err := r.feed.FeedHeads(ctx, sink{r})
	switch {
	case errors.Is(err, driver.ErrFeedUnavailable):
		r.log.Warn("shardq: change feed unavailable; consumers poll every PollInterval (docs/feed.md)", "err", err)
	case err != nil && ctx.Err() == nil:
		r.log.Error("shardq: change feed stopped; consumers poll every PollInterval", "err", err)
	}
}

// sink is the registry's side of the feed.
type sink struct{ r *Registry }

func (s sink) Moved(heads []driver.HeadChange) {
	s.r.dispatch(heads)
}

func (s sink) Rescan() { s.r.rescan() }

func (s sink) Up(names bool) {
	s.r.log.Info("shardq: change feed up; consumers poll only as a safety net")
	s.r.names.Store(names)
	s.r.up.Store(true)
	s.r.rescan()
}

func (s sink) Note(msg string, args ...any) { s.r.log.Warn(msg, args...) }

func (s sink) Down(err error) {
	if s.r.up.Swap(false) {
		s.r.log.Warn("shardq: change feed down; consumers poll every PollInterval until it reconnects", "err", err)
	}
}
