// SPDX-License-Identifier: Apache-2.0

package drivertest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
)

// Static membership (Kafka's group.instance.id): a process that starts
// with the InstanceID of a running one takes over its leases, with new
// tokens, and its place in the group, so that the other member keeps
// every partition it had, with the same tokens (no rebalance); the
// earlier process is fenced: it stops by itself, and Stop says so. The
// group then goes on delivering every partition, in order.
func testStaticMembership(t *testing.T, open Open) {
	d, c := setup(t, open, nil)
	ctx := context.Background()
	const keys = 8
	publish := func(round int) {
		var msgs []shardq.Message
		for k := range keys {
			msgs = append(msgs, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: fmt.Sprintf("k%d", k), ID: fmt.Sprintf("k%d-%d", k, round)})
		}
		mustPublish(t, c, msgs...)
	}
	var mu sync.Mutex
	got := map[string][]string{} // key -> ids, in delivery order
	cfgFor := func(instance string) shardq.SubscriberConfig {
		cfg := fastConfig("g", "x", []string{"t"}, func(_ context.Context, m *shardq.Delivery) error {
			mu.Lock()
			got[m.PartitionKey] = append(got[m.PartitionKey], m.ID)
			mu.Unlock()
			return nil
		})
		cfg.InstanceID, cfg.IdleRelease = instance, 10*time.Minute // leases stay while the test looks
		return cfg
	}
	scope := driver.GroupScope{Tenants: []string{"t"}, Topic: "x", ConsumerGroup: "g"}
	owners := func() map[string]driver.Lease { // key -> lease
		ls, err := d.HeldLeases(ctx, scope)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]driver.Lease{}
		for _, l := range ls {
			out[l.PartitionKey] = l
		}
		return out
	}
	of := func(ls map[string]driver.Lease, owner string) map[string]int64 { // key -> token
		out := map[string]int64{}
		for k, l := range ls {
			if l.Owner == owner {
				out[k] = l.Token
			}
		}
		return out
	}
	a1, err := c.Subscribe(ctx, cfgFor("a"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.Subscribe(ctx, cfgFor("b"))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Stop(ctx)
	waitFor(t, "both members' heartbeats", 30*time.Second, func() bool {
		ms, err := d.Subscribers(ctx, scope)
		return err == nil && len(ms) == 2
	})
	publish(0) // both see the work at once, and split it
	waitFor(t, "an even split", 30*time.Second, func() bool {
		ls := owners()
		return len(of(ls, a1.ID())) == keys/2 && len(of(ls, b.ID())) == keys/2
	})
	before := owners()
	aKeys, bTokens := slices.Sorted(maps.Keys(of(before, a1.ID()))), of(before, b.ID())

	a2, err := c.Subscribe(ctx, cfgFor("a"))
	if err != nil {
		t.Fatal(err)
	}
	defer a2.Stop(ctx)
	select {
	case <-a1.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the earlier process of instance a was not fenced")
	}
	if err := a1.Stop(ctx); !errors.Is(err, shardq.ErrInstanceFenced) {
		t.Fatalf("the fenced process's Stop = %v, want ErrInstanceFenced", err)
	}
	waitFor(t, "the later process holding instance a's partitions", 30*time.Second, func() bool {
		return slices.Equal(slices.Sorted(maps.Keys(of(owners(), a2.ID()))), aKeys)
	})
	after := owners()
	if got := of(after, b.ID()); !maps.Equal(got, bTokens) {
		t.Fatalf("member b's leases moved: %v, before %v", got, bTokens)
	}
	for _, k := range aKeys {
		if after[k].Token <= before[k].Token {
			t.Fatalf("partition %s: token %d after the takeover, %d before: the earlier process is not fenced", k, after[k].Token, before[k].Token)
		}
	}
	members, err := d.Subscribers(ctx, scope)
	if err != nil || len(members) != 2 {
		t.Fatalf("heartbeat rows %+v (%v): want b and the later process of a", members, err)
	}

	publish(1)
	waitFor(t, "every message delivered", 30*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for k := range keys {
			if ids := got[fmt.Sprintf("k%d", k)]; len(ids) == 0 || ids[len(ids)-1] != fmt.Sprintf("k%d-1", k) {
				return false
			}
		}
		return true
	})
	// Partitions of b: each message once. Of a: in order; the earlier
	// process's last cursor commit may have been fenced out, and then
	// the later one delivers what it had handled again (at least once).
	mu.Lock()
	for k, ids := range got {
		want := []string{k + "-0", k + "-1"}
		if _, ofB := bTokens[k]; !ofB {
			ids = slices.Compact(slices.Clone(ids))
		}
		if !slices.Equal(ids, want) {
			t.Errorf("partition %s delivered %v, want %v in order (b's once)", k, got[k], want)
		}
	}
	mu.Unlock()

	for _, bad := range []shardq.SubscriberConfig{
		{InstanceID: "a\x00"},
		{InstanceID: string(make([]byte, 247))},
		{InstanceID: "a", Take: shardq.TakeUngrouped},
	} {
		cfg := cfgFor(bad.InstanceID)
		cfg.Take = bad.Take
		if _, err := c.Subscribe(ctx, cfg); !errors.Is(err, shardq.ErrInvalid) {
			t.Errorf("Subscribe with instance id %q take %v = %v, want ErrInvalid", bad.InstanceID, bad.Take, err)
		}
	}
}
