// SPDX-License-Identifier: Apache-2.0

package consumer

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/lifecycle"
	"github.com/shardq/shardq/internal/testdb"
)

// headsRecorder notes when the head watcher reads heads; while moving,
// it publishes a message to the watched partition first, as another
// process would.
type headsRecorder struct {
	driver.Driver
	moving *atomic.Bool
	n      *atomic.Int64 // messages published
	at     chan time.Time
}

func (r headsRecorder) HeadsOf(ctx context.Context, topic string, tenants, keys []string) (map[driver.HeadKey]int64, error) {
	if r.moving.Load() {
		m := &driver.InsertMessage{Tenant: "bench", Topic: "tick", PartitionKey: "k0000000", ID: fmt.Sprint("moved-", r.n.Add(1)), CreatedAt: time.Now()}
		tx, err := r.Driver.BeginWrite(ctx)
		if err != nil {
			return nil, err
		}
		if err := r.Driver.InsertMessages(ctx, tx, []*driver.InsertMessage{m}); err != nil {
			tx.Rollback()
			return nil, err
		}
		if err := tx.Commit(); err != nil {
			return nil, err
		}
	}
	heads, err := r.Driver.HeadsOf(ctx, topic, tenants, keys)
	select {
	case r.at <- time.Now():
	default:
	}
	return heads, err
}

// TestHeadWatcherPollsFasterWhileHeadsMove: without a change feed, the
// head watcher polls at a twentieth of PollInterval while idle
// partitions' heads rise, and backs off to PollInterval once they stop,
// so that a busy member is woken within milliseconds and a still one
// costs what it did. A head that stays past its worker's cursor (its
// messages aged out unread) wakes the worker at every poll, but is not
// activity: the polls back off.
func TestHeadWatcherPollsFasterWhileHeadsMove(t *testing.T) {
	const every = time.Second // a floor of 50 ms
	d := testdb.Migrated(t, testdb.SQLite(t))
	publishKeys(t, d, "k", 0, 1) // the head of k0000000 is 1
	polls := make(chan time.Time, 64)
	var moving atomic.Bool
	var published atomic.Int64
	moving.Store(true)
	s := &Member{drv: headsRecorder{d, &moving, &published, polls}, workers: map[driver.PartitionRef]*worker{}, life: lifecycle.New(context.Background()),
		log: slog.New(slog.DiscardHandler), rescan: make(chan struct{}, 1), cfg: Config{ConsumerGroup: "g", Topic: "tick", PollInterval: every}}
	w := &worker{wake: make(chan struct{}, 1)}
	w.idleAfter.Store(1) // waits for offset 1, which is there and never read
	s.mu.Lock()
	s.workers[driver.PartitionRef{Tenant: "bench", ConsumerGroup: "g", Topic: "tick", PartitionKey: "k0000000"}] = w
	s.mu.Unlock()
	s.life.Go(s.watchHeads)
	defer s.life.Stop(context.Background())

	next := func() time.Time {
		t.Helper()
		select {
		case at := <-polls:
			return at
		case <-time.After(10 * time.Second):
			t.Fatal("the head watcher stopped polling")
			return time.Time{}
		}
	}
	signal(s.rescan) // the first poll at once
	first := next()
	for range 5 {
		next()
	}
	if took := time.Since(first); took >= every {
		t.Fatalf("5 polls while the head rose took %v: not faster than PollInterval (%v)", took, every)
	}
	select {
	case <-w.wake:
	default:
		t.Fatal("the idle worker whose head moved was not woken")
	}

	moving.Store(false) // the head stays at its last value, past the cursor
	for len(polls) > 0 {
		<-polls
	}
	last := next()
	var gaps []time.Duration
	for range 9 {
		at := next()
		gaps = append(gaps, at.Sub(last))
		last = at
	}
	// At most five at 50 ms, then backing off: 100, 200, 400,
	// 800 ms. Polls that stayed fast would keep 50 ms gaps, and a late
	// timer only lengthens them.
	if tail := gaps[6] + gaps[7] + gaps[8]; tail < every*6/10 {
		t.Fatalf("gaps between polls of a still head %v: not backing off towards PollInterval (%v)", gaps, every)
	}
	select {
	case <-w.wake:
	default:
		t.Fatal("the worker whose head stays past its cursor was not woken")
	}
}
