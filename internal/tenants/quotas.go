// SPDX-License-Identifier: Apache-2.0

package tenants

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/lifecycle"
	"github.com/shardq/shardq/internal/publish"
	"github.com/shardq/shardq/internal/telemetry"
)

// hasQuota reports whether l sets any quota (retention aside).
func hasQuota(l driver.TenantLimits) bool {
	return l.PublishRate > 0 || l.PublishByteRate > 0 || l.MaxMessages > 0 || l.MaxBytes > 0 || l.MaxPartitions > 0
}

// Admit refuses rows (all of tenant) when the tenant is suspended or the
// rows would take it over a quota. With wait, a rate quota delays the call
// instead (a large message's chunks: the write goes on at the tenant's
// rate). What it admits is held against the storage quotas until end.
func (ts *States) Admit(ctx context.Context, tenant string, rows []*driver.InsertMessage, wait bool) (publish.End, error) {
	st, s, err := ts.read(ctx, tenant)
	if err != nil {
		return nil, err
	}
	if !s.suspendedAt.IsZero() {
		return nil, &TenantSuspendedError{Tenant: tenant, Since: s.suspendedAt}
	}
	if !hasQuota(s.limits) {
		return publish.NoEnd, nil
	}
	n, bytes := int64(len(rows)), int64(0)
	if s.limits.PublishByteRate > 0 || s.limits.MaxBytes > 0 {
		for _, r := range rows {
			b, err := driver.MessageBytes(r)
			if err != nil {
				return nil, fmt.Errorf("tenant %q: size a message for its quotas: %w", tenant, err)
			}
			bytes += b
		}
	}
	// The rate first, given back when the storage check refuses: what
	// that check admits counts as stored.
	taken, err := ts.takeRate(ctx, tenant, &st.quota, s.limits, n, bytes, wait)
	end := publish.NoEnd
	if err == nil {
		var a *admission
		if a, err = ts.checkStored(ctx, tenant, &st.quota, s.limits, rows, n, bytes); err != nil {
			st.quota.giveBack(taken, ts.clock())
		} else if a != nil {
			end = a.end
		}
	}
	var qe *QuotaExceededError
	if errors.As(err, &qe) {
		ts.tel.QuotaRefused(tenant, qe.Quota)
	}
	if err != nil {
		return nil, err
	}
	return end, nil
}

// admitStored refuses a consumer's write of bytes to tenant's stores (a
// message group's state, a deferred row) when the tenant is suspended or
// the bytes would take it past MaxBytes (they are not messages, nor
// publishes: the other quotas leave them alone). What it admits is held
// as a publish's is, until end.
func (ts *States) admitStored(ctx context.Context, tenant string, bytes int64) (publish.End, error) {
	st, s, err := ts.read(ctx, tenant)
	if err != nil {
		return nil, err
	}
	if !s.suspendedAt.IsZero() {
		return nil, &TenantSuspendedError{Tenant: tenant, Since: s.suspendedAt}
	}
	l, q := s.limits.MaxBytes, &st.quota
	if l == 0 {
		return publish.NoEnd, nil
	}
	u, err := ts.usage(ctx, tenant, q)
	if err != nil {
		return nil, err
	}
	if err := q.admitting.lock(ctx); err != nil {
		return nil, fmt.Errorf("tenant %q: wait to check its quotas: %w", tenant, err)
	}
	defer q.admitting.unlock()
	if c := q.counted(u); c.bytes+bytes > l {
		ts.tel.QuotaRefused(tenant, QuotaMaxBytes)
		return nil, &QuotaExceededError{Tenant: tenant, Quota: QuotaMaxBytes, Limit: l, Usage: c.bytes, Call: bytes}
	}
	return q.hold(usageSums{bytes: bytes}, nil, nil).end, nil
}

// full reports whether tenant stores what its MaxBytes allows, or more
// (false when it has none): the bookkeeping of new message groups, which
// holds no message, is refused then (writes.AcquireLease).
func (ts *States) full(ctx context.Context, tenant string) (limit, stored int64, err error) {
	st, s, err := ts.read(ctx, tenant)
	if err != nil || s.limits.MaxBytes == 0 {
		return 0, 0, err
	}
	u, err := ts.usage(ctx, tenant, &st.quota)
	if err != nil {
		return 0, 0, err
	}
	if c := st.quota.counted(u); c.bytes >= s.limits.MaxBytes {
		return s.limits.MaxBytes, c.bytes, nil
	}
	return 0, 0, nil
}

