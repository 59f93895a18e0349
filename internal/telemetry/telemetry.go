// SPDX-License-Identifier: Apache-2.0

// Package telemetry is shardq's OpenTelemetry instrumentation: spans and
// metrics through the OpenTelemetry API only (the application chooses the
// SDK and exporters), named after the messaging semantic conventions where
// they have a name, and shardq.* otherwise (docs/observability.md).
//
// Attributes are bounded: tenant, topic, consumer group, producer group
// and an operation or outcome; never a partition key or a message id.
package telemetry

import (
	"context"
	"errors"
	"reflect"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/semconv/v1.43.0/messagingconv"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/shardq/shardq/driver"
)

// Scope is the instrumentation scope of shardq's tracer and meter.
const Scope = "github.com/shardq/shardq"

// System is the value of messaging.system.
const System = "shardq"

// Attribute keys shardq adds to the semantic conventions' own.
const (
	TenantKey        = attribute.Key("shardq.tenant")
	AttemptKey       = attribute.Key("shardq.attempt")
	ProducerGroupKey = attribute.Key("shardq.producer_group")
	OutcomeKey       = attribute.Key("shardq.outcome")
	TransactionalKey = attribute.Key("shardq.transactional")
	QuotaKey         = attribute.Key("shardq.quota")
)

var (
	systemAttr = attribute.String("messaging.system", System)
	opNameKey  = attribute.Key("messaging.operation.name")
	opTypeKey  = attribute.Key("messaging.operation.type")
	destKey    = attribute.Key("messaging.destination.name")
	groupKey   = attribute.Key("messaging.consumer.group.name")
	batchKey   = attribute.Key("messaging.batch.message_count")
	errTypeKey = attribute.Key("error.type")
)

// T holds a client's tracer, meter and instruments. Its methods are safe
// for concurrent use; with the OpenTelemetry API's no-op providers (the
// globals before an application installs an SDK) they cost a few
// nanoseconds and allocate nothing on the hot paths.
type T struct {
	tracer trace.Tracer
	// global: the tracer is the global provider's, which may have no SDK
	// behind it (tracingOff).
	global bool

	sent       messagingconv.ClientSentMessages
	consumed   messagingconv.ClientConsumedMessages
	opDuration messagingconv.ClientOperationDuration
	process    messagingconv.ProcessDuration

	batchSize        metric.Int64Histogram
	batchCalls       metric.Int64Histogram
	leasesHeld       metric.Int64UpDownCounter
	leasesAcquired   metric.Int64Counter
	leasesLost       metric.Int64Counter
	rebalance        metric.Float64Histogram
	retries          metric.Int64Counter
	deadLettered     metric.Int64Counter
	expired          metric.Int64Counter
	checks           metric.Int64Counter
	retentionDeleted metric.Int64Counter
	quotaRefused     metric.Int64Counter

	// sets caches attribute sets by what they are made of, so that a hot
	// path builds none.
	sets sync.Map

	mu         sync.Mutex
	lagSources map[*LagSource]struct{}
	halfSource map[*HalfSource]struct{}
	quotas     func() []QuotaUse
}

