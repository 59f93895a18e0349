// SPDX-License-Identifier: Apache-2.0

package telemetry

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// Group records the events of one consumer (a subscriber, a group
// receiver) of a topic's consumer group. A nil *Group records nothing.
type Group struct {
	t            *T
	topic, group string
}

// Group returns the recorder of topic's consumer group group.
func (t *T) Group(topic, group string) *Group { return &Group{t: t, topic: topic, group: group} }

func (g *Group) set(tenant string) metric.MeasurementOption {
	return metric.WithAttributeSet(g.t.groupSet(tenant, g.topic, g.group))
}

// LeaseAcquired counts a partition lease taken in tenant.
func (g *Group) LeaseAcquired(tenant string) {
	if g == nil {
		return
	}
	ctx := context.Background()
	g.t.leasesAcquired.Add(ctx, 1, g.set(tenant))
	g.t.leasesHeld.Add(ctx, 1, g.set(tenant))
}

// LeaseEnded counts a lease given up: released, or lost (taken over,
// expired, fenced).
func (g *Group) LeaseEnded(tenant string, lost bool) {
	if g == nil {
		return
	}
	ctx := context.Background()
	g.t.leasesHeld.Add(ctx, -1, g.set(tenant))
	if lost {
		g.t.leasesLost.Add(ctx, 1, g.set(tenant))
	}
}

// Tick records one rebalance tick's duration.
func (g *Group) Tick(d time.Duration) {
	if g == nil {
		return
	}
	set := g.t.set(groupKeyT{"", g.topic, g.group}, func() []attribute.KeyValue {
		return []attribute.KeyValue{systemAttr, destKey.String(g.topic), groupKey.String(g.group)}
	})
	g.t.rebalance.Record(context.Background(), seconds(d), metric.WithAttributeSet(set))
}

// Retry counts a failed delivery that is tried again.
func (g *Group) Retry(tenant string) {
	if g == nil {
		return
	}
	g.t.retries.Add(context.Background(), 1, g.set(tenant))
}

// DeadLettered counts n messages copied to the dead-letter topic.
func (g *Group) DeadLettered(tenant string, n int) {
	if g == nil {
		return
	}
	g.t.deadLettered.Add(context.Background(), int64(n), g.set(tenant))
}

// Expired counts n messages that expired before they were handed out.
func (g *Group) Expired(tenant string, n int) {
	if g == nil {
		return
	}
	g.t.expired.Add(context.Background(), int64(n), g.set(tenant))
}

// Lag is one tenant's backlog in a consumer group.
type Lag struct {
	Tenant string
	// Messages counts the messages after the group's cursors, up to
	// driver.LagCountLimit per partition.
	Messages int64
	// Oldest is the creation time of the oldest of them (zero: none).
	Oldest time.Time
}

// LagSource is a consumer's lag, read at each collection.
type LagSource struct {
	Topic, Group string
	Read         func(ctx context.Context) ([]Lag, error)
}

// AddLag reports src's lag until RemoveLag.
func (t *T) AddLag(src *LagSource) {
	t.mu.Lock()
	t.lagSources[src] = struct{}{}
	t.mu.Unlock()
}

// RemoveLag stops reporting src.
func (t *T) RemoveLag(src *LagSource) {
	t.mu.Lock()
	delete(t.lagSources, src)
	t.mu.Unlock()
}

// collectTimeout bounds the reads one collection makes for the lag and
// half-message gauges.
const collectTimeout = 5 * time.Second

// observeLag registers shardq.consumer.lag and shardq.consumer.lag.age.
// Every member reports its tenants' lag; aggregate with max by tenant,
// topic and group.
func (t *T) observeLag(m metric.Meter) error {
	lag, err := m.Int64ObservableGauge("shardq.consumer.lag", metric.WithUnit("{message}"),
		metric.WithDescription("Messages after the consumer group's committed cursors, per tenant (up to 10,000 per partition)."))
	if err != nil {
		return err
	}
	age, err := m.Float64ObservableGauge("shardq.consumer.lag.age", metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest message after the consumer group's committed cursors; 0 when caught up."))
	if err != nil {
		return err
	}
	_, err = m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		t.mu.Lock()
		srcs := make([]*LagSource, 0, len(t.lagSources))
		for s := range t.lagSources {
			srcs = append(srcs, s)
		}
		t.mu.Unlock()
		ctx, cancel := context.WithTimeout(ctx, collectTimeout)
		defer cancel()
		now := time.Now()
		var errs []error
		for _, s := range srcs {
			lags, err := s.Read(ctx)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			for _, l := range lags {
				set := metric.WithAttributeSet(t.groupSet(l.Tenant, s.Topic, s.Group))
				o.ObserveInt64(lag, l.Messages, set)
				a := 0.0
				if !l.Oldest.IsZero() {
					a = max(0, now.Sub(l.Oldest).Seconds())
				}
				o.ObserveFloat64(age, a, set)
			}
		}
		return errors.Join(errs...)
	}, lag, age)
	return err
}

// HalfSource is a transaction producer group's pending half messages per
// tenant, read at each collection.
type HalfSource struct {
	ProducerGroup string
	Read          func(ctx context.Context) (map[string]int64, error)
}

