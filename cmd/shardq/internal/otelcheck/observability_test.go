// SPDX-License-Identifier: Apache-2.0

package otelcheck_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/internal/testdb"
)

// Values no attribute may ever carry: the partition key and message ids.
const (
	secretKey = "key-secret-7f3a"
	secretID  = "id-secret-c0ffee"
)

// useTraceContext installs the W3C trace-context propagator for the test,
// as an application does next to its SDK.
func useTraceContext(t *testing.T) {
	prev := otel.GetTextMapPropagator()
	otel.SetTextMapPropagator(propagation.TraceContext{})
	t.Cleanup(func() { otel.SetTextMapPropagator(prev) })
}

// A publish in one client and its delivery in another (two connection
// pools and two tracer providers, as two processes have: the trace
// context travels only in the stored message) form one trace: the process
// span is a child of the send span and links to it, and the handler's
// context carries the process span.
func TestTraceFollowsAMessageAcrossClients(t *testing.T) {
	useTraceContext(t)
	for _, db := range []string{"sqlite", "mysql"} {
		t.Run(db, func(t *testing.T) {
			ctx := context.Background()
			pubDrv, subDrv := testdb.TwoDrivers(t, db)
			pubSpans, subSpans := tracetest.NewSpanRecorder(), tracetest.NewSpanRecorder()
			pubTP := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(pubSpans))
			subTP := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(subSpans))
			pub := newTestClient(t, pubDrv, &shardq.Config{TracerProvider: pubTP})
			if err := pub.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			sub := newTestClient(t, subDrv, &shardq.Config{TracerProvider: subTP})

			handled := make(chan trace.SpanContext, 1)
			cfg := faultSubscriberConfig(func(ctx context.Context, d *shardq.Delivery) error {
				handled <- trace.SpanContextFromContext(ctx)
				return nil
			})
			if _, err := sub.Subscribe(ctx, cfg); err != nil {
				t.Fatal(err)
			}
			reqCtx, req := pubTP.Tracer("app").Start(ctx, "POST /orders")
			if _, err := pub.Publish(reqCtx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: secretKey, ID: secretID, Payload: []byte("1")}); err != nil {
				t.Fatal(err)
			}
			req.End()
			var inHandler trace.SpanContext
			select {
			case inHandler = <-handled:
			case <-time.After(30 * time.Second):
				t.Fatal("no delivery")
			}
			send := onlySpan(t, pubSpans.Ended(), "send x")
			if send.SpanKind() != trace.SpanKindProducer || send.Parent().SpanID() != req.SpanContext().SpanID() {
				t.Fatalf("send span: kind %v, parent %v; want a producer span under the request", send.SpanKind(), send.Parent().SpanID())
			}
			waitFor(t, "the process span", func() bool { return len(spansNamed(subSpans.Ended(), "process x")) == 1 })
			process := onlySpan(t, subSpans.Ended(), "process x")
			sc := send.SpanContext()
			if process.SpanContext().TraceID() != sc.TraceID() || process.Parent().SpanID() != sc.SpanID() || !process.Parent().IsRemote() {
				t.Fatalf("process span trace %s parent %s; want trace %s under the send span %s", process.SpanContext().TraceID(),
					process.Parent().SpanID(), sc.TraceID(), sc.SpanID())
			}
			if len(process.Links()) != 1 || process.Links()[0].SpanContext.SpanID() != sc.SpanID() {
				t.Fatalf("process span links %v; want the send span", process.Links())
			}
			if inHandler.SpanID() != process.SpanContext().SpanID() {
				t.Fatalf("the handler's context carries span %s; want the process span %s", inHandler.SpanID(), process.SpanContext().SpanID())
			}
			wantAttrs(t, process, map[string]string{"messaging.system": "shardq", "messaging.operation.type": "process",
				"messaging.destination.name": "x", "messaging.consumer.group.name": "g", "shardq.tenant": "t"})
			wantAttrs(t, send, map[string]string{"messaging.operation.type": "send", "messaging.destination.name": "x", "shardq.tenant": "t"})
			noSecrets(t, append(pubSpans.Ended(), subSpans.Ended()...), nil)
		})
	}
}

