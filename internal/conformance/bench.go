// SPDX-License-Identifier: Apache-2.0

package conformance

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
)

// Benchmark measures publishing against the database's own ceiling in the
// same run. d must be migrated; rawDDL creates bench_raw_messages, a table
// of queue_messages' shape whose offset the database assigns, and
// createdAt is a created_at value of the database's type. Compare the
// msgs/s of each shardq case with its raw twin:
//
//	publish-1msg-16conc             vs raw-autocommit-16conns
//	publish-100msgs                 vs raw-multirow-100
//	send-in-transaction-16conc-1key vs publish-1msg-16conc-1key
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
	// Sixteen senders on one hot key: a transactional send (a half
	// message written, then committed) beside a publish to that key.
	hot := func(name string, send func(shardq.Message) error) {
		b.Run(name, func(b *testing.B) {
			b.SetParallelism(16 / max(1, runtime.GOMAXPROCS(0)))
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := send(shardq.Message{Tenant: "bench", Topic: "hot", PartitionKey: "hot", Payload: payload}); err != nil {
						b.Fatal(err)
					}
				}
			})
			reportRate(b, 1)
		})
	}
	hot("publish-1msg-16conc-1key", func(m shardq.Message) error { _, err := c.Publish(ctx, m); return err })
	commit := func(context.Context, *shardq.HalfMessage) (shardq.TxState, error) { return shardq.TxCommit, nil }
	tp, err := c.StartTransactionProducer(ctx, shardq.TransactionProducerConfig{ProducerGroup: "bench", Tenants: []string{"bench"}, Checker: commit})
	if err != nil {
		b.Fatal(err)
	}
	defer tp.Stop(ctx)
	hot("send-in-transaction-16conc-1key", func(m shardq.Message) error {
		_, err := tp.SendInTransaction(ctx, m, nil, nil, commit)
		return err
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

// BenchmarkConsume measures consumption of 20,000 messages over 64
// partitions by 4 subscribers of one group (a per-message handler) against
// its raw twin in the same run: 4 workers each owning 16 partitions,
// looping { begin; select up to 100 rows after the cursor; update the
// cursor row; commit } until every row is read. Compare msgs/s.
func BenchmarkConsume(b *testing.B, open func(b *testing.B) driver.Driver) {
	const total, parts, workers = 20_000, 64, 4
	ctx := context.Background()
	fill := func(b *testing.B, c *shardq.Client, tenant string) {
		payload := []byte(strings.Repeat("x", 256))
		for i := 0; i < total; i += 500 {
			batch := make([]shardq.Message, 0, 500)
			for j := i; j < i+500; j++ {
				batch = append(batch, shardq.Message{Tenant: tenant, Topic: "consume", PartitionKey: fmt.Sprintf("p%02d", j%parts), Payload: payload})
			}
			if _, err := c.Publish(ctx, batch...); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("raw-ordered-consume-4x16", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			d := open(b)
			c, _ := shardq.NewClient(d, nil)
			tenant := fmt.Sprintf("raw%d", i)
			fill(b, c, tenant)
			b.StartTimer()
			var wg sync.WaitGroup
			var read atomic.Int64
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for p := w; p < parts; p += workers {
						key := fmt.Sprintf("p%02d", p)
						var cursor int64
						for {
							tx, err := beginWrite(ctx, d)
							if err != nil {
								b.Error(err)
								return
							}
							rows, err := tx.QueryContext(ctx, "SELECT "+offsetColumn(d)+", payload FROM queue_messages WHERE tenant = ? AND topic = ? AND partition_key = ? AND "+
								offsetColumn(d)+" > ? ORDER BY "+offsetColumn(d)+" LIMIT 100", tenant, "consume", key, cursor)
							if err != nil {
								tx.Rollback()
								b.Error(err)
								return
							}
							n := 0
							for rows.Next() {
								var payload []byte
								rows.Scan(&cursor, &payload)
								n++
							}
							rows.Close()
							// The cursor row: a real one-row write per batch (this
							// throwaway database's head row stands in for it).
							if _, err := tx.ExecContext(ctx, "UPDATE queue_partitions SET head_offset = ? WHERE tenant = ? AND topic = ? AND partition_key = ?",
								cursor, tenant, "consume", key); err != nil {
								tx.Rollback()
								b.Error(err)
								return
							}
							if err := tx.Commit(); err != nil {
								b.Error(err)
								return
							}
							read.Add(int64(n))
							if n < 100 {
								break
							}
						}
					}
				}()
			}
			wg.Wait()
			if read.Load() != total {
				b.Fatalf("raw read %d of %d", read.Load(), total)
			}
			c.Close()
		}
		reportRate(b, total)
	})
	b.Run("subscribers-4-per-message", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			d := open(b)
			c, _ := shardq.NewClient(d, nil)
			tenant := fmt.Sprintf("sub%d", i)
			fill(b, c, tenant)
			b.StartTimer()
			consumeAll(b, c, total, workers, 0, shardq.SubscriberConfig{ConsumerGroup: "g", Topic: "consume", Tenants: []string{tenant},
				DiscoveryInterval: 20 * time.Millisecond, PollInterval: 5 * time.Millisecond})
			c.Close()
		}
		reportRate(b, total)
	})
}

