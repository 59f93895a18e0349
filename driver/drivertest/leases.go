// SPDX-License-Identifier: Apache-2.0

package drivertest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/balance"
)

var leaseTests = []struct {
	name string
	fn   func(*testing.T, Open)
}{
	{"LeaseIsExclusiveAndFenced", testLeaseIsExclusiveAndFenced},
	{"HeldLeaseRefusedWithoutWaiting", testHeldLeaseRefusedWithoutWaiting},
	{"LeaseRenewAndReacquire", testLeaseRenewAndReacquire},
	{"RenewManyLeasesAtOnce", testRenewManyLeasesAtOnce},
	{"CommitNeverMovesBack", testCommitNeverMovesBack},
	{"LeaseAcquireRace", testLeaseAcquireRace},
	{"SweepFreesDeadOwners", testSweepFreesDeadOwners},
	{"HeartbeatsScoped", testHeartbeatsScoped},
	{"RetryBookkeepingFenced", testRetryBookkeepingFenced},
	{"DeadLetterMovesAtomically", testDeadLetterMovesAtomically},
	{"FairShareConvergesAt10000Partitions", testFairShareConverges},
}

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// firstToken is the first token of a lease row made at t0: the row
// starts at t0 in microseconds (docs/leases.md).
var firstToken = t0.UnixMicro() + 1

const ttl = 30 * time.Second

// Committed returns group's cursor for one partition (0 when none).
func Committed(t *testing.T, d driver.Driver, tenant, topic, key, group string) int64 {
	t.Helper()
	ps, err := d.PartitionHeads(context.Background(), []string{tenant}, topic)
	if err != nil {
		t.Fatal(err)
	}
	work, err := d.PartitionsWithWork(context.Background(), driver.GroupScope{Tenants: []string{tenant}, Topic: topic, ConsumerGroup: group})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range work {
		if p.PartitionKey == key {
			return p.CommittedOffset
		}
	}
	for _, p := range ps {
		if p.PartitionKey == key {
			return p.HeadOffset // no work left: the cursor is at the head
		}
	}
	t.Fatalf("partition %q not found", key)
	return 0
}