// Every metric moves when its event happens, the lag returns to zero once
// the group has caught up, and no attribute carries a partition key or a
// message id.
func TestMetricsFollowEvents(t *testing.T) {
	useTraceContext(t)
	for _, db := range []string{"sqlite", "mysql"} {
		t.Run(db, func(t *testing.T) {
			ctx := context.Background()
			drv, _ := testdb.TwoDrivers(t, db)
			reader := sdkmetric.NewManualReader()
			// The Prometheus exporter beside it: what examples/ name must be there.
			reg := prometheus.NewRegistry()
			exp, err := otelprom.New(otelprom.WithRegisterer(reg))
			if err != nil {
				t.Fatal(err)
			}
			mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader), sdkmetric.WithReader(exp))
			spans := tracetest.NewSpanRecorder()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
			c := newTestClient(t, drv, &shardq.Config{TracerProvider: tp, MeterProvider: mp})
			if err := c.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			m := &metricsOf{t: t, reader: reader}
			group := map[string]string{"shardq.tenant": "t", "messaging.destination.name": "x", "messaging.consumer.group.name": "g"}

			// A handler held at a gate, so that lag builds up; "flaky"
			// fails once, "poison" always (dead-lettered at attempt 2).
			gate := make(chan struct{})
			var once sync.Once
			cfg := faultSubscriberConfig(func(ctx context.Context, d *shardq.Delivery) error {
				<-gate
				switch {
				case d.ID == "poison":
					return errors.New("cannot parse")
				case d.ID == "flaky" && d.Attempt == 1:
					return errors.New("first attempt fails")
				}
				return nil
			})
			cfg.MaxAttempts, cfg.BackoffMin, cfg.BackoffMax = 2, time.Millisecond, 2*time.Millisecond
			sub, err := c.Subscribe(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer once.Do(func() { close(gate) })
			ids := []string{secretID, "flaky", "poison", "m3", "m4"}
			for _, id := range ids {
				if _, err := c.Publish(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: secretKey, ID: id}); err != nil {
					t.Fatal(err)
				}
			}
			m.waitUntil("lag of five messages", func() bool { return m.gaugeInt("shardq.consumer.lag", group) == 5 })
			if age := m.gaugeFloat("shardq.consumer.lag.age", group); age <= 0 {
				t.Fatalf("lag age %v with five messages waiting; want > 0", age)
			}
			if n := m.sum("messaging.client.sent.messages", map[string]string{"shardq.tenant": "t", "messaging.destination.name": "x"}); n != 5 {
				t.Fatalf("sent.messages = %d, want 5", n)
			}
			if m.histCount("shardq.publish.batch.size") < 1 || m.histCount("messaging.client.operation.duration") != 5 {
				t.Fatalf("batch.size count %d, operation.duration count %d; want ≥ 1 and 5",
					m.histCount("shardq.publish.batch.size"), m.histCount("messaging.client.operation.duration"))
			}
			// Discovery may report the lag before the member's lease is
			// taken: wait for it, then it must be exactly one.
			m.waitUntil("one lease acquired and held", func() bool { return m.sum("shardq.consumer.leases.acquired", group) >= 1 })
			if m.sum("shardq.consumer.leases.acquired", group) != 1 || m.sum("shardq.consumer.leases.held", group) != 1 {
				t.Fatalf("leases acquired %d held %d; want 1 and 1", m.sum("shardq.consumer.leases.acquired", group), m.sum("shardq.consumer.leases.held", group))
			}
			once.Do(func() { close(gate) })
			m.waitUntil("lag back to zero", func() bool {
				return m.gaugeInt("shardq.consumer.lag", group) == 0 && m.gaugeFloat("shardq.consumer.lag.age", group) == 0
			})
			exported := map[string]bool{}
			gather(t, reg, exported) // the gauges, while the subscriber runs
			// 5 messages, 1 retry of flaky, 1 of poison.
			if n := m.sum("messaging.client.consumed.messages", group); n != 7 {
				t.Fatalf("consumed.messages = %d, want 7 (five, and two second attempts)", n)
			}
			if m.histCount("messaging.process.duration") != 7 {
				t.Fatalf("process.duration count = %d, want 7", m.histCount("messaging.process.duration"))
			}
			if r, dl := m.sum("shardq.consumer.retries", group), m.sum("shardq.consumer.dead_lettered", group); r != 2 || dl != 1 {
				t.Fatalf("retries %d, dead-lettered %d; want 2 and 1", r, dl)
			}
			if m.histCount("shardq.consumer.rebalance.duration") == 0 {
				t.Fatal("no rebalance tick recorded")
			}

			// An operator's reset revokes the lease: the holder loses it.
			if _, err := c.Admin().ResetOffsets(ctx, shardq.ResetRequest{Tenant: "t", Topic: "x", ConsumerGroup: "g", To: shardq.ResetToLatest, Force: true}); err != nil {
				t.Fatal(err)
			}
			m.waitUntil("the lease lost", func() bool { return m.sum("shardq.consumer.leases.lost", group) == 1 })
			if err := sub.Stop(ctx); err != nil {
				t.Fatal(err)
			}
			if held := m.sum("shardq.consumer.leases.held", group); held != 0 {
				t.Fatalf("leases held after stop = %d", held)
			}

			// A transactional send left unknown is pending until its
			// check-back commits it.
			p, err := c.StartTransactionProducer(ctx, shardq.TransactionProducerConfig{ProducerGroup: "pg", Tenants: []string{"t"},
				TransactionTimeout: 500 * time.Millisecond, PollInterval: 20 * time.Millisecond,
				Checker: func(context.Context, *shardq.HalfMessage) (shardq.TxState, error) { return shardq.TxCommit, nil }})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Stop(ctx)
			if _, err := p.SendInTransaction(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: secretKey, ID: "tx-" + secretID}, nil, nil,
				func(context.Context, *shardq.HalfMessage) (shardq.TxState, error) { return shardq.TxUnknown, nil }); err != nil {
				t.Fatal(err)
			}
			producer := map[string]string{"shardq.producer_group": "pg", "shardq.tenant": "t"}
			if n := m.gaugeInt("shardq.tx.half_messages.pending", producer); n != 1 {
				t.Fatalf("half messages pending = %d, want 1", n)
			}
			m.waitUntil("the check-back's commit", func() bool {
				return m.sum("shardq.tx.checks", map[string]string{"shardq.producer_group": "pg", "shardq.outcome": "commit"}) == 1
			})
			m.waitUntil("no half message pending", func() bool { return m.gaugeInt("shardq.tx.half_messages.pending", producer) == 0 })
			send := spansNamed(spans.Ended(), "send x")
			check := onlySpan(t, spans.Ended(), "check x")
			if tx := send[len(send)-1]; check.Parent().SpanID() != tx.SpanContext().SpanID() {
				t.Fatalf("check span's parent %s; want the transactional send %s", check.Parent().SpanID(), tx.SpanContext().SpanID())
			}

			// Retention deletes what every group passed.
			rep, err := c.Admin().RunRetention(ctx, shardq.Scope{Tenants: []string{"t"}}, shardq.RetentionConfig{
				Default: shardq.RetentionPolicy{MinRetention: time.Nanosecond, MaxRetention: time.Hour}, DedupWindow: -1})
			if err != nil {
				t.Fatal(err)
			}
			if rep.Deleted == 0 || m.sum("shardq.retention.deleted", map[string]string{"shardq.tenant": "t"}) != rep.Deleted {
				t.Fatalf("retention deleted %d; the metric says %d", rep.Deleted, m.sum("shardq.retention.deleted", map[string]string{"shardq.tenant": "t"}))
			}
			noSecrets(t, spans.Ended(), m.collect())
			gather(t, reg, exported)
			checkExamples(t, exported)
		})
	}
}

