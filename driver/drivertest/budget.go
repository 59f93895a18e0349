// SPDX-License-Identifier: Apache-2.0

package drivertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/shardq/shardq/driver"
)

var budgetTests = []struct {
	name string
	fn   func(*testing.T, Open)
}{
	{"FetchWithinByteBudget", testFetchWithin},
	{"ClaimWithinByteBudget", testClaimWithin},
	{"CommitReceivedStopsAtHead", testCommitReceived},
	{"CommitOffsetsAllOrNothing", testCommitOffsets},
	{"ClaimSettledOnlyByItsOwner", testClaimOwnerFence},
}

// budgetMessages publishes, to partition key, 10 messages of 100 bytes,
// one of 300 KB, then 5 of 100 bytes; it returns their payloads by id.
func budgetMessages(t *testing.T, d driver.Driver, key string, delayed bool) map[string][]byte {
	t.Helper()
	want := map[string][]byte{}
	var msgs []driver.InsertMessage
	add := func(id string, n int) {
		p := bytes.Repeat([]byte(id[:1]), n)
		want[id] = p
		msgs = append(msgs, driver.InsertMessage{Tenant: "t", Topic: "x", PartitionKey: key, ID: id, Payload: p, Headers: map[string]string{"h": id}})
	}
	for i := range 10 {
		add(fmt.Sprintf("a%02d", i), 100)
	}
	add("big", 300<<10)
	for i := range 5 {
		add(fmt.Sprintf("c%02d", i), 100)
	}
	if delayed {
		msgs[12].NotBefore = time.Now().Add(time.Hour) // c01: a placeholder claim row, not a delivery
	}
	for _, m := range msgs {
		mustInsert(t, d, m)
	}
	return want
}

func checkBodies(t *testing.T, what string, ms []driver.Message, want map[string][]byte) {
	t.Helper()
	for _, m := range ms {
		if !bytes.Equal(m.Payload, want[m.ID]) || m.Headers["h"] != m.ID {
			t.Fatalf("%s: message %s has a payload of %d bytes and headers %v; want %d bytes and h=%s", what, m.ID, len(m.Payload), m.Headers, len(want[m.ID]), m.ID)
		}
	}
}

// A read within a budget stops before the message that would pass it,
// always carries the first, and reads a large message's body whole.
func testFetchWithin(t *testing.T, open Open) {
	d := setup(t, open)
	ctx := context.Background()
	want := budgetMessages(t, d, "k", false)
	const budget = 200 << 10
	var after int64
	var ids []string
	for round := 0; round < 10 && len(ids) < len(want); round++ {
		ms, truncated, err := d.FetchWithin(ctx, driver.FetchWithinParams{Partition: driver.TopicPartition{Tenant: "t", Topic: "x", PartitionKey: "k"}, After: after, Limit: 20, Budget: budget})
		if err != nil || len(ms) == 0 {
			t.Fatalf("round %d: %d messages, %v", round, len(ms), err)
		}
		checkBodies(t, "FetchWithin", ms, want)
		var n int
		for _, m := range ms {
			n += len(m.Payload) + len(m.Headers["h"])
			ids = append(ids, m.ID)
		}
		if len(ms) > 1 && n > budget {
			t.Fatalf("round %d: %d bytes in %d messages, budget %d", round, n, len(ms), budget)
		}
		if more := len(ids) < len(want); truncated != more {
			t.Fatalf("round %d: truncated %v with %d of %d read", round, truncated, len(ids), len(want))
		}
		after = ms[len(ms)-1].Offset
	}
	if len(ids) != len(want) || ids[10] != "big" {
		t.Fatalf("read %v: want all %d in order, big alone at the 11th", ids, len(want))
	}
}

