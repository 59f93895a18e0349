// SPDX-License-Identifier: Apache-2.0

package consumer

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/large"
	"github.com/shardq/shardq/internal/lifecycle"
	"github.com/shardq/shardq/internal/testdb"
)

// deadlineDriver fails every lease acquisition as a call past its
// deadline does.
type deadlineDriver struct{ driver.Driver }

func (deadlineDriver) AcquireLease(context.Context, driver.AcquireLeaseParams) (driver.Lease, error) {
	return driver.Lease{}, fmt.Errorf("acquire lease: %w", context.DeadlineExceeded)
}

// countingHandler counts the records whose message contains substr.
type countingHandler struct {
	slog.Handler
	substr string
	n      *atomic.Int64
}

func (countingHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h countingHandler) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, h.substr) {
		h.n.Add(1)
	}
	return nil
}

// TestAcquisitionsPastTheDeadlineLogOnce: once a tick's deadline passes,
// acquiring the rest of its plan stops with one warning, not one per
// partition (hundreds of thousands of lines when a member starts on a
// topic with that many partitions with work).
func TestAcquisitionsPastTheDeadlineLogOnce(t *testing.T) {
	d := testdb.Migrated(t, testdb.SQLite(t))
	for i := 0; i < 50; i += publishKeys(t, d, "k", i, 50) {
	}
	if err := d.Heartbeat(context.Background(), driver.GroupScope{Tenants: []string{"bench"}, Topic: "tick", ConsumerGroup: "g"}, "m0", time.Now()); err != nil {
		t.Fatal(err)
	}
	var warnings atomic.Int64
	s := &Member{drv: deadlineDriver{d}, workers: map[driver.PartitionRef]*worker{}, life: lifecycle.New(context.Background()),
		log:    slog.New(countingHandler{slog.DiscardHandler, "acquir", &warnings}),
		beatAt: map[string]time.Time{"bench": time.Now()},
		cfg: Config{ConsumerGroup: "g", Topic: "tick", Tenants: []string{"bench"}, ID: "m0", LeaseTTL: time.Minute, StaleAfter: time.Minute,
			MaxPartitions: 100, DiscoveryWindow: time.Minute, FullDiscoveryInterval: time.Hour, Clock: time.Now}}
	defer s.life.Stop(context.Background())
	s.tick()
	if n := warnings.Load(); n != 1 {
		t.Fatalf("%d warnings about acquiring 50 partitions past the deadline, want 1", n)
	}
}

// TestLateMemberSparesItsPeers: a member whose own heartbeat is late
// (this process frozen, or every writer held up by another process frozen
// inside a write on SQLite's file) sweeps no peer that beat within an
// interval and a half of its own last heartbeat before the delay, and
// takes no expired lease of theirs, until its heartbeat has been on time
// for StaleAfter: they were likely held up as long, and get that time to
// write theirs again. A peer that was stale before the delay is swept as
// ever (and its partitions taken); the held-up peer that stays stale is
// swept once the time is up.
func TestLateMemberSparesItsPeers(t *testing.T) {
	ctx := context.Background()
	d := testdb.Migrated(t, testdb.SQLite(t))
	publishKeys(t, d, "k", 0, 4)
	scope := driver.GroupScope{Tenants: []string{"bench"}, Topic: "tick", ConsumerGroup: "g"}
	clock := testdb.NewClock(time.Unix(1_000_000, 0)) // read by the workers the ticks start
	now := clock.Now()
	const stale, beatEvery = 4 * time.Second, time.Second
	ref := func(i int) driver.PartitionRef {
		return driver.PartitionRef{Tenant: "bench", ConsumerGroup: "g", Topic: "tick", PartitionKey: fmt.Sprintf("k%07d", i)}
	}
	// "dead" stopped beating long before; "held" beat with m0 until the
	// delay. Each holds a lease unexpired (swept only) and one that
	// expires during the delay (taken only).
	for _, m := range []struct {
		name string
		at   time.Time
		keys []int
	}{{"dead", now.Add(-time.Minute), []int{0, 1}}, {"held", now, []int{2, 3}}} {
		if err := d.Heartbeat(ctx, scope, m.name, m.at); err != nil {
			t.Fatal(err)
		}
		if _, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: ref(m.keys[0]), Owner: m.name, Now: now, TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
		if _, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: ref(m.keys[1]), Owner: m.name, Now: now, TTL: 2 * time.Second}); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Heartbeat(ctx, scope, "m0", now); err != nil {
		t.Fatal(err)
	}
	s := &Member{drv: d, workers: map[driver.PartitionRef]*worker{}, life: lifecycle.New(ctx), log: slog.New(slog.DiscardHandler),
		cfg: Config{ConsumerGroup: "g", Topic: "tick", Tenants: []string{"bench"}, ID: "m0", LeaseTTL: time.Hour, StaleAfter: stale,
			HeartbeatInterval: beatEvery, DiscoveryWindow: time.Minute, FullDiscoveryInterval: time.Hour, MaxPartitions: 10, BatchSize: 10,
			PollInterval: time.Hour, IdleRelease: time.Hour, Clock: clock.Now,
			Handle: func(context.Context, []driver.Message, *large.Whole, int) error { return nil }}}
	defer s.life.Stop(ctx)
	s.beaten(scope.Tenants, now)
	owners := func() map[string]string {
		ls, err := d.HeldLeases(ctx, scope)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for _, l := range ls {
			out[l.PartitionKey] = l.Owner
		}
		return out
	}
	want := func(when string, w map[int]string) {
		t.Helper()
		got := owners()
		for k, o := range w {
			if got[fmt.Sprintf("k%07d", k)] != o {
				t.Fatalf("%s: partition %d held by %q, want %q (all: %v)", when, k, got[fmt.Sprintf("k%07d", k)], o, got)
			}
		}
	}
	beat := func() {
		if err := s.heartbeat(ctx, clock.Now()); err != nil {
			t.Fatal(err)
		}
	}

	// m0 and "held" frozen past StaleAfter and past the short leases; m0
	// wakes first.
	clock.Add(stale + time.Second)
	s.tick()
	want("the first tick after the delay", map[int]string{0: "", 1: "", 2: "held", 3: "held"})
	beat() // lands late
	for end := clock.Now().Add(stale); clock.Now().Before(end); clock.Add(stale / 4) {
		s.tick()
		want(fmt.Sprintf("%s after m0's late heartbeat", clock.Now().Sub(end.Add(-stale))), map[int]string{2: "held", 3: "held"})
		beat()
	}
	s.tick()
	want("StaleAfter after m0's heartbeat came back on time", map[int]string{0: "m0", 1: "m0", 2: "", 3: "m0"})
}
