// SPDX-License-Identifier: Apache-2.0

package drivertest

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/shardq/shardq/driver"
)

var groupTests = []struct {
	name string
	fn   func(*testing.T, Open)
}{
	{"ReadyGroupsInOrderOverPages", testReadyGroupsOverPages},
	{"UngroupedAckDeletesAndTheMarkBoundsTheCursor", testUngroupedAckDeletes},
	{"UngroupedRowsOfSchema12AreHonoured", testUngroupedSchema12Rows},
	{"UngroupedClaimAfterItsCursorRowWent", testUngroupedCursorRowGone},
}

// ReadyGroups orders the free groups by their next message after the
// cursor, over more groups than it reads at a time, whatever their keys'
// order: here the keys run against the publish order, and a third of the
// groups consumed their first message, so that their next one is of a
// later publish.
func testReadyGroupsOverPages(t *testing.T, open Open) {
	d := setup(t, open)
	ctx := context.Background()
	const groups = 700
	key := func(i int) string { return fmt.Sprintf("k%04d", groups-i) }
	next := map[string]int64{}
	for pass := range 2 {
		for start := 0; start < groups; start += 100 {
			batch := make([]driver.InsertMessage, 100)
			for i := range batch {
				batch[i] = driver.InsertMessage{Tenant: "t", Topic: "x", PartitionKey: key(start + i), ID: fmt.Sprint(pass, "-", start+i)}
			}
			for i, r := range mustInsert(t, d, batch...) {
				if k := key(start + i); pass == 0 || (start+i)%3 == 0 {
					next[k] = r.Offset
				}
			}
		}
	}
	now := time.Now()
	for i := 0; i < groups; i += 3 {
		p := driver.PartitionRef{Tenant: "t", ConsumerGroup: "g", Topic: "x", PartitionKey: key(i)}
		l, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: p, Owner: "m", Now: now, TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		first, err := d.FetchAfter(ctx, driver.TopicPartition{Tenant: "t", Topic: "x", PartitionKey: key(i)}, 0, 1)
		if err != nil || len(first) != 1 {
			t.Fatalf("first message of %s: %v %v", key(i), first, err)
		}
		if err := d.CommitOffset(ctx, l, first[0].Offset, now); err != nil {
			t.Fatal(err)
		}
		if err := d.ReleaseLease(ctx, l, now); err != nil {
			t.Fatal(err)
		}
	}
	want := slices.Collect(maps.Keys(next))
	slices.SortFunc(want, func(a, b string) int { return cmp.Compare(next[a], next[b]) })
	for _, limit := range []int{5, 320, groups + 1} {
		got, err := d.ReadyGroups(ctx, driver.GroupScope{Tenants: []string{"t"}, Topic: "x", ConsumerGroup: "g"}, time.Now(), limit)
		if err != nil {
			t.Fatal(err)
		}
		if n := min(limit, groups); len(got) != n {
			t.Fatalf("limit %d: %d ready groups, want %d", limit, len(got), n)
		}
		for i, g := range got {
			if g.PartitionKey != want[i] || g.NextOffset != next[want[i]] {
				t.Fatalf("limit %d: ready group %d is %s at %d, want %s at %d", limit, i, g.PartitionKey, g.NextOffset, want[i], next[want[i]])
			}
		}
	}
}

