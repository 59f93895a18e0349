// SPDX-License-Identifier: Apache-2.0

package conformance

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/testdb"
)

var groupTests = []conformanceTest{
	{"AcceptGroupIsExclusiveAndContinuesInOrder", testAcceptGroupIsExclusive},
	{"AcceptGroupWaits", testAcceptGroupWaits},
	{"ReceiverAndSubscriberNeverShareAGroup", testReceiverAndSubscriberNeverShare},
	{"AcceptNextGroupTakesOldestReadyFreeGroup", testAcceptNextGroup},
	{"ReceiverIdleRelease", testReceiverIdleRelease},
	{"GroupStateAcrossOwnersAndFenced", testGroupState},
	{"ReceiverNoDeliveryAfterExpiry", testReceiverNoDeliveryAfterExpiry},
	{"LapsedClaimNotDelivered", testLapsedClaimNotDelivered},
	{"ReceiverNackRetriesThenDeadLetters", testReceiverNackRetriesThenDeadLetters},
	{"UngroupedCompetingConsumers", testUngroupedCompetingConsumers},
	{"UngroupedRedeliveredOnlyAfterVisibilityTimeout", testUngroupedVisibility},
	{"UngroupedClaimRenewedWhileHandled", testUngroupedRenewal},
	{"UngroupedRetriesThenDeadLetters", testUngroupedDeadLetters},
	{"UngroupedOutlivingItsClaimDeadLetters", testUngroupedOutlivingDeadLetters},
	{"UngroupedLapsedInQueueUncounted", testUngroupedLapsedInQueueUncounted},
	{"UngroupedReplayAfterOffsetReset", testUngroupedReplay},
	{"UngroupedTenantBacklogLeavesRoom", testUngroupedTenantBacklogLeavesRoom},
	{"UngroupedStopGivesBackUncounted", testUngroupedStopGivesBack},
	{"UngroupedRetryDueBeforePoll", testUngroupedRetryDueBeforePoll},
	{"MixedSubscribers", testMixedSubscribers},
}

// receiverOpts are test-sized receiver options.
func receiverOpts(name string) *shardq.ReceiverOptions {
	return &shardq.ReceiverOptions{Name: name, PollInterval: 10 * time.Millisecond, BackoffMin: time.Millisecond, BackoffMax: 5 * time.Millisecond}
}

func publishGroup(t *testing.T, c *shardq.Client, key string, ids ...string) {
	t.Helper()
	msgs := make([]shardq.Message, len(ids))
	for i, id := range ids {
		msgs[i] = shardq.Message{Tenant: "t", Topic: "x", PartitionKey: key, ID: id}
	}
	mustPublish(t, c, msgs...)
}

// receiveAck receives n messages, acks each, and returns their ids.
func receiveAck(t *testing.T, r *shardq.GroupReceiver, n int) []string {
	t.Helper()
	var ids []string
	for range n {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		d, err := r.Receive(ctx)
		cancel()
		if err != nil {
			t.Fatalf("receive after %v: %v", ids, err)
		}
		if err := r.Ack(context.Background(), d); err != nil {
			t.Fatalf("ack %s: %v", d.ID, err)
		}
		ids = append(ids, d.ID)
	}
	return ids
}

func closeReceiver(t *testing.T, r *shardq.GroupReceiver) {
	t.Helper()
	if err := r.Stop(context.Background()); err != nil {
		t.Errorf("close: %v", err)
	}
}

