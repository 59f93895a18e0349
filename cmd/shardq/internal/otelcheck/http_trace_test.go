// SPDX-License-Identifier: Apache-2.0

package otelcheck_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/cmd/shardq/internal/server"
	"github.com/shardq/shardq/internal/testdb"
)

// A client in another language sends only bytes: a traceparent header on
// its publish. The trace runs on through serve (a server span under the
// caller's span, the send span under it), the stored message, an HTTP
// receive (the message's headers) and a large body's download (its
// traceparent header), and a Go consumer in another process (its process
// span in the caller's trace). The HTTP metrics are otelhttp's, by route.
func TestTraceCrossesHTTP(t *testing.T) {
	useTraceContext(t)
	const (
		traceID  = "4bf92f3577b34da6a3ce929d0e0e4736"
		callerID = "00f067aa0ba902b7"
	)
	for _, db := range []string{"sqlite", "mysql"} {
		t.Run(db, func(t *testing.T) {
			ctx := context.Background()
			srvDrv, subDrv := testdb.TwoDrivers(t, db)
			srvSpans, subSpans := tracetest.NewSpanRecorder(), tracetest.NewSpanRecorder()
			srvTP := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(srvSpans))
			subTP := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(subSpans))
			reader := sdkmetric.NewManualReader()
			mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
			c := newTestClient(t, srvDrv, &shardq.Config{TracerProvider: srvTP})
			if err := c.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			rc, err := c.Receipts(&shardq.ReceiptOptions{MessageBytes: server.MessageBytes, Name: "test"})
			if err != nil {
				t.Fatal(err)
			}
			srv, err := server.New(server.Config{Client: c, Driver: srvDrv, Receipts: rc, MeterProvider: mp, TracerProvider: srvTP})
			if err != nil {
				t.Fatal(err)
			}
			hs := httptest.NewServer(srv)
			t.Cleanup(func() { srv.Drain(); hs.CloseClientConnections(); hs.Close() })
			tok, _, err := server.NewToken(ctx, srvDrv, []string{"t"}, []string{server.RolePublish, server.RoleConsume}, 0, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			call := func(method, path string, body io.Reader, header http.Header) *http.Response {
				t.Helper()
				req, err := http.NewRequest(method, hs.URL+path, body)
				if err != nil {
					t.Fatal(err)
				}
				req.Header = header.Clone()
				if req.Header == nil {
					req.Header = http.Header{}
				}
				req.Header.Set("Authorization", "Bearer "+tok)
				res, err := hs.Client().Do(req)
				if err != nil {
					t.Fatal(err)
				}
				if res.StatusCode != 200 {
					b, _ := io.ReadAll(res.Body)
					t.Fatalf("%s %s: %d %s", method, path, res.StatusCode, b)
				}
				return res
			}
			caller := http.Header{"Traceparent": {"00-" + traceID + "-" + callerID + "-01"}}

			call("POST", "/v1/tenants/t/topics/x/messages", strings.NewReader(`{"key":"k","id":"m1","payload":"1"}`), caller).Body.Close()
			srvSpan := onlySpan(t, srvSpans.Ended(), "POST /v1/tenants/{tenant}/topics/{topic}/messages")
			if srvSpan.SpanKind() != trace.SpanKindServer || srvSpan.SpanContext().TraceID().String() != traceID ||
				srvSpan.Parent().SpanID().String() != callerID || !srvSpan.Parent().IsRemote() {
				t.Fatalf("server span: kind %v trace %s parent %s; want a server span under the caller's %s", srvSpan.SpanKind(),
					srvSpan.SpanContext().TraceID(), srvSpan.Parent().SpanID(), callerID)
			}
			send := onlySpan(t, srvSpans.Ended(), "send x")
			if send.Parent().SpanID() != srvSpan.SpanContext().SpanID() {
				t.Fatalf("send span's parent %s; want the server span %s", send.Parent().SpanID(), srvSpan.SpanContext().SpanID())
			}

			// Over HTTP, each message carries its traceparent in headers.
			res := call("POST", "/v1/tenants/t/topics/x/groups/h/receive", strings.NewReader(`{"max":10}`), nil)
			var got struct {
				Messages []struct {
					ID      string            `json:"id"`
					Headers map[string]string `json:"headers"`
					BodyURL string            `json:"body_url"`
				} `json:"messages"`
			}
			if err := json.NewDecoder(res.Body).Decode(&got); err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			wantTP := "00-" + traceID + "-" + send.SpanContext().SpanID().String() + "-01"
			if len(got.Messages) != 1 || got.Messages[0].Headers["traceparent"] != wantTP {
				t.Fatalf("received %+v; want m1 with traceparent %s (the send span)", got.Messages, wantTP)
			}

			// A client's baggage is never taken, and a tracestate past the
			// library's bound is left out: both would be copied into every
			// message of the request.
			long := http.Header{"Traceparent": {"00-" + traceID + "-" + callerID + "-01"},
				"Tracestate": {"a=" + strings.Repeat("x", 250) + ",b=" + strings.Repeat("y", 250)},
				"Baggage":    {"k=" + strings.Repeat("z", 4000)}}
			call("POST", "/v1/tenants/t/topics/bounded/messages", strings.NewReader(`{"messages":[{"key":"k"},{"key":"k"}]}`), long).Body.Close()
			short := http.Header{"Traceparent": {"00-" + traceID + "-" + callerID + "-01"}, "Tracestate": {"a=1"}}
			call("POST", "/v1/tenants/t/topics/bounded/messages", strings.NewReader(`{"key":"k"}`), short).Body.Close()
			res = call("POST", "/v1/tenants/t/topics/bounded/groups/h/receive", strings.NewReader(`{"max":10}`), nil)
			if err := json.NewDecoder(res.Body).Decode(&got); err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			if len(got.Messages) != 3 {
				t.Fatalf("received %d messages, want 3", len(got.Messages))
			}
			for i, m := range got.Messages {
				_, state := m.Headers["tracestate"]
				if _, bag := m.Headers["baggage"]; bag || state != (i == 2) || !strings.Contains(m.Headers["traceparent"], traceID) {
					t.Fatalf("message %d's headers %v: want the traceparent, no baggage, a tracestate only when short", i, m.Headers)
				}
			}

			// A Go consumer in another process continues the trace.
			handled := make(chan struct{}, 1)
			sub := newTestClient(t, subDrv, &shardq.Config{TracerProvider: subTP})
			s, err := sub.Subscribe(ctx, faultSubscriberConfig(func(context.Context, *shardq.Delivery) error {
				handled <- struct{}{}
				return nil
			}))
			if err != nil {
				t.Fatal(err)
			}
			select {
			case <-handled:
			case <-time.After(30 * time.Second):
				t.Fatal("no delivery to the Go consumer")
			}
			if err := s.Stop(ctx); err != nil {
				t.Fatal(err)
			}
			process := onlySpan(t, subSpans.Ended(), "process x")
			if process.SpanContext().TraceID().String() != traceID || process.Parent().SpanID() != send.SpanContext().SpanID() {
				t.Fatalf("process span trace %s parent %s; want trace %s under the send span", process.SpanContext().TraceID(), process.Parent().SpanID(), traceID)
			}

			// A large message: its body's download says its traceparent.
			upCaller := http.Header{"Traceparent": {"00-" + traceID + "-" + "1111111111111111" + "-01"}}
			call("POST", "/v1/tenants/t/topics/files/large?key=k&id=blob", bytes.NewReader(bytes.Repeat([]byte("b"), 1<<20)), upCaller).Body.Close()
			res = call("POST", "/v1/tenants/t/topics/files/groups/h/receive", strings.NewReader(`{"max":10}`), nil)
			if err := json.NewDecoder(res.Body).Decode(&got); err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			if len(got.Messages) != 1 || got.Messages[0].BodyURL == "" || !strings.Contains(got.Messages[0].Headers["traceparent"], traceID) {
				t.Fatalf("received %+v; want the large message with the caller's trace", got.Messages)
			}
			res = call("GET", got.Messages[0].BodyURL, nil, nil)
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
			if tp := res.Header.Get("Traceparent"); tp != got.Messages[0].Headers["traceparent"] {
				t.Fatalf("body download's traceparent %q; want the message's %q", tp, got.Messages[0].Headers["traceparent"])
			}

			// otelhttp's duration by route pattern, never the raw path.
			var rm metricdata.ResourceMetrics
			if err := reader.Collect(ctx, &rm); err != nil {
				t.Fatal(err)
			}
			routes := map[string]bool{}
			for _, sm := range rm.ScopeMetrics {
				for _, m := range sm.Metrics {
					if m.Name != "http.server.request.duration" {
						continue
					}
					for _, p := range m.Data.(metricdata.Histogram[float64]).DataPoints {
						r, _ := p.Attributes.Value(attribute.Key("http.route"))
						routes[r.AsString()] = true
					}
				}
			}
			for _, want := range []string{"/v1/tenants/{tenant}/topics/{topic}/messages", "/v1/tenants/{tenant}/topics/{topic}/groups/{group}/receive"} {
				if !routes[want] {
					t.Fatalf("http.server.request.duration routes %v; want %s", routes, want)
				}
			}
		})
	}
}

