// SPDX-License-Identifier: Apache-2.0

package drivertest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/balance"
)

// BenchmarkTick measures one discovery tick of a subscriber at 10,000 and
// 100,000 partitions with work (one message each; 1,000 of them leased by
// 8 subscribers): list subscribers, leases and partitions with work, then
// plan the fair share. d must be migrated and empty.
func BenchmarkTick(b *testing.B, d driver.Driver) {
	ctx := context.Background()
	now := time.Now()
	have := 0
	for _, parts := range []int{10_000, 100_000} {
		for have < parts {
			batch := make([]driver.InsertMessage, 0, 500)
			for ; have < parts && len(batch) < 500; have++ {
				batch = append(batch, driver.InsertMessage{Tenant: "bench", Topic: "tick", PartitionKey: fmt.Sprintf("p%06d", have)})
			}
			if _, err := Insert(ctx, d, batch...); err != nil {
				b.Fatal(err)
			}
		}
		if parts == 10_000 {
			for i := range 1000 {
				p := driver.PartitionRef{Tenant: "bench", ConsumerGroup: "g", Topic: "tick", PartitionKey: fmt.Sprintf("p%06d", i*7)}
				if _, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: p, Owner: fmt.Sprintf("sub-%d", i%8), Now: now, TTL: time.Hour}); err != nil {
					b.Fatal(err)
				}
			}
			for i := range 8 {
				if err := d.Heartbeat(ctx, driver.GroupScope{Tenants: []string{"bench"}, Topic: "tick", ConsumerGroup: "g"}, fmt.Sprintf("sub-%d", i), now); err != nil {
					b.Fatal(err)
				}
			}
		}
		b.Run(fmt.Sprintf("partitions=%d", parts), func(b *testing.B) {
			for b.Loop() {
				subs, err := d.Subscribers(ctx, driver.GroupScope{Tenants: []string{"bench"}, Topic: "tick", ConsumerGroup: "g"})
				if err != nil {
					b.Fatal(err)
				}
				leases, err := d.ListLeases(ctx, driver.GroupScope{Tenants: []string{"bench"}, Topic: "tick", ConsumerGroup: "g"})
				if err != nil {
					b.Fatal(err)
				}
				work, err := d.PartitionsWithWork(ctx, driver.GroupScope{Tenants: []string{"bench"}, Topic: "tick", ConsumerGroup: "g"})
				if err != nil {
					b.Fatal(err)
				}
				live := map[string][]string{}
				for _, s := range subs {
					live[s.Tenant] = append(live[s.Tenant], s.Name)
				}
				refs := make([]driver.PartitionRef, len(work))
				for i, p := range work {
					refs[i] = driver.PartitionRef{Tenant: p.Tenant, ConsumerGroup: "g", Topic: p.Topic, PartitionKey: p.PartitionKey}
				}
				plan := balance.Compute(balance.Input{Me: "sub-0", Live: live, Work: refs, Leases: leases, Now: now})
				if len(work) != parts || plan.Quota["bench"] == 0 {
					b.Fatalf("tick saw %d partitions with work, want %d", len(work), parts)
				}
			}
		})
	}
}