// N receivers race for one group: exactly one wins, the others are told
// who holds it; the next owner continues from the committed cursor.
func testAcceptGroupIsExclusive(t *testing.T, open Open) {
	_, c := setup(t, open, nil)
	publishGroup(t, c, "k", "m1", "m2", "m3", "m4", "m5", "m6")
	const racers = 6
	var wg sync.WaitGroup
	won := make(chan *shardq.GroupReceiver, racers)
	owned := make(chan *shardq.GroupOwnedError, racers)
	for i := range racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := c.AcceptGroup(context.Background(), shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, "k", receiverOpts(fmt.Sprintf("r%d", i)))
			var goe *shardq.GroupOwnedError
			switch {
			case err == nil:
				won <- r
			case errors.As(err, &goe) && errors.Is(err, shardq.ErrGroupOwned):
				owned <- goe
			default:
				t.Errorf("racer %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	close(won)
	close(owned)
	if len(won) != 1 || len(owned) != racers-1 {
		t.Fatalf("%d receivers won and %d were refused; want 1 and %d", len(won), len(owned), racers-1)
	}
	r := <-won
	for e := range owned {
		if e.Owner != r.ID() || e.PartitionKey != "k" {
			t.Fatalf("refusal names %q on %q; the holder is %q", e.Owner, e.PartitionKey, r.ID())
		}
	}
	if got := receiveAck(t, r, 3); fmt.Sprint(got) != "[m1 m2 m3]" {
		t.Fatalf("first owner received %v", got)
	}
	d, err := r.Receive(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Receive(context.Background()); !errors.Is(err, shardq.ErrUnsettled) {
		t.Fatalf("receive with %s unsettled: %v, want ErrUnsettled", d.ID, err)
	}
	closeReceiver(t, r) // m4 unsettled: the next owner gets it again
	next, err := c.AcceptGroup(context.Background(), shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, "k", receiverOpts("next"))
	if err != nil {
		t.Fatal(err)
	}
	defer closeReceiver(t, next)
	if got := receiveAck(t, next, 3); fmt.Sprint(got) != "[m4 m5 m6]" {
		t.Fatalf("next owner received %v, want [m4 m5 m6]", got)
	}
}

func testAcceptGroupWaits(t *testing.T, open Open) {
	d, c := setup(t, open, nil)
	publishGroup(t, c, "k", "m1")
	holder, err := c.AcceptGroup(context.Background(), shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, "k", receiverOpts("holder"))
	if err != nil {
		t.Fatal(err)
	}
	o := receiverOpts("waiter")
	o.Wait = 300 * time.Millisecond
	start := time.Now()
	_, err = c.AcceptGroup(context.Background(), shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, "k", o)
	if !errors.Is(err, shardq.ErrAcceptTimeout) || !errors.Is(err, shardq.ErrGroupOwned) {
		t.Fatalf("accept of a held group with a wait: %v, want ErrAcceptTimeout wrapping ErrGroupOwned", err)
	}
	if waited := time.Since(start); waited < o.Wait {
		t.Fatalf("gave up after %s, before the %s wait", waited, o.Wait)
	}
	// The holder lets go while the waiter waits: the waiter gets the group.
	go func() {
		time.Sleep(200 * time.Millisecond)
		closeReceiver(t, holder)
	}()
	o.Wait = 30 * time.Second
	waiter, err := c.AcceptGroup(context.Background(), shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, "k", o)
	if err != nil {
		t.Fatalf("accept with a wait while the holder closes: %v", err)
	}
	if got := receiveAck(t, waiter, 1); got[0] != "m1" {
		t.Fatalf("received %v", got)
	}
	closeReceiver(t, waiter)

	// RequireReady: nothing is ready in k now; the lease is not kept.
	o = receiverOpts("picky")
	o.RequireReady = true
	if _, err := c.AcceptGroup(context.Background(), shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, "k", o); !errors.Is(err, shardq.ErrNoReadyGroup) {
		t.Fatalf("RequireReady on a drained group: %v, want ErrNoReadyGroup", err)
	}
	for _, l := range leaseRows(t, d) {
		if l.Owner != "" {
			t.Fatalf("lease left held by %q", l.Owner)
		}
	}
	if _, err := c.AcceptGroup(context.Background(), shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, "", o); !errors.Is(err, shardq.ErrInvalid) {
		t.Fatalf("accepting the ungrouped partition: %v, want ErrInvalid", err)
	}
}

func leaseRows(t *testing.T, d driver.Driver) []driver.Lease {
	t.Helper()
	ls, err := d.ListLeases(context.Background(), driver.GroupScope{Tenants: []string{"t"}, Topic: "x", ConsumerGroup: "g"})
	if err != nil {
		t.Fatal(err)
	}
	return ls
}

// A receiver's lease is never swept by subscribers (it has no heartbeat
// row) and its group is never delivered by them while it is open; a
// subscriber's group is refused to a receiver.
func testReceiverAndSubscriberNeverShare(t *testing.T, open Open) {
	d, c := setup(t, open, nil)
	r, err := c.AcceptGroup(context.Background(), shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, "mine", receiverOpts("receiver"))
	if err != nil {
		t.Fatal(err)
	}
	publishGroup(t, c, "mine", "r1", "r2")
	publishGroup(t, c, "theirs", "s1")
	var mu sync.Mutex
	got := map[string]bool{}
	block := make(chan struct{})
	s, err := c.Subscribe(context.Background(), fastConfig("g", "x", []string{"t"}, func(ctx context.Context, dl *shardq.Delivery) error {
		mu.Lock()
		got[dl.ID] = true
		mu.Unlock()
		if dl.ID == "s1" {
			select { // hold "theirs" while the receiver asks for it
			case <-block:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer stopAll(t, s)
	waitFor(t, "s1 delivered", 20*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return got["s1"] })
	_, err = c.AcceptGroup(context.Background(), shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, "theirs", receiverOpts("late"))
	var goe *shardq.GroupOwnedError
	if !errors.As(err, &goe) || goe.Owner != s.ID() {
		t.Fatalf("accepting a subscriber's group: %v, want GroupOwnedError naming %q", err, s.ID())
	}
	close(block)
	time.Sleep(500 * time.Millisecond) // ten discovery ticks
	mu.Lock()
	if got["r1"] || got["r2"] {
		t.Fatalf("the subscriber delivered the receiver's group: %v", got)
	}
	mu.Unlock()
	for _, l := range leaseRows(t, d) {
		if l.PartitionKey == "mine" && l.Owner != r.ID() {
			t.Fatalf("the receiver's lease is now %q's", l.Owner)
		}
	}
	if ids := receiveAck(t, r, 1); ids[0] != "r1" {
		t.Fatalf("receiver got %v", ids)
	}
	closeReceiver(t, r) // the subscriber takes the group over from the cursor
	waitFor(t, "r2 delivered by the subscriber", 20*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return got["r2"] })
	mu.Lock()
	defer mu.Unlock()
	if got["r1"] {
		t.Fatal("r1, acked by the receiver, was delivered again")
	}
}

func testAcceptNextGroup(t *testing.T, open Open) {
	_, c := setup(t, open, nil)
	ctx := context.Background()
	publishGroup(t, c, "owned", "o1")
	publishGroup(t, c, "retrying", "x1")
	publishGroup(t, c, "drained", "d1")
	publishGroup(t, c, "old", "a1", "a2")
	publishGroup(t, c, "new", "b1")
	owner, err := c.AcceptGroup(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, "owned", receiverOpts("owner"))
	if err != nil {
		t.Fatal(err)
	}
	defer closeReceiver(t, owner)
	r, err := c.AcceptGroup(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, "retrying", receiverOpts("r"))
	if err != nil {
		t.Fatal(err)
	}
	dl, err := r.Receive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Nack(ctx, dl, shardq.RetryAfter(time.Hour, errors.New("later"))); err != nil {
		t.Fatal(err)
	}
	closeReceiver(t, r)
	r, err = c.AcceptGroup(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, "drained", receiverOpts("r"))
	if err != nil {
		t.Fatal(err)
	}
	receiveAck(t, r, 1)
	closeReceiver(t, r)

	for _, want := range []string{"old", "new"} {
		next, err := c.AcceptNextGroup(ctx, shardq.NextGroupRequest{Tenants: []string{"t"}, Topic: "x", ConsumerGroup: "g"}, receiverOpts("next-"+want))
		if err != nil {
			t.Fatalf("accept next (want %q): %v", want, err)
		}
		if next.PartitionKey() != want {
			t.Fatalf("accepted %q, want %q (oldest ready free group)", next.PartitionKey(), want)
		}
		defer closeReceiver(t, next)
	}
	if _, err := c.AcceptNextGroup(ctx, shardq.NextGroupRequest{Tenants: []string{"t"}, Topic: "x", ConsumerGroup: "g"}, receiverOpts("none")); !errors.Is(err, shardq.ErrNoReadyGroup) {
		t.Fatalf("accept next with only owned, retrying and drained groups: %v, want ErrNoReadyGroup", err)
	}
	o := receiverOpts("patient")
	o.Wait = 200 * time.Millisecond
	if _, err := c.AcceptNextGroup(ctx, shardq.NextGroupRequest{Tenants: []string{"t"}, Topic: "x", ConsumerGroup: "g"}, o); !errors.Is(err, shardq.ErrAcceptTimeout) {
		t.Fatalf("accept next with a wait and nothing ready: %v, want ErrAcceptTimeout", err)
	}
	// A message arriving during the wait is picked up.
	go func() {
		time.Sleep(100 * time.Millisecond)
		if _, err := c.Publish(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "fresh", ID: "f1"}); err != nil {
			t.Error(err)
		}
	}()
	o.Wait = 30 * time.Second
	fresh, err := c.AcceptNextGroup(ctx, shardq.NextGroupRequest{Tenants: []string{"t"}, Topic: "x", ConsumerGroup: "g"}, o)
	if err != nil || fresh.PartitionKey() != "fresh" {
		t.Fatalf("accept next while a message arrives: %v", err)
	}
	closeReceiver(t, fresh)
}

func testReceiverIdleRelease(t *testing.T, open Open) {
	d, c := setup(t, open, nil)
	publishGroup(t, c, "k", "m1")
	o := receiverOpts("idler")
	o.IdleTimeout = 300 * time.Millisecond
	r, err := c.AcceptGroup(context.Background(), shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, "k", o)
	if err != nil {
		t.Fatal(err)
	}
	receiveAck(t, r, 1)
	waitFor(t, "the idle group's lease released", 20*time.Second, func() bool {
		ls := leaseRows(t, d)
		return len(ls) == 1 && ls[0].Owner == ""
	})
	if _, err := r.Receive(context.Background()); !errors.Is(err, shardq.ErrReceiverClosed) {
		t.Fatalf("receive after idle release: %v, want ErrReceiverClosed", err)
	}
	closeReceiver(t, r)
}

func testGroupState(t *testing.T, open Open) {
	_, c := setup(t, open, nil)
	ctx := context.Background()
	publishGroup(t, c, "k", "m1")
	a, err := c.AcceptGroup(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, "k", receiverOpts("a"))
	if err != nil {
		t.Fatal(err)
	}
	if st, err := a.State(ctx); err != nil || st != nil {
		t.Fatalf("fresh group state %q, %v; want nil", st, err)
	}
	if err := a.SetState(ctx, []byte("step-1")); err != nil {
		t.Fatal(err)
	}
	closeReceiver(t, a)
	b, err := c.AcceptGroup(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, "k", receiverOpts("b"))
	if err != nil {
		t.Fatal(err)
	}
	if st, err := b.State(ctx); err != nil || string(st) != "step-1" {
		t.Fatalf("next owner reads %q, %v; want step-1", st, err)
	}
	if err := b.SetState(ctx, []byte{}); err != nil {
		t.Fatal(err)
	}
	closeReceiver(t, b)

	// A stale owner: its lease expired (by its successor's clock) and the
	// group was taken over; every fenced call refuses it.
	clock := func(at time.Time) func() time.Time { return func() time.Time { return at } }
	so := receiverOpts("stale")
	so.Clock, so.LeaseTTL = clock(t0), time.Minute
	stale, err := c.AcceptGroup(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, "k", so)
	if err != nil {
		t.Fatal(err)
	}
	dl, err := stale.Receive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	no := receiverOpts("new")
	no.Clock = clock(t0.Add(2 * time.Minute))
	fresh, err := c.AcceptGroup(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, "k", no)
	if err != nil {
		t.Fatalf("taking over an expired group: %v", err)
	}
	defer closeReceiver(t, fresh)
	if err := stale.SetState(ctx, []byte("stale write")); !errors.Is(err, shardq.ErrLeaseLost) {
		t.Fatalf("stale SetState: %v, want ErrLeaseLost", err)
	}
	if _, err := stale.State(ctx); !errors.Is(err, shardq.ErrLeaseLost) || !errors.Is(err, shardq.ErrReceiverClosed) {
		t.Fatalf("stale State: %v, want ErrLeaseLost", err)
	}
	if err := stale.Ack(ctx, dl); !errors.Is(err, shardq.ErrLeaseLost) {
		t.Fatalf("stale Ack: %v, want ErrLeaseLost", err)
	}
	closeReceiver(t, stale)
	if st, err := fresh.State(ctx); err != nil || string(st) != "" || st == nil {
		t.Fatalf("state after the stale write %q, %v; want the empty state b set", st, err)
	}
	if ids := receiveAck(t, fresh, 1); ids[0] != "m1" {
		t.Fatalf("new owner received %v; the stale ack must not have moved the cursor", ids)
	}
}

func testReceiverNackRetriesThenDeadLetters(t *testing.T, open Open) {
	d, c := setup(t, open, nil)
	ctx := context.Background()
	publishGroup(t, c, "k", "poison", "next")
	o := receiverOpts("r")
	o.MaxAttempts = 3
	r, err := c.AcceptGroup(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, "k", o)
	if err != nil {
		t.Fatal(err)
	}
	defer closeReceiver(t, r)
	for attempt := 1; attempt <= 3; attempt++ {
		dl, err := r.Receive(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if dl.ID != "poison" || dl.Attempt != attempt {
			t.Fatalf("received %s attempt %d, want poison attempt %d", dl.ID, dl.Attempt, attempt)
		}
		if err := r.Nack(ctx, dl, errors.New("bad input")); err != nil {
			t.Fatal(err)
		}
	}
	if ids := receiveAck(t, r, 1); ids[0] != "next" {
		t.Fatalf("after the poison message: %v", ids)
	}
	dlq, err := d.FetchAfter(ctx, driver.TopicPartition{Tenant: "t", Topic: "x.dlq", PartitionKey: "k"}, 0, 10)
	if err != nil || len(dlq) != 1 || dlq[0].ID != "poison" || dlq[0].Headers[shardq.HeaderDLQAttempts] != "3" ||
		dlq[0].Headers[shardq.HeaderDLQLastError] != "bad input" {
		t.Fatalf("dead-letter topic: %+v, %v", dlq, err)
	}
}

// ungroupedConfig is a competing consumer of ungrouped messages.
func ungroupedConfig(name string, h shardq.Handler) shardq.SubscriberConfig {
	cfg := fastConfig("g", "x", []string{"t"}, h)
	cfg.Name, cfg.Take = name, shardq.TakeUngrouped
	return cfg
}

func testUngroupedCompetingConsumers(t *testing.T, open Open) {
	d, c := setup(t, open, nil)
	const total, consumers = 4_000, 8 // enough for every consumer to compete; CI runs it under -race beside other packages
	var batch []shardq.Message
	for i := range total {
		batch = append(batch, shardq.Message{Tenant: "t", Topic: "x", ID: fmt.Sprintf("u%05d", i)})
		if len(batch) == 500 {
			mustPublish(t, c, batch...)
			batch = batch[:0]
		}
	}
	var mu sync.Mutex
	attempts := map[string][]int{} // per id, the Attempt of each delivery
	offsets := map[string]int64{}
	perConsumer := make([]atomic.Int64, consumers)
	var distinct atomic.Int64
	var subs []*shardq.Subscriber
	logs := &testdb.LogLines{}
	for i := range consumers {
		cfg := ungroupedConfig(fmt.Sprintf("u%d", i), func(_ context.Context, dl *shardq.Delivery) error {
			mu.Lock()
			attempts[dl.ID] = append(attempts[dl.ID], dl.Attempt)
			offsets[dl.ID] = dl.Offset
			if len(attempts[dl.ID]) == 1 {
				distinct.Add(1)
			}
			mu.Unlock()
			perConsumer[i].Add(1)
			return nil
		})
		cfg.Logger = slog.New(logs)
		s, err := c.Subscribe(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		subs = append(subs, s)
	}
	defer func() { stopAll(t, subs...) }() // when a wait below fails
	waitFor(t, "every ungrouped message delivered", 180*time.Second, func() bool { return distinct.Load() == total })
	// The cursor passes everything once it is all done, and the claims go.
	// A claim that lapsed under load (its ack queued past the visibility
	// timeout, 30 s) holds the cursor until its message is claimed and
	// settled again: the wait covers two timeouts.
	waitFor(t, "the ungrouped cursor at the head", 90*time.Second, func() bool {
		ps, err := d.PartitionsWithWork(context.Background(), driver.GroupScope{Tenants: []string{"t"}, Topic: "x", ConsumerGroup: "g"})
		return err == nil && len(ps) == 0
	})
	stopAll(t, subs...)
	subs = nil
	// A message is delivered once, unless the settlement of one of its
	// claims was lost and logged as such (an ack that failed, or came
	// after the visibility timeout on a machine too loaded to commit it
	// in time): then it is delivered again by a later claim, whose
	// attempt is higher. Two deliveries under one attempt are two
	// holders of one claim, never right.
	lost := map[int64]bool{}
	kinds := map[string]int{} // the lost settlements' log lines, by message and error
	for _, line := range logs.All() {
		if !strings.Contains(line, "ungrouped") || !(strings.Contains(line, "delivered again") || strings.Contains(line, "claimed again") ||
			strings.Contains(line, "claim lost")) {
			continue
		}
		kind, rest, _ := strings.Cut(line, " offset=")
		var o int64
		if _, err := fmt.Sscanf(rest, "%d", &o); err != nil {
			t.Errorf("a lost settlement's log line without its offset: %s", line)
			continue
		}
		lost[o] = true
		if _, e, ok := strings.Cut(rest, " err="); ok {
			kind += " err=" + e
		}
		kinds[kind]++
	}
	mu.Lock()
	defer mu.Unlock()
	redelivered := 0
	for id, as := range attempts {
		if len(as) == 1 {
			continue
		}
		redelivered++
		if !lost[offsets[id]] {
			t.Errorf("%s (offset %d) delivered %d times (attempts %v), and no lost settlement of it was logged", id, offsets[id], len(as), as)
		}
		for i := 1; i < len(as); i++ {
			if as[i] <= as[i-1] {
				t.Errorf("%s delivered again at attempt %d after attempt %d (%v): a later claim counts a higher attempt", id, as[i], as[i-1], as)
			}
		}
	}
	busy := 0
	for i := range perConsumer {
		if perConsumer[i].Load() > 0 {
			busy++
		}
	}
	if busy < 2 {
		t.Errorf("only %d of %d consumers handled messages", busy, consumers)
	}
	if len(kinds) > 0 {
		t.Logf("lost settlements logged: %v", kinds)
	}
	t.Logf("per consumer: %v; delivered again after a lost settlement: %d", func() []int64 {
		out := make([]int64, consumers)
		for i := range perConsumer {
			out[i] = perConsumer[i].Load()
		}
		return out
	}(), redelivered)
}

// A claim that outlives its visibility timeout is delivered again, never
// before the timeout (by the members' clock, injected here); the late ack
// is refused.
func testUngroupedVisibility(t *testing.T, open Open) {
	_, c := setup(t, open, nil)
	const visibility = 500 * time.Millisecond
	fake := newFakeClock(t0)
	// Never renewed: the claim lapses at its time.
	attempts := slowUngrouped(t, c, fake, visibility, visibility)
	fake.Advance(visibility - time.Microsecond)
	select {
	case a := <-attempts:
		t.Fatalf("delivered again (attempt %d) before the claim expired", a)
	case <-time.After(300 * time.Millisecond): // thirty polls of both members
	}
	fake.Advance(time.Microsecond)
	wantRedelivered(t, attempts, "the expired claim")
}

// testUngroupedRenewal: a handler that outlives the visibility timeout
// keeps its claim while it runs, renewed up to MaxVisibilityRenewal; past
// that the claim lapses and another member delivers the message again.
// The members share a fake clock; between its steps (each shorter than
// the visibility timeout) the test leaves several renewal periods of real
// time.
func testUngroupedRenewal(t *testing.T, open Open) {
	_, c := setup(t, open, nil)
	const visibility, step = 400 * time.Millisecond, 300 * time.Millisecond
	fake := newFakeClock(t0)
	attempts := slowUngrouped(t, c, fake, visibility, 8*step)
	// Six steps: 1.8 s of the fake clock, four and a half visibility
	// timeouts, all within the renewal bound (2.4 s).
	for range 6 {
		time.Sleep(4 * visibility / 4) // four renewal periods
		fake.Advance(step)
		select {
		case a := <-attempts:
			t.Fatalf("delivered again (attempt %d) while its handler ran and renewed the claim", a)
		default:
		}
	}
	// Past the bound, the claim lapses: the other member delivers it.
	for range 4 {
		time.Sleep(visibility)
		fake.Advance(step)
	}
	wantRedelivered(t, attempts, "the claim held past MaxVisibilityRenewal")
}

// slowUngrouped publishes one ungrouped message and runs two members, a
// and b, on fake's clock with the given visibility timeout and renewal
// bound. The message's first delivery holds its handler until the test
// ends (or its context does). It returns each delivery's attempt, after
// the first one arrived.
func slowUngrouped(t *testing.T, c *shardq.Client, fake *fakeClock, visibility, maxRenewal time.Duration) <-chan int {
	t.Helper()
	mustPublish(t, c, shardq.Message{Tenant: "t", Topic: "x", ID: "slow"})
	attempts := make(chan int, 10)
	release := make(chan struct{})
	var subs []*shardq.Subscriber
	t.Cleanup(func() { close(release); stopAll(t, subs...) })
	for _, name := range []string{"a", "b"} {
		cfg := ungroupedConfig(name, func(ctx context.Context, dl *shardq.Delivery) error {
			attempts <- dl.Attempt
			if dl.Attempt == 1 { // outlive the claim
				select {
				case <-release:
				case <-ctx.Done(): // the claim lapsed
					return ctx.Err()
				}
			}
			return nil
		})
		cfg.VisibilityTimeout, cfg.MaxVisibilityRenewal, cfg.Clock = visibility, maxRenewal, fake.Now
		s, err := c.Subscribe(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		subs = append(subs, s)
	}
	if a := <-attempts; a != 1 {
		t.Fatalf("first delivery is attempt %d", a)
	}
	return attempts
}

// wantRedelivered waits for the message's second delivery, attempt 2.
func wantRedelivered(t *testing.T, attempts <-chan int, what string) {
	t.Helper()
	select {
	case a := <-attempts:
		if a != 2 {
			t.Fatalf("redelivered as attempt %d, want 2", a)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("%s was not delivered again", what)
	}
}

func testUngroupedDeadLetters(t *testing.T, open Open) {
	d, c := setup(t, open, nil)
	mustPublish(t, c, shardq.Message{Tenant: "t", Topic: "x", ID: "poison"})
	var attempts atomic.Int32
	cfg := ungroupedConfig("u", func(_ context.Context, dl *shardq.Delivery) error {
		attempts.Add(1)
		return errors.New("cannot")
	})
	cfg.MaxAttempts = 3
	s, err := c.Subscribe(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer stopAll(t, s)
	waitFor(t, "the poison message dead-lettered", 20*time.Second, func() bool {
		dlq, err := d.FetchAfter(context.Background(), driver.TopicPartition{Tenant: "t", Topic: "x.dlq", PartitionKey: ""}, 0, 10)
		return err == nil && len(dlq) == 1 && dlq[0].ID == "poison" && dlq[0].Headers[shardq.HeaderDLQAttempts] == "3"
	})
	if n := attempts.Load(); n != 3 {
		t.Fatalf("%d attempts, want 3", n)
	}
}

// testUngroupedOutlivingDeadLetters: a handler that always outlives its
// claim is cancelled before the claim lapses each time, records no retry
// for it, and is dead-lettered at its last attempt, not delivered for
// ever. Under load the last attempt's dead letter may miss its claim (the
// handler is cancelled a tenth of the visibility before the lapse): the
// next claim, past MaxAttempts, dead-letters it then.
func testUngroupedOutlivingDeadLetters(t *testing.T, open Open) {
	d, c := setup(t, open, nil)
	mustPublish(t, c, shardq.Message{Tenant: "t", Topic: "x", ID: "endless"})
	var attempts atomic.Int32
	cfg := ungroupedConfig("u", func(ctx context.Context, dl *shardq.Delivery) error {
		attempts.Add(1)
		<-ctx.Done()
		return ctx.Err()
	})
	cfg.MaxAttempts, cfg.HandlerTimeout = 2, time.Minute
	cfg.VisibilityTimeout, cfg.MaxVisibilityRenewal = time.Second, time.Second // never renewed
	s, err := c.Subscribe(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer stopAll(t, s)
	var header string
	waitFor(t, "the message that outlives its claim dead-lettered", 30*time.Second, func() bool {
		dlq, err := d.FetchAfter(context.Background(), driver.TopicPartition{Tenant: "t", Topic: "x.dlq", PartitionKey: ""}, 0, 10)
		if err != nil || len(dlq) != 1 || dlq[0].ID != "endless" {
			return false
		}
		header = dlq[0].Headers[shardq.HeaderDLQAttempts]
		return true
	})
	if n := attempts.Load(); header != fmt.Sprint(n) || n != 2 && n != 3 {
		t.Fatalf("dead-lettered after %d attempts (header %q), want 2, or 3 when the last one's dead letter missed its claim", n, header)
	}
}

// testUngroupedLapsedInQueueUncounted: claims that lapse in a member's
// local queue, behind a handler that holds the only slot, were never
// delivered: they come again as first attempts, not as retries.
func testUngroupedLapsedInQueueUncounted(t *testing.T, open Open) {
	_, c := setup(t, open, nil)
	for i := range 4 {
		mustPublish(t, c, shardq.Message{Tenant: "t", Topic: "x", ID: fmt.Sprintf("q%d", i)})
	}
	var mu sync.Mutex
	first := map[string]int{} // id -> the attempt of its first delivery
	var blocked atomic.Bool
	cfg := ungroupedConfig("u", func(ctx context.Context, dl *shardq.Delivery) error {
		mu.Lock()
		if _, ok := first[dl.ID]; !ok {
			first[dl.ID] = dl.Attempt
		}
		mu.Unlock()
		if blocked.CompareAndSwap(false, true) {
			<-ctx.Done() // outlives its claim: the queued ones lapse meanwhile
			return ctx.Err()
		}
		return nil
	})
	cfg.UngroupedConcurrency, cfg.MaxAttempts, cfg.HandlerTimeout = 1, 5, time.Minute
	cfg.VisibilityTimeout, cfg.MaxVisibilityRenewal = 500*time.Millisecond, 500*time.Millisecond // never renewed
	s, err := c.Subscribe(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer stopAll(t, s)
	waitFor(t, "every message delivered", 30*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(first) == 4
	})
	mu.Lock()
	defer mu.Unlock()
	for id, attempt := range first {
		if attempt != 1 {
			t.Errorf("%s: first delivered as attempt %d, want 1 (a claim that lapsed undelivered counted)", id, attempt)
		}
	}
}

// Grouped-only, ungrouped-only and both: each takes only its kind, grouped
// messages stay in order, everything is delivered.
func testMixedSubscribers(t *testing.T, open Open) {
	_, c := setup(t, open, nil)
	var batch []shardq.Message
	for i := range 200 {
		batch = append(batch, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: fmt.Sprintf("k%d", i%4), ID: fmt.Sprintf("g%03d", i)},
			shardq.Message{Tenant: "t", Topic: "x", ID: fmt.Sprintf("u%03d", i)})
	}
	mustPublish(t, c, batch...)
	rec := newRecorder()
	var mu sync.Mutex
	got := map[string]bool{}
	var errs []string
	handler := func(take shardq.Take) shardq.Handler {
		return func(ctx context.Context, dl *shardq.Delivery) error {
			grouped := dl.PartitionKey != ""
			mu.Lock()
			if (take == shardq.TakeGrouped && !grouped) || (take == shardq.TakeUngrouped && grouped) {
				errs = append(errs, fmt.Sprintf("member taking %d got %s", take, dl.ID))
			}
			got[dl.ID] = true
			mu.Unlock()
			if grouped {
				return rec.handle(ctx, dl)
			}
			return nil
		}
	}
	var subs []*shardq.Subscriber
	for i, take := range []shardq.Take{shardq.TakeGrouped, shardq.TakeUngrouped, shardq.TakeAll} {
		cfg := fastConfig("g", "x", []string{"t"}, handler(take))
		cfg.Name, cfg.Take = fmt.Sprintf("m%d", i), take
		s, err := c.Subscribe(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		subs = append(subs, s)
	}
	defer func() { stopAll(t, subs...) }() // when the wait fails
	waitFor(t, "all 400 messages", 60*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(got) == 400 })
	stopAll(t, subs...)
	subs = nil
	rec.check(t)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
}

// Resetting the ungrouped cursor delivers the messages again: the claims
// above the new cursor go with it.
func testUngroupedReplay(t *testing.T, open Open) {
	d, c := setup(t, open, nil)
	ctx := context.Background()
	mustPublish(t, c, shardq.Message{Tenant: "t", Topic: "x", ID: "u1"}, shardq.Message{Tenant: "t", Topic: "x", ID: "u2"})
	consume := func() int64 {
		var n atomic.Int64
		s, err := c.Subscribe(ctx, ungroupedConfig("u", func(context.Context, *shardq.Delivery) error { n.Add(1); return nil }))
		if err != nil {
			t.Fatal(err)
		}
		defer stopAll(t, s)
		waitFor(t, "both delivered and passed", 20*time.Second, func() bool {
			ps, err := d.PartitionsWithWork(ctx, driver.GroupScope{Tenants: []string{"t"}, Topic: "x", ConsumerGroup: "g"})
			return n.Load() >= 2 && err == nil && len(ps) == 0
		})
		return n.Load()
	}
	if n := consume(); n != 2 {
		t.Fatalf("first pass delivered %d", n)
	}
	if err := d.ResetOffset(ctx, driver.PartitionRef{Tenant: "t", Topic: "x", PartitionKey: "", ConsumerGroup: "g"}, 0); err != nil {
		t.Fatal(err)
	}
	if n := consume(); n != 2 {
		t.Fatalf("after the reset %d delivered, want both again", n)
	}
}

// A tenant's backlog of ungrouped messages does not stand before another
// tenant's message in a member's local queue: the woken tenant claims at
// once, and the handlers take the tenants' claims in turn. Without that,
// the other tenant's message waits behind the hundreds of claims that the
// member prefetched for a fast handler.
func testUngroupedTenantBacklogLeavesRoom(t *testing.T, open Open) {
	_, c := setup(t, open, nil)
	var batch []shardq.Message
	for i := range 3000 {
		batch = append(batch, shardq.Message{Tenant: "a", Topic: "x", ID: fmt.Sprintf("a%05d", i)})
		if len(batch) == 500 {
			mustPublish(t, c, batch...)
			batch = batch[:0]
		}
	}
	var handledA atomic.Int64
	atB := make(chan int64, 1)
	cfg := ungroupedConfig("u", func(ctx context.Context, dl *shardq.Delivery) error {
		if dl.Tenant == "b" {
			select {
			case atB <- handledA.Load():
			default: // delivered again: the first delivery counts
			}
			return nil
		}
		handledA.Add(1)
		time.Sleep(5 * time.Millisecond)
		return nil
	})
	cfg.Tenants, cfg.UngroupedConcurrency = []string{"a", "b"}, 1
	s, err := c.Subscribe(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer stopAll(t, s)
	// Past a second of handling the member prefetches for the handler's
	// rate: hundreds of tenant a's claims queued.
	waitFor(t, "tenant a's backlog handled for a while", 60*time.Second, func() bool { return handledA.Load() >= 300 })
	before := handledA.Load()
	mustPublish(t, c, shardq.Message{Tenant: "b", Topic: "x", ID: "b1"})
	select {
	case at := <-atB:
		if between := at - before; between > 100 {
			t.Fatalf("tenant b's message waited for %d of tenant a's (the local queue served a's backlog first)", between)
		} else {
			t.Logf("tenant b's message after %d of tenant a's", between)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("tenant b's message not delivered within 60 s")
	}
}

// A stop that cancels a handler (a hard stop) is not the message's
// failure: the claims in hand and in the member's queue are given back
// visible at once, their attempts uncounted, and the next member gets
// them as first deliveries at once, not after the visibility timeout.
func testUngroupedStopGivesBack(t *testing.T, open Open) {
	_, c := setup(t, open, nil)
	mustPublish(t, c, shardq.Message{Tenant: "t", Topic: "x", ID: "u0"}, shardq.Message{Tenant: "t", Topic: "x", ID: "u1"},
		shardq.Message{Tenant: "t", Topic: "x", ID: "u2"})
	g := newGate()
	defer g.open()
	cfg := ungroupedConfig("stopped", func(ctx context.Context, _ *shardq.Delivery) error { return g.hold(ctx) })
	cfg.UngroupedConcurrency, cfg.VisibilityTimeout = 1, time.Hour
	s, err := c.Subscribe(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	g.waitHeld(t, "the first message")
	hard, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Stop(hard); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	got := map[string]int{}
	next := ungroupedConfig("next", func(_ context.Context, d *shardq.Delivery) error {
		mu.Lock()
		got[d.ID] = d.Attempt
		mu.Unlock()
		return nil
	})
	next.VisibilityTimeout = time.Hour // a claim left to lapse would never come back in this test
	s2, err := c.Subscribe(context.Background(), next)
	if err != nil {
		t.Fatal(err)
	}
	defer stopAll(t, s2)
	waitFor(t, "all three delivered to the next member", 20*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) == 3
	})
	mu.Lock()
	defer mu.Unlock()
	for id, attempt := range got {
		if attempt != 1 {
			t.Errorf("%s delivered as attempt %d after a stop gave it back; want 1 (deliveries %v)", id, attempt, got)
		}
	}
}

// A retry due before the member's next poll is claimed when due: nothing
// else (no feed) announces it.
func testUngroupedRetryDueBeforePoll(t *testing.T, open Open) {
	_, c := setup(t, open, nil)
	mustPublish(t, c, shardq.Message{Tenant: "t", Topic: "x", ID: "u0"})
	attempts := make(chan int, 2)
	cfg := ungroupedConfig("retrier", func(_ context.Context, d *shardq.Delivery) error {
		attempts <- d.Attempt
		if d.Attempt == 1 {
			return shardq.RetryAfter(300*time.Millisecond, errors.New("nack")) // past the rereads after a wake-up (about 60 ms)
		}
		return nil
	})
	cfg.PollInterval, cfg.FeedPollInterval = time.Hour, time.Hour
	s, err := c.Subscribe(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer stopAll(t, s)
	for want := 1; want <= 2; want++ {
		select {
		case got := <-attempts:
			if got != want {
				t.Fatalf("delivery as attempt %d, want %d", got, want)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("attempt %d not delivered: a retry waited for the hourly poll", want)
		}
	}
}

// A receiver never hands out a message once its lease may have expired by
// its own clock: after a pause past the lease's expiry (renewal never ran),
// the message in hand can still be acked under its untaken token, but the
// next Receive fails with ErrLeaseLost, and the group's next owner gets
// the rest.
func testReceiverNoDeliveryAfterExpiry(t *testing.T, open Open) {
	_, c := setup(t, open, nil)
	ctx := context.Background()
	publishGroup(t, c, "k", "m0", "m1")
	clock := newFakeClock(time.Now())
	o := receiverOpts("frozen")
	o.Clock = clock.Now
	o.LeaseTTL, o.IdleTimeout = 30*time.Second, time.Hour // keepAlive's ticker (10 s) never fires here
	r, err := c.AcceptGroup(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, "k", o)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop(ctx)
	d0, err := r.Receive(ctx)
	if err != nil || d0.ID != "m0" {
		t.Fatalf("receive = %+v, %v", d0, err)
	}
	clock.Advance(2 * o.LeaseTTL)
	if err := r.Ack(ctx, d0); err != nil {
		t.Fatalf("ack under the expired, untaken lease: %v", err)
	}
	if d1, err := r.Receive(ctx); !errors.Is(err, shardq.ErrLeaseLost) || !errors.Is(err, shardq.ErrReceiverClosed) {
		t.Fatalf("receive after expiry = %+v, %v; want ErrReceiverClosed and ErrLeaseLost", d1, err)
	}
	ho := receiverOpts("heir")
	ho.Clock = o.Clock // the clock both share says the lease has expired
	heir, err := c.AcceptGroup(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, "k", ho)
	if err != nil {
		t.Fatal(err)
	}
	defer heir.Stop(ctx)
	if d1, err := heir.Receive(ctx); err != nil || d1.ID != "m1" {
		t.Fatalf("heir receives %+v, %v; want m1", d1, err)
	}
}

// A claim of an ungrouped message that lapsed while it waited in the
// member's queue (its visibility timeout passed by the member's clock) is
// never handed out: the message is delivered under its next claim (a new
// token), as a first attempt, since no handler saw the lapsed one.
func testLapsedClaimNotDelivered(t *testing.T, open Open) {
	d, c := setup(t, open, nil)
	clock := newFakeClock(time.Now())
	mustPublish(t, c, shardq.Message{Tenant: "t", Topic: "x", ID: "u0"}, shardq.Message{Tenant: "t", Topic: "x", ID: "u1"})
	token := func(offset int64) (tok int64) {
		if err := d.DB().QueryRow("SELECT token FROM queue_message_claims WHERE tenant = 't' AND message_offset = ?", offset).Scan(&tok); err != nil {
			t.Errorf("claim token of offset %d: %v", offset, err)
		}
		return tok
	}
	var mu sync.Mutex
	var got []string
	var u1Token int64 // the token u1 was delivered under
	g := newGate()
	cfg := fastConfig("g", "x", []string{"t"}, func(ctx context.Context, dl *shardq.Delivery) error {
		mu.Lock()
		got = append(got, fmt.Sprintf("%s@%d", dl.ID, dl.Attempt))
		first := len(got) == 1
		if dl.ID == "u1" && u1Token == 0 {
			u1Token = token(dl.Offset)
		}
		mu.Unlock()
		if first {
			// Held past its claim's cancellation: the only slot stays
			// busy, so nothing is popped until the gate opens.
			return g.hold(context.Background())
		}
		return nil
	})
	cfg.Take, cfg.UngroupedConcurrency, cfg.VisibilityTimeout, cfg.Clock = shardq.TakeUngrouped, 1, 30*time.Second, clock.Now
	s, err := c.Subscribe(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer stopAll(t, s)
	defer g.open() // before the stop, which waits for the held handler
	g.waitHeld(t, "u0")
	// u1 is claimed into the queue behind the busy handler.
	var queuedOffset int64
	waitFor(t, "u1 claimed and queued", 20*time.Second, func() bool {
		var n int
		err := d.DB().QueryRow("SELECT COUNT(*), MAX(message_offset) FROM queue_message_claims WHERE tenant = 't' AND done = 0").Scan(&n, &queuedOffset)
		return err == nil && n == 2
	})
	queuedToken := token(queuedOffset)
	clock.Advance(2 * cfg.VisibilityTimeout) // the queued claim lapses
	// While the only handler is still held, the member claims u1 again:
	// its lapsed claim is given back first, so the attempt is the same.
	waitFor(t, "u1 claimed again", 20*time.Second, func() bool { return token(queuedOffset) != queuedToken })
	var attempts int
	if err := d.DB().QueryRow("SELECT attempts FROM queue_message_claims WHERE tenant = 't' AND message_offset = ?", queuedOffset).Scan(&attempts); err != nil || attempts != 1 {
		t.Fatalf("u1 claimed again as attempt %d (%v), want 1: its lapsed claim, never handed out, counted", attempts, err)
	}
	g.open()
	// u0's claim lapsed too (the clock jumped while its handler ran), so
	// u0 may be delivered again meanwhile; only u1's first delivery counts.
	firstU1 := func() (string, []string, int64) {
		mu.Lock()
		defer mu.Unlock()
		for _, d := range got {
			if strings.HasPrefix(d, "u1@") {
				return d, slices.Clone(got), u1Token
			}
		}
		return "", nil, 0
	}
	waitFor(t, "u1 delivered", 20*time.Second, func() bool { d, _, _ := firstU1(); return d != "" })
	d1, all, tok := firstU1()
	if tok == queuedToken {
		t.Fatalf("u1 delivered under its lapsed claim (token %d; deliveries %v): it must come from its next claim", tok, all)
	}
	if d1 != "u1@1" {
		t.Fatalf("u1 delivered as %s (deliveries %v): the lapsed claim, never handed out, must not count an attempt", d1, all)
	}
}
