// SPDX-License-Identifier: Apache-2.0

package shardq_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
)

// Pausing a group under load stops its deliveries (grouped and
// ungrouped) within an interval while messages keep arriving; the members
// keep their leases; resuming delivers the rest in order, nothing lost.
func TestPauseAndResume(t *testing.T) {
	eachDatabase(t, func(t *testing.T, _ string, _ driver.Driver, c *shardq.Client) {
		ctx := context.Background()
		var mu sync.Mutex
		got := map[string][]int{} // key -> message numbers in delivery order
		total := 0
		sub, err := c.Subscribe(ctx, faultSubscriberConfig(func(_ context.Context, d *shardq.Delivery) error {
			mu.Lock()
			defer mu.Unlock()
			var n int
			fmt.Sscan(string(d.Payload), &n)
			got[d.PartitionKey] = append(got[d.PartitionKey], n)
			total++
			return nil
		}))
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Stop(ctx)
		delivered := func() int {
			mu.Lock()
			defer mu.Unlock()
			return total
		}
		sent := 0
		publish := func(n int) {
			t.Helper()
			for range n {
				for _, key := range []string{"a", "b", ""} {
					if _, err := c.Publish(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: key, Payload: []byte(fmt.Sprint(sent))}); err != nil {
						t.Fatal(err)
					}
				}
				sent++
			}
		}
		publish(10)
		waitFor(t, "the first 30 deliveries", func() bool { return delivered() == 30 })

		admin, scope := c.Admin(), shardq.Scope{Tenants: []string{"t"}}
		if _, err := admin.PauseGroup(ctx, shardq.PauseRequest{Scope: scope, Topic: "x", ConsumerGroup: "typo"}); !errors.Is(err, shardq.ErrInvalid) {
			t.Fatalf("pausing a group that never read the topic: %v; want it refused", err)
		}
		paused, err := admin.PauseGroup(ctx, shardq.PauseRequest{Scope: scope, Topic: "x", ConsumerGroup: "g"})
		if err != nil || len(paused) != 1 {
			t.Fatalf("pause: %v, %v", paused, err)
		}
		publish(10) // while the members may not have seen the pause yet
		// Absence needs a wait: many discovery intervals (50 ms here).
		time.Sleep(500 * time.Millisecond)
		before := delivered()
		publish(10)
		time.Sleep(500 * time.Millisecond)
		if after := delivered(); after != before {
			t.Fatalf("delivered %d messages while paused", after-before)
		}
		groups, err := admin.Groups(ctx, scope, "x", 0)
		if err != nil || len(groups) != 1 || !groups[0].Paused {
			t.Fatalf("groups while paused: %+v, %v", groups, err)
		}
		leases, err := admin.Leases(ctx, scope)
		if err != nil {
			t.Fatal(err)
		}
		held := 0
		for _, l := range leases {
			if l.Owner == sub.ID() {
				held++
			}
		}
		if held != 2 {
			t.Fatalf("the member holds %d leases while paused; want both partitions kept", held)
		}

		if _, err := admin.ResumeGroup(ctx, shardq.PauseRequest{Scope: scope, Topic: "x", ConsumerGroup: "g"}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "every message after the resume", func() bool { return delivered() == 3*sent })
		mu.Lock()
		defer mu.Unlock()
		for _, key := range []string{"a", "b"} {
			for i, n := range got[key] {
				if n != i {
					t.Fatalf("partition %s delivered %v; want 0..%d in order, once each", key, got[key], sent-1)
				}
			}
		}
		if len(got[""]) != sent {
			t.Fatalf("ungrouped: %d of %d", len(got[""]), sent)
		}
		if groups, _ := admin.Groups(ctx, scope, "x", 0); len(groups) != 1 || groups[0].Paused {
			t.Fatalf("groups after resume: %+v", groups)
		}
	})
}
