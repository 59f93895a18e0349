// SPDX-License-Identifier: Apache-2.0

package conformance

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
)

var receiptTests = []conformanceTest{
	{"ReceiptsGroupExclusiveCumulativeAck", testReceiptsGroup},
	{"ReceiptsVisibilityTimeoutRedelivers", testReceiptsVisibility},
	{"ReceiptsNackRetriesThenDeadLetters", testReceiptsNack},
	{"ReceiptsNackThatFailsGivesTheGroupBack", testReceiptsNackFails},
	{"ReceiptsStaleNackLeavesTheVisibility", testReceiptsStaleNack},
	{"ReceiptsUngrouped", testReceiptsUngrouped},
	{"ReceiptsNextGroupAndWait", testReceiptsNextGroup},
	{"ReceiptsAckGoesOnWithTheGroup", testReceiptsGoOn},
	{"ReceiptsAnyTakesUngroupedThenAGroup", testReceiptsAny},
	{"ReceiptsBytesBoundedByDefault", testReceiptsBytesBounded},
	{"ReceiptsChangeVisibility", testReceiptsChangeVisibility},
	{"ReceiptsSession", testReceiptsSession},
	{"AckTxSubscriber", testAckTxSubscriber},
	{"AckTxReceiver", testAckTxReceiver},
	{"MessagesExpire", testMessagesExpire},
	{"Deferral", testDeferral},
	{"DeferralReceipts", testDeferralReceipts},
	{"DeferralReceiptsFence", testDeferralReceiptsFence},
}

func receipts(t *testing.T, c *shardq.Client, clock *fakeClock, maxAttempts int) *shardq.Receipts {
	t.Helper()
	o := &shardq.ReceiptOptions{Name: "api", MaxAttempts: maxAttempts, PollInterval: 5 * time.Millisecond, FeedPollInterval: 5 * time.Millisecond}
	if clock != nil {
		o.Clock = clock.Now
	}
	r, err := c.Receipts(o)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func ids(ms []shardq.ReceivedMessage) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.ID
	}
	return out
}

func mustReceive(t *testing.T, r *shardq.Receipts, rq shardq.ReceiveRequest, want ...string) []shardq.ReceivedMessage {
	t.Helper()
	rq.Tenant, rq.Topic, rq.ConsumerGroup = "t", "x", "g"
	res, err := r.Receive(context.Background(), rq)
	if err != nil {
		t.Fatalf("receive %+v: %v", rq, err)
	}
	ms := res.Messages
	if got := ids(ms); !slices.Equal(got, want) && !(len(got) == 0 && len(want) == 0) {
		t.Fatalf("receive %+v = %v, want %v", rq, got, want)
	}
	return ms
}

// A receive holds its group until its last message is acked: no other
// receive sees the group meanwhile; acks are cumulative.
func testReceiptsGroup(t *testing.T, open Open) {
	_, c := setup(t, open, nil)
	ctx := context.Background()
	publishGroup(t, c, "k", "m1", "m2", "m3")
	r := receipts(t, c, nil, 0)
	got := mustReceive(t, r, shardq.ReceiveRequest{PartitionKey: "k", Max: 2}, "m1", "m2")
	if got[0].Attempt != 1 || got[0].PartitionKey != "k" {
		t.Fatalf("first delivery %+v", got[0].Delivery)
	}
	mustReceive(t, r, shardq.ReceiveRequest{PartitionKey: "k"}) // in flight: nothing
	if err := r.Ack(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, got[1].Receipt); err != nil {
		t.Fatal(err)
	}
	next := mustReceive(t, r, shardq.ReceiveRequest{PartitionKey: "k", Max: 5}, "m3")
	// The earlier receive's receipts are spent: its lease was given back.
	if err := r.Ack(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, got[0].Receipt); !errors.Is(err, shardq.ErrStaleReceipt) {
		t.Fatalf("ack of a receipt whose group was given back = %v, want ErrStaleReceipt", err)
	}
	if err := r.Ack(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "h"}, next[0].Receipt); !errors.Is(err, shardq.ErrInvalid) {
		t.Fatalf("ack in another group = %v, want ErrInvalid", err)
	}
	if err := r.Ack(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, "r1.!!"); !errors.Is(err, shardq.ErrInvalid) {
		t.Fatalf("ack of garbage = %v, want ErrInvalid", err)
	}
	if err := r.Ack(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, next[0].Receipt); err != nil {
		t.Fatal(err)
	}
	mustReceive(t, r, shardq.ReceiveRequest{PartitionKey: "k"})
}