// testHeldLeaseRefusedWithoutWaiting: an acquisition of a lease another
// owner holds unexpired is refused while the holder's own transaction has
// the row locked (a commit in flight, or the holder frozen inside one),
// without waiting for it: and so it never holds the holder's row itself
// (docs/leases.md, "Bounded waits").
func testHeldLeaseRefusedWithoutWaiting(t *testing.T, open Open) {
	d := setup(t, open)
	ctx := context.Background()
	res := mustInsert(t, d, driver.InsertMessage{Tenant: "t", Topic: "x", PartitionKey: "k"})
	p := driver.PartitionRef{Tenant: "t", ConsumerGroup: "g", Topic: "x", PartitionKey: "k"}
	a, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: p, Owner: "sub-a", Now: t0, TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := d.BeginWrite(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if err := d.InTx(tx).CommitOffset(ctx, a, res[0].Offset, t0); err != nil { // fences: the row is locked
		t.Fatal(err)
	}
	wait, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	_, err = d.AcquireLease(wait, driver.AcquireLeaseParams{Partition: p, Owner: "sub-b", Now: t0.Add(time.Second), TTL: ttl})
	if !errors.Is(err, driver.ErrLeaseHeld) {
		t.Fatalf("acquire of a lease held by a transaction in flight = %v, want ErrLeaseHeld at once", err)
	}
}

func testLeaseIsExclusiveAndFenced(t *testing.T, open Open) {
	d := setup(t, open)
	ctx := context.Background()
	var batch []driver.InsertMessage
	for range 10 {
		batch = append(batch, driver.InsertMessage{Tenant: "t", Topic: "x", PartitionKey: "k"})
	}
	res := mustInsert(t, d, batch...)
	p := driver.PartitionRef{Tenant: "t", ConsumerGroup: "g", Topic: "x", PartitionKey: "k"}

	a, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: p, Owner: "sub-a", Now: t0, TTL: ttl})
	if err != nil || a.Token != firstToken || a.Owner != "sub-a" || !a.ExpiresAt.Equal(t0.Add(ttl)) {
		t.Fatalf("first acquire = %+v, %v", a, err)
	}
	_, err = d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: p, Owner: "sub-b", Now: t0.Add(ttl - time.Second), TTL: ttl})
	var held *driver.LeaseHeldError
	if !errors.Is(err, driver.ErrLeaseHeld) || !errors.As(err, &held) || held.Owner != "sub-a" {
		t.Fatalf("acquire of a held lease = %v, want LeaseHeldError naming sub-a", err)
	}
	if err := d.CommitOffset(ctx, a, res[4].Offset, t0); err != nil {
		t.Fatal(err)
	}
	if got := Committed(t, d, "t", "x", "k", "g"); got != res[4].Offset {
		t.Fatalf("cursor %d after commit, want %d", got, res[4].Offset)
	}

	// a stalls past its expiry; b takes over with a higher token.
	b, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: p, Owner: "sub-b", Now: t0.Add(ttl + time.Second), TTL: ttl})
	if err != nil || b.Token != firstToken+1 || b.Committed != res[4].Offset {
		t.Fatalf("takeover after expiry = %+v, %v; want token first+1 starting after offset %d", b, err, res[4].Offset)
	}
	// The stale owner moves nothing.
	if err := d.CommitOffset(ctx, a, res[9].Offset, t0.Add(ttl+2*time.Second)); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("stale commit = %v, want ErrLeaseLost", err)
	}
	if got := Committed(t, d, "t", "x", "k", "g"); got != res[4].Offset {
		t.Fatalf("stale commit moved the cursor to %d", got)
	}
	if _, err := d.RenewLease(ctx, a, t0.Add(ttl+2*time.Second), ttl); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("stale renew = %v, want ErrLeaseLost", err)
	}
	if err := d.ReleaseLease(ctx, a, t0.Add(ttl+2*time.Second)); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("stale release = %v, want ErrLeaseLost", err)
	}
	ls, err := d.ListLeases(ctx, driver.GroupScope{Tenants: []string{"t"}, Topic: "x", ConsumerGroup: "g"})
	if err != nil || len(ls) != 1 || ls[0].Owner != "sub-b" || ls[0].Token != firstToken+1 {
		t.Fatalf("leases after stale writes = %+v, %v; want sub-b's untouched", ls, err)
	}
	// b commits and releases; the next owner's token is higher again.
	if err := d.CommitOffset(ctx, b, res[9].Offset, t0.Add(ttl+3*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := d.ReleaseLease(ctx, b, t0.Add(ttl+4*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := d.CommitOffset(ctx, b, res[9].Offset, t0.Add(ttl+5*time.Second)); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("commit after release = %v, want ErrLeaseLost", err)
	}
	a2, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: p, Owner: "sub-a", Now: t0.Add(ttl + 5*time.Second), TTL: ttl})
	if err != nil || a2.Token != firstToken+2 {
		t.Fatalf("acquire after release = %+v, %v; want token first+2", a2, err)
	}
	if ps, _ := d.PartitionsWithWork(ctx, driver.GroupScope{Tenants: []string{"t"}, Topic: "x", ConsumerGroup: "g"}); len(ps) != 0 {
		t.Fatalf("group still has work after committing the head: %+v", ps)
	}
}

