// SPDX-License-Identifier: Apache-2.0

package conformance

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/driver/drivertest"
	"github.com/shardq/shardq/internal/testdb"
)

var lifecycleTests = []conformanceTest{
	{"RetentionRemovesDrainedPartitions", testRetentionRemovesDrainedPartitions},
	{"RemovalKeepsWhatAGroupHasNotPassed", testRemovalKeepsWhatAGroupHasNotPassed},
	{"RemovalWaitsForLiveLeases", testRemovalWaitsForLiveLeases},
	{"RemovalRacesPublishersAndSubscribers", testRemovalRacesPublishersAndSubscribers},
	{"RemovalRacesReceivers", testRemovalRacesReceivers},
	{"DeleteTenant", testDeleteTenant},
	{"DedupWindow", testDedupWindow},
}

// Retention keeps every message younger than the de-duplication window,
// whatever its policies say: an id published again within the window is
// a duplicate. Past the window the message goes and its id is new again.
func testDedupWindow(t *testing.T, open Open) {
	clock := testdb.NewClock(t0)
	_, c := setup(t, open, &shardq.Config{Clock: clock.Now})
	ctx := context.Background()
	msg := shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "order-1", Payload: []byte("a")}
	mustPublish(t, c, msg)
	eager := shardq.RetentionConfig{Default: shardq.RetentionPolicy{MinRetention: time.Second, MaxRetention: time.Minute}, DedupWindow: 10 * time.Minute}
	clock.Add(9 * time.Minute) // past both policies, within the window
	if rep := retainAll(t, c, eager); rep.Deleted != 0 {
		t.Fatalf("retention deleted %d messages within the de-duplication window", rep.Deleted)
	}
	if res := mustPublish(t, c, msg); !res[0].Duplicate {
		t.Fatalf("the id again within the window: %+v; want a duplicate", res[0])
	}
	clock.Add(2 * time.Minute)
	if rep := retainAll(t, c, eager); rep.Deleted != 1 {
		t.Fatalf("retention past the window: %+v; want the message deleted", rep)
	}
	if res := mustPublish(t, c, msg); res[0].Duplicate {
		t.Fatalf("the id again once its message is gone: %+v; want a new message", res[0])
	}
	if _, err := c.Admin().RunRetention(ctx, shardq.Scope{Tenants: []string{"t"}}, shardq.RetentionConfig{DedupWindow: -1}); err != nil {
		t.Fatalf("a retention without a window: %v", err)
	}
}

func retainAll(t *testing.T, c *shardq.Client, cfg shardq.RetentionConfig) shardq.RetentionReport {
	t.Helper()
	rep, err := c.Admin().RunRetention(context.Background(), shardq.Scope{Tenants: []string{"t"}}, cfg)
	if err != nil {
		t.Fatalf("retention: %v", err)
	}
	return rep
}