// A claim within a budget does the same for ungrouped messages, passes
// over no message, and leaves a delayed one its placeholder.
func testClaimWithin(t *testing.T, open Open) {
	d := setup(t, open)
	ctx := context.Background()
	want := budgetMessages(t, d, "", true)
	const budget = 200 << 10
	seen := map[string]int{}
	for round := 0; round < 10 && len(seen) < len(want)-1; round++ {
		cs, truncated, err := d.ClaimMessages(ctx, driver.ClaimMessagesParams{Group: driver.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, Owner: "m", Now: t0, Visibility: time.Hour, Limit: driver.ClaimLimit{Messages: 20, Bytes: budget}})
		if err != nil || len(cs) == 0 {
			t.Fatalf("round %d: %d claims, %v", round, len(cs), err)
		}
		var ms []driver.Message
		var n int
		for _, cl := range cs {
			ms = append(ms, cl.Message)
			seen[cl.Message.ID]++
			n += len(cl.Message.Payload) + len(cl.Message.Headers["h"])
		}
		if len(cs) > 1 && n > budget {
			t.Fatalf("round %d: %d bytes in %d claims, budget %d", round, n, len(cs), budget)
		}
		if more := len(seen) < len(want)-1; truncated != more {
			t.Fatalf("round %d: truncated %v with %d of %d claimed", round, truncated, len(seen), len(want)-1)
		}
		checkBodies(t, "ClaimMessages", ms, want)
		if err := d.AckClaims(ctx, cs, t0); err != nil {
			t.Fatal(err)
		}
	}
	for id := range want {
		if n := seen[id]; (id == "c01") != (n == 0) || n > 1 {
			t.Fatalf("message %s claimed %d times (claims %v)", id, n, seen)
		}
	}
	// The delayed one, when due.
	cs, _, err := d.ClaimMessages(ctx, driver.ClaimMessagesParams{Group: driver.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, Owner: "m", Now: time.Now().Add(2 * time.Hour), Visibility: time.Hour, Limit: driver.ClaimLimit{Messages: 20, Bytes: budget}}) // NotBefore counts from this process's clock
	if err != nil || len(cs) != 1 || cs[0].Message.ID != "c01" {
		t.Fatalf("when due: %+v, %v; want c01", cs, err)
	}
}

// A commit a client named stops at the head: past it, ErrPastHead and
// nothing changed, the lease not released either. With release, a commit
// frees the lease in its transaction.
func testCommitReceived(t *testing.T, open Open) {
	d := setup(t, open)
	ctx := context.Background()
	res := mustInsert(t, d, driver.InsertMessage{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "m1"}, driver.InsertMessage{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "m2"})
	ref := driver.PartitionRef{Tenant: "t", ConsumerGroup: "g", Topic: "x", PartitionKey: "k"}
	l, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: ref, Owner: "r#1", Now: t0, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	head := res[1].Offset
	if err := d.CommitReceived(ctx, driver.CommitReceivedParams{Lease: l, Offset: head + 1, Release: true, Now: t0}); !errors.Is(err, driver.ErrPastHead) {
		t.Fatalf("commit past the head: %v, want ErrPastHead", err)
	}
	if err := d.CommitReceived(ctx, driver.CommitReceivedParams{Lease: l, Offset: 9e18, Release: true, Now: t0}); !errors.Is(err, driver.ErrPastHead) {
		t.Fatalf("commit at 9e18: %v, want ErrPastHead", err)
	}
	other := l
	other.Token++
	if err := d.CommitReceived(ctx, driver.CommitReceivedParams{Lease: other, Offset: res[0].Offset, Release: true, Now: t0}); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("commit under another token: %v, want ErrLeaseLost", err)
	}
	if _, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: ref, Owner: "r#2", Now: t0, TTL: time.Minute}); !errors.Is(err, driver.ErrLeaseHeld) {
		t.Fatalf("another owner after refused commits with release: %v, want ErrLeaseHeld (nothing released)", err)
	}
	again, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: ref, Owner: "r#1", Now: t0, TTL: time.Minute})
	if err != nil || again.Committed != 0 {
		t.Fatalf("cursor after refused commits: %d, %v; want 0", again.Committed, err)
	}
	if err := d.CommitReceived(ctx, driver.CommitReceivedParams{Lease: again, Offset: res[0].Offset, Release: false, Now: t0}); err != nil {
		t.Fatalf("commit below the head: %v", err)
	}
	if _, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: ref, Owner: "r#2", Now: t0, TTL: time.Minute}); !errors.Is(err, driver.ErrLeaseHeld) {
		t.Fatalf("another owner after a commit without release: %v, want ErrLeaseHeld", err)
	}
	if err := d.CommitReceived(ctx, driver.CommitReceivedParams{Lease: again, Offset: head, Release: true, Now: t0}); err != nil {
		t.Fatalf("commit at the head: %v", err)
	}
	next, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: ref, Owner: "r#2", Now: t0, TTL: time.Minute})
	if err != nil || next.Committed != head {
		t.Fatalf("another owner after the commit with release: cursor %d, %v; want %d and the lease", next.Committed, err, head)
	}
}

