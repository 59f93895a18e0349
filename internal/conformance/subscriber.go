// SPDX-License-Identifier: Apache-2.0

package conformance

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
)

var subscriberTests = []conformanceTest{
	{"SubscribersDeliverInOrder", testSubscribersDeliverInOrder},
	{"SubscribersJoinAndLeave", testSubscribersJoinAndLeave},
	{"PoisonMessageGoesToDLQ", testPoisonMessageGoesToDLQ},
	{"HandlerResults", testHandlerResults},
	{"SubscribeValidates", testSubscribeValidates},
	{"BatchHandlerSettlesTogether", testBatchHandlerSettlesTogether},
	{"IdleLeasesAreReleased", testIdleLeasesAreReleased},
	{"FullMemberMakesRoomForWaitingWork", testFullMemberMakesRoomForWaitingWork},
	{"TenantBacklogLeavesRoomForAnother", testTenantBacklogLeavesRoom},
	{"LostLeaseCancelsHandler", testLostLeaseCancelsHandler},
	{"ExpiryCancelsHandler", testExpiryCancelsHandler},
	{"GiveUpCommitsSettled", testGiveUpCommitsSettled},
	{"StaleHeartbeatCancelsHandler", testStaleHeartbeatCancelsHandler},
	{"HardStopCancelsHandlers", testHardStopCancelsHandlers},
	{"OwnLeaseWithoutWorkerIsTakenUp", testOwnLeaseWithoutWorkerIsTakenUp},
	{"OneNameTwoInstances", testOneNameTwoInstances},
	{"StaticMembership", testStaticMembership},
	{"NoDeliveryAfterLeaseExpiry", testNoDeliveryAfterLeaseExpiry},
	{"LocalPublishWakesIdleWorker", testLocalPublishWakesIdleWorker},
	{"MembersStartingTogetherSplitAtOnce", testMembersStartingTogetherSplitAtOnce},
	{"IdlePartitionsShareOneHeadQuery", testIdlePartitionsShareOneHeadQuery},
}

// fastConfig is a subscriber configuration with test-sized intervals. The
// lease TTL and staleness limit stay generous: CI runs packages in
// parallel under the race detector on two cores, where a heartbeat or
// renewal waiting for SQLite's single write connection among dozens of
// committing workers (database/sql serves waiters in random order) was
// seen to wait over 5 s; a member swept as dead then has its partitions
// redelivered. No test here relies on detecting a stale member.
func fastConfig(group, topic string, tenants []string, h shardq.Handler) shardq.SubscriberConfig {
	return shardq.SubscriberConfig{
		ConsumerGroup: group, Topic: topic, Tenants: tenants, Handler: h,
		LeaseTTL: 30 * time.Second, HeartbeatInterval: 100 * time.Millisecond, StaleAfter: 20 * time.Second,
		DiscoveryInterval: 50 * time.Millisecond, PollInterval: 10 * time.Millisecond, IdleRelease: 2 * time.Second,
		BackoffMin: time.Millisecond, BackoffMax: 5 * time.Millisecond,
	}
}

// recorder checks what a consumer group receives: per partition, offsets
// strictly increasing, no message twice, never two handlers at once.
type recorder struct {
	mu       sync.Mutex
	last     map[string]int64
	seen     map[string]bool
	inFlight map[string]*atomic.Int32
	errs     []error
	total    atomic.Int64
}

func newRecorder() *recorder {
	return &recorder{last: map[string]int64{}, seen: map[string]bool{}, inFlight: map[string]*atomic.Int32{}}
}

func (r *recorder) fail(format string, args ...any) {
	r.mu.Lock()
	r.errs = append(r.errs, fmt.Errorf(format, args...))
	r.mu.Unlock()
}

func (r *recorder) handle(_ context.Context, d *shardq.Delivery) error {
	key := d.Tenant + "/" + d.PartitionKey
	r.mu.Lock()
	n := r.inFlight[key]
	if n == nil {
		n = &atomic.Int32{}
		r.inFlight[key] = n
	}
	r.mu.Unlock()
	if n.Add(1) != 1 {
		r.fail("two handlers at once in partition %s", key)
	}
	defer n.Add(-1)
	r.mu.Lock()
	defer r.mu.Unlock()
	if d.Offset <= r.last[key] {
		r.errs = append(r.errs, fmt.Errorf("partition %s: offset %d after %d", key, d.Offset, r.last[key]))
	}
	r.last[key] = d.Offset
	if r.seen[d.ID] {
		r.errs = append(r.errs, fmt.Errorf("message %s delivered twice", d.ID))
	}
	r.seen[d.ID] = true
	r.total.Add(1)
	return nil
}

func (r *recorder) check(t *testing.T) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, err := range r.errs {
		if i == 10 {
			t.Fatalf("... and %d more", len(r.errs)-10)
		}
		t.Error(err)
	}
	if t.Failed() {
		t.FailNow()
	}
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, limit time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", limit, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func publishSpread(t *testing.T, c *shardq.Client, tenant, topic string, partitions, total int) {
	t.Helper()
	var batch []shardq.Message
	for i := range total {
		batch = append(batch, shardq.Message{Tenant: tenant, Topic: topic, PartitionKey: fmt.Sprintf("p%02d", i%partitions),
			ID: fmt.Sprintf("m-%05d", i)})
		if len(batch) == 500 {
			mustPublish(t, c, batch...)
			batch = batch[:0]
		}
	}
	if len(batch) > 0 {
		mustPublish(t, c, batch...)
	}
}