// testRetentionRemovesDrainedPartitions: a partition every group passed,
// emptied by retention and idle past the age, goes with every row that
// belonged to it; a later publish to its key makes it anew and the group
// reads exactly the new message, under a lease token above the old ones.
func testRetentionRemovesDrainedPartitions(t *testing.T, open Open) {
	clock := newFakeClock(time.Now())
	d, c := setup(t, open, &shardq.Config{Clock: clock.Now})
	ctx := context.Background()
	var msgs []shardq.Message
	for _, k := range []string{"k1", "k2", "k3", "k1", "k2", "k3", ""} {
		msgs = append(msgs, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: k})
	}
	mustPublish(t, c, msgs...)
	if err := d.RegisterGroup(ctx, driver.GroupScope{Tenants: []string{"t"}, Topic: "x", ConsumerGroup: "g"}, false, clock.Now()); err != nil {
		t.Fatal(err)
	}
	tokens := map[string]int64{}
	for _, k := range []string{"k1", "k2", "k3"} {
		l, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: driver.PartitionRef{Tenant: "t", ConsumerGroup: "g", Topic: "x", PartitionKey: k}, Owner: "m", Now: clock.Now(), TTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		got, err := d.FetchAfter(ctx, driver.TopicPartition{Tenant: "t", Topic: "x", PartitionKey: k}, 0, 10)
		if err != nil || len(got) != 2 {
			t.Fatalf("fetch %s = %d messages, %v", k, len(got), err)
		}
		head := got[1].Offset
		switch k {
		case "k1":
			if err := d.SetGroupState(ctx, l, []byte("session"), clock.Now()); err != nil {
				t.Fatal(err)
			}
		case "k2":
			// The group fails the second message and falls behind: the
			// message ages out, its bookkeeping stays behind.
			if err := d.RecordAttempt(ctx, driver.RecordAttemptParams{Lease: l, Offset: head, State: driver.DeliveryState{Attempts: 1, LastError: "retry"}, Now: clock.Now()}); err != nil {
				t.Fatal(err)
			}
			head = got[0].Offset
		}
		if err := d.CommitOffset(ctx, l, head, clock.Now()); err != nil {
			t.Fatal(err)
		}
		if err := d.ReleaseLease(ctx, l, clock.Now()); err != nil {
			t.Fatal(err)
		}
		tokens[k] = l.Token
	}
	// The ungrouped message is claimed and never settled: it ages out
	// with its claim row left.
	cs, _, err := d.ClaimMessages(ctx, driver.ClaimMessagesParams{Group: driver.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, Owner: "m", Now: clock.Now(), Visibility: time.Minute, Limit: driver.ClaimLimit{Messages: 10}})
	if err != nil || len(cs) != 1 {
		t.Fatalf("claim = %d, %v", len(cs), err)
	}
	before := drivertest.RowCounts(t, d, "t")
	for table, n := range before {
		if n == 0 {
			t.Fatalf("set-up left %s empty: %v", table, before)
		}
	}

	// Within the idle age nothing but messages goes: those passed, and
	// those past the maximum age.
	clock.Advance(2 * time.Hour)
	aged := shardq.RetentionPolicy{MinRetention: time.Hour, MaxRetention: 90 * time.Minute}
	rep := retainAll(t, c, shardq.RetentionConfig{Default: aged, PartitionIdle: 3 * time.Hour})
	if rep.Deleted != 7 || rep.Removed != 0 {
		t.Fatalf("pass within the idle age = %+v, want 7 messages deleted and no partition removed", rep)
	}
	if n := drivertest.RowCounts(t, d, "t")["queue_partitions"]; n != 4 {
		t.Fatalf("%d head rows after the first pass, want 4", n)
	}
	rep = retainAll(t, c, shardq.RetentionConfig{Default: aged})
	if rep.Removed != 4 {
		t.Fatalf("pass past the idle age = %+v, want 4 partitions removed", rep)
	}
	for table, n := range drivertest.RowCounts(t, d, "t") {
		if n != 0 {
			t.Errorf("%s keeps %d rows of removed partitions", table, n)
		}
	}
	if rep := retainAll(t, c, shardq.RetentionConfig{}); rep.Removed != 0 || rep.Deleted != 0 {
		t.Fatalf("pass with nothing left = %+v, want nothing done", rep)
	}

	again := mustPublish(t, c, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k1"})[0]
	l, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: driver.PartitionRef{Tenant: "t", ConsumerGroup: "g", Topic: "x", PartitionKey: "k1"}, Owner: "m2", Now: clock.Now(), TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	if l.Token <= tokens["k1"] {
		t.Fatalf("token after recreation %d, want above the removed row's %d", l.Token, tokens["k1"])
	}
	got, err := d.FetchAfter(ctx, driver.TopicPartition{Tenant: "t", Topic: "x", PartitionKey: "k1"}, l.Committed, 10)
	if err != nil || len(got) != 1 || got[0].Offset != again.Offset {
		t.Fatalf("recreated partition reads %+v, %v; want exactly the new message %d", got, err, again.Offset)
	}
	if st, err := d.GroupState(ctx, l); err != nil || st != nil {
		t.Fatalf("state of the recreated group = %q, %v; want none", st, err)
	}
	if ps, err := d.PartitionsWithWork(ctx, driver.GroupScope{Tenants: []string{"t"}, Topic: "x", ConsumerGroup: "g"}); err != nil || len(ps) != 1 || ps[0].PartitionKey != "k1" {
		t.Fatalf("work after recreation = %+v, %v; want k1 only", ps, err)
	}
}