// AddHalves reports src until RemoveHalves.
func (t *T) AddHalves(src *HalfSource) {
	t.mu.Lock()
	t.halfSource[src] = struct{}{}
	t.mu.Unlock()
}

// RemoveHalves stops reporting src.
func (t *T) RemoveHalves(src *HalfSource) {
	t.mu.Lock()
	delete(t.halfSource, src)
	t.mu.Unlock()
}

func (t *T) observeHalves(m metric.Meter) error {
	pending, err := m.Int64ObservableGauge("shardq.tx.half_messages.pending", metric.WithUnit("{message}"),
		metric.WithDescription("Half messages (transactional sends) neither committed nor rolled back, per producer group and tenant."))
	if err != nil {
		return err
	}
	_, err = m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		ctx, cancel := context.WithTimeout(ctx, collectTimeout)
		defer cancel()
		t.mu.Lock()
		srcs := make([]*HalfSource, 0, len(t.halfSource))
		for s := range t.halfSource {
			srcs = append(srcs, s)
		}
		t.mu.Unlock()
		var errs []error
		for _, s := range srcs {
			counts, err := s.Read(ctx)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			for tenant, n := range counts {
				o.ObserveInt64(pending, n, metric.WithAttributeSet(t.producerSet(s.ProducerGroup, tenant, "")))
			}
		}
		return errors.Join(errs...)
	}, pending)
	return err
}

type producerKeyT struct{ group, tenant, outcome string }

func (t *T) producerSet(group, tenant, outcome string) attribute.Set {
	return t.set(producerKeyT{group, tenant, outcome}, func() []attribute.KeyValue {
		kvs := []attribute.KeyValue{systemAttr, ProducerGroupKey.String(group), TenantKey.String(tenant)}
		if outcome != "" {
			kvs = append(kvs, OutcomeKey.String(outcome))
		}
		return kvs
	})
}

// StartCheck starts the span of one check-back of a half message, a child
// of the transactional send that stored it.
func (t *T) StartCheck(ctx context.Context, producerGroup, tenant, topic string, headers map[string]string) (context.Context, trace.Span) {
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(
		systemAttr, opNameKey.String(OpCheck), ProducerGroupKey.String(producerGroup), TenantKey.String(tenant), destKey.String(topic))}
	if sc := Extract(headers); sc.IsValid() {
		ctx = trace.ContextWithRemoteSpanContext(ctx, sc)
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
	}
	return t.start(ctx, OpCheck+" "+topic, opts...)
}

// EndCheck ends a check's span with its outcome (commit, rollback,
// unknown) and counts it. err is the checker's own.
func (t *T) EndCheck(span trace.Span, producerGroup, tenant, outcome string, err error) {
	span.SetAttributes(OutcomeKey.String(outcome))
	endSpan(span, err, false)
	t.checks.Add(context.Background(), 1, metric.WithAttributeSet(t.producerSet(producerGroup, tenant, outcome)))
}

// RetentionDeleted counts messages deleted by retention in a tenant.
func (t *T) RetentionDeleted(tenant string, n int64) {
	if n == 0 {
		return
	}
	t.retentionDeleted.Add(context.Background(), n, metric.WithAttributeSet(t.tenantSet(tenant)))
}

// QuotaUse is one quota of a tenant as a client knows it: its limit and,
// for what is stored, the usage last measured (Measured).
type QuotaUse struct {
	Tenant, Quota string
	Limit, Usage  int64
	Measured      bool
}

// SetQuotas reports what read returns at each collection; nil stops it.
func (t *T) SetQuotas(read func() []QuotaUse) {
	t.mu.Lock()
	t.quotas = read
	t.mu.Unlock()
}

// QuotaRefused counts a publish a tenant's quota refused.
func (t *T) QuotaRefused(tenant, quota string) {
	t.quotaRefused.Add(context.Background(), 1, metric.WithAttributeSet(t.quotaSet(tenant, quota)))
}

type quotaKeyT struct{ tenant, quota string }

func (t *T) quotaSet(tenant, quota string) attribute.Set {
	return t.set(quotaKeyT{tenant, quota}, func() []attribute.KeyValue {
		return []attribute.KeyValue{systemAttr, TenantKey.String(tenant), QuotaKey.String(quota)}
	})
}

func (t *T) observeQuotas(m metric.Meter) error {
	limit, err := m.Int64ObservableGauge("shardq.tenant.quota.limit",
		metric.WithDescription("A tenant's quota as this client last read it (rates per second), per tenant and quota."))
	if err != nil {
		return err
	}
	usage, err := m.Int64ObservableGauge("shardq.tenant.quota.usage",
		metric.WithDescription("What a tenant stores against its storage quotas, as this client last measured it, per tenant and quota."))
	if err != nil {
		return err
	}
	_, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		t.mu.Lock()
		read := t.quotas
		t.mu.Unlock()
		if read == nil {
			return nil
		}
		for _, q := range read() {
			set := metric.WithAttributeSet(t.quotaSet(q.Tenant, q.Quota))
			o.ObserveInt64(limit, q.Limit, set)
			if q.Measured {
				o.ObserveInt64(usage, q.Usage, set)
			}
		}
		return nil
	}, limit, usage)
	return err
}