func stopAll(t *testing.T, subs ...*shardq.Subscriber) {
	t.Helper()
	for _, s := range subs {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := s.Stop(ctx); err != nil {
			t.Errorf("stop %s: %v", s.Name(), err)
		}
		cancel()
	}
}

func testSubscribersDeliverInOrder(t *testing.T, open Open) {
	d, c := setup(t, open, nil)
	const total = 10_000
	publishSpread(t, c, "t", "orders", 64, total)
	rec := newRecorder()
	var subs []*shardq.Subscriber
	for i := range 4 {
		cfg := fastConfig("g", "orders", []string{"t"}, rec.handle)
		cfg.Name = fmt.Sprintf("sub-%d", i)
		s, err := c.Subscribe(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		subs = append(subs, s)
	}
	defer stopAll(t, subs...)
	waitFor(t, "all messages", 2*time.Minute, func() bool { return rec.total.Load() >= total })
	waitFor(t, "cursors at the head", 30*time.Second, func() bool {
		ps, err := d.PartitionsWithWork(context.Background(), driver.GroupScope{Tenants: []string{"t"}, Topic: "orders", ConsumerGroup: "g"})
		return err == nil && len(ps) == 0
	})
	rec.check(t)
	if rec.total.Load() != total {
		t.Fatalf("delivered %d, want %d", rec.total.Load(), total)
	}
}

func testSubscribersJoinAndLeave(t *testing.T, open Open) {
	d, c := setup(t, open, nil)
	rec := newRecorder()
	start := func(name string) *shardq.Subscriber {
		cfg := fastConfig("g", "x", []string{"t"}, rec.handle)
		cfg.Name = name
		s, err := c.Subscribe(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	a := start("a")
	stopped := []*shardq.Subscriber{}
	defer func() { stopAll(t, stopped...) }()
	publishSpread(t, c, "t", "x", 16, 1600)
	b, cc, dd := start("b"), start("c"), start("d")
	publishSpreadFrom(t, c, "t", "x", 16, 1600, 1600)
	// Fair share with 4 live subscribers and 16 busy partitions: 4 each.
	waitFor(t, "fair share across 4", 30*time.Second, func() bool {
		publishSpreadFrom(t, c, "t", "x", 16, 3200+int(rec.total.Load()), 16) // keep every partition busy
		return leaseCountsOf(t, d)[a.ID()] == 4 && leaseCountsOf(t, d)[dd.ID()] == 4
	})
	stopAll(t, b, cc)
	publishSpreadFrom(t, c, "t", "x", 16, 100_000, 800)
	stopped = append(stopped, a, dd)
	sent := int64(3200 + 800)
	waitFor(t, "everything after two left", time.Minute, func() bool {
		ps, err := d.PartitionsWithWork(context.Background(), driver.GroupScope{Tenants: []string{"t"}, Topic: "x", ConsumerGroup: "g"})
		return err == nil && len(ps) == 0
	})
	rec.check(t)
	if rec.total.Load() < sent {
		t.Fatalf("delivered %d of at least %d", rec.total.Load(), sent)
	}
}

func publishSpreadFrom(t *testing.T, c *shardq.Client, tenant, topic string, partitions, from, n int) {
	t.Helper()
	var batch []shardq.Message
	for i := from; i < from+n; i++ {
		batch = append(batch, shardq.Message{Tenant: tenant, Topic: topic, PartitionKey: fmt.Sprintf("p%02d", i%partitions),
			ID: fmt.Sprintf("m-%06d", i)})
	}
	mustPublish(t, c, batch...)
}

func testPoisonMessageGoesToDLQ(t *testing.T, open Open) {
	d, c := setup(t, open, nil)
	for i := range 5 {
		mustPublish(t, c, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: fmt.Sprintf("m%d", i),
			Payload: []byte(fmt.Sprint(i)), Headers: map[string]string{"trace": "abc"}})
	}
	var mu sync.Mutex
	var order []string
	attempts := map[int]bool{}
	cfg := fastConfig("g", "x", []string{"t"}, func(_ context.Context, dl *shardq.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		if dl.ID == "m2" {
			attempts[dl.Attempt] = true
			return errors.New("cannot parse m2")
		}
		order = append(order, dl.ID)
		return nil
	})
	cfg.MaxAttempts = 3
	s, err := c.Subscribe(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer stopAll(t, s)
	waitFor(t, "the partition to pass the poison message", 30*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(order) == 4
	})
	mu.Lock()
	if fmt.Sprint(order) != "[m0 m1 m3 m4]" || len(attempts) != 3 || !attempts[1] || !attempts[3] {
		t.Fatalf("delivered %v, attempts of m2 %v; want m0 m1 m3 m4 after attempts 1..3", order, attempts)
	}
	mu.Unlock()
	dlq := fetchAll(t, d, "t", "x.dlq", "k")
	if len(dlq) != 1 || dlq[0].ID != "m2" || string(dlq[0].Payload) != "2" {
		t.Fatalf("dead-letter topic: %+v", dlq)
	}
	h := dlq[0].Headers
	if h[shardq.HeaderDLQOriginalTopic] != "x" || h[shardq.HeaderDLQAttempts] != "3" || h[shardq.HeaderDLQLastError] != "cannot parse m2" ||
		h["trace"] != "abc" || h[shardq.HeaderDLQOriginalOffset] == "" {
		t.Fatalf("dead-letter headers %v", h)
	}
}

func testHandlerResults(t *testing.T, open Open) {
	d, c := setup(t, open, nil)
	mustPublish(t, c, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "now"},
		shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "later"},
		shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "panics"})
	var mu sync.Mutex
	seen := map[string][]int{}
	var retriedAt time.Time
	var firstAt time.Time
	s, err := c.Subscribe(context.Background(), fastConfig("g", "x", []string{"t"}, func(_ context.Context, dl *shardq.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		seen[dl.ID] = append(seen[dl.ID], dl.Attempt)
		switch {
		case dl.ID == "now":
			return shardq.DeadLetter(errors.New("schema v0 is not supported"))
		case dl.ID == "later" && dl.Attempt == 1:
			firstAt = time.Now()
			return shardq.RetryAfter(300*time.Millisecond, errors.New("rate limited"))
		case dl.ID == "later":
			retriedAt = time.Now()
		case dl.ID == "panics" && dl.Attempt == 1:
			panic("handler bug")
		}
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer stopAll(t, s)
	waitFor(t, "all three settled", 30*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen["panics"]) == 2
	})
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(seen["now"]) != "[1]" || fmt.Sprint(seen["later"]) != "[1 2]" || fmt.Sprint(seen["panics"]) != "[1 2]" {
		t.Fatalf("attempts %v", seen)
	}
	if retriedAt.Sub(firstAt) < 300*time.Millisecond {
		t.Fatalf("RetryAfter(300ms) retried after %v", retriedAt.Sub(firstAt))
	}
	if dlq := fetchAll(t, d, "t", "x.dlq", "k"); len(dlq) != 1 || dlq[0].ID != "now" || dlq[0].Headers[shardq.HeaderDLQAttempts] != "1" ||
		dlq[0].Headers[shardq.HeaderDLQLastError] != "schema v0 is not supported" {
		t.Fatalf("dead-letter topic: %+v", dlq)
	}
}