// An ack deletes its claim row, and a message without one at or below the
// claim mark is done: the cursor passes it once every message below is
// done, and never passes an open claim.
func testUngroupedAckDeletes(t *testing.T, open Open) {
	d := setup(t, open)
	ctx := context.Background()
	g := driver.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}
	res := mustInsert(t, d, driver.InsertMessage{Tenant: "t", Topic: "x", ID: "u1"}, driver.InsertMessage{Tenant: "t", Topic: "x", ID: "u2"},
		driver.InsertMessage{Tenant: "t", Topic: "x", ID: "u3"}, driver.InsertMessage{Tenant: "t", Topic: "x", ID: "u4"})
	claims, _, err := d.ClaimMessages(ctx, driver.ClaimMessagesParams{Group: g, Owner: "a", Now: t0, Visibility: time.Hour, Limit: driver.ClaimLimit{Messages: 3}}) // u4 stays above the mark
	if err != nil || len(claims) != 3 {
		t.Fatalf("claimed %d, %v", len(claims), err)
	}
	rows := func() (n int) {
		t.Helper()
		if err := d.DB().QueryRowContext(ctx, "SELECT COUNT(*) FROM queue_message_claims WHERE tenant = 't'").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	advance := func(want int64, why string) {
		t.Helper()
		if cur, err := d.AdvanceUngrouped(ctx, g, t0); err != nil || cur != want {
			t.Fatalf("cursor %d (%v), want %d: %s", cur, err, want, why)
		}
	}
	if err := d.AckClaims(ctx, claims[1:2], t0); err != nil {
		t.Fatal(err)
	}
	if n := rows(); n != 2 {
		t.Fatalf("%d claim rows after acking one of three, want 2: an ack deletes its row", n)
	}
	advance(res[0].Offset-1, "u1 is still claimed")
	if err := d.AckClaims(ctx, claims[:1], t0); err != nil {
		t.Fatal(err)
	}
	advance(res[1].Offset, "u1 and u2 are done, u3 is claimed")
	if err := d.AckClaims(ctx, claims[2:], t0); err != nil {
		t.Fatal(err)
	}
	advance(res[2].Offset, "the three claimed are done, u4 is above the mark")
	if n := rows(); n != 0 {
		t.Fatalf("%d claim rows left once all are done", n)
	}
	again, _, err := d.ClaimMessages(ctx, driver.ClaimMessagesParams{Group: g, Owner: "b", Now: t0.Add(2 * time.Hour), Visibility: time.Hour, Limit: driver.ClaimLimit{Messages: 10}})
	if err != nil || len(again) != 1 || again[0].Message.ID != "u4" {
		t.Fatalf("claimed %+v (%v) after the acks; want u4 alone", again, err)
	}
}