// gather adds the names of reg's metric families (with a histogram's
// series suffixes) and their labels to known.
func gather(t *testing.T, reg *prometheus.Registry, known map[string]bool) {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		known[f.GetName()] = true
		if f.GetType() == dto.MetricType_HISTOGRAM {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				known[f.GetName()+s] = true
			}
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				known[l.GetName()] = true
			}
		}
	}
	known["le"] = true // a histogram's bucket bound
}

// checkExamples checks that every metric and label the Prometheus rules
// and the Grafana dashboard in examples/ name is among known.
func checkExamples(t *testing.T, known map[string]bool) {
	t.Helper()
	// Identifiers of shardq's and OpenTelemetry's messaging metrics and labels.
	ident := regexp.MustCompile(`\b(?:shardq|messaging|error)_[a-z0-9_]+\b`)
	for _, file := range []string{"../../../../examples/prometheus/shardq-alerts.yml", "../../../../examples/grafana/shardq-dashboard.json"} {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		names := ident.FindAllString(string(b), -1)
		if len(names) < 10 {
			t.Fatalf("%s names %d metrics and labels; the pattern finds too few", file, len(names))
		}
		for _, n := range names {
			if !known[n] {
				t.Errorf("%s names %s, which is not exported", file, n)
			}
		}
	}
}

