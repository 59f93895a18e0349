// SPDX-License-Identifier: Apache-2.0

package drivertest

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/shardq/shardq/driver"
)

var discoveryTests = []struct {
	name string
	fn   func(*testing.T, Open)
}{
	{"DiscoveryReadsWhatMoved", testDiscoveryReadsWhatMoved},
}

// stampGap lets the wall clock move past the head stamps written so far
// (DATETIME(6) and SQLite's microseconds), so that a time taken now
// separates them from the next.
func stampGap() time.Time {
	time.Sleep(2 * time.Millisecond)
	t := time.Now()
	time.Sleep(2 * time.Millisecond)
	return t
}

// testDiscoveryReadsWhatMoved checks the reads of incremental discovery:
// partitions with work whose head moved since a time, partitions with work
// among named ones, and the held leases only.
func testDiscoveryReadsWhatMoved(t *testing.T, open Open) {
	d := setup(t, open)
	ctx := context.Background()
	heads := map[string]int64{}
	publish := func(tenant, key string) {
		heads[tenant+"/"+key] = mustInsert(t, d, driver.InsertMessage{Tenant: tenant, Topic: "orders", PartitionKey: key})[0].Offset
	}
	names := func(ps []driver.Partition, err error) []string {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, p := range ps {
			out = append(out, fmt.Sprintf("%s/%s@%d", p.Tenant, p.PartitionKey, p.CommittedOffset))
		}
		slices.Sort(out) // the reads promise no order
		return out
	}
	publish("a", "k1")
	publish("a", "k2")
	publish("b", "k1")
	t0 := stampGap()
	publish("a", "k3")
	publish("c", "k1") // a tenant not asked for
	moved := func(since time.Time) []string {
		return names(d.PartitionsMovedSince(ctx, driver.GroupScope{Tenants: []string{"a", "b"}, Topic: "orders", ConsumerGroup: "g"}, since))
	}
	if got, want := moved(t0), []string{"a/k3@0"}; !slices.Equal(got, want) {
		t.Fatalf("moved since t0 = %v, want %v", got, want)
	}
	if got, want := moved(t0.Add(-time.Hour)), []string{"a/k1@0", "a/k2@0", "a/k3@0", "b/k1@0"}; !slices.Equal(got, want) {
		t.Fatalf("moved since an hour ago = %v, want %v", got, want)
	}
	if got := names(d.PartitionsMovedSince(ctx, driver.GroupScope{Tenants: nil, Topic: "orders", ConsumerGroup: "g"}, t0)); len(got) != 0 {
		t.Fatalf("an empty tenant list returned %v", got)
	}
	// A cursor at the head leaves no work; a rewound one gives work and
	// stamps the head row, so that it counts as moved.
	if err := d.ResetOffset(ctx, driver.PartitionRef{Tenant: "a", Topic: "orders", PartitionKey: "k1", ConsumerGroup: "g"}, heads["a/k1"]); err != nil {
		t.Fatal(err)
	}
	of := func(keys ...string) []string {
		return names(d.PartitionsWithWorkOf(ctx, driver.GroupScope{Tenants: []string{"a"}, Topic: "orders", ConsumerGroup: "g"}, keys))
	}
	if got, want := of("k1", "k2", "k3", "absent"), []string{"a/k2@0", "a/k3@0"}; !slices.Equal(got, want) {
		t.Fatalf("work of named partitions = %v, want %v", got, want)
	}
	t1 := stampGap()
	if got := moved(t1); len(got) != 0 {
		t.Fatalf("moved since t1 = %v, want none", got)
	}
	if err := d.ResetOffset(ctx, driver.PartitionRef{Tenant: "b", Topic: "orders", PartitionKey: "k1", ConsumerGroup: "g"}, heads["b/k1"]-1); err != nil {
		t.Fatal(err)
	}
	if got, want := moved(t1), []string{fmt.Sprintf("b/k1@%d", heads["b/k1"]-1)}; !slices.Equal(got, want) {
		t.Fatalf("after rewinding b/k1, moved since t1 = %v, want %v", got, want)
	}

	// Held leases: a released lease row stays, but is not held.
	now := time.Now()
	ref := func(key string) driver.PartitionRef {
		return driver.PartitionRef{Tenant: "a", ConsumerGroup: "g", Topic: "orders", PartitionKey: key}
	}
	held, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: ref("k2"), Owner: "m1", Now: now, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	freed, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: ref("k3"), Owner: "m1", Now: now, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.ReleaseLease(ctx, freed, now); err != nil {
		t.Fatal(err)
	}
	all, err := d.ListLeases(ctx, driver.GroupScope{Tenants: []string{"a"}, Topic: "orders", ConsumerGroup: "g"})
	if err != nil || len(all) != 2 {
		t.Fatalf("ListLeases = %v, %v; want the held and the free row", all, err)
	}
	hs, err := d.HeldLeases(ctx, driver.GroupScope{Tenants: []string{"a", "b"}, Topic: "orders", ConsumerGroup: "g"})
	if err != nil || len(hs) != 1 || hs[0].PartitionKey != "k2" || hs[0].Owner != "m1" || hs[0].Token != held.Token {
		t.Fatalf("HeldLeases = %v, %v; want only k2's, held by m1", hs, err)
	}
}
