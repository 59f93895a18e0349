// SPDX-License-Identifier: Apache-2.0

package consumer

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/shardq/shardq/driver"
)

// TestHeartbeatAfterALapseStopsTheWorkers: a heartbeat that lands once
// the member's last one could have gone stale (a process frozen across
// the write, or between two beats) does not make the leases held before
// it live again: another member may have counted this one dead and swept
// them, unexpired, meanwhile. A tenant whose heartbeat never lapsed keeps
// its workers.
func TestHeartbeatAfterALapseStopsTheWorkers(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	s := &Member{workers: map[driver.PartitionRef]*worker{}, log: slog.New(slog.DiscardHandler),
		cfg: Config{Tenants: []string{"a", "b"}, LeaseTTL: time.Minute, StaleAfter: 3 * time.Second, Clock: func() time.Time { return now }}}
	hold := func(tenant string) *worker {
		ref := driver.PartitionRef{Tenant: tenant, ConsumerGroup: "g", Topic: "x", PartitionKey: "k"}
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		w := &worker{s: s, lease: driver.Lease{PartitionRef: ref, Token: 1, Owner: "m", ExpiresAt: now.Add(time.Minute)},
			ctx: ctx, cancel: cancel, lost: make(chan struct{}), handback: make(chan struct{})}
		s.workers[ref] = w
		return w
	}
	s.beaten([]string{"a", "b"}, now)
	a, b := hold("a"), hold("b")

	now = now.Add(time.Second)
	s.beaten([]string{"a", "b"}, now) // on time
	if !a.leaseLive() || !b.leaseLive() {
		t.Fatal("a heartbeat on time stopped a worker")
	}

	// Tenant a's next write starts on time and ends after the others
	// could count the member dead there (StaleAfter after the last beat,
	// less the margin); tenant b's beat comes on time.
	stamp := now.Add(time.Second)
	now = now.Add(1500 * time.Millisecond)
	s.beaten([]string{"b"}, now)
	now = now.Add(1400 * time.Millisecond)
	s.beaten([]string{"a"}, stamp)
	if a.leaseLive() {
		t.Fatalf("tenant a's worker still hands out messages at %s after a heartbeat that landed past its last one's staleness (lives until %s)",
			now.Format(time.StampMilli), a.giveUpAt().Format(time.StampMilli))
	}
	select {
	case <-a.ctx.Done():
	default:
		t.Fatal("tenant a's handler was not cancelled")
	}
	if !b.leaseLive() {
		t.Fatal("tenant b's worker stopped, though its heartbeat never lapsed")
	}
}

// TestLeaseAcquiredAcrossALapseIsDropped: a lease acquired before a
// freeze whose heartbeat lapse is handled before its worker is added
// (no worker to stop then) may have been swept meanwhile; the worker is
// lost before it hands anything out. One acquired after the lapse was
// handled is worked.
func TestLeaseAcquiredAcrossALapseIsDropped(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	s := &Member{workers: map[driver.PartitionRef]*worker{}, log: slog.New(slog.DiscardHandler),
		cfg: Config{Tenants: []string{"a", "b"}, LeaseTTL: time.Minute, StaleAfter: 3 * time.Second, Clock: func() time.Time { return now }}}
	worker := func(tenant, key string) *worker {
		ref := driver.PartitionRef{Tenant: tenant, ConsumerGroup: "g", Topic: "x", PartitionKey: key}
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		return &worker{s: s, lease: driver.Lease{PartitionRef: ref, Token: 1, Owner: "m", ExpiresAt: now.Add(time.Minute)},
			ctx: ctx, cancel: cancel, lost: make(chan struct{}), handback: make(chan struct{})}
	}
	s.beaten([]string{"a", "b"}, now)
	beforeA, beforeB := s.lapsesIn("a"), s.lapsesIn("b")
	// Acquired now; the process freezes past its heartbeat's staleness
	// in tenant a, and the heartbeat that lands on waking is handled
	// before the workers are added.
	for range 4 { // tenant b's rows are written on time meanwhile
		now = now.Add(time.Second)
		s.beaten([]string{"b"}, now)
	}
	now = now.Add(time.Second)
	s.beaten([]string{"a"}, now)
	acrossA, acrossB := worker("a", "k1"), worker("b", "k1")
	if s.addWorker(acrossA, beforeA) || s.workers[acrossA.lease.PartitionRef] != nil {
		t.Fatal("a lease acquired before tenant a's heartbeat lapsed is worked after the lapse was handled")
	}
	if !s.addWorker(acrossB, beforeB) || !acrossB.leaseLive() {
		t.Fatal("tenant b's worker was dropped, though its heartbeat never lapsed")
	}
	after := worker("a", "k2")
	if !s.addWorker(after, s.lapsesIn("a")) || !after.leaseLive() {
		t.Fatal("a lease acquired after the lapse was handled was dropped")
	}
	// A lapse handled once a worker is added stops it (beaten).
	for range 5 {
		now = now.Add(time.Second)
		s.beaten([]string{"b"}, now)
	}
	s.beaten([]string{"a"}, now)
	if after.leaseLive() {
		t.Fatal("a worker added before a lapse was handled still hands out")
	}
}
