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

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/lifecycle"
	"github.com/shardq/shardq/internal/publish"
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
// client, and what the client admitted that the measure may not hold.
type quotaState struct {
	mu              sync.Mutex
	msgs, bytes     *bucket
	msgRate, byteRt int64 // what the buckets were made for

	usage     atomic.Pointer[storedUsage]
	measuring ctxMutex // held by the call measuring the first usage
	refresh   atomic.Bool
	admitting ctxMutex // orders the storage checks and what they admit

	// acct guards what this client admitted: writes in flight (open),
	// and ended ones by the last measure epoch that may miss them. A
	// write is counted from its check until a measure that started after
	// it ended lands, so no measure drops a write it cannot see.
	acct  sync.Mutex
	epoch int64 // measures started
	open  usageSums
	ended map[int64]usageSums
	// keys are the partitions written to that a measure may not hold yet
	// (only under a partitions quota), any of which may be new.
	keys map[[2]string]*keyUse
}

// usageSums is what writes add to a tenant's stored usage.
type usageSums struct{ messages, bytes int64 }

func (u usageSums) plus(v usageSums) usageSums {
	return usageSums{u.messages + v.messages, u.bytes + v.bytes}
}

func (u usageSums) minus(v usageSums) usageSums {
	return usageSums{u.messages - v.messages, u.bytes - v.bytes}
}

