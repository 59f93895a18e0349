// SPDX-License-Identifier: Apache-2.0

package otelcheck_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/internal/testdb"
)

// BenchmarkTelemetry is one publish call and one delivery on SQLite with
// the OpenTelemetry defaults (no SDK: what a user who does nothing pays)
// and with a recording SDK; internal/telemetry's BenchmarkInstrumentation
// is the instrumentation alone. docs/BENCHMARKS.md has the ratios.
//
//	go test -bench Telemetry -run '^$' -count 6 .
func BenchmarkTelemetry(b *testing.B) {
	providers := []struct {
		name string
		tp   trace.TracerProvider
		mp   metric.MeterProvider
	}{
		{"default", nil, nil},
		{"sdk", sdktrace.NewTracerProvider(), sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))},
	}
	open := func(b *testing.B, tp trace.TracerProvider, mp metric.MeterProvider) *shardq.Client {
		drv := testdb.SQLite(b)
		c, err := shardq.NewClient(drv, &shardq.Config{TracerProvider: tp, MeterProvider: mp, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close() })
		if err := c.Migrate(context.Background()); err != nil {
			b.Fatal(err)
		}
		return c
	}
	for _, p := range providers {
		b.Run("publish/"+p.name, func(b *testing.B) {
			c := open(b, p.tp, p.mp)
			i := 0
			for b.Loop() {
				i++
				if _, err := c.Publish(context.Background(), shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: fmt.Sprint(i)}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	for _, p := range providers {
		b.Run("consume/"+p.name, func(b *testing.B) {
			c := open(b, p.tp, p.mp)
			n := b.N
			msgs := make([]shardq.Message, 0, 500)
			for i := range n {
				msgs = append(msgs, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: fmt.Sprint("k", i%8), ID: fmt.Sprint(i)})
				if len(msgs) == cap(msgs) || i == n-1 {
					if _, err := c.Publish(context.Background(), msgs...); err != nil {
						b.Fatal(err)
					}
					msgs = msgs[:0]
				}
			}
			var got atomic.Int64
			done := make(chan struct{})
			b.ResetTimer()
			sub, err := c.Subscribe(context.Background(), shardq.SubscriberConfig{ConsumerGroup: "g", Topic: "x", Tenants: []string{"t"},
				DiscoveryInterval: 10 * time.Millisecond, Handler: func(context.Context, *shardq.Delivery) error {
					if got.Add(1) == int64(n) {
						close(done)
					}
					return nil
				}})
			if err != nil {
				b.Fatal(err)
			}
			<-done
			b.StopTimer()
			sub.Stop(context.Background())
		})
	}
}
