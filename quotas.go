// SPDX-License-Identifier: Apache-2.0

package shardq

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/lifecycle"
	"github.com/shardq/shardq/internal/telemetry"
)

// ErrQuotaExceeded refuses a publish that would take its tenant over one
// of its quotas (Admin.SetTenantLimits); the error is a
// *QuotaExceededError, and nothing of the call is stored.
var ErrQuotaExceeded = errors.New("tenant quota exceeded")

// The quotas a QuotaExceededError names.
const (
	QuotaPublishRate     = "publish_rate"      // messages per second
	QuotaPublishByteRate = "publish_byte_rate" // message bytes per second (driver.MessageBytes)
	QuotaMaxMessages     = "max_messages"      // messages stored
	QuotaMaxBytes        = "max_bytes"         // bytes stored (TopicUsage.Bytes)
	QuotaMaxPartitions   = "max_partitions"    // partitions with a message
)

// QuotaExceededError names the tenant, the quota and its limit. For a rate,
// RetryAfter is when the call would fit (zero: never, the call alone is
// over a second's worth); for what is stored, Usage is what was last
// measured and the call fits only once the tenant stores less.
type QuotaExceededError struct {
	Tenant     string
	Quota      string // one of the Quota constants
	Limit      int64
	Usage      int64 // stored (as last measured) or, for a rate, the call's own
	Call       int64 // what the call adds
	RetryAfter time.Duration
}

func (e *QuotaExceededError) Error() string {
	switch {
	case e.Quota == QuotaPublishRate || e.Quota == QuotaPublishByteRate:
		if e.RetryAfter == 0 {
			return fmt.Sprintf("tenant %q: %s quota is %d per second; a call of %d is more than a second's worth", e.Tenant, e.Quota, e.Limit, e.Call)
		}
		return fmt.Sprintf("tenant %q: %s quota of %d per second exceeded; retry after %v", e.Tenant, e.Quota, e.Limit, e.RetryAfter)
	default:
		return fmt.Sprintf("tenant %q: %s quota of %d exceeded: %d stored, the call adds %d", e.Tenant, e.Quota, e.Limit, e.Usage, e.Call)
	}
}

// Is makes errors.Is(err, ErrQuotaExceeded) match.
func (e *QuotaExceededError) Is(target error) bool { return target == ErrQuotaExceeded }

// DefaultTenantUsageInterval is Config.TenantUsageInterval's default.
const DefaultTenantUsageInterval = 30 * time.Second

// quotaState is a tenant's rate limiters and last measured usage in one
// client.
type quotaState struct {
	mu              sync.Mutex
	msgs, bytes     *rate.Limiter
	msgRate, byteRt int64 // what the limiters were made for

	usage     atomic.Pointer[storedUsage]
	measuring ctxMutex // held by the call measuring the first usage
	refresh   atomic.Bool
	admitting ctxMutex // orders the storage checks and what they add
}

// ctxMutex is a mutex whose Lock gives up when ctx ends: its holders may
// wait on the database.
type ctxMutex struct{ ch chan struct{} }

func (m *ctxMutex) init() { m.ch = make(chan struct{}, 1) }