// checkStored refuses rows that would take the tenant past what it may
// store: the last measure (at most TenantUsageInterval old, refreshed in
// the background; the first one in the call) plus what this client
// admitted that the measure may not hold (in flight, or ended after it
// started). So one client never takes a tenant past its quota; a tenant
// goes over only by what other clients write between their measures.
func (ts *States) checkStored(ctx context.Context, tenant string, q *quotaState, l driver.TenantLimits, rows []*driver.InsertMessage, n, bytes int64) (*admission, error) {
	if l.MaxMessages == 0 && l.MaxBytes == 0 && l.MaxPartitions == 0 {
		return nil, nil
	}
	u, err := ts.usage(ctx, tenant, q)
	if err != nil {
		return nil, err
	}
	if err := q.admitting.lock(ctx); err != nil {
		return nil, fmt.Errorf("tenant %q: wait to check its quotas: %w", tenant, err)
	}
	defer q.admitting.unlock()
	c := q.counted(u)
	if l.MaxMessages > 0 && c.messages+n > l.MaxMessages {
		return nil, &QuotaExceededError{Tenant: tenant, Quota: QuotaMaxMessages, Limit: l.MaxMessages, Usage: c.messages, Call: n}
	}
	if l.MaxBytes > 0 && c.bytes+bytes > l.MaxBytes {
		return nil, &QuotaExceededError{Tenant: tenant, Quota: QuotaMaxBytes, Limit: l.MaxBytes, Usage: c.bytes, Call: bytes}
	}
	var keys [][2]string
	var exists map[[2]string]bool
	if l.MaxPartitions > 0 {
		if keys, exists, err = ts.checkPartitions(ctx, tenant, q, u, l, rows); err != nil {
			return nil, err
		}
	}
	return q.hold(usageSums{n, bytes}, keys, exists), nil
}

// checkPartitions refuses rows that would give the tenant more partitions
// (head rows) than its quota, and returns their keys (each once) and
// those found to exist. Far from the limit it reads nothing: the measure
// plus every key written to since, each counted as new, stays within
// it. Near the limit it counts the tenant's head rows and reads which of
// the call's keys have none (two indexed reads); the keys of writes in
// flight not known to exist count as new too.
func (ts *States) checkPartitions(ctx context.Context, tenant string, q *quotaState, u *storedUsage, l driver.TenantLimits, rows []*driver.InsertMessage) ([][2]string, map[[2]string]bool, error) {
	var keys [][2]string
	byTopic := map[string][]string{} // the call's keys, each once
	for _, r := range rows {
		k := [2]string{r.Topic, r.PartitionKey}
		if !slices.Contains(byTopic[r.Topic], r.PartitionKey) {
			byTopic[r.Topic] = append(byTopic[r.Topic], r.PartitionKey)
			keys = append(keys, k)
		}
	}
	// Counted: the keys of writes that the measure may not hold; unseen:
	// the call's other keys; inFlight: the keys of writes in flight,
	// not the call's, not known to exist.
	var counted, unseen, inFlight int64
	q.acct.Lock()
	u = q.latest(u)
	for k, ku := range q.keys {
		if ku.open > 0 || ku.until >= u.epoch {
			counted++
		}
		if ku.open > 0 && !ku.exists && !slices.Contains(byTopic[k[0]], k[1]) {
			inFlight++
		}
	}
	for _, k := range keys {
		if ku := q.keys[k]; ku == nil || ku.open == 0 && ku.until < u.epoch {
			unseen++
		}
	}
	q.acct.Unlock()
	if u.partitions+counted+unseen <= l.MaxPartitions {
		return keys, nil, nil
	}
	have, err := ts.drv.TenantPartitions(ctx, tenant)
	if err != nil {
		return nil, nil, fmt.Errorf("tenant %q: check its partitions quota: %w", tenant, err)
	}
	exists := map[[2]string]bool{}
	var added int64
	for topic, ks := range byTopic {
		heads, err := ts.drv.HeadsOf(ctx, topic, []string{tenant}, ks)
		if err != nil {
			return nil, nil, fmt.Errorf("tenant %q: check its partitions quota: %w", tenant, err)
		}
		for h := range heads {
			exists[[2]string{topic, h.PartitionKey}] = true
		}
		added += int64(len(ks) - len(heads))
	}
	if added > 0 && have+inFlight+added > l.MaxPartitions {
		return nil, nil, &QuotaExceededError{Tenant: tenant, Quota: QuotaMaxPartitions, Limit: l.MaxPartitions, Usage: have + inFlight, Call: added}
	}
	return keys, exists, nil
}

