// SPDX-License-Identifier: Apache-2.0

package shardq_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
)

// commitCounter counts the cursor commits that reach its driver.
type commitCounter struct {
	driver.Driver
	single atomic.Int64 // CommitOffset calls
	mu     sync.Mutex
	shared []int // CommitOffsets calls, by their number of cursors
}

func (c *commitCounter) CommitOffset(ctx context.Context, l driver.Lease, offset int64, now time.Time) error {
	c.single.Add(1)
	return c.Driver.CommitOffset(ctx, l, offset, now)
}

func (c *commitCounter) CommitOffsets(ctx context.Context, cs []driver.OffsetCommit, now time.Time) error {
	c.mu.Lock()
	c.shared = append(c.shared, len(cs))
	c.mu.Unlock()
	return c.Driver.CommitOffsets(ctx, cs, now)
}

// TestMemberCommitsInOneTransaction: a member commits the settled cursors
// of all its partitions together, one transaction per CommitInterval, and
// its workers commit none on their own while they deliver: with one
// process's writers queueing for SQLite's write lock, a commit per
// partition held up every other process's publishers and deliveries.
func TestMemberCommitsInOneTransaction(t *testing.T) {
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprint("batch=", batch), func(t *testing.T) { testMemberCommits(t, batch) })
	}
}

func testMemberCommits(t *testing.T, batch bool) {
	eachDatabase(t, func(t *testing.T, _ string, drv driver.Driver, pub *shardq.Client) {
		ctx := context.Background()
		counted := &commitCounter{Driver: drv}
		c, err := shardq.NewClient(counted, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		const partitions, each = 8, 5
		var msgs []shardq.Message
		for k := range partitions {
			for i := range each {
				msgs = append(msgs, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: fmt.Sprint("k", k), ID: fmt.Sprint(k, "-", i)})
			}
		}
		if _, err := pub.Publish(ctx, msgs...); err != nil {
			t.Fatal(err)
		}
		var delivered atomic.Int64
		cfg := faultSubscriberConfig(func(context.Context, *shardq.Delivery) error { delivered.Add(1); return nil })
		if batch {
			cfg.Handler, cfg.BatchHandler = nil, func(_ context.Context, ds []*shardq.Delivery) error { delivered.Add(int64(len(ds))); return nil }
		}
		cfg.CommitInterval, cfg.IdleRelease = 100*time.Millisecond, time.Hour
		s, err := c.Subscribe(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Stop(ctx)
		deadline := time.Now().Add(time.Minute)
		for {
			ps, err := drv.PartitionsWithWork(ctx, driver.GroupScope{Tenants: []string{"t"}, Topic: "x", ConsumerGroup: "g"})
			if err != nil {
				t.Fatal(err)
			}
			if len(ps) == 0 && delivered.Load() == partitions*each {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("after a minute: %d delivered, %d partitions with uncommitted work", delivered.Load(), len(ps))
			}
			time.Sleep(20 * time.Millisecond)
		}
		counted.mu.Lock()
		shared := append([]int(nil), counted.shared...)
		counted.mu.Unlock()
		if n := counted.single.Load(); n != 0 {
			t.Errorf("workers committed %d times on their own while delivering; want 0", n)
		}
		most := 0
		for _, n := range shared {
			most = max(most, n)
		}
		if most < 2 {
			t.Errorf("shared commits %v: never more than one cursor in a transaction", shared)
		}
	})
}
