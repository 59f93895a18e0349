// SPDX-License-Identifier: Apache-2.0

package server

import (
	"context"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"

	"github.com/shardq/shardq/driver"
)

// DefaultTokenCacheTTL is how long a token's stored row is reused: a
// revocation reaches every server within it.
const DefaultTokenCacheTTL = time.Second

// tokenCacheEntries bounds the cache, as the limiter maps.
const tokenCacheEntries = limiterEntries

// cachedTokens reads tokens through a cache of their stored rows by
// (tenant, id), each reused for ttl after it was read. What is cached is
// the row, not a verdict: every request still has its secret compared
// with the row's hash and its expiry checked against the clock, so only a
// revocation (or a token newly stored for a tenant it lacked) waits up to
// ttl to be seen. An unknown id is not cached: a token created a moment
// ago works at once.
type cachedTokens struct {
	driver.Tokens
	ttl   time.Duration
	clock func() time.Time
	rows  *lru.Cache[tokenKey, cachedToken]
}

type tokenKey struct{ tenant, id string }

type cachedToken struct {
	t    driver.APIToken
	read time.Time
}

// newCachedTokens caches drv's token rows for ttl; a ttl of zero or less
// reads the row at every request.
func newCachedTokens(drv driver.Tokens, ttl time.Duration, clock func() time.Time) driver.Tokens {
	if ttl <= 0 {
		return drv
	}
	rows, _ := lru.New[tokenKey, cachedToken](tokenCacheEntries) // size > 0: cannot fail
	return &cachedTokens{Tokens: drv, ttl: ttl, clock: clock, rows: rows}
}

func (c *cachedTokens) TokenIn(ctx context.Context, tenant, id string) (driver.APIToken, error) {
	k := tokenKey{tenant, id}
	now := c.clock()
	if e, ok := c.rows.Get(k); ok && now.Sub(e.read) < c.ttl && !now.Before(e.read) {
		return e.t, nil
	}
	t, err := c.Tokens.TokenIn(ctx, tenant, id)
	if err != nil {
		c.rows.Remove(k)
		return t, err
	}
	c.rows.Add(k, cachedToken{t: t, read: now})
	return t, nil
}

// forgetTenant drops the cached rows of tenant's tokens: after the tenant
// is deleted through this server, its tokens fail here at once (other
// servers see it within ttl, as a revocation).
func (c *cachedTokens) forgetTenant(tenant string) {
	for _, k := range c.rows.Keys() {
		if k.tenant == tenant {
			c.rows.Remove(k)
		}
	}
}