func testLeaseRenewAndReacquire(t *testing.T, open Open) {
	d := setup(t, open)
	ctx := context.Background()
	p := driver.PartitionRef{Tenant: "t", ConsumerGroup: "g", Topic: "x", PartitionKey: "k"}
	a, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: p, Owner: "sub-a", Now: t0, TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	// Renewing with a frozen clock must work too (no change in the row).
	if _, err := d.RenewLease(ctx, a, t0, ttl); err != nil {
		t.Fatalf("renew at the same instant: %v", err)
	}
	a, err = d.RenewLease(ctx, a, t0.Add(20*time.Second), ttl)
	if err != nil || !a.ExpiresAt.Equal(t0.Add(50*time.Second)) {
		t.Fatalf("renew = %+v, %v", a, err)
	}
	if _, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: p, Owner: "sub-b", Now: t0.Add(40 * time.Second), TTL: ttl}); !errors.Is(err, driver.ErrLeaseHeld) {
		t.Fatalf("acquire within the renewed lease = %v, want ErrLeaseHeld", err)
	}
	// An expired lease is lost to its holder even when nobody took it:
	// renewal is refused (the holder must acquire again, with a new
	// token), and so is a batch renewal; a commit under the still-current
	// token is accepted (nobody else can have delivered).
	if _, err := d.RenewLease(ctx, a, t0.Add(time.Hour), ttl); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("renew of an expired, untaken lease = %v, want ErrLeaseLost", err)
	}
	if renewed, lost, err := d.RenewLeases(ctx, []driver.Lease{a}, t0.Add(time.Hour), ttl); err != nil || len(renewed) != 0 || len(lost) != 1 {
		t.Fatalf("batch renew of an expired lease = %v renewed, %v lost, %v", renewed, lost, err)
	}
	if err := d.CommitOffset(ctx, a, 0, t0.Add(time.Hour)); err != nil {
		t.Fatalf("commit under the expired, untaken lease: %v", err)
	}
	// Acquiring again as the same owner starts a new epoch and fences
	// the old handle.
	again, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: p, Owner: "sub-a", Now: t0.Add(time.Hour), TTL: ttl})
	if err != nil || again.Token != a.Token+1 {
		t.Fatalf("re-acquire by owner = %+v, %v", again, err)
	}
	if _, err := d.RenewLease(ctx, a, t0.Add(time.Hour), ttl); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("renew of the superseded handle = %v, want ErrLeaseLost", err)
	}
}

func testCommitNeverMovesBack(t *testing.T, open Open) {
	d := setup(t, open)
	ctx := context.Background()
	res := mustInsert(t, d, driver.InsertMessage{Tenant: "t", Topic: "x", PartitionKey: "k"},
		driver.InsertMessage{Tenant: "t", Topic: "x", PartitionKey: "k"}, driver.InsertMessage{Tenant: "t", Topic: "x", PartitionKey: "k"})
	l, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: driver.PartitionRef{Tenant: "t", ConsumerGroup: "g", Topic: "x", PartitionKey: "k"}, Owner: "s", Now: t0, TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	for _, off := range []int64{res[1].Offset, res[0].Offset, res[1].Offset} {
		if err := d.CommitOffset(ctx, l, off, t0); err != nil {
			t.Fatal(err)
		}
	}
	if got := Committed(t, d, "t", "x", "k", "g"); got != res[1].Offset {
		t.Fatalf("cursor %d, want %d: a commit must never move it back", got, res[1].Offset)
	}
}

func testLeaseAcquireRace(t *testing.T, open Open) {
	d := setup(t, open)
	ctx := context.Background()
	p := driver.PartitionRef{Tenant: "t", ConsumerGroup: "g", Topic: "x", PartitionKey: "hot"}
	const racers = 8
	var wg sync.WaitGroup
	won := make(chan driver.Lease, racers)
	errs := make(chan error, racers)
	for i := range racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: p, Owner: fmt.Sprintf("sub-%d", i), Now: t0, TTL: ttl})
			switch {
			case err == nil:
				won <- l
			case errors.Is(err, driver.ErrLeaseHeld):
			case d.Retryable(err): // a deadlock InnoDB resolved by aborting one racer
			default:
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(won)
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	var winners []driver.Lease
	for l := range won {
		winners = append(winners, l)
	}
	if len(winners) != 1 || winners[0].Token != firstToken {
		t.Fatalf("winners %+v, want exactly one with the first token %d", winners, firstToken)
	}
}

