// SPDX-License-Identifier: Apache-2.0

package conformance

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/shardq/shardq"
)

var gref = shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}

// A receipt's visibility timeout changes after the receive, as SQS's
// ChangeMessageVisibility: longer keeps the group's lease or the
// message's claim past the first timeout; 0 gives it back at once.
func testReceiptsChangeVisibility(t *testing.T, open Open) {
	_, c := setup(t, open, nil)
	ctx := context.Background()
	publishGroup(t, c, "k", "m1", "m2")
	mustPublish(t, c, shardq.Message{Tenant: "t", Topic: "x", ID: "u1"}, shardq.Message{Tenant: "t", Topic: "x", ID: "u2"})
	clock := newFakeClock(time.Now())
	r := receipts(t, c, clock, 5)

	g := mustReceive(t, r, shardq.ReceiveRequest{PartitionKey: "k", Max: 2, Visibility: 5 * time.Second}, "m1", "m2")
	u := mustReceive(t, r, shardq.ReceiveRequest{Ungrouped: true, Visibility: 5 * time.Second}, "u1")
	if stale, err := r.ChangeVisibility(ctx, gref, []string{g[0].Receipt, g[1].Receipt, u[0].Receipt}, time.Minute); err != nil || len(stale) != 0 {
		t.Fatalf("extend = %v, %v", stale, err)
	}
	clock.Advance(10 * time.Second) // past the first timeout, within the new one
	mustReceive(t, r, shardq.ReceiveRequest{PartitionKey: "k"})
	mustReceive(t, r, shardq.ReceiveRequest{Ungrouped: true, Visibility: time.Minute}, "u2") // u1 still claimed
	if err := r.Ack(ctx, gref, u[0].Receipt); err != nil {
		t.Fatalf("ack of an extended claim: %v", err)
	}

	// 0: the group goes back at once, its messages come again.
	if stale, err := r.ChangeVisibility(ctx, gref, []string{g[0].Receipt}, 0); err != nil || len(stale) != 0 {
		t.Fatalf("visibility 0 = %v, %v", stale, err)
	}
	again := mustReceive(t, r, shardq.ReceiveRequest{PartitionKey: "k", Max: 2}, "m1", "m2")
	if stale, err := r.ChangeVisibility(ctx, gref, []string{again[0].Receipt, g[1].Receipt}, time.Minute); err != nil || !slices.Equal(stale, []int{1}) {
		t.Fatalf("extend with a receipt of the given-back receive = %v, %v; want stale [1]", stale, err)
	}
	if err := r.Ack(ctx, gref, again[1].Receipt); err != nil {
		t.Fatal(err)
	}

	// An ungrouped claim at 0: claimable at once, its attempt counted.
	mustReceive(t, r, shardq.ReceiveRequest{Ungrouped: true}) // u2 is claimed for a minute
	clock.Advance(2 * time.Minute)
	u2 := mustReceive(t, r, shardq.ReceiveRequest{Ungrouped: true, Visibility: time.Minute}, "u2")
	if _, err := r.ChangeVisibility(ctx, gref, []string{u2[0].Receipt}, 0); err != nil {
		t.Fatal(err)
	}
	u2b := mustReceive(t, r, shardq.ReceiveRequest{Ungrouped: true}, "u2")
	if u2b[0].Attempt != u2[0].Attempt+1 {
		t.Fatalf("attempt after visibility 0 = %d, want %d", u2b[0].Attempt, u2[0].Attempt+1)
	}
	if stale, err := r.ChangeVisibility(ctx, gref, []string{u2[0].Receipt}, time.Minute); err != nil || !slices.Equal(stale, []int{0}) {
		t.Fatalf("extend a claim taken again = %v, %v; want stale [0]", stale, err)
	}

	for _, bad := range []struct {
		rcpts []string
		vis   time.Duration
	}{
		{[]string{u2b[0].Receipt}, shardq.MaxVisibility + time.Second},
		{[]string{u2b[0].Receipt}, -time.Second},
		{[]string{u2b[0].Receipt, "r2.x"}, time.Second},
		{nil, time.Second},
	} {
		if _, err := r.ChangeVisibility(ctx, gref, bad.rcpts, bad.vis); !errors.Is(err, shardq.ErrInvalid) {
			t.Errorf("change visibility %d receipts to %s = %v, want ErrInvalid", len(bad.rcpts), bad.vis, err)
		}
	}
	if _, err := r.ChangeVisibility(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "h"}, []string{u2b[0].Receipt}, time.Second); !errors.Is(err, shardq.ErrInvalid) {
		t.Errorf("change visibility in another group = %v, want ErrInvalid", err)
	}
}

