// SPDX-License-Identifier: Apache-2.0

package otelcheck_test

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/telemetry"
)

// A client made before the application installs its SDK (the common
// order: a package-level client, main sets the providers) records spans
// once the SDK is there; before, it starts none. (This test sets otel's
// global tracer provider for the rest of the package's tests.)
func TestGlobalProviderInstalledLater(t *testing.T) {
	tel := telemetry.New(nil, nil)
	_, span := tel.StartSend(context.Background(), false)
	if span.SpanContext().IsValid() || span.IsRecording() {
		t.Fatal("a span was started with no SDK installed")
	}
	rec := tracetest.NewSpanRecorder()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)))
	ctx, span := tel.StartSend(context.Background(), false)
	headers := map[string]string{}
	telemetry.Inject(ctx, headers)
	tel.EndSend(ctx, span, time.Now(), []*driver.InsertMessage{{Tenant: "t", Topic: "x", Headers: headers}}, nil)
	if got := rec.Ended(); len(got) != 1 || got[0].Name() != "send x" {
		t.Fatalf("after the SDK was installed: spans %v; want one send span", got)
	}
}

func TestErrorTypeIsBounded(t *testing.T) {
	for err, want := range map[error]string{
		nil:                      "",
		context.DeadlineExceeded: "timeout",
		context.Canceled:         "canceled",
		driver.ErrLeaseLost:      "lease_lost",
		driver.ErrHalfResolved:   "_OTHER",
	} {
		if got := telemetry.ErrorType(err); got != want {
			t.Errorf("ErrorType(%v) = %q, want %q", err, got, want)
		}
	}
}
