// SPDX-License-Identifier: Apache-2.0

package telemetry

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/shardq/shardq/driver"
)

// Operation names (messaging.operation.name).
const (
	OpSend    = "send"
	OpProcess = "process"
	OpReceive = "receive"
	OpCheck   = "check"
)

// StartSend starts the span of one publish call (kind producer). Its name
// gets the topic once the messages are validated (Sent).
func (t *T) StartSend(ctx context.Context, transactional bool) (context.Context, trace.Span) {
	ctx, span := t.start(ctx, OpSend, producerKind...)
	if span.IsRecording() { // without an SDK, build nothing
		span.SetAttributes(systemAttr, opNameKey.String(OpSend), opTypeKey.String("send"), TransactionalKey.Bool(transactional))
	}
	return ctx, span
}

var (
	producerKind = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindProducer)}
	consumerKind = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer)}
)

// MaxTraceHeaderBytes bounds each header Inject writes: a traceparent
// is 55 bytes, and a tracestate or baggage longer than this is left out.
// Those come from whoever started the trace (an HTTP client of serve,
// say) and are copied into every message of a publish, outside the
// caller's header limits: unbounded, they would multiply what a small
// request stores.
const MaxTraceHeaderBytes = 256

// Inject writes ctx's trace context (W3C traceparent through the global
// propagator) into headers, keeping any key the caller set itself and
// leaving out values over MaxTraceHeaderBytes. With no span context in
// ctx it writes nothing.
func Inject(ctx context.Context, headers map[string]string) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	carrier := propagation.MapCarrier{}
	Propagator().Inject(ctx, carrier)
	for k, v := range carrier {
		if _, set := headers[k]; !set && len(v) <= MaxTraceHeaderBytes {
			headers[k] = v
		}
	}
}

// Extract returns the trace context a message carries (its creation
// context), or an invalid one.
func Extract(headers map[string]string) trace.SpanContext {
	if len(headers) == 0 {
		return trace.SpanContext{}
	}
	return trace.SpanContextFromContext(Propagator().Extract(context.Background(), propagation.MapCarrier(headers)))
}

// EndSend ends a publish call's span and counts its messages
// (messaging.client.sent.messages, per tenant and topic) and its duration
// (messaging.client.operation.duration). rows is nil when the call was
// refused before anything was sent: only the span records that.
func (t *T) EndSend(ctx context.Context, span trace.Span, start time.Time, rows []*driver.InsertMessage, err error) {
	if len(rows) == 0 {
		endSpan(span, err, true)
		return
	}
	first := rows[0]
	if span.IsRecording() {
		span.SetName(OpSend + " " + first.Topic)
		span.SetAttributes(TenantKey.String(first.Tenant), destKey.String(first.Topic))
		if len(rows) > 1 {
			span.SetAttributes(batchKey.Int(len(rows)))
		}
	}
	endSpan(span, err, true)
	if !t.sent.Enabled(ctx) && !t.opDuration.Enabled(ctx) {
		return
	}
	errType := ErrorType(err)
	for i := 0; i < len(rows); {
		j := i + 1
		for j < len(rows) && rows[j].Topic == rows[i].Topic {
			j++
		}
		t.sent.AddSet(ctx, int64(j-i), t.dest(OpSend, rows[i].Tenant, rows[i].Topic, "", errType))
		i = j
	}
	t.opDuration.RecordSet(ctx, seconds(time.Since(start)), t.dest(OpSend, first.Tenant, first.Topic, "", errType))
}

// Batch records one publish transaction: its messages and the calls that
// share it.
func (t *T) Batch(ctx context.Context, tenant string, messages, calls int) {
	if !t.batchSize.Enabled(ctx) && !t.batchCalls.Enabled(ctx) {
		return
	}
	set := metric.WithAttributeSet(t.tenantSet(tenant))
	t.batchSize.Record(ctx, int64(messages), set)
	t.batchCalls.Record(ctx, int64(calls), set)
}

// StartProcess starts the span of one handler invocation (kind consumer)
// over messages of one partition. A single message's creation context is
// the span's parent, so that publish and delivery form one trace; every
// message's is also a link, as the conventions ask for batches.
func (t *T) StartProcess(ctx context.Context, tenant, topic, group string, msgs []driver.Message, attempt int) (context.Context, trace.Span) {
	var links []trace.Link
	for _, m := range msgs {
		if sc := Extract(m.Headers); sc.IsValid() {
			links = append(links, trace.Link{SpanContext: sc})
		}
	}
	if len(msgs) == 1 && len(links) == 1 {
		ctx = trace.ContextWithRemoteSpanContext(ctx, links[0].SpanContext)
	}
	opts := consumerKind
	if len(links) > 0 {
		opts = []trace.SpanStartOption{consumerKind[0], trace.WithLinks(links...)}
	}
	ctx, span := t.start(ctx, OpProcess, opts...)
	if span.IsRecording() { // without an SDK, build nothing
		span.SetName(OpProcess + " " + topic)
		span.SetAttributes(systemAttr, opNameKey.String(OpProcess), opTypeKey.String("process"), TenantKey.String(tenant),
			destKey.String(topic), groupKey.String(group), AttemptKey.Int(attempt))
		if len(msgs) > 1 {
			span.SetAttributes(batchKey.Int(len(msgs)))
		}
	}
	return ctx, span
}

// EndProcess ends a handler's span (err is the handler's own) and records
// messaging.client.consumed.messages and messaging.process.duration.
func (t *T) EndProcess(ctx context.Context, span trace.Span, tenant, topic, group string, n int, start time.Time, err error) {
	endSpan(span, err, false)
	if t.consumed.Enabled(ctx) {
		t.consumed.AddSet(ctx, int64(n), t.dest(OpProcess, tenant, topic, group, ""))
	}
	if t.process.Enabled(ctx) {
		t.process.RecordSet(ctx, seconds(time.Since(start)), t.dest(OpProcess, tenant, topic, group, ErrorType(err)))
	}
}

// Received records a message a receiver handed to the application: a
// receive span linked to (and, for one message, a child of) its creation
// context, the consumed counter and the operation's duration.
func (t *T) Received(ctx context.Context, m driver.Message, group string, start time.Time) {
	sc := Extract(m.Headers)
	opts := []trace.SpanStartOption{consumerKind[0], trace.WithTimestamp(start)}
	if sc.IsValid() {
		ctx = trace.ContextWithRemoteSpanContext(ctx, sc)
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
	}
	_, span := t.start(ctx, OpReceive+" "+m.Topic, opts...)
	if span.IsRecording() { // without an SDK, build nothing
		span.SetAttributes(systemAttr, opNameKey.String(OpReceive), opTypeKey.String("receive"), TenantKey.String(m.Tenant),
			destKey.String(m.Topic), groupKey.String(group))
	}
	span.End()
	if t.consumed.Enabled(ctx) || t.opDuration.Enabled(ctx) {
		set := t.dest(OpReceive, m.Tenant, m.Topic, group, "")
		t.consumed.AddSet(ctx, 1, set)
		t.opDuration.RecordSet(ctx, seconds(time.Since(start)), set)
	}
}