// A receive with Hold accepts a message group as a session: acks keep
// it, a receive in the session goes on from the group's cursor (waiting
// for a message within it), its state is read and written under the
// session's lease, and it ends when closed, at a nack (so that no ack
// passes the failed message), or when another receive takes the lapsed
// lease; a lapsed lease nobody took is resumed.
func testReceiptsSession(t *testing.T, open Open) {
	_, c := setup(t, open, nil)
	ctx := context.Background()
	publishGroup(t, c, "k", "m1", "m2", "m3", "m4")
	clock := newFakeClock(time.Now())
	r := receipts(t, c, clock, 5)
	in := func(s *shardq.ReceiveSession, max int) shardq.ReceiveRequest {
		t.Helper()
		if s == nil {
			t.Fatal("no session")
		}
		return shardq.ReceiveRequest{Session: s.ID, Max: max, Visibility: 5 * time.Minute}
	}
	accept := func(key string, want ...string) *shardq.ReceiveSession {
		t.Helper()
		res, err := r.Receive(ctx, shardq.ReceiveRequest{Tenant: "t", Topic: "x", ConsumerGroup: "g", PartitionKey: key, Hold: true, Visibility: 5 * time.Minute})
		if err != nil || !slices.Equal(ids(res.Messages), want) && len(want)+len(res.Messages) > 0 || res.Session == nil || res.Session.PartitionKey != key {
			t.Fatalf("accept %s = %+v, %v; want %v and a session", key, res, err, want)
		}
		if len(res.Messages) > 0 {
			if err := r.Ack(ctx, gref, res.Messages[0].Receipt); err != nil {
				t.Fatal(err)
			}
		}
		return res.Session
	}
	s := accept("k", "m1")                                      // acked
	mustReceive(t, r, shardq.ReceiveRequest{PartitionKey: "k"}) // the ack kept the group
	m2 := mustReceive(t, r, in(s, 1), "m2")
	again := mustReceive(t, r, in(s, 2), "m2", "m3") // from the cursor: unacked, m2 comes again
	if again[0].Attempt != m2[0].Attempt {
		t.Fatalf("a session's receive again is attempt %d, want %d", again[0].Attempt, m2[0].Attempt)
	}
	// A cumulative ack settles m2; its nack is then stale and counts nothing.
	if err := r.Ack(ctx, gref, again[1].Receipt); err != nil {
		t.Fatal(err)
	}
	if err := r.Nack(ctx, gref, again[0].Receipt, shardq.NackOptions{}); !errors.Is(err, shardq.ErrStaleReceipt) {
		t.Fatalf("nack of a message an ack settled = %v, want ErrStaleReceipt", err)
	}
	mustReceive(t, r, shardq.ReceiveRequest{PartitionKey: "k"}) // still the session's

	// State, under the session.
	if st, err := r.GroupState(ctx, gref, s.ID); err != nil || st != nil {
		t.Fatalf("state before any = %q, %v", st, err)
	}
	if err := r.SetGroupState(ctx, gref, s.ID, []byte("step 2")); err != nil {
		t.Fatal(err)
	}
	if st, err := r.GroupState(ctx, gref, s.ID); err != nil || !bytes.Equal(st, []byte("step 2")) {
		t.Fatalf("state = %q, %v", st, err)
	}
	if err := r.SetGroupState(ctx, gref, s.ID, make([]byte, c.MaxMessageBytes()+1)); !errors.Is(err, shardq.ErrInvalid) {
		t.Fatalf("oversized state = %v, want ErrInvalid", err)
	}

	// Renewed by a visibility change, the session outlasts its timeout;
	// lapsed with nobody taking the group, it is resumed.
	if stale, err := r.ChangeVisibility(ctx, gref, []string{s.ID}, 10*time.Minute); err != nil || len(stale) != 0 {
		t.Fatalf("renew = %v, %v", stale, err)
	}
	clock.Advance(7 * time.Minute)
	mustReceive(t, r, shardq.ReceiveRequest{PartitionKey: "k"})
	clock.Advance(4 * time.Minute)
	m4 := mustReceive(t, r, in(s, 1), "m4")

	// A nack ends the session; the message comes again after its delay.
	if err := r.Nack(ctx, gref, m4[0].Receipt, shardq.NackOptions{RetryAfter: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Receive(ctx, shardq.ReceiveRequest{Tenant: "t", Topic: "x", ConsumerGroup: "g", Session: s.ID}); !errors.Is(err, shardq.ErrStaleReceipt) {
		t.Fatalf("receive in a session after its nack = %v, want ErrStaleReceipt", err)
	}
	if _, err := r.GroupState(ctx, gref, s.ID); !errors.Is(err, shardq.ErrStaleReceipt) {
		t.Fatalf("state of an ended session = %v, want ErrStaleReceipt", err)
	}
	if err := r.CloseSession(ctx, gref, s.ID); !errors.Is(err, shardq.ErrStaleReceipt) {
		t.Fatalf("close an ended session = %v, want ErrStaleReceipt", err)
	}
	clock.Advance(time.Minute)
	res, err := r.Receive(ctx, shardq.ReceiveRequest{Tenant: "t", Topic: "x", ConsumerGroup: "g", PartitionKey: "k", Hold: true})
	if err != nil || !slices.Equal(ids(res.Messages), []string{"m4"}) || res.Messages[0].Attempt != 2 || res.Session == nil {
		t.Fatalf("accept after the retry delay = %+v, %v; want m4, attempt 2", res, err)
	}
	if err := r.CloseSession(ctx, gref, res.Messages[0].Receipt); !errors.Is(err, shardq.ErrInvalid) {
		t.Fatalf("close by a message's receipt = %v, want ErrInvalid", err)
	}
	// Closed: the group goes to any receive, its message again, uncounted.
	if err := r.CloseSession(ctx, gref, res.Session.ID); err != nil {
		t.Fatal(err)
	}
	other := mustReceive(t, r, shardq.ReceiveRequest{PartitionKey: "k"}, "m4")
	if other[0].Attempt != 2 {
		t.Fatalf("after a close, attempt %d, want 2", other[0].Attempt)
	}
	if err := r.Ack(ctx, gref, other[0].Receipt); err != nil {
		t.Fatal(err)
	}

	// A named group is accepted while empty, unless RequireReady; a
	// receive in its session waits for the group's message.
	if res, err := r.Receive(ctx, shardq.ReceiveRequest{Tenant: "t", Topic: "x", ConsumerGroup: "g", PartitionKey: "e", Hold: true, RequireReady: true}); err != nil || res.Session != nil {
		t.Fatalf("require_ready on an empty group = %+v, %v; want no session", res, err)
	}
	e := accept("e")
	waited := make(chan shardq.ReceiveResult, 1)
	go func() {
		rq := in(e, 1)
		rq.Tenant, rq.Topic, rq.ConsumerGroup, rq.Wait = "t", "x", "g", 10*time.Second
		res, err := r.Receive(ctx, rq)
		if err != nil {
			t.Error(err)
		}
		waited <- res
	}()
	// Each look of the waiting receive renews the session's lease: past
	// its first visibility timeout no other receive gets the group.
	time.Sleep(50 * time.Millisecond) // the receive is waiting (it returns either way)
	clock.Advance(4 * time.Minute)
	time.Sleep(50 * time.Millisecond) // it looks again, every PollInterval
	clock.Advance(4 * time.Minute)
	time.Sleep(50 * time.Millisecond)
	mustReceive(t, r, shardq.ReceiveRequest{PartitionKey: "e"})
	publishGroup(t, c, "e", "e1")
	if got := <-waited; !slices.Equal(ids(got.Messages), []string{"e1"}) || got.Session == nil || got.Session.ID != e.ID {
		t.Fatalf("a receive waiting in the session = %+v, want e1", got)
	}
	mustReceive(t, r, shardq.ReceiveRequest{PartitionKey: "e"}) // held by the session

	// Lapsed and taken by another receive, the session is lost.
	clock.Advance(6 * time.Minute)
	mustReceive(t, r, shardq.ReceiveRequest{PartitionKey: "e"}, "e1")
	if _, err := r.Receive(ctx, shardq.ReceiveRequest{Tenant: "t", Topic: "x", ConsumerGroup: "g", Session: e.ID}); !errors.Is(err, shardq.ErrStaleReceipt) {
		t.Fatalf("receive in a session whose group was taken = %v, want ErrStaleReceipt", err)
	}

	// The next free group, held.
	publishGroup(t, c, "n", "n1")
	clock.Advance(6 * time.Minute) // e's receive lapses
	next, err := r.Receive(ctx, shardq.ReceiveRequest{Tenant: "t", Topic: "x", ConsumerGroup: "g", NextGroup: true, Hold: true})
	if err != nil || len(next.Messages) != 1 || next.Session == nil || next.Session.PartitionKey != next.Messages[0].PartitionKey {
		t.Fatalf("next group held = %+v, %v", next, err)
	}

	for _, bad := range []shardq.ReceiveRequest{
		{Hold: true}, {Hold: true, Ungrouped: true}, {PartitionKey: "k", RequireReady: true}, {NextGroup: true, Hold: true, RequireReady: true},
		{Session: s.ID, PartitionKey: "k"}, {Session: s.ID, Hold: true}, {Session: other[0].Receipt}, {Session: "r2.x"},
	} {
		bad.Tenant, bad.Topic, bad.ConsumerGroup = "t", "x", "g"
		if _, err := r.Receive(ctx, bad); !errors.Is(err, shardq.ErrInvalid) {
			t.Errorf("receive %+v = %v, want ErrInvalid", bad, err)
		}
		if err := r.Check(ctx, bad); !errors.Is(err, shardq.ErrInvalid) {
			t.Errorf("check %+v = %v, want ErrInvalid", bad, err)
		}
	}
	if err := r.Ack(ctx, gref, s.ID); !errors.Is(err, shardq.ErrInvalid) {
		t.Errorf("ack of a session id = %v, want ErrInvalid", err)
	}
	if _, err := r.GroupState(ctx, gref, other[0].Receipt); !errors.Is(err, shardq.ErrInvalid) {
		t.Errorf("state by a message's receipt = %v, want ErrInvalid", err)
	}
	if _, err := r.GroupState(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "h"}, next.Session.ID); !errors.Is(err, shardq.ErrInvalid) {
		t.Errorf("state of another group's session = %v, want ErrInvalid", err)
	}
}
