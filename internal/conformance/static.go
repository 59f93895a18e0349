// SPDX-License-Identifier: Apache-2.0

package conformance

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
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
// group then goes on delivering every partition, in order, never two
// handlers of one partition at once (the later process waits out the
// lease the earlier one knew).
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
	inFlight := map[string]int{}
	overlaps := 0
	release := make(chan struct{}) // ends the handlers of round 1
	cfgFor := func(instance string) shardq.SubscriberConfig {
		cfg := fastConfig("g", "x", []string{"t"}, func(ctx context.Context, m *shardq.Delivery) error {
			mu.Lock()
			got[m.PartitionKey] = append(got[m.PartitionKey], m.ID)
			inFlight[m.PartitionKey]++
			if inFlight[m.PartitionKey] > 1 {
				overlaps++
				t.Logf("%s delivered while another delivery of partition %s is in a handler", m.ID, m.PartitionKey)
			}
			mu.Unlock()
			defer func() {
				mu.Lock()
				inFlight[m.PartitionKey]--
				mu.Unlock()
			}()
			if strings.HasSuffix(m.ID, "-1") { // in a handler when the takeover comes
				select {
				case <-release:
				case <-ctx.Done(): // the lease was lost
					return ctx.Err()
				}
			}
			return nil
		})
		// Leases stay while the test looks; the later process of a waits
		// out the earlier one's lease (LeaseTTL) before it hands out, so
		// a's is short. b keeps the suite's: a 4 s lease leaves a renewal
		// about 2 s to land before its worker gives the partition up
		// (LeaseTTL/3 less the holder margin), which a loaded CI machine
		// missed once or twice, and b then lost a partition through no
		// takeover.
		cfg.InstanceID, cfg.IdleRelease = instance, 10*time.Minute
		if instance == "a" {
			cfg.LeaseTTL = 4 * time.Second
		}
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
	// The earlier process beats and ticks slowly: it finds itself taken over up to
	// a second late, its handler of round 1 still running meanwhile.
	slow := cfgFor("a")
	slow.HeartbeatInterval, slow.DiscoveryInterval = time.Second, time.Second
	a1, err := c.Subscribe(ctx, slow)
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
	publish(1)
	waitFor(t, "a handler of every partition in flight", 30*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, c := range inFlight {
			n += c
		}
		return n == keys
	})

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

	// The later process delivers round 1 of a's partitions again (the
	// earlier one's handlers were cancelled), after their earlier leases
	// lapsed; b's handlers finish now.
	waitFor(t, "the later process redelivering", time.Minute, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, k := range aKeys {
			if len(got[k]) < 3 {
				return false
			}
		}
		return true
	})
	close(release)
	publish(2)
	waitFor(t, "every message delivered", time.Minute, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for k := range keys {
			if ids := got[fmt.Sprintf("k%d", k)]; len(ids) == 0 || ids[len(ids)-1] != fmt.Sprintf("k%d-2", k) {
				return false
			}
		}
		return true
	})
	// Partitions of b: each message once. Of a: each at least once (the
	// later process reads from the cursor the earlier one committed last,
	// and round 1's handler was cancelled), ending with round 1 and 2 in
	// order.
	mu.Lock()
	if overlaps > 0 {
		t.Errorf("%d deliveries of a partition while another of it was in a handler: two holders at once", overlaps)
	}
	for k, ids := range got {
		want := []string{k + "-0", k + "-1", k + "-2"}
		first := []string{}
		for _, id := range ids {
			if !slices.Contains(first, id) {
				first = append(first, id)
			}
		}
		_, ofB := bTokens[k]
		if ofB && !slices.Equal(ids, want) || !ofB && (!slices.Equal(first, want) || !slices.Equal(ids[len(ids)-2:], want[1:])) {
			t.Errorf("partition %s delivered %v, want %v in order (b's once)", k, got[k], want)
		}
	}
	mu.Unlock()

	// A graceful stop keeps the static member's place: its heartbeat
	// rows stay and its leases end now in its name, so that b takes
	// nothing and its next process takes them over and hands out at once.
	if err := a2.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	stopped := owners()
	if got := of(stopped, a2.ID()); !slices.Equal(slices.Sorted(maps.Keys(got)), aKeys) {
		t.Fatalf("after a graceful stop the static member's leases are %v, want still %v in its name", got, aKeys)
	}
	for _, k := range aKeys {
		if stopped[k].ExpiresAt.After(time.Now()) {
			t.Fatalf("partition %s: the stopped static member's lease runs until %v, want ended", k, stopped[k].ExpiresAt)
		}
	}
	if ms, err := d.Subscribers(ctx, scope); err != nil || len(ms) != 2 {
		t.Fatalf("heartbeat rows after a graceful stop %+v (%v): want both members", ms, err)
	}
	// A restart takes a while, and b plans many times meanwhile (every
	// 50 ms): the stopped member's partitions, idle and their leases ended,
	// still count in the share, so b hands back none of its own.
	time.Sleep(500 * time.Millisecond)
	a3, err := c.Subscribe(ctx, cfgFor("a"))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the next process holding instance a's partitions", 30*time.Second, func() bool {
		return slices.Equal(slices.Sorted(maps.Keys(of(owners(), a3.ID()))), aKeys)
	})
	if got := of(owners(), b.ID()); !maps.Equal(got, bTokens) {
		t.Fatalf("member b's leases moved across the static member's restart: %v, before %v", got, bTokens)
	}
	if err := a3.Stop(ctx); err != nil {
		t.Fatal(err)
	}

	// Two processes of the instance started together (a misconfiguration:
	// the peers may see three members meanwhile): one stays, the other
	// stops, fenced, and the group goes on.
	var a4, a5 *shardq.Subscriber
	var wg sync.WaitGroup
	var err4, err5 error
	wg.Go(func() { a4, err4 = c.Subscribe(ctx, cfgFor("a")) })
	wg.Go(func() { a5, err5 = c.Subscribe(ctx, cfgFor("a")) })
	wg.Wait()
	if err4 != nil || err5 != nil {
		t.Fatal(err4, err5)
	}
	var survivor, fenced *shardq.Subscriber
	select {
	case <-a4.Done():
		survivor, fenced = a5, a4
	case <-a5.Done():
		survivor, fenced = a4, a5
	case <-time.After(30 * time.Second):
		t.Fatal("two processes of one instance both run")
	}
	defer survivor.Stop(ctx)
	if err := fenced.Stop(ctx); !errors.Is(err, shardq.ErrInstanceFenced) {
		t.Fatalf("the other process's Stop = %v, want ErrInstanceFenced", err)
	}
	publish(3)
	waitFor(t, "round 3 delivered", time.Minute, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for k := range keys {
			if ids := got[fmt.Sprintf("k%d", k)]; ids[len(ids)-1] != fmt.Sprintf("k%d-3", k) {
				return false
			}
		}
		return true
	})

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
