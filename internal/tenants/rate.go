// SPDX-License-Identifier: Apache-2.0

package tenants

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/shardq/shardq/driver"
)

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
func (ts *States) takeRate(ctx context.Context, tenant string, q *quotaState, l driver.TenantLimits, n, bytes int64, wait bool) ([]rateTake, error) {
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