func testSubscribeValidates(t *testing.T, open Open) {
	_, c := setup(t, open, nil)
	h := func(context.Context, *shardq.Delivery) error { return nil }
	t.Setenv("SHARDQ_TENANTS", "")
	for _, tc := range []struct {
		cfg  shardq.SubscriberConfig
		want string
	}{
		{shardq.SubscriberConfig{Topic: "x", Tenants: []string{"t"}, Handler: h}, "consumer group: must not be empty"},
		{shardq.SubscriberConfig{ConsumerGroup: "g", Topic: "x", Handler: h}, "SHARDQ_TENANTS: empty tenant list"},
		{shardq.SubscriberConfig{ConsumerGroup: "g", Topic: "x", Tenants: []string{"t", "t"}, Handler: h}, `tenants: entry 2: tenant "t" appears twice`},
		{shardq.SubscriberConfig{ConsumerGroup: "g", Topic: "x", Tenants: []string{"t"}}, "handler: set exactly one"},
		{shardq.SubscriberConfig{ConsumerGroup: "g", Topic: fmt.Sprintf("%0252d", 0), Tenants: []string{"t"}, Handler: h}, "dead-letter topic"},
	} {
		_, err := c.Subscribe(context.Background(), tc.cfg)
		if !errors.Is(err, shardq.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Subscribe(%+v) = %v, want an ErrInvalid containing %q", tc.cfg, err, tc.want)
		}
	}
	t.Setenv("SHARDQ_TENANTS", " t1 , t2")
	s, err := c.Subscribe(context.Background(), fastConfig("g", "x", nil, h))
	if err != nil {
		t.Fatalf("tenants from SHARDQ_TENANTS: %v", err)
	}
	stopAll(t, s)
}

