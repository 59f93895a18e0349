// SPDX-License-Identifier: Apache-2.0

package conformance

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/testhook"
)

// Previous is what Upgrade needs of the previous release that this code
// no longer has: how the dialect stores a time, and a read of open claims
// as that release sent it.
type Previous struct {
	EncodeTime func(time.Time) any
	// ClaimRead selects message_offset of tenant ?'s open claims through
	// idx_claims_open, as the previous release's claims and advances did.
	ClaimRead string
}

// Upgrade checks the newest migration, 13 (a contract one), against state
// in flight. older and newer are drivers on one fresh, empty database;
// older embeds every migration but the newest, newer all of them.
//
// A member at schema 12 publishes ordered messages to two partitions,
// ungrouped ones, a delayed one and one that its handler dead-letters,
// and it is mid-partition (a handler holds a message of partition a) when
// the new release migrates. The ungrouped partition is as the previous
// release left it (this code claims only on schema 13): the cursor past
// u0 and u1, u2 to u4 and u7 acked (done rows), u5 held by a member, u6
// without a row (a claimer that failed), u8's claim expired (its member
// was killed) and u9 unclaimed. After the
// migration that release's claim read fails naming the index it forces,
// its ack of u5 still counts, the ordered member keeps working, the
// delayed message comes at its time, and with a member of the new release
// the group receives every message once (u6, u8 and u9 of the ungrouped
// ones), in order per partition, with the dead letter in the dead-letter
// topic; a new member resumes from the cursors left, the new schema
// serves receipts, and the previous release refuses the schema.
//
// older and newer are two drivers of one database; Upgrade makes older
// embed every migration but the newest (testhook.TrimMigrations), as the
// previous release did.
func Upgrade(t *testing.T, older, newer driver.Driver, prev Previous) {
	trim, ok := testhook.TrimMigrations[older.Name()]
	if !ok {
		t.Fatalf("driver %q registers no TrimMigrations", older.Name())
	}
	trim(older)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := older.Migrate(ctx); err != nil {
		t.Fatalf("migrate to the previous version: %v", err)
	}
	cur, latest, err := newer.SchemaVersion(ctx)
	if err != nil || cur != latest-1 || latest != 13 {
		t.Fatalf("before the upgrade: version %d of %d (%v); want 12 of 13 (a newer migration needs its own Upgrade)", cur, latest, err)
	}
	oldClient, err := shardq.NewClient(older, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer oldClient.Close()

	const perKey = 10
	var msgs []shardq.Message
	want := map[string][]string{} // partition key -> ids in order
	for _, key := range []string{"a", "b", ""} {
		for i := range perKey {
			id := fmt.Sprintf("%s%d", key, i)
			if key == "" {
				id = fmt.Sprintf("u%d", i)
			}
			msgs = append(msgs, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: key, ID: id, Payload: []byte(id)})
			want[key] = append(want[key], id)
		}
	}
	// Long enough to be pending when the migration ends, which takes
	// milliseconds (checked below).
	const delay = 5 * time.Second
	// By the wall clock, as NotBefore is judged (Round(0) drops the
	// monotonic reading): a clock step must not fail the test.
	due := time.Now().Add(delay).Round(0)
	msgs = append(msgs, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "d", ID: "delayed", Delay: delay},
		shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "p", ID: "poison"})
	want["d"] = []string{"delayed"}
	want[""] = []string{"u6", "u8", "u9"}
	published := mustPublish(t, oldClient, msgs...)
	ungrouped := map[string]int64{} // id -> offset
	for i, m := range msgs {
		if m.PartitionKey == "" {
			ungrouped[m.ID] = published[i].Offset
		}
	}
	previousRelease(ctx, t, older, prev, ungrouped)

	var mu sync.Mutex
	got := map[string][]string{}
	midPartition := newGate()
	handler := func(ctx context.Context, dl *shardq.Delivery) error {
		switch dl.ID {
		case "a5":
			if err := midPartition.hold(ctx); err != nil {
				return err
			}
		case "poison":
			return shardq.DeadLetter(errors.New("poison"))
		}
		if now := time.Now().Round(0); dl.ID == "delayed" && now.Before(due) {
			t.Errorf("the delayed message came %s before its time", due.Sub(now))
		}
		mu.Lock()
		got[dl.PartitionKey] = append(got[dl.PartitionKey], dl.ID)
		mu.Unlock()
		return nil
	}
	config := func(name string) shardq.SubscriberConfig {
		cfg := fastConfig("g", "x", []string{"t"}, handler)
		cfg.Name = name
		return cfg
	}
	// Ordered partitions only: this code claims ungrouped messages only on
	// schema 13.
	oldConfig := config("old")
	oldConfig.Take = shardq.TakeGrouped
	oldMember, err := oldClient.Subscribe(ctx, oldConfig)
	if err != nil {
		t.Fatal(err)
	}
	defer stopAll(t, oldMember)
	midPartition.waitHeld(t, "the old member's handler of a5")

	if applied, err := newer.Migrate(ctx); err != nil || len(applied) != 1 || applied[0] != latest {
		t.Fatalf("the upgrade applied %v (%v); want [%d]", applied, err, latest)
	}
	if !time.Now().Before(due) {
		t.Fatalf("the delayed message fell due before the migration ended (%s late): the test did not reach its state", time.Since(due))
	}
	// The previous release's claims and advances fail, naming the index
	// they force; its member's ack of the claim it holds still counts.
	if rows, err := newer.DB().QueryContext(ctx, prev.ClaimRead, "t"); err == nil {
		rows.Close()
		t.Fatal("the previous release's claim read ran on the new schema: its member would deliver acked messages again")
	} else if !strings.Contains(err.Error(), "idx_claims_open") {
		t.Fatalf("the previous release's claim read failed with %v; want an error naming idx_claims_open", err)
	}
	if r, err := newer.DB().ExecContext(ctx, "UPDATE queue_message_claims SET done = 1, updated_at = ? WHERE tenant = 't' AND consumer_group = 'g' AND topic = 'x' "+
		"AND message_offset = ? AND token = 42 AND owner = 'old#1' AND done = 0", prev.EncodeTime(time.Now()), ungrouped["u5"]); err != nil {
		t.Fatalf("the previous release's ack of u5: %v", err)
	} else if n, _ := r.RowsAffected(); n != 1 {
		t.Fatalf("the previous release's ack of u5 matched %d rows", n)
	}
	newClient, err := shardq.NewClient(newer, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer newClient.Close()
	newMember, err := newClient.Subscribe(ctx, config("new"))
	if err != nil {
		t.Fatal(err)
	}
	defer stopAll(t, newMember)
	midPartition.open()

	received := func(keys ...string) bool {
		mu.Lock()
		defer mu.Unlock()
		for _, k := range keys {
			if len(got[k]) < len(want[k]) {
				return false
			}
		}
		return true
	}
	waitFor(t, "every message", time.Minute, func() bool { return received("a", "b", "", "d") })
	waitFor(t, "the dead letter", time.Minute, func() bool { return len(fetchAll(t, newer, "t", "x.dlq", "p")) == 1 })

	mu.Lock()
	for _, k := range []string{"a", "b", "d"} {
		if !slices.Equal(got[k], want[k]) {
			t.Errorf("partition %q delivered %v, want %v (once each, in order)", k, got[k], want[k])
		}
	}
	if u := slices.Sorted(slices.Values(got[""])); !slices.Equal(u, want[""]) {
		t.Errorf("ungrouped delivered %v, want each of %v once (the others were done or held before the upgrade)", got[""], want[""])
	}
	mu.Unlock()
	if t.Failed() {
		return
	}

	// Both members stop; a new one resumes where they left off.
	stopAll(t, oldMember, newMember)
	mustPublish(t, newClient, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "a", ID: "after"})
	mu.Lock()
	clear(got)
	mu.Unlock()
	resumed, err := newClient.Subscribe(ctx, config("resumed"))
	if err != nil {
		t.Fatal(err)
	}
	defer stopAll(t, resumed)
	waitFor(t, "the message published after the upgrade", time.Minute, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got["a"]) > 0
	})
	// A replay from a lost cursor would come before it, in order.
	mu.Lock()
	if !slices.Equal(got["a"], []string{"after"}) || len(got["b"])+len(got[""]) > 0 {
		t.Errorf("a member started after the upgrade received %v; want only [after]", got)
	}
	mu.Unlock()

	rc, err := newClient.Receipts(&shardq.ReceiptOptions{Name: "upgraded"})
	if err != nil {
		t.Fatal(err)
	}
	mustPublish(t, newClient, shardq.Message{Tenant: "t", Topic: "y", PartitionKey: "r", ID: "r0"})
	res, err := rc.Receive(ctx, shardq.ReceiveRequest{Tenant: "t", Topic: "y", ConsumerGroup: "h", PartitionKey: "r", Max: 1})
	if err != nil || len(res.Messages) != 1 {
		t.Fatalf("receive on the new schema: %+v, %v", res, err)
	}
	if err := rc.Ack(ctx, shardq.GroupRef{Tenant: "t", Topic: "y", ConsumerGroup: "h"}, res.Messages[0].Receipt); err != nil {
		t.Fatalf("ack on the new schema: %v", err)
	}

	// Every ungrouped message is done: the cursor passes them all and no
	// claim row is left.
	g := driver.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}
	if cur, err := newer.AdvanceUngrouped(ctx, g, time.Now()); err != nil || cur != ungrouped["u9"] {
		t.Errorf("ungrouped cursor %d (%v), want %d", cur, err, ungrouped["u9"])
	}
	var left int
	if err := newer.DB().QueryRowContext(ctx, "SELECT COUNT(*) FROM queue_message_claims WHERE tenant = 't'").Scan(&left); err != nil || left != 0 {
		t.Errorf("%d claim rows left (%v), want none", left, err)
	}

	// The previous release refuses the schema (a pod of it that restarts
	// during the rollout stops with the error, as the CLI and serve do).
	if _, err := older.Migrate(ctx); !errors.Is(err, driver.ErrSchemaNewer) {
		t.Errorf("the previous release's Migrate on the new schema: %v; want ErrSchemaNewer", err)
	}
	if err := older.SchemaCompatible(ctx); !errors.Is(err, driver.ErrSchemaNewer) || !strings.Contains(err.Error(), "_contract") {
		t.Errorf("the previous release on the new schema: %v; want ErrSchemaNewer naming the contract migration", err)
	}
}

