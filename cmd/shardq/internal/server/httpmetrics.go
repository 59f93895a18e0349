// SPDX-License-Identifier: Apache-2.0

package server

import (
	"context"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// httpMetrics are the HTTP server's own metrics under OpenTelemetry's
// semantic conventions: the route is the matched pattern, never the raw
// path, so their series are bounded by the routes.
type httpMetrics struct {
	duration metric.Float64Histogram
	active   metric.Int64UpDownCounter
}

func newHTTPMetrics(mp metric.MeterProvider) (httpMetrics, error) {
	m := mp.Meter("github.com/shardq/shardq/cmd/shardq/internal/server")
	var h httpMetrics
	var err error
	if h.duration, err = m.Float64Histogram("http.server.request.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of HTTP server requests."),
		metric.WithExplicitBucketBoundaries(0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20)); err != nil {
		return h, err
	}
	if h.active, err = m.Int64UpDownCounter("http.server.active_requests", metric.WithUnit("{request}"),
		metric.WithDescription("Number of active HTTP server requests.")); err != nil {
		return h, err
	}
	return h, nil
}

// start counts r as active; the returned func records it as done.
func (h httpMetrics) start(r *http.Request) func(*http.Request, int) {
	t0 := time.Now()
	method := attribute.String("http.request.method", knownMethod(r.Method))
	ctx := context.WithoutCancel(r.Context())
	h.active.Add(ctx, 1, metric.WithAttributes(method))
	return func(r *http.Request, status int) {
		h.active.Add(ctx, -1, metric.WithAttributes(method))
		route := r.Pattern
		if route == "" {
			route = "unmatched"
		}
		h.duration.Record(ctx, time.Since(t0).Seconds(), metric.WithAttributes(method, attribute.String("http.route", route),
			attribute.Int("http.response.status_code", status)))
	}
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