func testSweepFreesDeadOwners(t *testing.T, open Open) {
	d := setup(t, open)
	ctx := context.Background()
	ref := func(k string) driver.PartitionRef {
		return driver.PartitionRef{Tenant: "t", ConsumerGroup: "g", Topic: "x", PartitionKey: k}
	}
	dead, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: ref("k1"), Owner: "dead", Now: t0, TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	alive, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: ref("k2"), Owner: "alive", Now: t0, TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	// revived's heartbeat was stale when the sweeper read it, and was
	// written again before the sweep: the sweep checks it again.
	revived, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: ref("k3"), Owner: "revived", Now: t0, TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	// late's lease was acquired after the sweeper read the heartbeats
	// (after its Now): whatever the sweep reads of late's heartbeat, the
	// lease is not a dead owner's.
	late, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: ref("k4"), Owner: "late", Now: t0.Add(2 * time.Second), TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	scope := driver.GroupScope{Tenants: []string{"t"}, Topic: "x", ConsumerGroup: "g"}
	for name, at := range map[string]time.Time{"dead": t0.Add(-time.Minute), "alive": t0, "revived": t0, "late": t0.Add(-time.Minute)} {
		if err := d.Heartbeat(ctx, scope, name, at); err != nil {
			t.Fatal(err)
		}
	}
	n, err := d.SweepLeases(ctx, driver.SweepLeasesParams{Group: scope, Owners: []string{"dead", "revived", "late"}, StaleBefore: t0.Add(-30 * time.Second), Now: t0.Add(time.Second)})
	if err != nil || n != 1 {
		t.Fatalf("sweep = %d, %v; want 1", n, err)
	}
	if _, err := d.RenewLease(ctx, late, t0.Add(3*time.Second), ttl); err != nil {
		t.Fatalf("sweep took a lease acquired after the sweeper's now: %v", err)
	}
	if _, err := d.RenewLease(ctx, revived, t0.Add(time.Second), ttl); err != nil {
		t.Fatalf("sweep took the lease of an owner whose heartbeat was written again: %v", err)
	}
	if err := d.CommitOffset(ctx, dead, 1, t0.Add(time.Second)); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("swept owner's commit = %v, want ErrLeaseLost", err)
	}
	if _, err := d.RenewLease(ctx, alive, t0.Add(time.Second), ttl); err != nil {
		t.Fatalf("sweep touched a live owner's lease: %v", err)
	}
	// The swept lease is free at once, not after its expiry.
	next, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: ref("k1"), Owner: "heir", Now: t0.Add(2 * time.Second), TTL: ttl})
	if err != nil || next.Token <= dead.Token+1 {
		t.Fatalf("acquire after sweep = %+v, %v; want a token above %d", next, err, dead.Token+1)
	}
}