// New makes a client's instruments from tp and mp (nil: the globals). An
// instrument the SDK refuses is logged through otel's error handler and
// left a no-op: telemetry never stops a client.
func New(tp trace.TracerProvider, mp metric.MeterProvider) *T {
	global := tp == nil
	if global {
		tp = otel.GetTracerProvider()
	}
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(Scope)
	t := &T{tracer: tp.Tracer(Scope), global: global, lagSources: map[*LagSource]struct{}{}, halfSource: map[*HalfSource]struct{}{}}
	var errs []error
	note := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	var err error
	t.sent, err = messagingconv.NewClientSentMessages(m)
	note(err)
	t.consumed, err = messagingconv.NewClientConsumedMessages(m)
	note(err)
	t.opDuration, err = messagingconv.NewClientOperationDuration(m)
	note(err)
	t.process, err = messagingconv.NewProcessDuration(m)
	note(err)
	t.batchSize, err = m.Int64Histogram("shardq.publish.batch.size", metric.WithUnit("{message}"),
		metric.WithDescription("Messages per publish transaction (concurrent Publish calls share one)."),
		metric.WithExplicitBucketBoundaries(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000))
	note(err)
	t.batchCalls, err = m.Int64Histogram("shardq.publish.batch.calls", metric.WithUnit("{call}"),
		metric.WithDescription("Publish calls coalesced into one publish transaction."),
		metric.WithExplicitBucketBoundaries(1, 2, 5, 10, 20, 50, 100, 200, 500))
	note(err)
	t.leasesHeld, err = m.Int64UpDownCounter("shardq.consumer.leases.held", metric.WithUnit("{lease}"),
		metric.WithDescription("Partition leases this process holds."))
	note(err)
	t.leasesAcquired, err = m.Int64Counter("shardq.consumer.leases.acquired", metric.WithUnit("{lease}"),
		metric.WithDescription("Partition leases acquired."))
	note(err)
	t.leasesLost, err = m.Int64Counter("shardq.consumer.leases.lost", metric.WithUnit("{lease}"),
		metric.WithDescription("Partition leases lost (taken over, expired or fenced) rather than released."))
	note(err)
	t.rebalance, err = m.Float64Histogram("shardq.consumer.rebalance.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of one rebalance tick (discovery, orphan sweep, acquisitions)."),
		metric.WithExplicitBucketBoundaries(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
	note(err)
	t.retries, err = m.Int64Counter("shardq.consumer.retries", metric.WithUnit("{attempt}"),
		metric.WithDescription("Failed deliveries scheduled for another attempt."))
	note(err)
	t.deadLettered, err = m.Int64Counter("shardq.consumer.dead_lettered", metric.WithUnit("{message}"),
		metric.WithDescription("Messages copied to the dead-letter topic."))
	note(err)
	t.expired, err = m.Int64Counter("shardq.consumer.expired", metric.WithUnit("{message}"),
		metric.WithDescription("Messages past their expiry, settled without delivery (dead-lettered when configured)."))
	note(err)
	t.checks, err = m.Int64Counter("shardq.tx.checks", metric.WithUnit("{check}"),
		metric.WithDescription("Check-backs of half messages, by outcome (commit, rollback, unknown)."))
	note(err)
	t.retentionDeleted, err = m.Int64Counter("shardq.retention.deleted", metric.WithUnit("{message}"),
		metric.WithDescription("Messages deleted by retention."))
	note(err)
	t.quotaRefused, err = m.Int64Counter("shardq.tenant.quota.refused", metric.WithUnit("{call}"),
		metric.WithDescription("Publish calls a tenant's quota refused, per tenant and quota."))
	note(err)
	note(t.observeQuotas(m))
	note(t.observeLag(m))
	note(t.observeHalves(m))
	if len(errs) > 0 {
		otel.Handle(errors.Join(errs...))
	}
	return t
}

// unsetGlobal is the type of otel's global tracer provider before an
// application sets one (nil if one was set before this package loaded).
var unsetGlobal = func() reflect.Type {
	typ := reflect.TypeOf(otel.GetTracerProvider())
	if typ.Kind() == reflect.Pointer && typ.Elem().PkgPath() == "go.opentelemetry.io/otel/internal/global" {
		return typ
	}
	return nil
}()

// start starts a span, unless the tracer is the global one and no SDK is
// installed: then it returns ctx and a no-op span without allocating (a
// span the global tracer starts costs two allocations per message).
func (t *T) start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	if t.global && reflect.TypeOf(otel.GetTracerProvider()) == unsetGlobal {
		return ctx, noop.Span{}
	}
	return t.tracer.Start(ctx, name, opts...)
}

// set returns the cached attribute set of kvs under key.
func (t *T) set(key any, kvs func() []attribute.KeyValue) attribute.Set {
	if s, ok := t.sets.Load(key); ok {
		return s.(attribute.Set)
	}
	s := attribute.NewSet(kvs()...)
	t.sets.Store(key, s)
	return s
}

type destKeyT struct{ op, tenant, topic, group, errType string }

// dest is the set {system, operation, tenant, topic[, group][, error]}.
func (t *T) dest(op, tenant, topic, group, errType string) attribute.Set {
	return t.set(destKeyT{op, tenant, topic, group, errType}, func() []attribute.KeyValue {
		kvs := []attribute.KeyValue{systemAttr, opNameKey.String(op), TenantKey.String(tenant), destKey.String(topic)}
		if group != "" {
			kvs = append(kvs, groupKey.String(group))
		}
		if errType != "" {
			kvs = append(kvs, errTypeKey.String(errType))
		}
		return kvs
	})
}

type groupKeyT struct{ tenant, topic, group string }

// groupSet is {tenant, topic, group}: the consumer metrics' attributes.
func (t *T) groupSet(tenant, topic, group string) attribute.Set {
	return t.set(groupKeyT{tenant, topic, group}, func() []attribute.KeyValue {
		return []attribute.KeyValue{systemAttr, TenantKey.String(tenant), destKey.String(topic), groupKey.String(group)}
	})
}

type tenantKeyT string

// tenantSet is {system, tenant}.
func (t *T) tenantSet(tenant string) attribute.Set {
	return t.set(tenantKeyT(tenant), func() []attribute.KeyValue { return []attribute.KeyValue{systemAttr, TenantKey.String(tenant)} })
}

// ErrorType classifies err for error.type with a bounded set of values.
func ErrorType(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, driver.ErrLeaseLost):
		return "lease_lost"
	default:
		return "_OTHER"
	}
}

// Propagator is the global text map propagator, read at each use so that
// one an application installs after NewClient applies.
func Propagator() propagation.TextMapPropagator { return otel.GetTextMapPropagator() }

// endSpan ends span with err's status. shardq's own errors name
// partitions and ids, so only their class is recorded (error.type); an
// application's error (handler, local transaction, checker) is recorded as
// given.
func endSpan(span trace.Span, err error, own bool) {
	if err != nil && span.IsRecording() {
		span.SetAttributes(errTypeKey.String(ErrorType(err)))
		if own {
			span.SetStatus(codes.Error, ErrorType(err))
		} else {
			span.RecordError(err)
			span.SetStatus(codes.Error, "")
		}
	}
	span.End()
}

// seconds is d in seconds, as the conventions' durations are.
func seconds(d time.Duration) float64 { return d.Seconds() }