// A receive of MaxReceiveMessages with no MaxBytes holds at most
// DefaultReceiveMaxBytes of payload (and one message more), grouped or
// not; the rest come next.
func testReceiptsBytesBounded(t *testing.T, open Open) {
	_, c := setup(t, open, nil)
	payload := make([]byte, shardq.DefaultMaxPayloadBytes)
	const n = 10 // more than DefaultReceiveMaxBytes of payload
	for _, key := range []string{"k", ""} {
		msgs := make([]shardq.Message, n)
		for i := range msgs {
			msgs[i] = shardq.Message{Tenant: "t", Topic: "x", PartitionKey: key, ID: fmt.Sprintf("%s%d", key, i), Payload: payload}
		}
		for _, m := range msgs { // one a call: a batch is bounded too
			mustPublish(t, c, m)
		}
	}
	r := receipts(t, c, nil, 0)
	for _, rq := range []shardq.ReceiveRequest{{PartitionKey: "k"}, {Ungrouped: true}} {
		rq.Tenant, rq.Topic, rq.ConsumerGroup, rq.Max = "t", "x", "g", shardq.MaxReceiveMessages
		got := 0
		for round := 0; got < n && round < n; round++ {
			res, err := r.Receive(context.Background(), rq)
			if err != nil {
				t.Fatal(err)
			}
			var bytes int
			rcpts := make([]string, len(res.Messages))
			for i, m := range res.Messages {
				bytes += len(m.Payload)
				rcpts[i] = m.Receipt
			}
			if len(res.Messages) == 0 || bytes > shardq.DefaultReceiveMaxBytes+shardq.DefaultMaxPayloadBytes {
				t.Fatalf("%+v: %d messages, %d bytes of payload in one receive", rq, len(res.Messages), bytes)
			}
			if _, err := r.AckAll(context.Background(), shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, rcpts); err != nil {
				t.Fatal(err)
			}
			got += len(res.Messages)
		}
		if got != n {
			t.Fatalf("%+v: received %d of %d", rq, got, n)
		}
	}
}

// Unsettled past its visibility timeout, a receive's messages go to the
// next receive, and the first receive's receipts change nothing.
func testReceiptsVisibility(t *testing.T, open Open) {
	d, c := setup(t, open, nil)
	ctx := context.Background()
	publishGroup(t, c, "k", "m1", "m2")
	clock := newFakeClock(time.Now())
	r := receipts(t, c, clock, 0)
	first := mustReceive(t, r, shardq.ReceiveRequest{PartitionKey: "k", Max: 2, Visibility: 5 * time.Second}, "m1", "m2")
	clock.Advance(6 * time.Second)
	second := mustReceive(t, r, shardq.ReceiveRequest{PartitionKey: "k", Max: 2}, "m1", "m2")
	if err := r.Ack(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, first[1].Receipt); !errors.Is(err, shardq.ErrStaleReceipt) {
		t.Fatalf("ack after the visibility timeout = %v, want ErrStaleReceipt", err)
	}
	offsets, err := d.ListLeases(ctx, driver.GroupScope{Tenants: []string{"t"}, Topic: "x", ConsumerGroup: "g"})
	if err != nil || len(offsets) != 1 || offsets[0].Committed != 0 {
		t.Fatalf("cursor after a stale ack: %+v, %v; want unmoved", offsets, err)
	}
	if err := r.Ack(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, second[1].Receipt); err != nil {
		t.Fatal(err)
	}
}