func testHeartbeatsScoped(t *testing.T, open Open) {
	d := setup(t, open)
	ctx := context.Background()
	if err := d.Heartbeat(ctx, driver.GroupScope{Tenants: []string{"t1", "t2"}, Topic: "x", ConsumerGroup: "g"}, "s1", t0); err != nil {
		t.Fatal(err)
	}
	if err := d.Heartbeat(ctx, driver.GroupScope{Tenants: []string{"t1"}, Topic: "x", ConsumerGroup: "g"}, "s2", t0); err != nil {
		t.Fatal(err)
	}
	if err := d.Heartbeat(ctx, driver.GroupScope{Tenants: []string{"t3"}, Topic: "x", ConsumerGroup: "g"}, "s3", t0); err != nil {
		t.Fatal(err)
	}
	if err := d.Heartbeat(ctx, driver.GroupScope{Tenants: []string{"t1"}, Topic: "x", ConsumerGroup: "g"}, "s1", t0.Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	subs, err := d.Subscribers(ctx, driver.GroupScope{Tenants: []string{"t1", "t2"}, Topic: "x", ConsumerGroup: "g"})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range subs {
		got = append(got, fmt.Sprintf("%s/%s@%ds", s.Tenant, s.Name, int(s.HeartbeatAt.Sub(t0).Seconds())))
		if !s.StartedAt.Equal(t0) {
			t.Fatalf("%s started_at %v changed by a later heartbeat", s.Name, s.StartedAt)
		}
	}
	if want := []string{"t1/s1@5s", "t1/s2@0s", "t2/s1@0s"}; !slices.Equal(got, want) {
		t.Fatalf("subscribers %v, want %v (never t3)", got, want)
	}
	if err := d.RemoveHeartbeat(ctx, driver.GroupScope{Tenants: []string{"t1", "t2"}, Topic: "x", ConsumerGroup: "g"}, "s1"); err != nil {
		t.Fatal(err)
	}
	subs, _ = d.Subscribers(ctx, driver.GroupScope{Tenants: []string{"t1", "t2", "t3"}, Topic: "x", ConsumerGroup: "g"})
	if len(subs) != 2 || subs[0].Name != "s2" || subs[1].Name != "s3" {
		t.Fatalf("after removing s1: %+v", subs)
	}
	if subs, _ := d.Subscribers(ctx, driver.GroupScope{Tenants: nil, Topic: "x", ConsumerGroup: "g"}); len(subs) != 0 {
		t.Fatalf("an empty tenant list returned %+v", subs)
	}
}

func testRetryBookkeepingFenced(t *testing.T, open Open) {
	d := setup(t, open)
	ctx := context.Background()
	res := mustInsert(t, d, driver.InsertMessage{Tenant: "t", Topic: "x", PartitionKey: "k"}, driver.InsertMessage{Tenant: "t", Topic: "x", PartitionKey: "k"})
	p := driver.PartitionRef{Tenant: "t", ConsumerGroup: "g", Topic: "x", PartitionKey: "k"}
	l, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: p, Owner: "s", Now: t0, TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	state := func(off int64) (driver.DeliveryState, bool) {
		t.Helper()
		sts, err := d.DeliveryStates(ctx, p, off-1, off)
		if err != nil {
			t.Fatal(err)
		}
		st, ok := sts[off]
		return st, ok
	}
	if _, found := state(res[0].Offset); found {
		t.Fatal("fresh message has bookkeeping")
	}
	for attempt := 1; attempt <= 2; attempt++ {
		st := driver.DeliveryState{Attempts: attempt, NextAttemptAt: t0.Add(time.Duration(attempt) * time.Second), LastError: fmt.Sprintf("boom %d", attempt)}
		if err := d.RecordAttempt(ctx, driver.RecordAttemptParams{Lease: l, Offset: res[0].Offset, State: st, Now: t0}); err != nil {
			t.Fatal(err)
		}
	}
	st, found := state(res[0].Offset)
	if !found || st.Attempts != 2 || st.LastError != "boom 2" || !st.NextAttemptAt.Equal(t0.Add(2*time.Second)) {
		t.Fatalf("bookkeeping = %+v %v", st, found)
	}
	if sts, _ := d.DeliveryStates(ctx, p, res[0].Offset, res[1].Offset); len(sts) != 0 {
		t.Fatalf("range after the message returned %+v", sts)
	}
	// A takeover fences the old owner's bookkeeping.
	l2, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: p, Owner: "s2", Now: t0.Add(time.Hour), TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.RecordAttempt(ctx, driver.RecordAttemptParams{Lease: l, Offset: res[0].Offset, State: driver.DeliveryState{Attempts: 9}, Now: t0.Add(time.Hour)}); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("stale RecordAttempt = %v, want ErrLeaseLost", err)
	}
	if st, _ := state(res[0].Offset); st.Attempts != 2 {
		t.Fatalf("stale owner changed attempts to %d", st.Attempts)
	}
	// Acking the message (committing past it) drops its bookkeeping.
	if err := d.CommitOffset(ctx, l2, res[0].Offset, t0.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, found := state(res[0].Offset); found {
		t.Fatal("bookkeeping kept after the cursor passed the message")
	}
}

func testDeadLetterMovesAtomically(t *testing.T, open Open) {
	d := setup(t, open)
	ctx := context.Background()
	res := mustInsert(t, d, driver.InsertMessage{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "poison", Payload: []byte("bad")},
		driver.InsertMessage{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "next"})
	p := driver.PartitionRef{Tenant: "t", ConsumerGroup: "g", Topic: "x", PartitionKey: "k"}
	l, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: p, Owner: "s", Now: t0, TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.RecordAttempt(ctx, driver.RecordAttemptParams{Lease: l, Offset: res[0].Offset, State: driver.DeliveryState{Attempts: 3, LastError: "boom"}, Now: t0}); err != nil {
		t.Fatal(err)
	}
	dlq := func() *driver.InsertMessage {
		return &driver.InsertMessage{Tenant: "t", Topic: "x.dlq", PartitionKey: "k", ID: "poison", Payload: []byte("bad"),
			Headers: map[string]string{"queue_name": "t", "dlq_original_topic": "x"}, CreatedAt: t0}
	}
	// A stale owner's dead-letter writes nothing at all.
	if _, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: p, Owner: "s2", Now: t0.Add(time.Hour), TTL: ttl}); err != nil {
		t.Fatal(err)
	}
	if err := d.DeadLetter(ctx, driver.DeadLetterParams{Lease: l, Copy: dlq(), Offset: res[0].Offset, Now: t0.Add(time.Hour)}); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("stale DeadLetter = %v, want ErrLeaseLost", err)
	}
	if got := fetchAll(t, d, "t", "x.dlq", "k"); len(got) != 0 {
		t.Fatalf("stale dead-letter stored %d messages", len(got))
	}
	if sts, _ := d.DeliveryStates(ctx, p, 0, res[0].Offset); len(sts) != 1 {
		t.Fatal("stale dead-letter dropped the bookkeeping")
	}
	l, err = d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: p, Owner: "s", Now: t0.Add(2 * time.Hour), TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.DeadLetter(ctx, driver.DeadLetterParams{Lease: l, Copy: dlq(), Offset: res[0].Offset, Now: t0.Add(2 * time.Hour)}); err != nil {
		t.Fatal(err)
	}
	got := fetchAll(t, d, "t", "x.dlq", "k")
	if len(got) != 1 || got[0].ID != "poison" || string(got[0].Payload) != "bad" || got[0].Headers["dlq_original_topic"] != "x" {
		t.Fatalf("dead-letter topic holds %+v", got)
	}
	if sts, _ := d.DeliveryStates(ctx, p, 0, res[0].Offset); len(sts) != 0 {
		t.Fatal("bookkeeping kept after dead-lettering")
	}
	work, err := d.PartitionsWithWork(ctx, driver.GroupScope{Tenants: []string{"t"}, Topic: "x", ConsumerGroup: "g"})
	if err != nil || len(work) != 1 || work[0].CommittedOffset != res[0].Offset {
		t.Fatalf("after dead-lettering, work = %+v %v; want the cursor past the poison message only", work, err)
	}
}