// previousRelease writes the ungrouped partition's state as the previous
// release left it (see Upgrade); offsets are the messages' by id.
func previousRelease(ctx context.Context, t *testing.T, d driver.Driver, prev Previous, offsets map[string]int64) {
	t.Helper()
	now := prev.EncodeTime(time.Now())
	if _, err := d.DB().ExecContext(ctx, "INSERT INTO queue_offsets (tenant, topic, partition_key, consumer_group, committed_offset, updated_at) "+
		"VALUES ('t', 'x', '', 'g', ?, ?)", offsets["u1"], now); err != nil {
		t.Fatal(err)
	}
	claim := func(id string, token int64, done int, visibleAt any) {
		if _, err := d.DB().ExecContext(ctx, "INSERT INTO queue_message_claims (tenant, consumer_group, topic, message_offset, owner, token, attempts, "+
			"visible_at, done, updated_at) VALUES ('t', 'g', 'x', ?, 'old#1', ?, 1, ?, ?, ?)", offsets[id], token, visibleAt, done, now); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"u2", "u3", "u4", "u7"} {
		claim(id, 41, 1, now)
	}
	claim("u5", 42, 0, prev.EncodeTime(time.Now().Add(time.Hour)))
	claim("u8", 43, 0, prev.EncodeTime(time.Now().Add(-time.Minute))) // its member was killed: expired
}
