// SPDX-License-Identifier: Apache-2.0

package drivertest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
)

// Upgrade checks the newest migration against state in flight. older and
// newer are drivers on one fresh, empty database; older embeds every
// migration but the newest, newer all of them, as the previous and the
// new release do.
//
// A member of the previous release works on the previous schema: it
// publishes ordered messages to two partitions, ungrouped ones, a delayed
// one and one that its handler dead-letters, and it is mid-partition (a
// handler holds a message of partition a) and holds an ungrouped claim
// (another handler holds one) when the new release migrates. Then the old
// member must keep working, the delayed message must come at its time,
// and together with a member of the new release the group must receive
// every message once, in order per partition, with the dead letter in
// the dead-letter topic; a new member resumes from the cursors the old
// one left, and the new schema serves receipts.
func Upgrade(t *testing.T, older, newer driver.Driver) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := older.Migrate(ctx); err != nil {
		t.Fatalf("migrate to the previous version: %v", err)
	}
	cur, latest, err := newer.SchemaVersion(ctx)
	if err != nil || cur != latest-1 {
		t.Fatalf("before the upgrade: version %d of %d (%v); want %d", cur, latest, err, latest-1)
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
	mustPublish(t, oldClient, msgs...)

	var mu sync.Mutex
	got := map[string][]string{}
	midPartition, claimHeld := newGate(), newGate()
	handler := func(ctx context.Context, dl *shardq.Delivery) error {
		switch dl.ID {
		case "a5":
			if err := midPartition.hold(ctx); err != nil {
				return err
			}
		case "u5":
			if err := claimHeld.hold(ctx); err != nil {
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
	oldMember, err := oldClient.Subscribe(ctx, config("old"))
	if err != nil {
		t.Fatal(err)
	}
	defer stopAll(t, oldMember)
	midPartition.waitHeld(t, "the old member's handler of a5")
	claimHeld.waitHeld(t, "the old member's handler of u5")

	if applied, err := newer.Migrate(ctx); err != nil || len(applied) != 1 || applied[0] != latest {
		t.Fatalf("the upgrade applied %v (%v); want [%d]", applied, err, latest)
	}
	if !time.Now().Before(due) {
		t.Fatalf("the delayed message fell due before the migration ended (%s late): the test did not reach its state", time.Since(due))
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
	claimHeld.open()

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
	if u := slices.Sorted(slices.Values(got[""])); !slices.Equal(u, slices.Sorted(slices.Values(want[""]))) {
		t.Errorf("ungrouped delivered %v, want each of %v once", got[""], want[""])
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

	// A member of the previous release that restarts during the rollout
	// (Migrate at start, then work) runs on the new schema: the newest
	// migration only adds (expand, then contract).
	if applied, err := older.Migrate(ctx); err != nil || len(applied) != 0 {
		t.Fatalf("the previous release's Migrate on the new schema: %v, %v; want nothing applied and no error", applied, err)
	}
	if err := older.SchemaCompatible(ctx); err != nil {
		t.Fatalf("the previous release on the new schema: %v", err)
	}
	restarted, err := shardq.NewClient(older, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer restarted.Close()
	mustPublish(t, restarted, shardq.Message{Tenant: "t", Topic: "y", PartitionKey: "r", ID: "r1"})
	orc, err := restarted.Receipts(&shardq.ReceiptOptions{Name: "restarted"})
	if err != nil {
		t.Fatal(err)
	}
	res, err = orc.Receive(ctx, shardq.ReceiveRequest{Tenant: "t", Topic: "y", ConsumerGroup: "h", PartitionKey: "r", Max: 1})
	if err != nil || len(res.Messages) != 1 || res.Messages[0].ID != "r1" {
		t.Fatalf("the previous release's receive on the new schema: %+v, %v", res, err)
	}
}
