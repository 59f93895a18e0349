package drivertest

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
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