// keyUse is one partition's writes since the measure: open is how many
// are in flight; until the last measure epoch that may miss the ended
// ones; exists that a check found its head row (it is not new).
type keyUse struct {
	open   int
	until  int64
	exists bool
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

func (m *ctxMutex) unlock() { <-m.ch }

// storedUsage is a measure of what a tenant stores, taken from epoch on:
// it holds every write that ended before its epoch began.
type storedUsage struct {
	at                          time.Time
	epoch                       int64
	messages, bytes, partitions int64 // partitions: head rows
}

// admission is what a check admitted of one write: held against the
// tenant's storage quotas from the check until its end, then until a
// measure that started after the end lands.
type admission struct {
	q    *quotaState
	sums usageSums
	keys [][2]string
	done atomic.Bool
}

// end records how the write ended (publish.End). A write that ends out of
// sight is held until the second measure from now lands: at least
// TenantUsageInterval, since measures start that far apart.
func (a *admission) end(o publish.Outcome) {
	if !a.done.CompareAndSwap(false, true) {
		return
	}
	q := a.q
	q.acct.Lock()
	defer q.acct.Unlock()
	until := q.epoch
	if o == publish.EndsUnseen {
		until++
	}
	q.open = q.open.minus(a.sums)
	if q.ended == nil {
		q.ended = map[int64]usageSums{}
	}
	q.ended[until] = q.ended[until].plus(a.sums)
	for _, k := range a.keys {
		ku := q.keys[k]
		ku.open--
		ku.until = max(ku.until, until)
	}
}

// hold admits sums and keys (each once), in flight until their end;
// exists are those of keys whose head rows a check found.
func (q *quotaState) hold(sums usageSums, keys [][2]string, exists map[[2]string]bool) *admission {
	q.acct.Lock()
	defer q.acct.Unlock()
	q.open = q.open.plus(sums)
	if len(keys) > 0 && q.keys == nil {
		q.keys = map[[2]string]*keyUse{}
	}
	for _, k := range keys {
		ku := q.keys[k]
		if ku == nil {
			ku = &keyUse{until: -1}
			q.keys[k] = ku
		}
		ku.open++
		ku.exists = ku.exists || exists[k]
	}
	return &admission{q: q, sums: sums, keys: keys}
}

// latest is u, or the measure that landed after it: what a later measure
// holds is no longer counted beside it (q.acct held).
func (q *quotaState) latest(u *storedUsage) *storedUsage {
	if cur := q.usage.Load(); cur != nil && cur.epoch > u.epoch {
		return cur
	}
	return u
}

// counted is the measure (u, or a later one) plus what this client
// admitted that it may not hold.
func (q *quotaState) counted(u *storedUsage) usageSums {
	q.acct.Lock()
	defer q.acct.Unlock()
	u = q.latest(u)
	sum := usageSums{u.messages, u.bytes}.plus(q.open)
	for e, s := range q.ended {
		if e >= u.epoch {
			sum = sum.plus(s)
		}
	}
	return sum
}

// startMeasure begins a measure's epoch: writes that end from now on may
// be missing from it.
func (q *quotaState) startMeasure() int64 {
	q.acct.Lock()
	defer q.acct.Unlock()
	q.epoch++
	return q.epoch
}

// land makes u the measure in use (unless a later one landed first) and
// forgets the writes it holds.
func (q *quotaState) land(u *storedUsage) {
	q.acct.Lock()
	defer q.acct.Unlock()
	if cur := q.usage.Load(); cur != nil && cur.epoch > u.epoch {
		return
	}
	q.usage.Store(u)
	for e := range q.ended {
		if e < u.epoch {
			delete(q.ended, e)
		}
	}
	for k, ku := range q.keys {
		if ku.open == 0 && ku.until < u.epoch {
			delete(q.keys, k)
		}
	}
}

// hasQuota reports whether l sets any quota (retention aside).
func hasQuota(l driver.TenantLimits) bool {
	return l.PublishRate > 0 || l.PublishByteRate > 0 || l.MaxMessages > 0 || l.MaxBytes > 0 || l.MaxPartitions > 0
}

// admit refuses rows (all of tenant) when the tenant is suspended or the
// rows would take it over a quota. With wait, a rate quota delays the call
// instead (a large message's chunks: the write goes on at the tenant's
// rate). What it admits is held against the storage quotas until end.
func (ts *tenantStates) admit(ctx context.Context, tenant string, rows []*driver.InsertMessage, wait bool) (publish.End, error) {
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

// bucket is a token bucket of rate tokens a second that holds at most a
// second's worth. A take may leave it in debt (the caller waits it out),
// and a take given back before it was used is returned whole, as if it
// never happened: so a write given up while it waited keeps nothing of
// the rate it reserved. (A limiter of reservations that returns one only
// as far as no later one holds tokens would keep the earlier pieces of a
// take larger than a second's worth.)
type bucket struct {
	rate, tokens float64
	last         time.Time
}

func newBucket(perSecond int64, now time.Time) *bucket {
	return &bucket{rate: float64(perSecond), tokens: float64(perSecond), last: now}
}

func (b *bucket) refill(now time.Time) {
	if now.After(b.last) {
		b.tokens = min(b.rate, b.tokens+now.Sub(b.last).Seconds()*b.rate)
		b.last = now
	}
}

// take takes n at now and says how long the caller must wait until the
// bucket would have held them.
func (b *bucket) take(n int64, now time.Time) time.Duration {
	b.refill(now)
	b.tokens -= float64(n)
	if b.tokens >= 0 {
		return 0
	}
	return time.Duration(math.Ceil(-b.tokens / b.rate * float64(time.Second)))
}

// giveBack returns n that a take took and the caller did not use.
func (b *bucket) giveBack(n int64, now time.Time) {
	b.refill(now)
	b.tokens = min(b.rate, b.tokens+float64(n))
}

// rateTake is what one call took of the tenant's buckets.
type rateTake struct {
	b *bucket
	n int64
}

func (q *quotaState) giveBack(taken []rateTake, now time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, t := range taken {
		t.b.giveBack(t.n, now)
	}
}

// takeRate takes n messages and bytes from the tenant's rate buckets
// (per client, as Kafka's quotas are per broker), each allowing a
// second's worth at once. Without wait, a call that would wait is
// refused with when it would fit, and one over a second's worth for
// good; with wait, the call waits (a large message's chunks: at the
// tenant's rate), and gives back what it took when ctx ends first.
func (ts *tenantStates) takeRate(ctx context.Context, tenant string, q *quotaState, l driver.TenantLimits, n, bytes int64, wait bool) ([]rateTake, error) {
	if l.PublishRate == 0 && l.PublishByteRate == 0 {
		return nil, nil
	}
	q.mu.Lock()
	now := ts.clock()
	if q.msgs == nil || q.msgRate != l.PublishRate {
		q.msgs, q.msgRate = newBucket(l.PublishRate, now), l.PublishRate
	}
	if q.bytes == nil || q.byteRt != l.PublishByteRate {
		q.bytes, q.byteRt = newBucket(l.PublishByteRate, now), l.PublishByteRate
	}
	var delay time.Duration
	var worst *QuotaExceededError
	var taken []rateTake
	for _, t := range []struct {
		quota    string
		limit, n int64
		b        *bucket
	}{{QuotaPublishRate, l.PublishRate, n, q.msgs}, {QuotaPublishByteRate, l.PublishByteRate, bytes, q.bytes}} {
		if t.limit == 0 || t.n == 0 {
			continue
		}
		if t.n > t.limit && !wait {
			worst = &QuotaExceededError{Tenant: tenant, Quota: t.quota, Limit: t.limit, Usage: t.n, Call: t.n}
			delay = 0
			break
		}
		taken = append(taken, rateTake{t.b, t.n})
		if d := t.b.take(t.n, now); d > delay {
			delay = d
			worst = &QuotaExceededError{Tenant: tenant, Quota: t.quota, Limit: t.limit, Usage: t.n, Call: t.n, RetryAfter: d}
		}
	}
	if worst != nil && (worst.RetryAfter == 0 || !wait) {
		for _, t := range taken {
			t.b.giveBack(t.n, now)
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

// admitStored refuses a consumer's write of bytes to tenant's stores (a
// message group's state, a deferred row) when the tenant is suspended or
// the bytes would take it past MaxBytes (they are not messages, nor
// publishes: the other quotas leave them alone). What it admits is held
// as a publish's is, until end.
func (ts *tenantStates) admitStored(ctx context.Context, tenant string, bytes int64) (publish.End, error) {
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
// holds no message, is refused then (tenantWrites.AcquireLease).
func (ts *tenantStates) full(ctx context.Context, tenant string) (limit, stored int64, err error) {
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
func (ts *tenantStates) checkStored(ctx context.Context, tenant string, q *quotaState, l driver.TenantLimits, rows []*driver.InsertMessage, n, bytes int64) (*admission, error) {
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
func (ts *tenantStates) checkPartitions(ctx context.Context, tenant string, q *quotaState, u *storedUsage, l driver.TenantLimits, rows []*driver.InsertMessage) ([][2]string, map[[2]string]bool, error) {
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

// measure reads what the tenant stores, in a new epoch of q.
func (ts *tenantStates) measure(ctx context.Context, tenant string, q *quotaState) (*storedUsage, error) {
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
