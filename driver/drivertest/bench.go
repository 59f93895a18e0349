package drivertest

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/balance"
)

// Benchmark measures publishing against the database's own ceiling in the
// same run. d must be migrated; rawDDL creates bench_raw_messages, a table
// of queue_messages' shape whose offset the database assigns, and
// createdAt is a created_at value of the database's type. Compare the
// msgs/s of each shardq case with its raw twin:
//
//	publish-1msg-16conc vs raw-autocommit-16conns
//	publish-100msgs     vs raw-multirow-100
func Benchmark(b *testing.B, d driver.Driver, rawDDL string, createdAt any) {
	payload := []byte(strings.Repeat("x", 256))
	ctx := context.Background()
	var seq atomic.Int64
	if _, err := d.DB().ExecContext(ctx, rawDDL); err != nil {
		b.Fatal(err)
	}
	const rawInsertPrefix = "INSERT INTO bench_raw_messages (tenant, topic, partition_key, id, headers, payload, created_at) VALUES"

	b.Run("raw-autocommit-16conns", func(b *testing.B) {
		b.SetParallelism(16 / max(1, runtime.GOMAXPROCS(0)))
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				n := seq.Add(1)
				if _, err := d.DB().ExecContext(ctx, rawInsertPrefix+" (?, ?, ?, ?, ?, ?, ?)",
					"bench", "raw", fmt.Sprint(n%64), fmt.Sprint(n), "{}", payload, createdAt); err != nil {
					b.Fatal(err)
				}
			}
		})
		reportRate(b, 1)
	})
	c, err := shardq.NewClient(d, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	b.Run("publish-1msg-16conc", func(b *testing.B) {
		b.SetParallelism(16 / max(1, runtime.GOMAXPROCS(0)))
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				n := seq.Add(1)
				if _, err := c.Publish(ctx, shardq.Message{Tenant: "bench", Topic: "q", PartitionKey: fmt.Sprint(n % 64),
					Payload: payload}); err != nil {
					b.Fatal(err)
				}
			}
		})
		reportRate(b, 1)
	})
	b.Run("raw-multirow-100", func(b *testing.B) {
		rows := strings.TrimSuffix(strings.Repeat("(?, ?, ?, ?, ?, ?, ?), ", 100), ", ")
		for b.Loop() {
			args := make([]any, 0, 700)
			for range 100 {
				n := seq.Add(1)
				args = append(args, "bench", "raw", fmt.Sprint(n%64), fmt.Sprint(n), "{}", payload, createdAt)
			}
			if _, err := d.DB().ExecContext(ctx, rawInsertPrefix+" "+rows, args...); err != nil {
				b.Fatal(err)
			}
		}
		reportRate(b, 100)
	})
	b.Run("publish-100msgs", func(b *testing.B) {
		msgs := make([]shardq.Message, 100)
		for b.Loop() {
			for i := range msgs {
				msgs[i] = shardq.Message{Tenant: "bench", Topic: "q", PartitionKey: fmt.Sprint(seq.Add(1) % 64), Payload: payload}
			}
			if _, err := c.Publish(ctx, msgs...); err != nil {
				b.Fatal(err)
			}
		}
		reportRate(b, 100)
	})
}

func reportRate(b *testing.B, perOp int) {
	b.ReportMetric(float64(b.N*perOp)/b.Elapsed().Seconds(), "msgs/s")
}

// BenchmarkTick measures one discovery tick of a subscriber at 10,000 and
// 100,000 partitions with work (one message each; 1,000 of them leased by
// 8 subscribers): list subscribers, leases and partitions with work, then
// plan the fair share. d must be migrated and empty.
func BenchmarkTick(b *testing.B, d driver.Driver) {
	ctx := context.Background()
	c, err := shardq.NewClient(d, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	now := time.Now()
	have := 0
	for _, parts := range []int{10_000, 100_000} {
		for have < parts {
			batch := make([]shardq.Message, 0, 500)
			for ; have < parts && len(batch) < 500; have++ {
				batch = append(batch, shardq.Message{Tenant: "bench", Topic: "tick", PartitionKey: fmt.Sprintf("p%06d", have)})
			}
			if _, err := c.Publish(ctx, batch...); err != nil {
				b.Fatal(err)
			}
		}
		if parts == 10_000 {
			for i := range 1000 {
				p := driver.PartitionRef{Tenant: "bench", ConsumerGroup: "g", Topic: "tick", PartitionKey: fmt.Sprintf("p%06d", i*7)}
				if _, err := d.AcquireLease(ctx, p, fmt.Sprintf("sub-%d", i%8), now, time.Hour); err != nil {
					b.Fatal(err)
				}
			}
			for i := range 8 {
				if err := d.Heartbeat(ctx, []string{"bench"}, "g", "tick", fmt.Sprintf("sub-%d", i), now); err != nil {
					b.Fatal(err)
				}
			}
		}
		b.Run(fmt.Sprintf("partitions=%d", parts), func(b *testing.B) {
			for b.Loop() {
				subs, err := d.Subscribers(ctx, []string{"bench"}, "g", "tick")
				if err != nil {
					b.Fatal(err)
				}
				leases, err := d.ListLeases(ctx, []string{"bench"}, "g", "tick")
				if err != nil {
					b.Fatal(err)
				}
				work, err := d.PartitionsWithWork(ctx, []string{"bench"}, "tick", "g")
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