// offsetColumn is the offset column quoted for d's dialect.
func offsetColumn(d driver.Driver) string {
	if d.Name() == "mysql" {
		return "`offset`"
	}
	return `"offset"`
}

// BenchmarkUngrouped measures competing consumers of ungrouped messages:
// 10,000 messages with an empty partition key, consumed by 1, 2, 4 and 8
// subscribers (TakeUngrouped) of one group, each running 4 handlers at
// once. With an instant handler the database is the limit (a claim
// transaction per batch, shared ack transactions); with a 10 ms handler
// (work that waits, like a call to another service) the handlers are, and
// msgs/s grows with consumers until the database's limit.
func BenchmarkUngrouped(b *testing.B, open func(b *testing.B) driver.Driver) {
	const total = 10_000
	ctx := context.Background()
	for _, c := range []struct {
		consumers int
		work      time.Duration
	}{{1, 0}, {8, 0}, {1, 10 * time.Millisecond}, {2, 10 * time.Millisecond}, {4, 10 * time.Millisecond}, {8, 10 * time.Millisecond}} {
		consumers, work := c.consumers, c.work
		b.Run(fmt.Sprintf("handler=%s/consumers=%d", work, consumers), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				d := open(b)
				c, _ := shardq.NewClient(d, nil)
				for j := 0; j < total; j += 500 {
					batch := make([]shardq.Message, 500)
					for k := range batch {
						batch[k] = shardq.Message{Tenant: "t", Topic: "u", Payload: []byte("x")}
					}
					if _, err := c.Publish(ctx, batch...); err != nil {
						b.Fatal(err)
					}
				}
				b.StartTimer()
				consumeAll(b, c, total, consumers, work, shardq.SubscriberConfig{ConsumerGroup: "g", Topic: "u", Tenants: []string{"t"},
					Take: shardq.TakeUngrouped, PollInterval: 5 * time.Millisecond, UngroupedConcurrency: 4})
				c.Close()
			}
			reportRate(b, total)
		})
	}
}

// consumeAll runs members copies of cfg (a handler that takes work per
// message) until total messages were handled, stops the timer, and stops
// them.
func consumeAll(b *testing.B, c *shardq.Client, total, members int, work time.Duration, cfg shardq.SubscriberConfig) {
	ctx := context.Background()
	var got atomic.Int64
	done := make(chan struct{})
	cfg.Handler = func(context.Context, *shardq.Delivery) error {
		time.Sleep(work)
		if got.Add(1) == int64(total) {
			close(done)
		}
		return nil
	}
	var subs []*shardq.Subscriber
	for w := range members {
		cfg.Name = fmt.Sprintf("w%d", w)
		s, err := c.Subscribe(ctx, cfg)
		if err != nil {
			b.Fatal(err)
		}
		subs = append(subs, s)
	}
	<-done
	b.StopTimer()
	for _, s := range subs {
		s.Stop(ctx)
	}
}