// Schema 12 kept acked rows (done = 1) until the cursor passed them, and
// a claimer that failed could leave a message without a row below the
// highest claim. After the migration the mark is the cursor, and claims
// walk up from it: a held claim stays its holder's, done rows stay done,
// and the message without a row is claimed, each once. An expired claim
// of schema 12 is claimed again only once the walk has passed it: acked
// before that, its row would be gone above the mark, and the walk would
// take its message as new.
func testUngroupedSchema12Rows(t *testing.T, open Open) {
	d := setup(t, open)
	ctx := context.Background()
	g := driver.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}
	var msgs []driver.InsertMessage
	for i := range 6 {
		msgs = append(msgs, driver.InsertMessage{Tenant: "t", Topic: "x", ID: fmt.Sprintf("u%d", i)})
	}
	res := mustInsert(t, d, msgs...)
	claims, _, err := d.ClaimMessages(ctx, driver.ClaimMessagesParams{Group: g, Owner: "a", Now: t0, Visibility: time.Hour, Limit: driver.ClaimLimit{Messages: 5}})
	if err != nil || len(claims) != 5 {
		t.Fatalf("claimed %d, %v", len(claims), err)
	}
	// u0 held until t0+1h, u4's claim expired (visible since the claim),
	// u1 and u3 done, u2 without a row, u5 never claimed.
	for _, q := range []struct {
		stmt string
		args []any
	}{
		{"UPDATE queue_message_claims SET done = 1 WHERE tenant = ? AND message_offset IN (?, ?)", []any{"t", res[1].Offset, res[3].Offset}},
		{"UPDATE queue_message_claims SET visible_at = updated_at WHERE tenant = ? AND message_offset = ?", []any{"t", res[4].Offset}},
		{"DELETE FROM queue_message_claims WHERE tenant = ? AND message_offset = ?", []any{"t", res[2].Offset}},
		{"UPDATE queue_offsets SET claimed_offset = NULL WHERE tenant = ?", []any{"t"}},
	} {
		if _, err := d.DB().ExecContext(ctx, q.stmt, q.args...); err != nil {
			t.Fatal(err)
		}
	}
	got := map[string]int{}
	var order []string
	claimAll := func(at time.Time) {
		t.Helper()
		for dry := 0; dry < 3; { // rows of schema 12 above the mark take rounds
			again, _, err := d.ClaimMessages(ctx, driver.ClaimMessagesParams{Group: g, Owner: "b", Now: at, Visibility: time.Hour, Limit: driver.ClaimLimit{Messages: 1}})
			if err != nil {
				t.Fatal(err)
			}
			if len(again) == 0 {
				dry++
				continue
			}
			for _, cl := range again {
				got[cl.Message.ID]++
				order = append(order, cl.Message.ID)
			}
			if err := d.AckClaims(ctx, again, at); err != nil {
				t.Fatal(err)
			}
		}
	}
	claimAll(t0.Add(time.Second))
	if len(got) != 3 || got["u2"] != 1 || got["u4"] != 1 || got["u5"] != 1 {
		t.Fatalf("claimed %v after the migration; want u2, u4 and u5 once each: u0 is held, u1 and u3 done", order)
	}
	if cur, err := d.AdvanceUngrouped(ctx, g, t0.Add(time.Second)); err != nil || cur != res[0].Offset-1 {
		t.Fatalf("cursor %d (%v), want %d: u0 is held", cur, err, res[0].Offset-1)
	}
	clear(got)
	order = nil
	claimAll(t0.Add(2 * time.Hour))
	if len(got) != 1 || got["u0"] != 1 {
		t.Fatalf("claimed %v once u0's claim expired; want u0 once", order)
	}
	if cur, err := d.AdvanceUngrouped(ctx, g, t0.Add(2*time.Hour)); err != nil || cur != res[5].Offset {
		t.Fatalf("cursor %d (%v), want %d once all six are done", cur, err, res[5].Offset)
	}
}

// A member remembers that a group's cursor row (the claim mark's) is
// there; another process may remove it (a drained partition's removal,
// the group's deletion). The next claim then adds it again instead of
// failing.
func testUngroupedCursorRowGone(t *testing.T, open Open) {
	d := setup(t, open)
	ctx := context.Background()
	g := driver.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}
	mustInsert(t, d, driver.InsertMessage{Tenant: "t", Topic: "x", ID: "u1"})
	claims, _, err := d.ClaimMessages(ctx, driver.ClaimMessagesParams{Group: g, Owner: "a", Now: t0, Visibility: time.Hour, Limit: driver.ClaimLimit{Messages: 10}})
	if err != nil || len(claims) != 1 {
		t.Fatalf("claimed %d, %v", len(claims), err)
	}
	if err := d.AckClaims(ctx, claims, t0); err != nil {
		t.Fatal(err)
	}
	// As retention's removal of the drained partition leaves it.
	for _, stmt := range []string{"DELETE FROM queue_messages WHERE tenant = 't'", "DELETE FROM queue_offsets WHERE tenant = 't'"} {
		if _, err := d.DB().ExecContext(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	mustInsert(t, d, driver.InsertMessage{Tenant: "t", Topic: "x", ID: "u2"})
	again, _, err := d.ClaimMessages(ctx, driver.ClaimMessagesParams{Group: g, Owner: "a", Now: t0, Visibility: time.Hour, Limit: driver.ClaimLimit{Messages: 10}})
	if err != nil || len(again) != 1 || again[0].Message.ID != "u2" {
		t.Fatalf("claimed %+v (%v) after the cursor row went; want u2", again, err)
	}
}
