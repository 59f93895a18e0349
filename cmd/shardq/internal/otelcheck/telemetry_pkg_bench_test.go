// SPDX-License-Identifier: Apache-2.0

package otelcheck_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/telemetry"
)

// What instrumentation adds to one publish call and one delivery, with
// the API's defaults (no SDK: what a user who does nothing pays) and with
// a recording SDK. Compare with BenchmarkTelemetry in the root package
// (a publish and a delivery on SQLite) for the ratio.
//
//	go test -bench . -run '^$' ./internal/telemetry
func BenchmarkInstrumentation(b *testing.B) {
	for _, p := range []struct {
		name string
		tp   trace.TracerProvider
		mp   metric.MeterProvider
	}{
		{"default", nil, nil},
		{"sdk", sdktrace.NewTracerProvider(), sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))},
	} {
		t := telemetry.New(p.tp, p.mp)
		b.Run(p.name+"/send", func(b *testing.B) {
			b.ReportAllocs()
			row := &driver.InsertMessage{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "m"}
			for b.Loop() {
				ctx, span := t.StartSend(context.Background(), false)
				headers := map[string]string{"queue_name": "t"}
				telemetry.Inject(ctx, headers)
				row.Headers = headers
				t.EndSend(ctx, span, time.Now(), []*driver.InsertMessage{row}, nil)
			}
		})
		b.Run(p.name+"/process", func(b *testing.B) {
			b.ReportAllocs()
			msgs := []driver.Message{{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "m", Headers: map[string]string{"queue_name": "t"}}}
			for b.Loop() {
				ctx, span := t.StartProcess(context.Background(), "t", "x", "g", msgs, 1)
				t.EndProcess(ctx, span, "t", "x", "g", 1, time.Now(), nil)
			}
		})
		b.Run(p.name+"/process-failed", func(b *testing.B) {
			msgs := []driver.Message{{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "m"}}
			err := errors.New("handler failed")
			for b.Loop() {
				ctx, span := t.StartProcess(context.Background(), "t", "x", "g", msgs, 1)
				t.EndProcess(ctx, span, "t", "x", "g", 1, time.Now(), err)
			}
		})
	}
}