// A Nack gives the group back with the message due again after its
// delay, counting an attempt; the last allowed attempt dead-letters it.
func testReceiptsNack(t *testing.T, open Open) {
	d, c := setup(t, open, nil)
	ctx := context.Background()
	publishGroup(t, c, "k", "m1", "m2")
	clock := newFakeClock(time.Now())
	r := receipts(t, c, clock, 2)
	got := mustReceive(t, r, shardq.ReceiveRequest{PartitionKey: "k", Max: 2}, "m1", "m2")
	if err := r.Nack(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, got[0].Receipt, shardq.NackOptions{RetryAfter: time.Minute, Reason: "bad"}); err != nil {
		t.Fatal(err)
	}
	if err := r.Ack(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, got[1].Receipt); !errors.Is(err, shardq.ErrStaleReceipt) {
		t.Fatalf("ack after the group was nacked = %v, want ErrStaleReceipt", err)
	}
	mustReceive(t, r, shardq.ReceiveRequest{PartitionKey: "k"}) // m1 waits for its retry; m2 waits behind it
	clock.Advance(time.Minute)
	again := mustReceive(t, r, shardq.ReceiveRequest{PartitionKey: "k"}, "m1")
	if again[0].Attempt != 2 {
		t.Fatalf("redelivery is attempt %d, want 2", again[0].Attempt)
	}
	if err := r.Nack(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, again[0].Receipt, shardq.NackOptions{RetryAfter: 0, Reason: "still bad"}); err != nil {
		t.Fatal(err)
	}
	if dlq := fetchAll(t, d, "t", "x.dlq", "k"); len(dlq) != 1 || dlq[0].ID != "m1" || dlq[0].Headers[shardq.HeaderDLQAttempts] != "2" {
		t.Fatalf("dead letters %+v, want m1 after 2 attempts", dlq)
	}
	mustReceive(t, r, shardq.ReceiveRequest{PartitionKey: "k"}, "m2")
}

// A nack holds its group's lease while it reads the cursor and the
// message's attempts; one that fails there (a cut connection, say) still
// gives the group back, so the next receive gets the messages at once,
// not after the nack's hold (30 s) or the receive's visibility timeout.
func testReceiptsNackFails(t *testing.T, open Open) {
	ctx := context.Background()
	d := open(t)
	if _, err := d.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	fd := &statesFault{Driver: d}
	c, err := shardq.NewClient(fd, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	publishGroup(t, c, "k", "m1", "m2")
	r := receipts(t, c, nil, 5)
	got := mustReceive(t, r, shardq.ReceiveRequest{PartitionKey: "k", Max: 2, Visibility: time.Hour}, "m1", "m2")
	fd.fail.Store(true)
	err = r.Nack(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, got[0].Receipt, shardq.NackOptions{Reason: "bad"})
	fd.fail.Store(false)
	if !errors.Is(err, errStatesFault) {
		t.Fatalf("nack = %v, want the injected failure", err)
	}
	again := mustReceive(t, r, shardq.ReceiveRequest{PartitionKey: "k", Max: 2}, "m1", "m2")
	if again[0].Attempt != 1 {
		t.Fatalf("redelivery is attempt %d, want 1: the failed nack recorded nothing", again[0].Attempt)
	}
}

// A nack whose message a later ack of its receive has passed (acks are
// cumulative) is stale, and leaves the group's lease to the receive's
// visibility: neither shortened to the nack's own hold nor lengthened to
// it.
func testReceiptsStaleNack(t *testing.T, open Open) {
	_, c := setup(t, open, nil)
	ctx := context.Background()
	ref := shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}
	publishGroup(t, c, "k", "m1", "m2", "m3", "m4", "m5", "m6")
	clock := newFakeClock(time.Now())
	r := receipts(t, c, clock, 5)
	staleNack := func(got []shardq.ReceivedMessage) {
		t.Helper()
		if err := r.Ack(ctx, ref, got[1].Receipt); err != nil {
			t.Fatal(err)
		}
		if err := r.Nack(ctx, ref, got[0].Receipt, shardq.NackOptions{Reason: "late"}); !errors.Is(err, shardq.ErrStaleReceipt) {
			t.Fatalf("nack of a message a later ack passed = %v, want ErrStaleReceipt", err)
		}
	}
	long := mustReceive(t, r, shardq.ReceiveRequest{PartitionKey: "k", Max: 3, Visibility: time.Hour}, "m1", "m2", "m3")
	staleNack(long)
	clock.Advance(time.Minute) // past the nack's hold, within the receive's hour
	mustReceive(t, r, shardq.ReceiveRequest{PartitionKey: "k"})
	if err := r.Ack(ctx, ref, long[2].Receipt); err != nil {
		t.Fatalf("the receive's last ack within its visibility: %v", err)
	}
	short := mustReceive(t, r, shardq.ReceiveRequest{PartitionKey: "k", Max: 3, Visibility: 5 * time.Second}, "m4", "m5", "m6")
	staleNack(short)
	clock.Advance(6 * time.Second) // past the receive's visibility, within the nack's hold
	mustReceive(t, r, shardq.ReceiveRequest{PartitionKey: "k"}, "m6")
}

