// SPDX-License-Identifier: Apache-2.0

package drivertest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/shardq/shardq/driver"
)

var lifecycleTests = []struct {
	name string
	fn   func(*testing.T, Open)
}{
	{"StartPositionLatest", testStartPositionLatest},
	{"UnreadPartitionsCounted", testUnreadPartitionsCounted},
	{"DeleteGroup", testDeleteGroup},
	{"RemovalPassesHeldPartitionsWithoutWaiting", testRemovalPassesHeldPartitionsWithoutWaiting},
}

// testRemovalPassesHeldPartitionsWithoutWaiting: a retention pass leaves
// a drained partition whose lease another member holds, and does not wait
// for that holder's transaction in flight to do so (nor, frozen inside
// its own, hold the holder's row): docs/leases.md, "Bounded waits". A
// drained partition nobody holds goes.
func testRemovalPassesHeldPartitionsWithoutWaiting(t *testing.T, open Open) {
	d := setup(t, open)
	ctx := context.Background()
	for _, m := range mustInsert(t, d, driver.InsertMessage{Tenant: "t", Topic: "x", PartitionKey: "held", ID: "a"},
		driver.InsertMessage{Tenant: "t", Topic: "x", PartitionKey: "free", ID: "b"}) {
		if _, err := d.DeleteMessage(ctx, driver.MessageRef{Tenant: "t", Topic: "x", PartitionKey: m.PartitionKey, ID: m.ID}); err != nil {
			t.Fatal(err)
		}
	}
	held := driver.PartitionRef{Tenant: "t", ConsumerGroup: "g", Topic: "x", PartitionKey: "held"}
	now := time.Now()
	a, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: held, Owner: "sub-a", Now: now, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	claim, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: driver.PartitionRef{Tenant: "t", ConsumerGroup: driver.RetentionGroup, Topic: "x"},
		Owner: "pass", Now: now, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := d.BeginWrite(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if err := d.InTx(tx).CommitOffset(ctx, a, 0, now); err != nil { // fences: the holder's row is locked
		t.Fatal(err)
	}
	wait, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	removed, err := d.RemovePartitions(wait, claim, driver.RemovePartitionsRequest{Tenant: "t", Topic: "x", ConsumerGroups: []string{"g"},
		PartitionKeys: []string{"held"}, IdleBefore: now.Add(time.Hour), Now: now})
	if err != nil || len(removed) != 0 {
		t.Fatalf("removal of a held partition while its holder's transaction runs: removed %v, %v; want none, at once", removed, err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	removed, err = d.RemovePartitions(ctx, claim, driver.RemovePartitionsRequest{Tenant: "t", Topic: "x", ConsumerGroups: []string{"g"},
		PartitionKeys: []string{"held", "free"}, IdleBefore: now.Add(time.Hour), Now: now})
	if err != nil || fmt.Sprint(removed) != "[free]" {
		t.Fatalf("removal of a held and a free drained partition: removed %v, %v; want [free]", removed, err)
	}
}

// testStartPositionLatest: a group made with the latest start position
// reads only what is published after it, in old partitions and new ones;
// one made with the earliest reads everything; a group that already has
// a cursor keeps reading from it whatever a new member asks.
func testStartPositionLatest(t *testing.T, open Open) {
	d := setup(t, open)
	ctx := context.Background()
	old := mustInsert(t, d, driver.InsertMessage{Tenant: "t", Topic: "x", PartitionKey: "k1"}, driver.InsertMessage{Tenant: "t", Topic: "x"})
	if err := d.RegisterGroup(ctx, driver.GroupScope{Tenants: []string{"t"}, Topic: "x", ConsumerGroup: "late"}, true, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := d.RegisterGroup(ctx, driver.GroupScope{Tenants: []string{"t"}, Topic: "x", ConsumerGroup: "early"}, false, time.Now()); err != nil {
		t.Fatal(err)
	}
	if ps, err := d.PartitionsWithWork(ctx, driver.GroupScope{Tenants: []string{"t"}, Topic: "x", ConsumerGroup: "late"}); err != nil || len(ps) != 0 {
		t.Fatalf("work of a latest group before any new message = %+v, %v", ps, err)
	}
	if rs, err := d.ReadyGroups(ctx, driver.GroupScope{Tenants: []string{"t"}, Topic: "x", ConsumerGroup: "late"}, time.Now(), 10); err != nil || len(rs) != 0 {
		t.Fatalf("ready groups of a latest group before any new message = %+v, %v", rs, err)
	}
	if cs, _, err := d.ClaimMessages(ctx, driver.ClaimMessagesParams{Group: driver.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "late"}, Owner: "m", Now: time.Now(), Visibility: time.Minute, Limit: driver.ClaimLimit{Messages: 10}}); err != nil || len(cs) != 0 {
		t.Fatalf("claims of a latest group before any new message = %+v, %v", cs, err)
	}
	fresh := mustInsert(t, d, driver.InsertMessage{Tenant: "t", Topic: "x", PartitionKey: "k1"}, driver.InsertMessage{Tenant: "t", Topic: "x", PartitionKey: "k2"},
		driver.InsertMessage{Tenant: "t", Topic: "x"})
	for _, k := range []string{"k1", "k2"} {
		l, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: driver.PartitionRef{Tenant: "t", ConsumerGroup: "late", Topic: "x", PartitionKey: k}, Owner: "m", Now: time.Now(), TTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		got, err := d.FetchAfter(ctx, driver.TopicPartition{Tenant: "t", Topic: "x", PartitionKey: k}, l.Committed, 10)
		want := fresh[0].Offset
		if k == "k2" {
			want = fresh[1].Offset
		}
		if err != nil || len(got) != 1 || got[0].Offset != want {
			t.Fatalf("latest group reads %s after %d: %+v, %v; want only %d", k, l.Committed, got, err, want)
		}
	}
	cs, _, err := d.ClaimMessages(ctx, driver.ClaimMessagesParams{Group: driver.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "late"}, Owner: "m", Now: time.Now(), Visibility: time.Minute, Limit: driver.ClaimLimit{Messages: 10}})
	if err != nil || len(cs) != 1 || cs[0].Message.Offset != fresh[2].Offset {
		t.Fatalf("latest group claims %+v, %v; want only the new ungrouped message", cs, err)
	}
	if got := len(fetchAll(t, d, "t", "x", "k1")); got != 2 {
		t.Fatalf("k1 holds %d messages", got)
	}
	l, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: driver.PartitionRef{Tenant: "t", ConsumerGroup: "early", Topic: "x", PartitionKey: "k1"}, Owner: "m", Now: time.Now(), TTL: ttl})
	if err != nil || l.Committed != 0 {
		t.Fatalf("earliest group starts after %d, %v; want 0", l.Committed, err)
	}
	// A group with a cursor (made before the registry existed, say) is
	// not new: latest does not move it.
	if err := d.CommitOffset(ctx, l, old[0].Offset, time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := d.DB().ExecContext(ctx, "DELETE FROM queue_consumer_groups WHERE tenant = ? AND consumer_group = ?", "t", "early"); err != nil {
		t.Fatal(err)
	}
	if err := d.RegisterGroup(ctx, driver.GroupScope{Tenants: []string{"t"}, Topic: "x", ConsumerGroup: "early"}, true, time.Now()); err != nil {
		t.Fatal(err)
	}
	if ps, err := d.PartitionsWithWork(ctx, driver.GroupScope{Tenants: []string{"t"}, Topic: "x", ConsumerGroup: "early"}); err != nil || len(ps) != 3 {
		t.Fatalf("work of an existing group asked to start latest = %+v, %v; want k1, k2 and the ungrouped partition", ps, err)
	}
}

// testUnreadPartitionsCounted: the partitions a group has no cursor for
// are listed with their lag from where the group starts.
func testUnreadPartitionsCounted(t *testing.T, open Open) {
	d := setup(t, open)
	ctx := context.Background()
	mustInsert(t, d, driver.InsertMessage{Tenant: "t", Topic: "x", PartitionKey: "a"}, driver.InsertMessage{Tenant: "t", Topic: "x", PartitionKey: "b"},
		driver.InsertMessage{Tenant: "t", Topic: "x", PartitionKey: "b"}, driver.InsertMessage{Tenant: "t", Topic: "x", PartitionKey: "c"})
	Drain(t, d, time.Now(), "g", "a")
	rows, err := d.UnreadPartitions(ctx, driver.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, 100)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range rows {
		got = append(got, fmt.Sprintf("%s:%d:%v", r.PartitionKey, r.Lag, r.NoCursor))
	}
	if fmt.Sprint(got) != "[b:2:true c:1:true]" {
		t.Fatalf("unread partitions = %v, want b with 2 and c with 1", got)
	}
}

// testDeleteGroup: a group with a live member or lease is not deleted
// unless forced; forced, its members' tokens are void; deleted, none of
// its rows is left and the other groups are untouched.
func testDeleteGroup(t *testing.T, open Open) {
	clock := newFakeClock(time.Now())
	d := setup(t, open)
	ctx := context.Background()
	res := mustInsert(t, d, driver.InsertMessage{Tenant: "t", Topic: "x", PartitionKey: "k", CreatedAt: clock.Now()}, driver.InsertMessage{Tenant: "t", Topic: "x", PartitionKey: "k", CreatedAt: clock.Now()})
	for _, g := range []string{"g", "other"} {
		if err := d.RegisterGroup(ctx, driver.GroupScope{Tenants: []string{"t"}, Topic: "x", ConsumerGroup: g}, false, clock.Now()); err != nil {
			t.Fatal(err)
		}
		Drain(t, d, clock.Now(), g, "k")
	}
	l, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: driver.PartitionRef{Tenant: "t", ConsumerGroup: "g", Topic: "x", PartitionKey: "k"}, Owner: "m", Now: clock.Now(), TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Heartbeat(ctx, driver.GroupScope{Tenants: []string{"t"}, Topic: "x", ConsumerGroup: "g"}, "m", clock.Now()); err != nil {
		t.Fatal(err)
	}
	err = d.DeleteGroup(ctx, driver.DeleteGroupParams{Group: driver.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, LiveSince: clock.Now().Add(-time.Minute), Now: clock.Now(), Force: false})
	var live *driver.GroupLiveError
	if !errors.As(err, &live) || !errors.Is(err, driver.ErrGroupLive) || live.Leases != 1 || len(live.Members) != 1 {
		t.Fatalf("delete of a live group = %v, want GroupLiveError naming one member and one lease", err)
	}
	if n := Committed(t, d, "t", "x", "k", "g"); n != res[1].Offset {
		t.Fatalf("refused delete moved the cursor to %d", n)
	}
	if err := d.DeleteGroup(ctx, driver.DeleteGroupParams{Group: driver.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, LiveSince: clock.Now().Add(-time.Minute), Now: clock.Now(), Force: true}); err != nil {
		t.Fatal(err)
	}
	if err := d.CommitOffset(ctx, l, res[1].Offset, clock.Now()); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("commit by a member of a deleted group = %v, want ErrLeaseLost", err)
	}
	groups, err := d.TopicGroups(ctx, "t", "x")
	if err != nil || fmt.Sprint(groups) != "[other]" {
		t.Fatalf("groups after the delete = %v, %v; want [other]", groups, err)
	}
	if n := Committed(t, d, "t", "x", "k", "other"); n != res[1].Offset {
		t.Fatalf("the other group's cursor is %d, want %d", n, res[1].Offset)
	}
	// Without members, no force is needed.
	if err := d.DeleteGroup(ctx, driver.DeleteGroupParams{Group: driver.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "other"}, LiveSince: clock.Now().Add(-time.Minute), Now: clock.Now(), Force: false}); err != nil {
		t.Fatal(err)
	}
	if n := RowCounts(t, d, "t"); n["queue_offsets"] != 0 || n["queue_partition_leases"] != 0 {
		t.Fatalf("rows left after deleting both groups: %v", n)
	}
}