// metricsOf reads a manual reader's metrics.
type metricsOf struct {
	t      *testing.T
	reader *sdkmetric.ManualReader
}

func (m *metricsOf) collect() *metricdata.ResourceMetrics {
	var rm metricdata.ResourceMetrics
	if err := m.reader.Collect(context.Background(), &rm); err != nil {
		m.t.Fatal(err)
	}
	return &rm
}

func (m *metricsOf) waitUntil(what string, cond func() bool) {
	m.t.Helper()
	waitFor(m.t, what, cond)
}

// points returns the data points of metric name whose attributes include
// want.
func (m *metricsOf) find(name string) any {
	for _, sm := range m.collect().ScopeMetrics {
		for _, mt := range sm.Metrics {
			if mt.Name == name {
				return mt.Data
			}
		}
	}
	return nil
}

func matches(set attribute.Set, want map[string]string) bool {
	for k, v := range want {
		if got, ok := set.Value(attribute.Key(k)); !ok || got.String() != v {
			return false
		}
	}
	return true
}

// sum adds the int64 sum points of name that match want.
func (m *metricsOf) sum(name string, want map[string]string) int64 {
	s, _ := m.find(name).(metricdata.Sum[int64])
	var n int64
	for _, p := range s.DataPoints {
		if matches(p.Attributes, want) {
			n += p.Value
		}
	}
	return n
}

// gaugeInt is the int64 gauge point of name that matches want (-1: none).
func (m *metricsOf) gaugeInt(name string, want map[string]string) int64 {
	g, _ := m.find(name).(metricdata.Gauge[int64])
	for _, p := range g.DataPoints {
		if matches(p.Attributes, want) {
			return p.Value
		}
	}
	return -1
}

func (m *metricsOf) gaugeFloat(name string, want map[string]string) float64 {
	g, _ := m.find(name).(metricdata.Gauge[float64])
	for _, p := range g.DataPoints {
		if matches(p.Attributes, want) {
			return p.Value
		}
	}
	return -1
}

// histCount is the number of values recorded in histogram name.
func (m *metricsOf) histCount(name string) uint64 {
	var n uint64
	switch h := m.find(name).(type) {
	case metricdata.Histogram[int64]:
		for _, p := range h.DataPoints {
			n += p.Count
		}
	case metricdata.Histogram[float64]:
		for _, p := range h.DataPoints {
			n += p.Count
		}
	}
	return n
}