var errStatesFault = errors.New("injected: delivery states unreadable")

// statesFault is a driver whose DeliveryStates fails while fail is set.
type statesFault struct {
	driver.Driver
	fail atomic.Bool
}

func (f *statesFault) DeliveryStates(ctx context.Context, p driver.PartitionRef, after, upTo int64) (map[int64]driver.DeliveryState, error) {
	if f.fail.Load() {
		return nil, errStatesFault
	}
	return f.Driver.DeliveryStates(ctx, p, after, upTo)
}

// Ungrouped messages: a claim each, competing receives never share one;
// a Nack or the visibility timeout makes the message claimable again.
func testReceiptsUngrouped(t *testing.T, open Open) {
	_, c := setup(t, open, nil)
	ctx := context.Background()
	mustPublish(t, c, shardq.Message{Tenant: "t", Topic: "x", ID: "u1"}, shardq.Message{Tenant: "t", Topic: "x", ID: "u2"},
		shardq.Message{Tenant: "t", Topic: "x", ID: "u3"})
	clock := newFakeClock(time.Now())
	r := receipts(t, c, clock, 3)
	a := mustReceive(t, r, shardq.ReceiveRequest{Max: 2, Visibility: 5 * time.Second}, "u1", "u2")
	b := mustReceive(t, r, shardq.ReceiveRequest{Max: 5}, "u3")
	if err := r.Ack(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, a[0].Receipt); err != nil {
		t.Fatal(err)
	}
	if err := r.Nack(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, b[0].Receipt, shardq.NackOptions{RetryAfter: 0, Reason: ""}); err != nil {
		t.Fatal(err)
	}
	clock.Advance(6 * time.Second) // u2's claim lapses
	again := mustReceive(t, r, shardq.ReceiveRequest{Max: 5}, "u2", "u3")
	if again[0].Attempt != 2 || again[1].Attempt != 2 {
		t.Fatalf("redeliveries %+v, want attempt 2 each", again)
	}
	if err := r.Ack(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, a[1].Receipt); !errors.Is(err, shardq.ErrStaleReceipt) {
		t.Fatalf("ack of a lapsed claim = %v, want ErrStaleReceipt", err)
	}
	for _, m := range again {
		if err := r.Ack(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, m.Receipt); err != nil {
			t.Fatal(err)
		}
	}
	mustReceive(t, r, shardq.ReceiveRequest{Max: 5})
}

// NextGroup takes the free group whose next message is oldest; a
// waiting receive returns once a message arrives.
func testReceiptsNextGroup(t *testing.T, open Open) {
	_, c := setup(t, open, nil)
	ctx := context.Background()
	publishGroup(t, c, "a", "a1")
	publishGroup(t, c, "b", "b1")
	r := receipts(t, c, nil, 0)
	first := mustReceive(t, r, shardq.ReceiveRequest{NextGroup: true, Max: 10}, "a1")
	mustReceive(t, r, shardq.ReceiveRequest{NextGroup: true, Max: 10}, "b1")
	mustReceive(t, r, shardq.ReceiveRequest{NextGroup: true})
	if err := r.Ack(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, first[0].Receipt); err != nil {
		t.Fatal(err)
	}
	done := make(chan []shardq.ReceivedMessage, 1)
	go func() {
		res, err := r.Receive(ctx, shardq.ReceiveRequest{Tenant: "t", Topic: "x", ConsumerGroup: "g", PartitionKey: "a", Wait: 10 * time.Second})
		if err != nil {
			t.Error(err)
		}
		done <- res.Messages
	}()
	time.Sleep(50 * time.Millisecond) // the receive is waiting (it returns either way)
	publishGroup(t, c, "a", "a2")
	if got := ids(<-done); !slices.Equal(got, []string{"a2"}) {
		t.Fatalf("waiting receive = %v, want a2", got)
	}
	for _, bad := range []shardq.ReceiveRequest{
		{Max: shardq.MaxReceiveMessages + 1}, {MaxBytes: -1}, {Wait: 21 * time.Second}, {Visibility: time.Millisecond}, {PartitionKey: "a", NextGroup: true}, {PartitionKey: "k "},
		{Ungrouped: true, NextGroup: true}, {Ungrouped: true, PartitionKey: "a"},
	} {
		bad.Tenant, bad.Topic, bad.ConsumerGroup = "t", "x", "g"
		if _, err := r.Receive(ctx, bad); !errors.Is(err, shardq.ErrInvalid) {
			t.Errorf("receive %+v = %v, want ErrInvalid", bad, err)
		}
	}
}