func testBatchHandlerSettlesTogether(t *testing.T, open Open) {
	d, c := setup(t, open, nil)
	publishSpread(t, c, "t", "x", 1, 25)
	var mu sync.Mutex
	var batches [][]int64
	failed := false
	cfg := fastConfig("g", "x", []string{"t"}, nil)
	cfg.BatchSize = 10
	cfg.BatchHandler = func(_ context.Context, ds []*shardq.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		var offs []int64
		for _, dl := range ds {
			offs = append(offs, dl.Offset)
		}
		if !failed {
			failed = true
			return errors.New("first batch fails once")
		}
		batches = append(batches, offs)
		return nil
	}
	s, err := c.Subscribe(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer stopAll(t, s)
	waitFor(t, "all batches", 30*time.Second, func() bool {
		ps, _ := d.PartitionsWithWork(context.Background(), driver.GroupScope{Tenants: []string{"t"}, Topic: "x", ConsumerGroup: "g"})
		return len(ps) == 0
	})
	mu.Lock()
	defer mu.Unlock()
	var all []int64
	for _, b := range batches {
		if len(b) > 10 {
			t.Fatalf("batch of %d, limit 10", len(b))
		}
		all = append(all, b...)
	}
	if len(all) != 25 || len(batches[0]) != 10 {
		t.Fatalf("batches %v: want the failed first batch redelivered whole, 25 messages in all", batches)
	}
	for i := 1; i < len(all); i++ {
		if all[i] <= all[i-1] {
			t.Fatalf("batches out of order: %v", batches)
		}
	}
}

func testIdleLeasesAreReleased(t *testing.T, open Open) {
	d, c := setup(t, open, nil)
	publishSpread(t, c, "t", "x", 4, 40)
	rec := newRecorder()
	cfg := fastConfig("g", "x", []string{"t"}, rec.handle)
	cfg.IdleRelease = 300 * time.Millisecond
	s, err := c.Subscribe(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer stopAll(t, s)
	waitFor(t, "all messages", 30*time.Second, func() bool { return rec.total.Load() == 40 })
	waitFor(t, "idle leases released", 30*time.Second, func() bool {
		ls, err := d.ListLeases(context.Background(), driver.GroupScope{Tenants: []string{"t"}, Topic: "x", ConsumerGroup: "g"})
		if err != nil || len(ls) != 4 {
			return false
		}
		for _, l := range ls {
			if l.Owner != "" {
				return false
			}
		}
		return true
	})
	// New work is picked up again.
	publishSpreadFrom(t, c, "t", "x", 4, 1000, 4)
	waitFor(t, "new messages after idle release", 30*time.Second, func() bool { return rec.total.Load() == 44 })
	rec.check(t)
}

// testFullMemberMakesRoomForWaitingWork: a member at MaxPartitions whose
// partitions are drained hands them back for partitions that wait, at
// once, not after IdleRelease. Its clock stands still, so idle release
// never comes: without the hand-back, 2 of the 8 partitions would be
// consumed and the rest never.
func testFullMemberMakesRoomForWaitingWork(t *testing.T, open Open) {
	_, c := setup(t, open, nil)
	publishSpread(t, c, "t", "x", 8, 16)
	rec := newRecorder()
	cfg := fastConfig("g", "x", []string{"t"}, rec.handle)
	clock := newFakeClock(time.Now())
	cfg.Clock, cfg.MaxPartitions, cfg.IdleRelease = clock.Now, 2, time.Hour
	s, err := c.Subscribe(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer stopAll(t, s)
	waitFor(t, "every partition consumed by a member holding two at a time", 30*time.Second, func() bool { return rec.total.Load() == 16 })
	rec.check(t)
}

// A tenant whose backlog fills every slot of a member does not keep
// another tenant's new partition waiting: a busy partition of the first is
// handed back (it finishes the message in hand, here held until the end)
// and the second's is delivered meanwhile. The member's slots are shared
// by max-min fairness, not taken first come.
func testTenantBacklogLeavesRoom(t *testing.T, open Open) {
	_, c := setup(t, open, nil)
	publishSpread(t, c, "a", "x", 8, 80)
	g := newGate()
	defer g.open()
	var busyA atomic.Int32
	deliveredB := make(chan string, 1)
	cfg := fastConfig("g", "x", []string{"a", "b"}, func(ctx context.Context, dl *shardq.Delivery) error {
		if dl.Tenant == "b" {
			deliveredB <- dl.ID
			return nil
		}
		busyA.Add(1)
		defer busyA.Add(-1)
		return g.hold(ctx)
	})
	cfg.MaxPartitions, cfg.IdleRelease = 4, time.Hour
	s, err := c.Subscribe(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer stopAll(t, s)
	waitFor(t, "tenant a's backlog in every slot", 30*time.Second, func() bool { return busyA.Load() == 4 })
	mustPublish(t, c, shardq.Message{Tenant: "b", Topic: "x", PartitionKey: "new", ID: "b1"})
	select {
	case id := <-deliveredB:
		if id != "b1" {
			t.Fatalf("tenant b got %s", id)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("tenant b's message waited 30 s behind tenant a's held slots")
	}
	if n := busyA.Load(); n != 4 {
		t.Fatalf("%d of tenant a's handlers in flight; the hand-back must wait for the message in hand", n)
	}
	g.open() // before the deferred stop, which would wait for the held handlers
}

func testLostLeaseCancelsHandler(t *testing.T, open Open) {
	d, c := setup(t, open, nil)
	mustPublish(t, c, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "slow"})
	started := make(chan struct{})
	cancelled := make(chan error, 1)
	cfg := fastConfig("g", "x", []string{"t"}, func(ctx context.Context, dl *shardq.Delivery) error {
		close(started)
		<-ctx.Done()
		cancelled <- ctx.Err()
		return ctx.Err()
	})
	cfg.LeaseTTL = 3 * time.Second // the loss shows at the next renewal, after a third of it
	s, err := c.Subscribe(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer stopAll(t, s)
	<-started
	// Another live member takes the partition (its clock is past the
	// expiry); its heartbeat keeps it from being swept as dead.
	p := driver.PartitionRef{Tenant: "t", ConsumerGroup: "g", Topic: "x", PartitionKey: "k"}
	if err := d.Heartbeat(context.Background(), driver.GroupScope{Tenants: []string{"t"}, Topic: "x", ConsumerGroup: "g"}, "thief", time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	thief, err := d.AcquireLease(context.Background(), driver.AcquireLeaseParams{Partition: p, Owner: "thief", Now: time.Now().Add(time.Hour), TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-cancelled:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("handler context ended with %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the handler's context was not cancelled after its lease was taken")
	}
	// The loser moved nothing: the message is still unacked, the thief's
	// lease untouched.
	if ps, _ := d.PartitionsWithWork(context.Background(), driver.GroupScope{Tenants: []string{"t"}, Topic: "x", ConsumerGroup: "g"}); len(ps) != 1 || ps[0].CommittedOffset != 0 {
		t.Fatalf("work after the loss: %+v", ps)
	}
	ls, _ := d.ListLeases(context.Background(), driver.GroupScope{Tenants: []string{"t"}, Topic: "x", ConsumerGroup: "g"})
	if len(ls) != 1 || ls[0].Owner != "thief" || ls[0].Token != thief.Token {
		t.Fatalf("leases after the loss: %d, first owned by %q with token %d; want thief's with token %d",
			len(ls), ls[0].Owner, ls[0].Token, thief.Token)
	}
}

// renewalsFail is the real database with its renewals of leases and
// claims failing, as when a member's connection to it is cut. It keeps
// the expiry of the last lease acquired or message claimed.
type renewalsFail struct {
	driver.Driver
	expiry *atomic.Int64 // Unix nanoseconds
}

func (r renewalsFail) AcquireLease(ctx context.Context, in driver.AcquireLeaseParams) (driver.Lease, error) {
	l, err := r.Driver.AcquireLease(ctx, in)
	if err == nil {
		r.expiry.Store(l.ExpiresAt.UnixNano())
	}
	return l, err
}

func (r renewalsFail) ClaimMessages(ctx context.Context, in driver.ClaimMessagesParams) ([]driver.Claim, bool, error) {
	cs, truncated, err := r.Driver.ClaimMessages(ctx, in)
	for _, c := range cs {
		r.expiry.Store(c.VisibleUntil.UnixNano())
	}
	return cs, truncated, err
}

var errInjectedUnreachable = errors.New("injected: the database is unreachable")

func (renewalsFail) RenewLeases(context.Context, []driver.Lease, time.Time, time.Duration) ([]driver.Lease, []driver.Lease, error) {
	return nil, nil, errInjectedUnreachable
}

func (renewalsFail) RetryClaim(context.Context, driver.RetryClaimParams) error {
	return errInjectedUnreachable
}

// testExpiryCancelsHandler: a handler ends before its lease (a key) or
// claim (an ungrouped message) expires unrenewed by the member's clock,
// even before the member hears of a loss: from the expiry on another
// member may hold the key or message, and the handler going on would be
// a second holder at once.
func testExpiryCancelsHandler(t *testing.T, open Open) {
	for name, take := range map[string]shardq.Take{"grouped": shardq.TakeGrouped, "ungrouped": shardq.TakeUngrouped} {
		t.Run(name, func(t *testing.T) {
			d, publisher := setup(t, open, nil)
			drv := renewalsFail{d, new(atomic.Int64)}
			c, err := shardq.NewClient(drv, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			key := "k"
			if take == shardq.TakeUngrouped {
				key = ""
			}
			mustPublish(t, publisher, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: key, ID: "slow"})
			type ending struct {
				err error
				at  time.Time
			}
			cancelled := make(chan ending, 1)
			cfg := fastConfig("g", "x", []string{"t"}, func(ctx context.Context, dl *shardq.Delivery) error {
				<-ctx.Done()
				select {
				case cancelled <- ending{ctx.Err(), time.Now()}: // the client's clock
				default:
				}
				return ctx.Err()
			})
			cfg.Take, cfg.HandlerTimeout = take, 10*time.Minute
			cfg.LeaseTTL, cfg.HeartbeatInterval = 3*time.Second, time.Second
			cfg.VisibilityTimeout, cfg.MaxVisibilityRenewal = 3*time.Second, time.Minute
			s, err := c.Subscribe(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer stopAll(t, s)
			select {
			case e := <-cancelled:
				if !errors.Is(e.err, context.Canceled) {
					t.Fatalf("handler context ended with %v", e.err)
				}
				// Another member may take the key or message at the expiry.
				if expiry := time.Unix(0, drv.expiry.Load()); !e.at.Before(expiry) {
					t.Fatalf("the handler was cancelled at %v, not before its lease or claim expired at %v", e.at, expiry)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("the handler ran on 30 s after its 3 s lease or claim expired unrenewed")
			}
		})
	}
}

// batchCommitsFail is renewalsFail with the member's periodic cursor
// commits failing too: a worker's own commit is then all that lands.
type batchCommitsFail struct{ renewalsFail }

func (batchCommitsFail) CommitOffsets(context.Context, []driver.OffsetCommit, time.Time) error {
	return errInjectedUnreachable
}

// testGiveUpCommitsSettled: a worker that gives its lease up before the
// expiry (its renewals fail) commits what its handlers settled, fenced by
// the lease's token: while nobody took the partition the commit lands,
// and the next holder (here the same member, again) starts after it
// instead of delivering the settled messages again.
func testGiveUpCommitsSettled(t *testing.T, open Open) {
	d, publisher := setup(t, open, nil)
	c, err := shardq.NewClient(batchCommitsFail{renewalsFail{d, new(atomic.Int64)}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	mustPublish(t, publisher, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "a"},
		shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "b"})
	var mu sync.Mutex
	var got []string
	again := make(chan struct{})
	cfg := fastConfig("g", "x", []string{"t"}, func(ctx context.Context, dl *shardq.Delivery) error {
		mu.Lock()
		got = append(got, dl.ID)
		if dl.ID == "b" && slices.Contains(got[:len(got)-1], "b") {
			close(again)
		}
		mu.Unlock()
		if dl.ID == "a" {
			return nil
		}
		<-ctx.Done() // b holds the partition until the lease is given up
		return ctx.Err()
	})
	cfg.LeaseTTL, cfg.HeartbeatInterval, cfg.HandlerTimeout = 3*time.Second, time.Second, 10*time.Minute
	s, err := c.Subscribe(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer stopAll(t, s)
	select {
	case <-again:
	case <-time.After(time.Minute):
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("b was not delivered again after the give-up: %v", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"a", "b", "b"}; !slices.Equal(got, want) {
		t.Fatalf("delivered %v, want %v: the give-up dropped a's settled cursor", got, want)
	}
}

// heartbeatsFail is the real database with the member's heartbeats
// failing once failing is set; last is the stamp of the last one written.
type heartbeatsFail struct {
	driver.Driver
	failing *atomic.Bool
	last    *atomic.Int64 // Unix nanoseconds
}

func (h heartbeatsFail) Heartbeat(ctx context.Context, g driver.GroupScope, subscriber string, now time.Time) error {
	if h.failing.Load() {
		return errInjectedUnreachable
	}
	err := h.Driver.Heartbeat(ctx, g, subscriber, now)
	if err == nil {
		h.last.Store(now.UnixNano())
	}
	return err
}

// testStaleHeartbeatCancelsHandler: a member whose heartbeats fail (while
// its lease renewals still succeed) stops its handlers before its
// heartbeat goes stale: from then on the others count it dead and sweep
// its leases, unexpired as they are, and take its keys.
func testStaleHeartbeatCancelsHandler(t *testing.T, open Open) {
	d, publisher := setup(t, open, nil)
	drv := heartbeatsFail{d, new(atomic.Bool), new(atomic.Int64)}
	c, err := shardq.NewClient(drv, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	mustPublish(t, publisher, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "slow"})
	type ending struct {
		err error
		at  time.Time
	}
	cancelled := make(chan ending, 1)
	cfg := fastConfig("g", "x", []string{"t"}, func(ctx context.Context, dl *shardq.Delivery) error {
		drv.failing.Store(true)
		<-ctx.Done()
		select {
		case cancelled <- ending{ctx.Err(), time.Now()}: // the client's clock
		default:
		}
		return ctx.Err()
	})
	cfg.HandlerTimeout, cfg.StaleAfter = 10*time.Minute, time.Second
	s, err := c.Subscribe(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer stopAll(t, s)
	select {
	case e := <-cancelled:
		if !errors.Is(e.err, context.Canceled) {
			t.Fatalf("handler context ended with %v", e.err)
		}
		if stale := time.Unix(0, drv.last.Load()).Add(cfg.StaleAfter); !e.at.Before(stale) {
			t.Fatalf("the handler was cancelled at %v, not before the member's heartbeat went stale at %v", e.at, stale)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the handler ran on 20 s after its member's heartbeat went stale (1 s), its 30 s lease renewed")
	}
}

func testHardStopCancelsHandlers(t *testing.T, open Open) {
	d, c := setup(t, open, nil)
	mustPublish(t, c, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "stuck"})
	started := make(chan struct{})
	s, err := c.Subscribe(context.Background(), fastConfig("g", "x", []string{"t"}, func(ctx context.Context, dl *shardq.Delivery) error {
		close(started)
		<-ctx.Done()
		return ctx.Err()
	}))
	if err != nil {
		t.Fatal(err)
	}
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := s.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if ps, _ := d.PartitionsWithWork(context.Background(), driver.GroupScope{Tenants: []string{"t"}, Topic: "x", ConsumerGroup: "g"}); len(ps) != 1 {
		t.Fatalf("a cancelled handler's message was acked: %+v", ps)
	}
	if ls, _ := d.ListLeases(context.Background(), driver.GroupScope{Tenants: []string{"t"}, Topic: "x", ConsumerGroup: "g"}); len(ls) != 1 || ls[0].Owner != "" {
		t.Fatalf("lease not released at stop: %+v", ls)
	}
	if subs, _ := d.Subscribers(context.Background(), driver.GroupScope{Tenants: []string{"t"}, Topic: "x", ConsumerGroup: "g"}); len(subs) != 0 {
		t.Fatalf("heartbeat left after stop: %+v", subs)
	}
}

// testOwnLeaseWithoutWorkerIsTakenUp: an acquisition can commit while its
// caller sees an error (a connection cut after COMMIT). The lease then
// names the subscriber but no worker runs; the subscriber must take it up.
// Acquiring in the subscriber's identity from outside makes that state
// (a worker that already ran loses its lease to the new token).
func testOwnLeaseWithoutWorkerIsTakenUp(t *testing.T, open Open) {
	d, c := setup(t, open, nil)
	publishSpread(t, c, "t", "x", 2, 10)
	rec := newRecorder()
	s, err := c.Subscribe(context.Background(), fastConfig("g", "x", []string{"t"}, rec.handle))
	if err != nil {
		t.Fatal(err)
	}
	defer stopAll(t, s)
	for _, k := range []string{"p00", "p01"} {
		p := driver.PartitionRef{Tenant: "t", ConsumerGroup: "g", Topic: "x", PartitionKey: k}
		if _, err := d.AcquireLease(context.Background(), driver.AcquireLeaseParams{Partition: p, Owner: s.ID(), Now: time.Now(), TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "messages of partitions leased in our identity from outside", 30*time.Second, func() bool { return rec.total.Load() == 10 })
	rec.check(t)
}

// A Publish through the subscriber's own client wakes the idle worker of
// its partition: with an hour-long poll interval, only the wake-up can
// deliver the second message.
func testLocalPublishWakesIdleWorker(t *testing.T, open Open) {
	_, c := setup(t, open, nil)
	// One subscriber per topic; one Publish call later writes both topics
	// and must wake both (not only the first row's topic).
	got := map[string]chan string{"x": make(chan string, 10), "y": make(chan string, 10)}
	for _, topic := range []string{"x", "y"} {
		cfg := fastConfig("g", topic, []string{"t"}, func(_ context.Context, d *shardq.Delivery) error {
			got[d.Topic] <- d.ID
			return nil
		})
		cfg.PollInterval = time.Hour
		mustPublish(t, c, shardq.Message{Tenant: "t", Topic: topic, PartitionKey: "k", ID: "first"})
		s, err := c.Subscribe(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer stopAll(t, s)
	}
	for _, want := range []string{"first", "second"} {
		if want == "second" {
			mustPublish(t, c, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "second"},
				shardq.Message{Tenant: "t", Topic: "y", PartitionKey: "k", ID: "second"})
		}
		for _, topic := range []string{"x", "y"} {
			select {
			case id := <-got[topic]:
				if id != want {
					t.Fatalf("topic %s delivered %q, want %q", topic, id, want)
				}
			case <-time.After(20 * time.Second):
				t.Fatalf("topic %s: %q not delivered: the publish did not wake the idle worker", topic, want)
			}
		}
	}
}

// Members that start within the join window split the partitions at their
// first tick, before any second discovery (an hour away here): nobody
// takes everything and hands it back later.
func testMembersStartingTogetherSplitAtOnce(t *testing.T, open Open) {
	d, c := setup(t, open, nil)
	const parts, members = 32, 4
	publishSpread(t, c, "t", "x", parts, parts)
	block := make(chan struct{})
	var subs []*shardq.Subscriber
	for i := range members {
		cfg := fastConfig("g", "x", []string{"t"}, func(ctx context.Context, _ *shardq.Delivery) error {
			select { // hold every partition until the check is done
			case <-block:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
		cfg.Name = fmt.Sprintf("m%d", i)
		cfg.DiscoveryInterval = time.Hour
		cfg.JoinWindow = 2 * time.Second
		s, err := c.Subscribe(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		subs = append(subs, s)
	}
	defer func() { close(block); stopAll(t, subs...) }()
	waitFor(t, "every partition leased", 30*time.Second, func() bool {
		n := 0
		for _, v := range leaseCountsOf(t, d) {
			n += v
		}
		return n == parts
	})
	for name, n := range leaseCountsOf(t, d) {
		if n != parts/members {
			t.Fatalf("%s holds %d partitions, want %d: %v", name, n, parts/members, leaseCountsOf(t, d))
		}
	}
}

// countingDriver counts the reads a subscriber makes (the database behind
// it is the real one).
type countingDriver struct {
	driver.Driver
	fetches, heads atomic.Int64
}

func (d *countingDriver) FetchAfter(ctx context.Context, p driver.TopicPartition, after int64, limit int) ([]driver.Message, error) {
	d.fetches.Add(1)
	return d.Driver.FetchAfter(ctx, p, after, limit)
}

func (d *countingDriver) HeadsOf(ctx context.Context, topic string, tenants, keys []string) (map[driver.HeadKey]int64, error) {
	d.heads.Add(1)
	return d.Driver.HeadsOf(ctx, topic, tenants, keys)
}

// Idle partitions are watched by one head query per poll, not polled one
// by one; a message published by another client (no local wake-up) is
// still delivered, found by the watcher.
func testIdlePartitionsShareOneHeadQuery(t *testing.T, open Open) {
	d, publisher := setup(t, open, nil)
	const parts = 8
	publishSpread(t, publisher, "t", "x", parts, parts)
	cd := &countingDriver{Driver: d}
	c, err := shardq.NewClient(cd, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var got atomic.Int64
	cfg := fastConfig("g", "x", []string{"t"}, func(context.Context, *shardq.Delivery) error { got.Add(1); return nil })
	cfg.PollInterval, cfg.Take = 20*time.Millisecond, shardq.TakeGrouped
	s, err := c.Subscribe(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer stopAll(t, s)
	waitFor(t, "the first messages", 20*time.Second, func() bool { return got.Load() == parts })
	f0, h0, start := cd.fetches.Load(), cd.heads.Load(), time.Now()
	time.Sleep(50 * cfg.PollInterval)
	polls := int64(time.Since(start) / cfg.PollInterval)
	fetches, heads := cd.fetches.Load()-f0, cd.heads.Load()-h0
	// Polling each partition would fetch parts×polls times; idle workers
	// fetch only every fifth poll on their own.
	if fetches > parts*polls/2 || heads == 0 {
		t.Fatalf("%d idle partitions over %d polls: %d fetches, %d head queries; want well under %d fetches and some head queries",
			parts, polls, fetches, heads, parts*polls/2)
	}
	mustPublish(t, publisher, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "p03", ID: "from-elsewhere"})
	waitFor(t, "a message published by another client", 20*time.Second, func() bool { return got.Load() == parts+1 })
	t.Logf("%d idle partitions, %d polls: %d fetches, %d head queries", parts, polls, fetches, heads)
}

// Two running subscribers given one name are two members: they split the
// partitions and never deliver one partition at the same time (with one
// identity, each took the other's leases as its own and both delivered
// every partition).
func testOneNameTwoInstances(t *testing.T, open Open) {
	_, c := setup(t, open, nil)
	const parts, total = 8, 800
	var mu sync.Mutex
	active := map[string]string{} // partition → instance delivering it now
	count := map[string]int{}
	var overlap atomic.Int64
	handler := func(id *string) shardq.Handler {
		return func(_ context.Context, dl *shardq.Delivery) error {
			mu.Lock()
			if other, busy := active[dl.PartitionKey]; busy && other != *id {
				overlap.Add(1)
			}
			active[dl.PartitionKey] = *id
			count[dl.ID]++
			mu.Unlock()
			time.Sleep(time.Millisecond)
			mu.Lock()
			delete(active, dl.PartitionKey)
			mu.Unlock()
			return nil
		}
	}
	var ids [2]string
	var subs []*shardq.Subscriber
	for i := range ids {
		cfg := fastConfig("g", "x", []string{"t"}, handler(&ids[i]))
		cfg.Name = "worker"
		s, err := c.Subscribe(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		ids[i] = s.ID()
		mu.Unlock()
		subs = append(subs, s)
	}
	defer stopAll(t, subs...)
	if ids[0] == ids[1] || subs[0].Name() != "worker" {
		t.Fatalf("identities %q and %q for the name %q", ids[0], ids[1], subs[0].Name())
	}
	publishSpread(t, c, "t", "x", parts, total)
	waitFor(t, "every message", time.Minute, func() bool { mu.Lock(); defer mu.Unlock(); return len(count) == total })
	if n := overlap.Load(); n > 0 {
		t.Fatalf("%d deliveries overlapped another instance's on the same partition", n)
	}
	mu.Lock()
	defer mu.Unlock()
	for id, n := range count {
		if n != 1 {
			t.Fatalf("%s delivered %d times without any failure", id, n)
		}
	}
}

// A member never hands out a message once its lease may have expired by
// its own clock (a frozen process, renewals that kept failing), even when
// nobody took the lease: it stops, acquires the partition again with a
// new token, and redelivers from the committed cursor. The clock is
// injected and renewal never runs (hour-long heartbeat interval).
func testNoDeliveryAfterLeaseExpiry(t *testing.T, open Open) {
	d, c := setup(t, open, nil)
	clock := newFakeClock(time.Now())
	publishGroup(t, c, "k", "m0", "m1")
	type delivery struct {
		id    string
		token int64
	}
	var mu sync.Mutex
	var got []delivery
	g := newGate()
	defer g.open()
	cfg := fastConfig("g", "x", []string{"t"}, func(ctx context.Context, dl *shardq.Delivery) error {
		ls, err := d.ListLeases(context.Background(), driver.GroupScope{Tenants: []string{"t"}, Topic: "x", ConsumerGroup: "g"})
		if err != nil || len(ls) != 1 {
			return fmt.Errorf("leases %+v: %v", ls, err)
		}
		mu.Lock()
		got = append(got, delivery{dl.ID, ls[0].Token})
		first := len(got) == 1
		mu.Unlock()
		if first {
			return g.hold(ctx)
		}
		return nil
	})
	// Renewal (at hour-long heartbeats, real time) never runs; the lease lives 4 h of the fake clock.
	cfg.Clock, cfg.HeartbeatInterval, cfg.StaleAfter, cfg.LeaseTTL, cfg.IdleRelease = clock.Now, time.Hour, 3*time.Hour, 4*time.Hour, 8*time.Hour
	s, err := c.Subscribe(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer stopAll(t, s)
	g.waitHeld(t, "m0")
	clock.Advance(2 * cfg.LeaseTTL) // the member "was frozen" past its lease
	g.open()
	waitFor(t, "m1 delivered", 20*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, g := range got {
			if g.id == "m1" {
				return true
			}
		}
		return false
	})
	mu.Lock()
	defer mu.Unlock()
	first := got[0].token
	for _, g := range got[1:] {
		if g.token <= first {
			t.Fatalf("%s delivered under token %d, the lease that expired (deliveries %+v)", g.id, g.token, got)
		}
	}
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
