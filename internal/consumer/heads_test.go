// SPDX-License-Identifier: Apache-2.0

package consumer

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/lifecycle"
	"github.com/shardq/shardq/internal/testdb"
)

// headsRecorder notes when the head watcher reads heads.
type headsRecorder struct {
	driver.Driver
	at chan time.Time
}

func (r headsRecorder) HeadsOf(ctx context.Context, topic string, tenants, keys []string) (map[driver.HeadKey]int64, error) {
	heads, err := r.Driver.HeadsOf(ctx, topic, tenants, keys)
	select {
	case r.at <- time.Now():
	default:
	}
	return heads, err
}

// TestHeadWatcherPollsFasterWhileHeadsMove: without a change feed, the
// head watcher polls at a twentieth of PollInterval while an idle
// partition's head has moved, and backs off to PollInterval once nothing
// moves, so that a busy member is woken within milliseconds and an idle
// one costs what it did.
func TestHeadWatcherPollsFasterWhileHeadsMove(t *testing.T) {
	const every = time.Second // a floor of 50 ms
	d := testdb.Migrated(t, testdb.SQLite(t))
	publishKeys(t, d, "k", 0, 1) // the head of k0000000 is 1
	polls := make(chan time.Time, 64)
	s := &Member{drv: headsRecorder{d, polls}, workers: map[driver.PartitionRef]*worker{}, life: lifecycle.New(context.Background()),
		log: slog.New(slog.DiscardHandler), rescan: make(chan struct{}, 1), cfg: Config{ConsumerGroup: "g", Topic: "tick", PollInterval: every}}
	w := &worker{wake: make(chan struct{}, 1)}
	w.idleAfter.Store(1) // waits for offset 1, which is there: the head moved, at every poll
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
		t.Fatalf("5 polls while the head moved took %v: not faster than PollInterval (%v)", took, every)
	}
	select {
	case <-w.wake:
	default:
		t.Fatal("the idle worker whose head moved was not woken")
	}

	w.idleAfter.Store(2) // nothing past offset 1: the head is still
	last := next()
	var gaps []time.Duration
	for range 8 {
		at := next()
		gaps = append(gaps, at.Sub(last))
		last = at
	}
	// Four more at 50 ms, then backing off: 100, 200, 400, 800 ms; a poll
	// that stayed fast would keep 50 ms gaps (a late timer only lengthens
	// them).
	if gaps[7] < every*4/10 {
		t.Fatalf("gaps between polls of a still head %v: not backing off towards PollInterval (%v)", gaps, every)
	}
}