// Without an SDK (serve without OTLP) there are no spans, and the
// caller's trace context still reaches the messages as it came.
func TestTraceCrossesHTTPWithoutSDK(t *testing.T) {
	useTraceContext(t)
	ctx := context.Background()
	drv := testdb.Migrated(t, testdb.SQLite(t))
	c := newTestClient(t, drv, &shardq.Config{TracerProvider: noop.NewTracerProvider()})
	rc, err := c.Receipts(&shardq.ReceiptOptions{MessageBytes: server.MessageBytes, Name: "test"})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{Client: c, Driver: drv, Receipts: rc, TracerProvider: noop.NewTracerProvider()})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(func() { srv.Drain(); hs.CloseClientConnections(); hs.Close() })
	tok, _, err := server.NewToken(ctx, drv, []string{"t"}, []string{server.RolePublish}, 0, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	req, err := http.NewRequest("POST", hs.URL+"/v1/tenants/t/topics/x/messages", strings.NewReader(`{"key":"k","id":"m1"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Traceparent", tp)
	res, err := hs.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("publish: %d", res.StatusCode)
	}
	ms, err := c.Admin().Messages(ctx, shardq.BrowseRequest{Tenant: "t", Topic: "x"})
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 1 || ms[0].Headers["traceparent"] != tp {
		t.Fatalf("stored %+v; want m1 carrying the caller's traceparent %s", ms, tp)
	}
}
