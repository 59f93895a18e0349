// SPDX-License-Identifier: Apache-2.0

package drivertest

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

// A receive with Hold accepts a message group as a session: acks and
// nacks keep it, a receive in the session goes on from the group's
// cursor, its state is read and written under the session's lease, and
// it ends when closed or when another receive takes the lapsed lease.
func testReceiptsSession(t *testing.T, open Open) {
	_, c := setup(t, open, nil)
	ctx := context.Background()
	publishGroup(t, c, "k", "m1", "m2", "m3")
	clock := newFakeClock(time.Now())
	r := receipts(t, c, clock, 5)
	in := func(s *shardq.ReceiveSession) shardq.ReceiveRequest {
		t.Helper()
		if s == nil {
			t.Fatal("no session")
		}
		return shardq.ReceiveRequest{Session: s.ID, Visibility: 5 * time.Minute}
	}

	res, err := r.Receive(ctx, shardq.ReceiveRequest{Tenant: "t", Topic: "x", ConsumerGroup: "g", PartitionKey: "k", Hold: true, Visibility: 5 * time.Minute})
	if err != nil || !slices.Equal(ids(res.Messages), []string{"m1"}) || res.Session == nil || res.Session.PartitionKey != "k" {
		t.Fatalf("accept = %+v, %v", res, err)
	}
	s := res.Session
	if err := r.Ack(ctx, gref, res.Messages[0].Receipt); err != nil {
		t.Fatal(err)
	}
	mustReceive(t, r, shardq.ReceiveRequest{PartitionKey: "k"}) // the ack kept the group
	m2 := mustReceive(t, r, in(s), "m2")
	m2b := mustReceive(t, r, in(s), "m2") // from the cursor: unacked, it comes again
	if m2b[0].Attempt != m2[0].Attempt {
		t.Fatalf("a session's receive again is attempt %d, want %d", m2b[0].Attempt, m2[0].Attempt)
	}

	// A nack keeps the group; the message is due again in the session.
	if err := r.Nack(ctx, gref, m2b[0].Receipt, shardq.NackOptions{RetryAfter: time.Minute}); err != nil {
		t.Fatal(err)
	}
	mustReceive(t, r, shardq.ReceiveRequest{PartitionKey: "k"})
	mustReceive(t, r, in(s))
	clock.Advance(time.Minute)
	retried := mustReceive(t, r, in(s), "m2")
	if retried[0].Attempt != 2 {
		t.Fatalf("retry in the session is attempt %d, want 2", retried[0].Attempt)
	}

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

	// Renewed by a visibility change, the session outlasts its timeout.
	if stale, err := r.ChangeVisibility(ctx, gref, []string{s.ID}, 10*time.Minute); err != nil || len(stale) != 0 {
		t.Fatalf("renew = %v, %v", stale, err)
	}
	clock.Advance(7 * time.Minute)
	mustReceive(t, r, shardq.ReceiveRequest{PartitionKey: "k"})

	// Closed: the group goes to any receive; the session is over.
	if err := r.CloseSession(ctx, gref, s.ID); err != nil {
		t.Fatal(err)
	}
	other := mustReceive(t, r, shardq.ReceiveRequest{PartitionKey: "k", Max: 2}, "m2", "m3")
	if _, err := r.Receive(ctx, shardq.ReceiveRequest{Tenant: "t", Topic: "x", ConsumerGroup: "g", Session: s.ID}); !errors.Is(err, shardq.ErrStaleReceipt) {
		t.Fatalf("receive in a closed session = %v, want ErrStaleReceipt", err)
	}
	if _, err := r.GroupState(ctx, gref, s.ID); !errors.Is(err, shardq.ErrStaleReceipt) {
		t.Fatalf("state of a closed session = %v, want ErrStaleReceipt", err)
	}
	if err := r.CloseSession(ctx, gref, s.ID); !errors.Is(err, shardq.ErrStaleReceipt) {
		t.Fatalf("close a closed session = %v, want ErrStaleReceipt", err)
	}
	if err := r.Ack(ctx, gref, other[1].Receipt); err != nil {
		t.Fatal(err)
	}

	// A named group is accepted while empty, unless RequireReady; the
	// session's receive then waits for its message.
	if res, err := r.Receive(ctx, shardq.ReceiveRequest{Tenant: "t", Topic: "x", ConsumerGroup: "g", PartitionKey: "e", Hold: true, RequireReady: true}); err != nil || res.Session != nil {
		t.Fatalf("require_ready on an empty group = %+v, %v; want no session", res, err)
	}
	res, err = r.Receive(ctx, shardq.ReceiveRequest{Tenant: "t", Topic: "x", ConsumerGroup: "g", PartitionKey: "e", Hold: true, Visibility: 5 * time.Minute})
	if err != nil || len(res.Messages) != 0 || res.Session == nil {
		t.Fatalf("accept an empty group = %+v, %v", res, err)
	}
	publishGroup(t, c, "e", "e1")
	mustReceive(t, r, shardq.ReceiveRequest{PartitionKey: "e"}) // held by the session
	mustReceive(t, r, in(res.Session), "e1")

	// Lapsed and taken by another receive, the session is lost.
	clock.Advance(6 * time.Minute)
	mustReceive(t, r, shardq.ReceiveRequest{PartitionKey: "e"}, "e1")
	if _, err := r.Receive(ctx, shardq.ReceiveRequest{Tenant: "t", Topic: "x", ConsumerGroup: "g", Session: res.Session.ID}); !errors.Is(err, shardq.ErrStaleReceipt) {
		t.Fatalf("receive in a session whose group was taken = %v, want ErrStaleReceipt", err)
	}

	for _, bad := range []shardq.ReceiveRequest{
		{Hold: true}, {Hold: true, Ungrouped: true}, {PartitionKey: "k", RequireReady: true}, {NextGroup: true, Hold: true, RequireReady: true},
		{Session: s.ID, PartitionKey: "k"}, {Session: s.ID, Hold: true}, {Session: other[0].Receipt}, {Session: "r2.x"},
	} {
		bad.Tenant, bad.Topic, bad.ConsumerGroup = "t", "x", "g"
		if _, err := r.Receive(ctx, bad); !errors.Is(err, shardq.ErrInvalid) {
			t.Errorf("receive %+v = %v, want ErrInvalid", bad, err)
		}
	}
	if err := r.Ack(ctx, gref, s.ID); !errors.Is(err, shardq.ErrInvalid) {
		t.Errorf("ack of a session id = %v, want ErrInvalid", err)
	}
	if _, err := r.GroupState(ctx, gref, other[0].Receipt); !errors.Is(err, shardq.ErrInvalid) {
		t.Errorf("state by a message's receipt = %v, want ErrInvalid", err)
	}
}