func testRenewManyLeasesAtOnce(t *testing.T, open Open) {
	d := setup(t, open)
	ctx := context.Background()
	var mine []driver.Lease
	for _, tk := range [][2]string{{"t1", "a"}, {"t1", "b"}, {"t2", "a"}} {
		lttl := 3 * ttl // t1/a and t2/a are still live at the renewal
		if tk[1] == "b" {
			lttl = ttl
		}
		l, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: driver.PartitionRef{Tenant: tk[0], ConsumerGroup: "g", Topic: "x", PartitionKey: tk[1]}, Owner: "me", Now: t0, TTL: lttl})
		if err != nil {
			t.Fatal(err)
		}
		mine = append(mine, l)
	}
	// t1/b expires and a peer takes it.
	if _, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: mine[1].PartitionRef, Owner: "peer", Now: t0.Add(ttl + time.Second), TTL: ttl}); err != nil {
		t.Fatal(err)
	}
	renewed, lost, err := d.RenewLeases(ctx, mine, t0.Add(ttl+2*time.Second), ttl)
	if err != nil {
		t.Fatal(err)
	}
	if len(renewed) != 2 || len(lost) != 1 || lost[0].PartitionRef != mine[1].PartitionRef {
		t.Fatalf("renewed %+v lost %+v; want t1/a and t2/a renewed, t1/b lost", renewed, lost)
	}
	for _, l := range renewed {
		if !l.ExpiresAt.Equal(t0.Add(2*ttl + 2*time.Second)) {
			t.Fatalf("renewed lease expires %v", l.ExpiresAt)
		}
	}
	ls, _ := d.ListLeases(ctx, driver.GroupScope{Tenants: []string{"t1", "t2"}, Topic: "x", ConsumerGroup: "g"})
	for _, l := range ls {
		if l.PartitionKey == "b" && (l.Owner != "peer" || !l.ExpiresAt.Equal(t0.Add(2*ttl+time.Second))) {
			t.Fatalf("the peer's lease was changed by a stale renewal: %+v", l)
		}
	}
	if _, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: mine[0].PartitionRef, Owner: "peer", Now: t0.Add(2 * ttl), TTL: ttl}); !errors.Is(err, driver.ErrLeaseHeld) {
		t.Fatalf("acquire of a renewed lease = %v, want ErrLeaseHeld", err)
	}
}