// A claim is settled only under its token and owner, and a delayed
// message's placeholder row (owner "", token 0) by nobody.
func testClaimOwnerFence(t *testing.T, open Open) {
	d := setup(t, open)
	ctx := context.Background()
	res := mustInsert(t, d, driver.InsertMessage{Tenant: "t", Topic: "x", ID: "later", NotBefore: time.Now().Add(time.Hour)}, driver.InsertMessage{Tenant: "t", Topic: "x", ID: "now"})
	cs, _, err := d.ClaimMessages(ctx, driver.ClaimMessagesParams{Group: driver.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, Owner: "m#1", Now: t0, Visibility: time.Minute, Limit: driver.ClaimLimit{Messages: 10}})
	if err != nil || len(cs) != 1 || cs[0].Message.ID != "now" {
		t.Fatalf("claims %+v, %v; want now", cs, err)
	}
	placeholder := driver.Claim{ConsumerGroup: "g", Message: driver.Message{Tenant: "t", Topic: "x", Offset: res[0].Offset}}
	stranger := cs[0]
	stranger.Owner = "m#2"
	for name, cl := range map[string]driver.Claim{"placeholder": placeholder, "another owner": stranger} {
		if err := d.AckClaims(ctx, []driver.Claim{cl}, t0); !errors.Is(err, driver.ErrLeaseLost) {
			t.Fatalf("ack of the %s: %v, want ErrLeaseLost", name, err)
		}
		if err := d.RetryClaim(ctx, driver.RetryClaimParams{Claim: cl, RetryAt: t0, LastError: "x", Now: t0}); !errors.Is(err, driver.ErrLeaseLost) {
			t.Fatalf("retry of the %s: %v, want ErrLeaseLost", name, err)
		}
		if err := d.ReleaseClaim(ctx, cl, t0); !errors.Is(err, driver.ErrLeaseLost) {
			t.Fatalf("release of the %s: %v, want ErrLeaseLost", name, err)
		}
		dlq := &driver.InsertMessage{Tenant: "t", Topic: "x.dlq", ID: "dl-" + name, CreatedAt: t0}
		if err := d.DeadLetterClaim(ctx, cl, dlq, t0); !errors.Is(err, driver.ErrLeaseLost) {
			t.Fatalf("dead-letter of the %s: %v, want ErrLeaseLost", name, err)
		}
	}
	if err := d.AckClaims(ctx, cs, t0); err != nil {
		t.Fatalf("ack by its owner: %v", err)
	}
}

// Several cursors commit in one call; when any lease is lost nothing is
// committed and the call says ErrLeaseLost.
func testCommitOffsets(t *testing.T, open Open) {
	d := setup(t, open)
	ctx := context.Background()
	a := mustInsert(t, d, driver.InsertMessage{Tenant: "t", Topic: "x", PartitionKey: "a", ID: "a1"}, driver.InsertMessage{Tenant: "t", Topic: "x", PartitionKey: "a", ID: "a2"})
	b := mustInsert(t, d, driver.InsertMessage{Tenant: "u", Topic: "x", PartitionKey: "b", ID: "b1"})
	refA := driver.PartitionRef{Tenant: "t", ConsumerGroup: "g", Topic: "x", PartitionKey: "a"}
	refB := driver.PartitionRef{Tenant: "u", ConsumerGroup: "g", Topic: "x", PartitionKey: "b"}
	la, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: refA, Owner: "m#1", Now: t0, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	lb, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: refB, Owner: "m#1", Now: t0, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	stale := lb
	stale.Token++
	if err := d.CommitOffsets(ctx, []driver.OffsetCommit{{Lease: la, Offset: a[0].Offset}, {Lease: stale, Offset: b[0].Offset}}, t0); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("with a lost lease: %v, want ErrLeaseLost", err)
	}
	cursor := func(l driver.Lease) int64 {
		t.Helper()
		if err := d.ReleaseLease(ctx, l, t0); err != nil {
			t.Fatal(err)
		}
		again, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: l.PartitionRef, Owner: "m#1", Now: t0, TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if err := d.ReleaseLease(ctx, again, t0); err != nil {
			t.Fatal(err)
		}
		return again.Committed
	}
	if ca, cb := cursor(la), cursor(lb); ca != 0 || cb != 0 {
		t.Fatalf("cursors after the refused call: %d, %d; want 0, 0", ca, cb)
	}
	la, _ = d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: refA, Owner: "m#1", Now: t0, TTL: time.Minute})
	lb, _ = d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: refB, Owner: "m#1", Now: t0, TTL: time.Minute})
	if err := d.CommitOffsets(ctx, []driver.OffsetCommit{{Lease: lb, Offset: b[0].Offset}, {Lease: la, Offset: a[1].Offset}}, t0); err != nil {
		t.Fatal(err)
	}
	if ca, cb := cursor(la), cursor(lb); ca != a[1].Offset || cb != b[0].Offset {
		t.Fatalf("cursors %d, %d; want %d, %d", ca, cb, a[1].Offset, b[0].Offset)
	}
}