func (m *ctxMutex) lock(ctx context.Context) error {
	select {
	case m.ch <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (m *ctxMutex) tryLock() bool {
	select {
	case m.ch <- struct{}{}:
		return true
	default:
		return false
	}
}

func (m *ctxMutex) unlock() { <-m.ch }

// storedUsage is a measure of what a tenant stores, plus what this client
// admitted since (guarded by quotaState.admitting): its own publishes
// count at once, other clients' at the next measure.
type storedUsage struct {
	at                          time.Time
	messages, bytes, partitions int64 // partitions: head rows
	added                       struct{ messages, bytes int64 }
	// keys are the partitions this client published to since the
	// measure, any of which may be new.
	keys map[[2]string]struct{}
}

// hasQuota reports whether l sets any quota (retention aside).
func hasQuota(l driver.TenantLimits) bool {
	return l.PublishRate > 0 || l.PublishByteRate > 0 || l.MaxMessages > 0 || l.MaxBytes > 0 || l.MaxPartitions > 0
}

// admit refuses rows (all of tenant) when the tenant is suspended or the
// rows would take it over a quota. With wait, a rate quota delays the call
// instead (a large message's chunks: the write goes on at the tenant's
// rate).
func (ts *tenantStates) admit(ctx context.Context, tenant string, rows []*driver.InsertMessage, wait bool) error {
	st, s, err := ts.read(ctx, tenant)
	if err != nil {
		return err
	}
	if !s.suspendedAt.IsZero() {
		return &TenantSuspendedError{Tenant: tenant, Since: s.suspendedAt}
	}
	if !hasQuota(s.limits) {
		return nil
	}
	n, bytes := int64(len(rows)), int64(0)
	if s.limits.PublishByteRate > 0 || s.limits.MaxBytes > 0 {
		for _, r := range rows {
			b, err := driver.MessageBytes(r)
			if err != nil {
				return fmt.Errorf("tenant %q: size a message for its quotas: %w", tenant, err)
			}
			bytes += b
		}
	}
	// The rate first, given back when the storage check refuses: what
	// that check admits counts as stored.
	taken, err := ts.takeRate(ctx, tenant, &st.quota, s.limits, n, bytes, wait)
	if err == nil {
		if err = ts.checkStored(ctx, tenant, &st.quota, s.limits, rows, n, bytes); err != nil {
			st.quota.giveBack(taken, ts.clock())
		}
	}
	var qe *QuotaExceededError
	if errors.As(err, &qe) {
		ts.tel.QuotaRefused(tenant, qe.Quota)
	}
	return err
}

func (q *quotaState) giveBack(taken []*rate.Reservation, now time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, r := range taken {
		r.CancelAt(now)
	}
}

// takeRate takes n messages and bytes from the tenant's rate limiters
// (per client, as Kafka's quotas are per broker), each allowing a
// second's worth at once. With wait, a call over a second's worth is
// taken in pieces of a second's worth, and the call waits for the last.
func (ts *tenantStates) takeRate(ctx context.Context, tenant string, q *quotaState, l driver.TenantLimits, n, bytes int64, wait bool) ([]*rate.Reservation, error) {
	if l.PublishRate == 0 && l.PublishByteRate == 0 {
		return nil, nil
	}
	q.mu.Lock()
	now := ts.clock()
	if q.msgs == nil || q.msgRate != l.PublishRate {
		q.msgs, q.msgRate = limiter(l.PublishRate), l.PublishRate
	}
	if q.bytes == nil || q.byteRt != l.PublishByteRate {
		q.bytes, q.byteRt = limiter(l.PublishByteRate), l.PublishByteRate
	}
	type take struct {
		quota    string
		limit, n int64
		lim      *rate.Limiter
	}
	var delay time.Duration
	var worst *QuotaExceededError
	var taken []*rate.Reservation
	for _, t := range []take{{QuotaPublishRate, l.PublishRate, n, q.msgs}, {QuotaPublishByteRate, l.PublishByteRate, bytes, q.bytes}} {
		if t.limit == 0 {
			continue
		}
		if t.n > t.limit && !wait {
			worst = &QuotaExceededError{Tenant: tenant, Quota: t.quota, Limit: t.limit, Usage: t.n, Call: t.n}
			break
		}
		for left := t.n; left > 0; {
			piece := min(left, int64(t.lim.Burst()))
			left -= piece
			r := t.lim.ReserveN(now, int(piece)) // within the burst: always OK
			taken = append(taken, r)
			if d := r.DelayFrom(now); d > delay {
				delay = d
				worst = &QuotaExceededError{Tenant: tenant, Quota: t.quota, Limit: t.limit, Usage: t.n, Call: t.n, RetryAfter: d}
			}
		}
	}
	if worst != nil && (worst.RetryAfter == 0 || !wait) {
		for _, r := range taken {
			r.CancelAt(now)
		}
		q.mu.Unlock()
		return nil, worst
	}
	q.mu.Unlock()
	if delay == 0 {
		return taken, nil
	}
	t := time.NewTimer(delay)
	defer t.Stop()
	select {
	case <-t.C:
		return taken, nil
	case <-ctx.Done():
		q.giveBack(taken, ts.clock())
		return nil, fmt.Errorf("tenant %q: waiting for its publish rate quota: %w", tenant, ctx.Err())
	}
}

// limiter allows perSecond a second, a second's worth at once (perSecond
// fits an int: the limits are checked against the burst first).
func limiter(perSecond int64) *rate.Limiter {
	if perSecond == 0 {
		return nil
	}
	return rate.NewLimiter(rate.Limit(perSecond), int(min(perSecond, math.MaxInt32)))
}

// checkStored refuses rows that would take the tenant past what it may
// store: the last measure (at most TenantUsageInterval old, refreshed in
// the background; the first one in the call) plus what this client
// admitted since. So a tenant goes over only by what other clients
// publish between measures. What it admits is counted whether or not its
// transaction commits, until the next measure.
func (ts *tenantStates) checkStored(ctx context.Context, tenant string, q *quotaState, l driver.TenantLimits, rows []*driver.InsertMessage, n, bytes int64) error {
	if l.MaxMessages == 0 && l.MaxBytes == 0 && l.MaxPartitions == 0 {
		return nil
	}
	u, err := ts.usage(ctx, tenant, q)
	if err != nil {
		return err
	}
	if err := q.admitting.lock(ctx); err != nil {
		return fmt.Errorf("tenant %q: wait to check its quotas: %w", tenant, err)
	}
	defer q.admitting.unlock()
	msgs, stored := u.messages+u.added.messages, u.bytes+u.added.bytes
	if l.MaxMessages > 0 && msgs+n > l.MaxMessages {
		return &QuotaExceededError{Tenant: tenant, Quota: QuotaMaxMessages, Limit: l.MaxMessages, Usage: msgs, Call: n}
	}
	if l.MaxBytes > 0 && stored+bytes > l.MaxBytes {
		return &QuotaExceededError{Tenant: tenant, Quota: QuotaMaxBytes, Limit: l.MaxBytes, Usage: stored, Call: bytes}
	}
	if err := ts.checkPartitions(ctx, tenant, u, l, rows); err != nil {
		return err
	}
	u.added.messages += n
	u.added.bytes += bytes
	return nil
}

// checkPartitions refuses rows that would give the tenant more partitions
// (head rows) than its quota. Far from the limit it reads nothing: the
// measure plus every key published to since, each counted as new, stays
// within it. Near the limit it counts the tenant's head rows and reads
// which of the call's keys have none (two indexed reads).
func (ts *tenantStates) checkPartitions(ctx context.Context, tenant string, u *storedUsage, l driver.TenantLimits, rows []*driver.InsertMessage) error {
	if l.MaxPartitions == 0 {
		return nil
	}
	keys := map[string][]string{} // per topic, each key once, not yet among u.keys
	var unseen int64
	for _, r := range rows {
		k := [2]string{r.Topic, r.PartitionKey}
		if _, ok := u.keys[k]; ok {
			continue
		}
		if !slices.Contains(keys[r.Topic], r.PartitionKey) {
			keys[r.Topic] = append(keys[r.Topic], r.PartitionKey)
			unseen++
		}
	}
	if u.partitions+int64(len(u.keys))+unseen > l.MaxPartitions {
		have, err := ts.drv.TenantPartitions(ctx, tenant)
		if err != nil {
			return fmt.Errorf("tenant %q: check its partitions quota: %w", tenant, err)
		}
		var added int64
		for topic, ks := range keys {
			heads, err := ts.drv.HeadsOf(ctx, topic, []string{tenant}, ks)
			if err != nil {
				return fmt.Errorf("tenant %q: check its partitions quota: %w", tenant, err)
			}
			added += int64(len(ks) - len(heads))
		}
		if added > 0 && have+added > l.MaxPartitions {
			return &QuotaExceededError{Tenant: tenant, Quota: QuotaMaxPartitions, Limit: l.MaxPartitions, Usage: have, Call: added}
		}
	}
	if u.keys == nil {
		u.keys = map[[2]string]struct{}{}
	}
	for topic, ks := range keys {
		for _, k := range ks {
			u.keys[[2]string{topic, k}] = struct{}{}
		}
	}
	return nil
}

// usage is the tenant's stored usage as last measured: measured in the
// call the first time, then in the background once older than
// usageEvery while calls go on with the last measure.
func (ts *tenantStates) usage(ctx context.Context, tenant string, q *quotaState) (*storedUsage, error) {
	u := q.usage.Load()
	if u == nil {
		if err := q.measuring.lock(ctx); err != nil {
			return nil, fmt.Errorf("tenant %q: wait for the measure of what it stores: %w", tenant, err)
		}
		defer q.measuring.unlock()
		if u = q.usage.Load(); u != nil {
			return u, nil
		}
		u, err := ts.measure(ctx, tenant)
		if err != nil {
			return nil, err
		}
		q.usage.Store(u)
		return u, nil
	}
	if ts.clock().Sub(u.at) >= ts.usageEvery && q.refresh.CompareAndSwap(false, true) {
		ts.goBackground(func() {
			defer q.refresh.Store(false)
			ctx, cancel := context.WithTimeout(ts.life, lifecycle.CallTimeout)
			defer cancel()
			if u, err := ts.measure(ctx, tenant); err == nil {
				q.usage.Store(u)
			} else if ts.life.Err() == nil {
				ts.log.Warn("shardq: measure a tenant's usage for its quotas; the last measure stands", "tenant", tenant, "err", err)
			}
		}, func() { q.refresh.Store(false) })
	}
	return u, nil
}

// goBackground runs fn unless the client closed (then closed runs).
func (ts *tenantStates) goBackground(fn, closed func()) {
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

func (ts *tenantStates) measure(ctx context.Context, tenant string) (*storedUsage, error) {
	at := ts.clock()
	topics, err := ts.drv.TenantUsage(ctx, tenant)
	var heads int64
	if err == nil {
		heads, err = ts.drv.TenantPartitions(ctx, tenant)
	}
	if err != nil {
		return nil, fmt.Errorf("tenant %q: measure what it stores for its quotas: %w", tenant, err)
	}
	u := &storedUsage{at: at, partitions: heads}
	for _, t := range topics {
		u.messages += t.Messages
		u.bytes += t.Bytes
	}
	return u, nil
}

// quotaUses is what this client knows of its tenants' quotas, for the
// quota metrics.
func (ts *tenantStates) quotaUses() []telemetry.QuotaUse {
	type known struct {
		tenant string
		st     *tenantState
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
			// admitting may be held across a read: not under ts.mu, and
			// a collection skips what it cannot read at once.
			if !k.st.quota.admitting.tryLock() {
				u = nil
			} else {
				v := storedUsage{messages: u.messages + u.added.messages, bytes: u.bytes + u.added.bytes, partitions: u.partitions}
				k.st.quota.admitting.unlock()
				u = &v
			}
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
