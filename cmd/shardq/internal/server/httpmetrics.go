// SPDX-License-Identifier: Apache-2.0

package server

import (
	"context"
	"net/http"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// instrument wraps h in otelhttp: a server span per request, child of
// the request's traceparent (W3C trace context, never baggage), named by the
// route pattern, and http.server.request.duration and the body sizes
// under OpenTelemetry's conventions. The probes and /metrics are left
// out: a scrape every few seconds would drown the traces. The metrics'
// server.address and server.port come from the client's Host header;
// the command drops them with a view (cli/telemetry.go), so that a
// client cannot invent series.
func instrument(h http.Handler, mp metric.MeterProvider, tp trace.TracerProvider) http.Handler {
	return otelhttp.NewHandler(h, "shardq serve",
		otelhttp.WithMeterProvider(mp),
		otelhttp.WithTracerProvider(tp),
		// The trace context only: a client's baggage would be copied into
		// every message it publishes.
		otelhttp.WithPropagators(propagation.TraceContext{}),
		otelhttp.WithFilter(func(r *http.Request) bool {
			switch r.URL.Path {
			case "/healthz", "/readyz", "/metrics":
				return false
			}
			return true
		}),
		otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string {
			if r.Pattern != "" {
				return r.Pattern // "POST /v1/tenants/{tenant}/topics/{topic}/messages": never the raw path
			}
			return knownMethod(r.Method)
		}))
}

// activeRequests is http.server.active_requests, which otelhttp does not
// record: a long poll's requests in flight.
type activeRequests struct{ n metric.Int64UpDownCounter }

func newActiveRequests(mp metric.MeterProvider) (activeRequests, error) {
	m := mp.Meter("github.com/shardq/shardq/cmd/shardq/internal/server")
	n, err := m.Int64UpDownCounter("http.server.active_requests", metric.WithUnit("{request}"),
		metric.WithDescription("Number of active HTTP server requests."))
	return activeRequests{n}, err
}

// start counts r as active; the returned func counts it done.
func (a activeRequests) start(r *http.Request) func() {
	set := metric.WithAttributes(attribute.String("http.request.method", knownMethod(r.Method)))
	ctx := context.WithoutCancel(r.Context())
	a.n.Add(ctx, 1, set)
	return func() { a.n.Add(ctx, -1, set) }
}

// statusWriter notes the status a handler wrote.
type statusWriter struct {
	http.ResponseWriter
	status int
	wrote  bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wrote {
		w.status, w.wrote = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection (deadlines,
// flushes).
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// knownMethod is r.Method when HTTP defines it, else "_OTHER" (the
// semantic conventions' rule): a client inventing methods must not
// invent series.
func knownMethod(m string) string {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete,
		http.MethodConnect, http.MethodOptions, http.MethodTrace:
		return m
	}
	return "_OTHER"
}