// A next-group receive whose acks settle the whole of a group's receive
// goes on with that group while it has more stored, ahead of an older
// group, under a new lease (the old receipts go stale), for at most
// MaxGroupTurns receives in a row; a group with nothing more is given
// back by the ack.
func testReceiptsGoOn(t *testing.T, open Open) {
	_, c := setup(t, open, nil)
	ctx := context.Background()
	g := shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}
	publishGroup(t, c, "k", "m1")
	publishGroup(t, c, "j", "n1") // older than every k message after m1
	var more []string
	for i := 2; i <= shardq.MaxGroupTurns+2; i++ {
		more = append(more, fmt.Sprintf("m%d", i))
	}
	publishGroup(t, c, "k", more...)
	r := receipts(t, c, nil, 0)
	prev := mustReceive(t, r, shardq.ReceiveRequest{NextGroup: true}, "m1")
	for i := 2; i <= shardq.MaxGroupTurns+1; i++ {
		res, err := r.Receive(ctx, shardq.ReceiveRequest{Tenant: "t", Topic: "x", ConsumerGroup: "g", NextGroup: true, Ack: []string{prev[0].Receipt}})
		if err != nil {
			t.Fatal(err)
		}
		if got, want := ids(res.Messages), []string{fmt.Sprintf("m%d", i)}; !slices.Equal(got, want) || res.Acked != 1 || len(res.Stale) != 0 {
			t.Fatalf("turn %d: receive = %v (acked %d, stale %v), want %v (acked 1)", i, got, res.Acked, res.Stale, want)
		}
		mustReceive(t, r, shardq.ReceiveRequest{PartitionKey: "k"}) // held on
		// The receipts of the turn before went stale: a repeated ack
		// cannot give the group back under this turn.
		if err := r.Ack(ctx, g, prev[0].Receipt); !errors.Is(err, shardq.ErrStaleReceipt) {
			t.Fatalf("turn %d: ack of the turn before = %v, want ErrStaleReceipt", i, err)
		}
		prev = res.Messages
	}
	// MaxGroupTurns in a row: the next ack gives k back, and the oldest
	// free group comes next.
	n1 := mustReceive(t, r, shardq.ReceiveRequest{NextGroup: true, Ack: []string{prev[0].Receipt}}, "n1")
	last := mustReceive(t, r, shardq.ReceiveRequest{PartitionKey: "k"}, fmt.Sprintf("m%d", shardq.MaxGroupTurns+2))
	// j has nothing more: the ack gives it back, and the receive takes
	// the next group (none).
	mustReceive(t, r, shardq.ReceiveRequest{NextGroup: true, Ack: []string{n1[0].Receipt, last[0].Receipt}})
	publishGroup(t, c, "j", "n2")
	mustReceive(t, r, shardq.ReceiveRequest{PartitionKey: "j"}, "n2")
	mustReceive(t, r, shardq.ReceiveRequest{PartitionKey: "k"})
}

// A receive that names no group takes what is available, as SQS FIFO's
// ReceiveMessage does: ungrouped messages first, then the next free
// group; Ungrouped takes only the former.
func testReceiptsAny(t *testing.T, open Open) {
	_, c := setup(t, open, nil)
	ctx := context.Background()
	publishGroup(t, c, "a", "a1")
	mustPublish(t, c, shardq.Message{Tenant: "t", Topic: "x", ID: "u1"})
	r := receipts(t, c, nil, 0)
	u := mustReceive(t, r, shardq.ReceiveRequest{Max: 10}, "u1")
	mustReceive(t, r, shardq.ReceiveRequest{Ungrouped: true, Max: 10}) // a1 is grouped
	a := mustReceive(t, r, shardq.ReceiveRequest{Max: 10}, "a1")
	mustReceive(t, r, shardq.ReceiveRequest{Max: 10}) // both in flight
	for _, m := range append(u, a...) {
		if err := r.Ack(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, m.Receipt); err != nil {
			t.Fatal(err)
		}
	}
	mustReceive(t, r, shardq.ReceiveRequest{Max: 10})
}