// testRemovalKeepsWhatAGroupHasNotPassed: a group that has not read a
// message keeps it, and its partition, even once the group has no cursor
// left anywhere in the topic (its cursors went with removed partitions).
func testRemovalKeepsWhatAGroupHasNotPassed(t *testing.T, open Open) {
	clock := newFakeClock(time.Now())
	d, c := setup(t, open, &shardq.Config{Clock: clock.Now})
	ctx := context.Background()
	for _, g := range []string{"g1", "g2"} {
		if err := d.RegisterGroup(ctx, driver.GroupScope{Tenants: []string{"t"}, Topic: "x", ConsumerGroup: g}, false, clock.Now()); err != nil {
			t.Fatal(err)
		}
	}
	mustPublish(t, c, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k1"})
	drivertest.Drain(t, d, clock.Now(), "g1", "k1")
	drivertest.Drain(t, d, clock.Now(), "g2", "k1")
	clock.Advance(2 * time.Hour)
	if rep := retainAll(t, c, shardq.RetentionConfig{}); rep.Removed != 1 {
		t.Fatalf("first pass = %+v, want k1 removed", rep)
	}
	// g2 now has no cursor in the topic; g1 reads k2, g2 does not.
	k2 := mustPublish(t, c, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k2"})[0]
	drivertest.Drain(t, d, clock.Now(), "g1", "k2")
	// A group that lags on k3 keeps k3's messages after its cursor.
	k3 := mustPublish(t, c, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k3"}, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k3"})
	for _, g := range []string{"g1", "g2"} {
		drivertest.Drain(t, d, clock.Now(), g, "k3")
	}
	if err := d.ResetOffset(ctx, driver.PartitionRef{Tenant: "t", Topic: "x", PartitionKey: "k3", ConsumerGroup: "g2"}, k3[0].Offset); err != nil {
		t.Fatal(err)
	}
	clock.Advance(2 * time.Hour)
	rep := retainAll(t, c, shardq.RetentionConfig{PartitionIdle: time.Nanosecond})
	if rep.Removed != 0 || rep.Deleted != 1 {
		t.Fatalf("pass = %+v, want only k3's first message deleted and nothing removed", rep)
	}
	if got := fetchAll(t, d, "t", "x", "k2"); len(got) != 1 || got[0].Offset != k2.Offset {
		t.Fatalf("k2 holds %+v, want the message g2 has not read", got)
	}
	if got := fetchAll(t, d, "t", "x", "k3"); len(got) != 1 || got[0].Offset != k3[1].Offset {
		t.Fatalf("k3 holds %+v, want the message after g2's cursor", got)
	}
	if l := drivertest.Drain(t, d, clock.Now(), "g2", "k2"); l.Committed != 0 {
		t.Fatalf("g2 starts k2 after %d, want 0", l.Committed)
	}
}

// testRemovalWaitsForLiveLeases: a drained partition whose lease is held
// (a member or a receiver with its state) stays until the lease is free.
func testRemovalWaitsForLiveLeases(t *testing.T, open Open) {
	clock := newFakeClock(time.Now())
	d, c := setup(t, open, &shardq.Config{Clock: clock.Now})
	ctx := context.Background()
	res := mustPublish(t, c, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k"})
	l, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: driver.PartitionRef{Tenant: "t", ConsumerGroup: "g", Topic: "x", PartitionKey: "k"}, Owner: "m", Now: clock.Now(), TTL: 4 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.SetGroupState(ctx, l, []byte("session"), clock.Now()); err != nil {
		t.Fatal(err)
	}
	if err := d.CommitOffset(ctx, l, res[0].Offset, clock.Now()); err != nil {
		t.Fatal(err)
	}
	clock.Advance(2 * time.Hour)
	if rep := retainAll(t, c, shardq.RetentionConfig{}); rep.Deleted != 1 || rep.Removed != 0 {
		t.Fatalf("pass with the lease held = %+v, want the message deleted and the partition kept", rep)
	}
	if st, err := d.GroupState(ctx, l); err != nil || string(st) != "session" {
		t.Fatalf("state under the held lease = %q, %v", st, err)
	}
	if err := d.ReleaseLease(ctx, l, clock.Now()); err != nil {
		t.Fatal(err)
	}
	if rep := retainAll(t, c, shardq.RetentionConfig{}); rep.Removed != 1 {
		t.Fatalf("pass after release = %+v, want the partition removed", rep)
	}
	// The old handle is void, and so is a handle whose lease expired
	// before the removal.
	if err := d.CommitOffset(ctx, l, res[0].Offset, clock.Now()); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("commit under the removed lease = %v, want ErrLeaseLost", err)
	}
}

// delivered records deliveries by message id and checks order per key.
type delivered struct {
	mu    sync.Mutex
	count map[string]int
	last  map[string]int64
	bad   []string
}

func (d *delivered) add(key, id string, offset int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.count[id]++
	if offset <= d.last[key] {
		d.bad = append(d.bad, fmt.Sprintf("%s: offset %d after %d", key, offset, d.last[key]))
	}
	d.last[key] = offset
}

// churn publishes n messages over keys from two publishers, pausing now
// and then so partitions fall idle, while retention passes with a tiny
// idle age remove whatever is drained; it returns the ids published and
// the partitions removed.
func churn(t *testing.T, c *shardq.Client, n int, keys []string, consumed func() int) (ids []string, removed int64, err error) {
	t.Helper()
	ctx := context.Background()
	var mu sync.Mutex
	var wg sync.WaitGroup
	for p := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(p), 7))
			for i := range n / 2 {
				m := shardq.Message{Tenant: "t", Topic: "x", PartitionKey: keys[rng.IntN(len(keys))], ID: fmt.Sprintf("p%d-%d", p, i)}
				if _, err := c.Publish(ctx, m); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				ids = append(ids, m.ID)
				mu.Unlock()
				if rng.IntN(25) == 0 { // every partition falls idle
					time.Sleep(time.Duration(50+rng.IntN(50)) * time.Millisecond)
				}
			}
		}()
	}
	published := make(chan struct{})
	go func() { wg.Wait(); close(published) }()
	cfg := shardq.RetentionConfig{Default: shardq.RetentionPolicy{MinRetention: time.Microsecond}, PartitionIdle: time.Millisecond, DedupWindow: -1}
	deadline := time.Now().Add(30 * time.Second)
	for {
		rep, err := c.Admin().RunRetention(ctx, shardq.Scope{Tenants: []string{"t"}}, cfg)
		if err != nil {
			<-published
			return ids, removed, fmt.Errorf("retention: %w", err)
		}
		removed += rep.Removed
		select {
		case <-published:
			if consumed() >= n {
				return ids, removed, nil
			}
		default:
		}
		if time.Now().After(deadline) {
			<-published
			return ids, removed, fmt.Errorf("consumed %d of %d within 30 s", consumed(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (d *delivered) check(t *testing.T, ids []string, removed int64) {
	t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, id := range ids {
		if d.count[id] != 1 {
			t.Errorf("message %s delivered %d times, want once", id, d.count[id])
		}
	}
	if len(d.bad) > 0 {
		t.Errorf("order broken: %v", d.bad)
	}
	if removed == 0 {
		t.Errorf("no partition was removed while the test ran: the race it is about never happened")
	}
}

func (d *delivered) total() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.count)
}

// testRemovalRacesPublishersAndSubscribers removes partitions while two
// publishers write to them and a subscriber reads them (acquiring and
// idle-releasing their leases): every message is delivered once, in
// order, none replayed after its partition was made anew.
func testRemovalRacesPublishersAndSubscribers(t *testing.T, open Open) {
	_, c := setup(t, open, nil)
	seen := &delivered{count: map[string]int{}, last: map[string]int64{}}
	sub, err := c.Subscribe(context.Background(), shardq.SubscriberConfig{
		ConsumerGroup: "g", Topic: "x", Tenants: []string{"t"},
		DiscoveryInterval: 20 * time.Millisecond, PollInterval: 5 * time.Millisecond, IdleRelease: 10 * time.Millisecond,
		Handler: func(_ context.Context, m *shardq.Delivery) error {
			seen.add(m.PartitionKey, m.ID, m.Offset)
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ids, removed, err := churn(t, c, 300, []string{"a", "b", "c", "d", "e"}, seen.total)
	if serr := sub.Stop(context.Background()); serr != nil {
		t.Error(serr)
	}
	if err != nil {
		t.Fatal(err)
	}
	seen.check(t, ids, removed)
}

// testRemovalRacesReceivers is the same race with explicit receivers that
// accept the next ready group, drain it and close it.
func testRemovalRacesReceivers(t *testing.T, open Open) {
	_, c := setup(t, open, nil)
	seen := &delivered{count: map[string]int{}, last: map[string]int64{}}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				r, err := c.AcceptNextGroup(ctx, shardq.NextGroupRequest{Tenants: []string{"t"}, Topic: "x", ConsumerGroup: "g"}, &shardq.ReceiverOptions{Wait: 50 * time.Millisecond, PollInterval: 5 * time.Millisecond})
				if err != nil {
					if !errors.Is(err, shardq.ErrAcceptTimeout) && !errors.Is(err, shardq.ErrNoReadyGroup) && ctx.Err() == nil {
						t.Error(err)
					}
					continue
				}
				for {
					rctx, rcancel := context.WithTimeout(ctx, 20*time.Millisecond)
					m, err := r.Receive(rctx)
					rcancel()
					if err != nil {
						break
					}
					seen.add(m.PartitionKey, m.ID, m.Offset)
					if err := r.Ack(ctx, m); err != nil {
						if ctx.Err() == nil { // not the test ending
							t.Error(err)
						}
						break
					}
				}
				if err := r.Stop(context.WithoutCancel(ctx)); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	ids, removed, err := churn(t, c, 200, []string{"a", "b", "c", "d"}, seen.total)
	cancel()
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	seen.check(t, ids, removed)
}

// A tenant's deletion: a preview changes nothing; a live member refuses
// it; a delete stopped midway and run again leaves none of the tenant's
// rows in any table, and another tenant's rows as they were.
func testDeleteTenant(t *testing.T, open Open) {
	d, c := setup(t, open, nil)
	ctx := context.Background()
	for _, tenant := range []string{"t", "u"} {
		publishSpread(t, c, tenant, "x", 4, 40)
		mustPublish(t, c, shardq.Message{Tenant: tenant, Topic: "x", ID: "ungrouped-" + tenant})
	}
	rec := newRecorder()
	cfg := fastConfig("g", "x", []string{"t", "u"}, rec.handle)
	s, err := c.Subscribe(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer stopAll(t, s)
	waitFor(t, "both tenants consumed", 30*time.Second, func() bool { return rec.total.Load() == 82 })
	// A cursor is committed after its handler returns: the previews below
	// count rows, so they wait until no cursor is left to move.
	waitFor(t, "every cursor committed", 30*time.Second, func() bool {
		work, err := d.PartitionsWithWork(ctx, driver.GroupScope{Tenants: []string{"t", "u"}, Topic: "x", ConsumerGroup: "g"})
		if err != nil {
			t.Fatal(err)
		}
		return len(work) == 0
	})
	r, err := c.AcceptGroup(ctx, shardq.GroupRef{Tenant: "t", Topic: "y", ConsumerGroup: "g"}, "k", receiverOpts("r"))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.SetState(ctx, []byte("state")); err != nil {
		t.Fatal(err)
	}
	closeReceiver(t, r)

	counts := func(tenant string) map[string]int64 {
		t.Helper()
		rows, err := c.Admin().DeleteTenant(ctx, tenant, shardq.DeleteTenantOptions{})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]int64{}
		for _, r := range rows {
			out[r.Table] = r.Rows
		}
		return out
	}
	before, other := counts("t"), counts("u")
	for _, table := range []string{"queue_messages", "queue_partitions", "queue_offsets", "queue_partition_leases",
		"queue_subscriber_heartbeats", "queue_consumer_groups", "queue_group_state"} {
		if before[table] == 0 || table != "queue_group_state" && other[table] == 0 {
			t.Fatalf("%s: tenant t has %d rows, u %d; the test needs some of each", table, before[table], other[table])
		}
	}
	if again := counts("t"); !maps.Equal(again, before) {
		t.Fatalf("a preview changed the counts: %v, then %v", before, again)
	}
	_, err = c.Admin().DeleteTenant(ctx, "t", shardq.DeleteTenantOptions{Apply: true})
	var live *shardq.TenantLiveError
	if !errors.Is(err, shardq.ErrTenantLive) || !errors.As(err, &live) || len(live.Members) == 0 {
		t.Fatalf("deleting a tenant with a running member: %v, want ErrTenantLive naming it", err)
	}
	stopAll(t, s)
	// A suspension is the tenant's too: it goes with the rest.
	if err := c.Admin().SuspendTenant(ctx, "t"); err != nil {
		t.Fatal(err)
	}

	// A delete that stopped after two batches, then run again.
	sum := func(m map[string]int64) (n int64) {
		for _, v := range m {
			n += v
		}
		return n
	}
	stopped := sum(counts("t"))
	for range 2 {
		if _, n, err := d.DeleteTenantBatch(ctx, "t", 1); err != nil || n != 1 {
			t.Fatalf("one batch: %d rows, %v", n, err)
		}
	}
	if left := sum(counts("t")); left != stopped-2 {
		t.Fatalf("%d rows after two batches of one, from %d", left, stopped)
	}
	other = counts("u") // as the stopped member left them
	var progress int64
	deleted, err := c.Admin().WithProgress(func(n int64) { progress += n }).DeleteTenant(ctx, "t", shardq.DeleteTenantOptions{Apply: true, BatchSize: 7})
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, r := range deleted {
		total += r.Rows
	}
	if total != stopped-2 || progress != total {
		t.Fatalf("deleted %d rows (progress %d) in %v; want the %d left", total, progress, deleted, stopped-2)
	}
	for table, n := range counts("t") {
		if n != 0 {
			t.Errorf("%s keeps %d rows of the deleted tenant", table, n)
		}
	}
	if after := counts("u"); !maps.Equal(after, other) {
		t.Fatalf("the other tenant's rows changed: %v, then %v", other, after)
	}
	// The tenant starts anew, not suspended.
	mustPublish(t, c, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "again"})
	if msgs := fetchAll(t, d, "t", "x", "k"); len(msgs) != 1 || msgs[0].ID != "again" {
		t.Fatalf("after the delete, tenant t's partition holds %v", msgs)
	}
}