// usage is the tenant's stored usage as last measured: measured in the
// call the first time, then in the background once older than
// usageEvery while calls go on with the last measure.
func (ts *States) usage(ctx context.Context, tenant string, q *quotaState) (*storedUsage, error) {
	u := q.usage.Load()
	if u == nil {
		if err := q.measuring.lock(ctx); err != nil {
			return nil, fmt.Errorf("tenant %q: wait for the measure of what it stores: %w", tenant, err)
		}
		defer q.measuring.unlock()
		if u = q.usage.Load(); u != nil {
			return u, nil
		}
		u, err := ts.measure(ctx, tenant, q)
		if err != nil {
			return nil, err
		}
		q.land(u)
		return q.usage.Load(), nil
	}
	if ts.clock().Sub(u.at) >= ts.usageEvery && q.refresh.CompareAndSwap(false, true) {
		ts.goBackground(func() {
			defer q.refresh.Store(false)
			ctx, cancel := context.WithTimeout(ts.life, lifecycle.CallTimeout)
			defer cancel()
			if u, err := ts.measure(ctx, tenant, q); err == nil {
				q.land(u)
			} else if ts.life.Err() == nil {
				ts.log.Warn("shardq: measure a tenant's usage for its quotas; the last measure stands", "tenant", tenant, "err", err)
			}
		}, func() { q.refresh.Store(false) })
	}
	return u, nil
}

// goBackground runs fn unless the client closed (then closed runs).
func (ts *States) goBackground(fn, closed func()) {
	ts.bgMu.Lock()
	defer ts.bgMu.Unlock()
	if ts.life.Err() != nil {
		closed()
		return
	}
	ts.bg.Add(1)
	go func() {
		defer ts.bg.Done()
		fn()
	}()
}

// measure reads what the tenant stores, in a new epoch of q.
func (ts *States) measure(ctx context.Context, tenant string, q *quotaState) (*storedUsage, error) {
	at, epoch := ts.clock(), q.startMeasure()
	topics, err := ts.drv.TenantUsage(ctx, tenant)
	var heads int64
	if err == nil {
		heads, err = ts.drv.TenantPartitions(ctx, tenant)
	}
	if err != nil {
		return nil, fmt.Errorf("tenant %q: measure what it stores for its quotas: %w", tenant, err)
	}
	u := &storedUsage{at: at, epoch: epoch, partitions: heads}
	for _, t := range topics {
		u.messages += t.Messages
		u.bytes += t.Bytes
	}
	return u, nil
}

// QuotaUses is what this client knows of its tenants' quotas, for the
// quota metrics.
func (ts *States) QuotaUses() []telemetry.QuotaUse {
	type known struct {
		tenant string
		st     *state
	}
	var all []known
	ts.mu.Lock()
	for tenant, st := range ts.known {
		all = append(all, known{tenant, st})
	}
	ts.mu.Unlock()
	var out []telemetry.QuotaUse
	for _, k := range all {
		s := k.st.snap.Load()
		if s == nil || !hasQuota(s.limits) {
			continue
		}
		u := k.st.quota.usage.Load()
		if u != nil {
			c := k.st.quota.counted(u)
			u = &storedUsage{messages: c.messages, bytes: c.bytes, partitions: u.partitions}
		}
		l := s.limits
		for _, q := range []struct {
			name  string
			limit int64
			usage func(*storedUsage) int64
		}{
			{QuotaPublishRate, l.PublishRate, nil},
			{QuotaPublishByteRate, l.PublishByteRate, nil},
			{QuotaMaxMessages, l.MaxMessages, func(u *storedUsage) int64 { return u.messages }},
			{QuotaMaxBytes, l.MaxBytes, func(u *storedUsage) int64 { return u.bytes }},
			{QuotaMaxPartitions, l.MaxPartitions, func(u *storedUsage) int64 { return u.partitions }},
		} {
			if q.limit == 0 {
				continue
			}
			qu := telemetry.QuotaUse{Tenant: k.tenant, Quota: q.name, Limit: q.limit}
			if q.usage != nil && u != nil {
				qu.Usage, qu.Measured = q.usage(u), true
			}
			out = append(out, qu)
		}
	}
	return out
}