func spansNamed(spans []sdktrace.ReadOnlySpan, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

func onlySpan(t *testing.T, spans []sdktrace.ReadOnlySpan, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	got := spansNamed(spans, name)
	if len(got) != 1 {
		var names []string
		for _, s := range spans {
			names = append(names, s.Name())
		}
		t.Fatalf("%d spans named %q among %q; want 1", len(got), name, names)
	}
	return got[0]
}

func wantAttrs(t *testing.T, s sdktrace.ReadOnlySpan, want map[string]string) {
	t.Helper()
	if !matches(attribute.NewSet(s.Attributes()...), want) {
		t.Fatalf("span %q has attributes %v; want %v among them", s.Name(), s.Attributes(), want)
	}
}

// noSecrets fails when a span (its attributes, events, links, status) or
// a metric point carries the partition key or a message id.
func noSecrets(t *testing.T, spans []sdktrace.ReadOnlySpan, rm *metricdata.ResourceMetrics) {
	t.Helper()
	check := func(where string, kvs []attribute.KeyValue) {
		for _, kv := range kvs {
			if v := kv.Value.String(); strings.Contains(v, secretKey) || strings.Contains(v, secretID) {
				t.Fatalf("%s: attribute %s = %q names a partition key or message id", where, kv.Key, v)
			}
		}
	}
	for _, s := range spans {
		check("span "+s.Name(), s.Attributes())
		for _, e := range s.Events() {
			check("span "+s.Name()+" event "+e.Name, e.Attributes)
		}
		for _, l := range s.Links() {
			check("span "+s.Name()+" link", l.Attributes)
		}
		if strings.Contains(s.Status().Description, secretKey) || strings.Contains(s.Status().Description, secretID) {
			t.Fatalf("span %s: status %q names a partition key or message id", s.Name(), s.Status().Description)
		}
	}
	if rm == nil {
		return
	}
	points := 0
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			for _, set := range pointSets(mt.Data) {
				points++
				check(fmt.Sprintf("metric %s", mt.Name), set.ToSlice())
			}
		}
	}
	if points == 0 {
		t.Fatal("no metric points to check")
	}
}

func pointSets(data any) []attribute.Set {
	var out []attribute.Set
	switch d := data.(type) {
	case metricdata.Sum[int64]:
		for _, p := range d.DataPoints {
			out = append(out, p.Attributes)
		}
	case metricdata.Gauge[int64]:
		for _, p := range d.DataPoints {
			out = append(out, p.Attributes)
		}
	case metricdata.Gauge[float64]:
		for _, p := range d.DataPoints {
			out = append(out, p.Attributes)
		}
	case metricdata.Histogram[int64]:
		for _, p := range d.DataPoints {
			out = append(out, p.Attributes)
		}
	case metricdata.Histogram[float64]:
		for _, p := range d.DataPoints {
			out = append(out, p.Attributes)
		}
	}
	return out
}

// The MySQL driver's own lines (the binary-log reader's, go-sql-driver's)
// reach the client's logger, the reader's configuration (it holds the
// password) never does, and shardq's lines use the documented keys.
func TestDriverLogsGoToTheClientLogger(t *testing.T) {
	drv, _ := testdb.TwoDrivers(t, "mysql")
	log := &testdb.LogLines{}
	c := newTestClient(t, drv, &shardq.Config{Logger: slog.New(log)})
	ctx := context.Background()
	if err := c.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	fail := errors.New("bad")
	cfg := faultSubscriberConfig(func(context.Context, *shardq.Delivery) error { return shardq.DeadLetter(fail) })
	if _, err := c.Subscribe(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Publish(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the binary-log reader's lines", func() bool { return log.Count("begin to sync binlog") > 0 })
	waitFor(t, "the dead-letter line", func() bool { return log.Count("message dead-lettered") > 0 })
	for _, line := range log.All() {
		if strings.Contains(line, "Password") || strings.Contains(line, "BinlogSyncerConfig") {
			t.Fatalf("a log line shows the reader's configuration: %s", line)
		}
		if strings.HasPrefix(line, "shardq: message dead-lettered") {
			for _, key := range []string{" tenant=t", " partition_key=k", " offset=", " id="} {
				if !strings.Contains(line, key) {
					t.Fatalf("dead-letter line %q lacks %q", line, key)
				}
			}
		}
	}
}