// testFairShareConverges runs the rebalancing decisions of 8 subscribers
// (list, plan, acquire, release: what a tick does, without delivering)
// against the database's lease table for 10,000 partitions with work, until
// a round changes nothing. Each must end within one of ceil(P/N).
func testFairShareConverges(t *testing.T, open Open) {
	d := setup(t, open)
	ctx := context.Background()
	const parts, members = 10_000, 8
	batch := make([]driver.InsertMessage, 0, 500)
	for i := range parts {
		batch = append(batch, driver.InsertMessage{Tenant: "t", Topic: "x", PartitionKey: fmt.Sprintf("p%02d", i), ID: fmt.Sprintf("m-%05d", i)})
		if len(batch) == cap(batch) {
			mustInsert(t, d, batch...)
			batch = batch[:0]
		}
	}
	if len(batch) > 0 {
		mustInsert(t, d, batch...)
	}
	names := make([]string, members)
	for i := range names {
		names[i] = fmt.Sprintf("sub-%d", i)
		if err := d.Heartbeat(ctx, driver.GroupScope{Tenants: []string{"t"}, Topic: "x", ConsumerGroup: "g"}, names[i], t0); err != nil {
			t.Fatal(err)
		}
	}
	work, err := d.PartitionsWithWork(ctx, driver.GroupScope{Tenants: []string{"t"}, Topic: "x", ConsumerGroup: "g"})
	if err != nil || len(work) != parts {
		t.Fatalf("%d partitions with work, %v", len(work), err)
	}
	refs := make([]driver.PartitionRef, len(work))
	for i, p := range work {
		refs[i] = driver.PartitionRef{Tenant: p.Tenant, ConsumerGroup: "g", Topic: p.Topic, PartitionKey: p.PartitionKey}
	}
	rounds := 0
	for changed := true; changed; rounds++ {
		if rounds == 5 {
			t.Fatalf("no convergence in %d rounds: %v", rounds, leaseCountsOf(t, d))
		}
		changed = false
		for _, me := range names {
			leases, err := d.ListLeases(ctx, driver.GroupScope{Tenants: []string{"t"}, Topic: "x", ConsumerGroup: "g"})
			if err != nil {
				t.Fatal(err)
			}
			plan := balance.Compute(balance.Input{Me: me, Live: map[string][]string{"t": names}, Work: refs, Leases: leases, Now: t0})
			for _, p := range plan.Release {
				for _, l := range leases {
					if l.PartitionRef == p {
						if err := d.ReleaseLease(ctx, l, t0); err != nil {
							t.Fatal(err)
						}
						changed = true
					}
				}
			}
			// A member's acquisitions are of distinct partitions: eight at
			// a time, as a database's latency (vtgate's most) bounds them.
			var acquired atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, len(plan.Acquire))
			next := make(chan driver.PartitionRef)
			for range 8 {
				wg.Go(func() {
					for p := range next {
						_, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: p, Owner: me, Now: t0, TTL: time.Hour})
						switch {
						case err == nil:
							acquired.Add(1)
						case !errors.Is(err, driver.ErrLeaseHeld):
							errs <- err
						}
					}
				})
			}
			for _, p := range plan.Acquire {
				next <- p
			}
			close(next)
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			changed = changed || acquired.Load() > 0
		}
	}
	counts := leaseCountsOf(t, d)
	ceil := (parts + members - 1) / members
	total := 0
	for _, name := range names {
		if counts[name] < ceil-1 || counts[name] > ceil {
			t.Fatalf("%s holds %d partitions, want within one of %d: %v", name, counts[name], ceil, counts)
		}
		total += counts[name]
	}
	if total != parts {
		t.Fatalf("%d of %d partitions leased", total, parts)
	}
	t.Logf("converged in %d rounds: %v", rounds, counts)
}

func leaseCountsOf(t *testing.T, d driver.Driver) map[string]int {
	ls, err := d.ListLeases(context.Background(), driver.GroupScope{Tenants: []string{"t"}, Topic: "x", ConsumerGroup: "g"})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, l := range ls {
		if l.Owner != "" {
			out[l.Owner]++
		}
	}
	return out
}
