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

// TestLateMemberJudgesNobody: a member whose own heartbeat is late (this
// process frozen, or every writer held up by another process frozen
// inside a write on SQLite's file) sweeps nobody until its heartbeat has
// been on time for StaleAfter: the others
// were likely held up as long, and get that time to write theirs again.
// Then a member that stays stale is swept.
func TestLateMemberJudgesNobody(t *testing.T) {
	ctx := context.Background()
	d := testdb.Migrated(t, testdb.SQLite(t))
	publishKeys(t, d, "k", 0, 4)
	scope := driver.GroupScope{Tenants: []string{"bench"}, Topic: "tick", ConsumerGroup: "g"}
	now := time.Unix(1_000_000, 0)
	const stale = 4 * time.Second
	for _, m := range []string{"ghost", "m0"} {
		if err := d.Heartbeat(ctx, scope, m, now); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 4 {
		ref := driver.PartitionRef{Tenant: "bench", ConsumerGroup: "g", Topic: "tick", PartitionKey: fmt.Sprintf("k%07d", i)}
		if _, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: ref, Owner: "ghost", Now: now, TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	s := &Member{drv: d, workers: map[driver.PartitionRef]*worker{}, life: lifecycle.New(ctx), log: slog.New(slog.DiscardHandler),
		cfg: Config{ConsumerGroup: "g", Topic: "tick", Tenants: []string{"bench"}, ID: "m0", LeaseTTL: time.Hour, StaleAfter: stale,
			HeartbeatInterval: time.Second, DiscoveryWindow: time.Minute, FullDiscoveryInterval: time.Hour, Clock: func() time.Time { return now }}}
	defer s.life.Stop(ctx)
	s.beaten(scope.Tenants, now)
	ghostHolds := func() int {
		ls, err := d.HeldLeases(ctx, scope)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, l := range ls {
			if l.Owner == "ghost" {
				n++
			}
		}
		return n
	}
	beat := func() {
		if err := s.heartbeat(ctx, now); err != nil {
			t.Fatal(err)
		}
	}

	// Both frozen past StaleAfter: m0 wakes first.
	now = now.Add(stale + time.Second)
	s.tick()
	if n := ghostHolds(); n != 4 {
		t.Fatalf("a member whose own heartbeat was %s old swept a peer's leases (%d of 4 left)", stale+time.Second, n)
	}
	beat() // lands late
	for end := now.Add(stale); now.Before(end); now = now.Add(stale / 4) {
		s.tick()
		if n := ghostHolds(); n != 4 {
			t.Fatalf("swept a peer %s after its own late heartbeat (%d of 4 leases left), before the peer had StaleAfter (%s) to write again",
				now.Sub(end.Add(-stale)), n, stale)
		}
		beat()
	}
	s.tick()
	if n := ghostHolds(); n != 0 {
		t.Fatalf("a peer stale for StaleAfter after this member's heartbeat came back on time still holds %d leases", n)
	}
}