// partitionTables are the tables whose rows belong to partitions: all of
// them must be empty for a tenant whose partitions were all removed
// (retention's own claim row, per topic, aside).
var partitionTables = []string{"queue_messages", "queue_partitions", "queue_offsets", "queue_partition_leases",
	"queue_delivery_state", "queue_group_state", "queue_message_claims"}

// RowCounts counts tenant's rows in each table whose rows belong to
// partitions (the keys of the map; retention's own lease rows aside).
func RowCounts(t *testing.T, d driver.Driver, tenant string) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, table := range partitionTables {
		var n int
		// Table names are this file's constants; the tenant is bound.
		q := "SELECT COUNT(*) FROM " + table + " WHERE tenant = ?"
		if table == "queue_partition_leases" {
			q += " AND consumer_group <> '" + driver.RetentionGroup + "'"
		}
		if err := d.DB().QueryRowContext(context.Background(), q, tenant).Scan(&n); err != nil {
			t.Fatalf("count %s: %v", table, err)
		}
		out[table] = n
	}
	return out
}

// Drain reads key of tenant "t" and topic "x" for group to its head under
// a lease and commits, leaving the lease released; it returns the lease it
// used.
func Drain(t *testing.T, d driver.Driver, now time.Time, group, key string) driver.Lease {
	t.Helper()
	ctx := context.Background()
	l, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: driver.PartitionRef{Tenant: "t", ConsumerGroup: group, Topic: "x", PartitionKey: key}, Owner: "m-" + group, Now: now, TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := d.FetchAfter(ctx, driver.TopicPartition{Tenant: "t", Topic: "x", PartitionKey: key}, l.Committed, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) > 0 {
		if err := d.CommitOffset(ctx, l, msgs[len(msgs)-1].Offset, now); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.ReleaseLease(ctx, l, now); err != nil {
		t.Fatal(err)
	}
	return l
}
