// SPDX-License-Identifier: Apache-2.0

package server

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/testdb"
)

// TestTokenCacheBoundsRevocation: a token's stored row is reused for
// TokenCacheTTL, so a revocation is seen within that time and no later;
// the secret and the expiry are checked at every request all the same.
func TestTokenCacheBoundsRevocation(t *testing.T) {
	eachDB(t, func(t *testing.T, drv driver.Driver) {
		h := newHarness(t, drv, harnessOptions{})
		admin, adminID := h.token(RoleAdmin, 0, "acme")
		short, _ := h.token(RoleAdmin, DefaultTokenCacheTTL/2, "acme")
		h.must(200, "GET", "/v1/tenants/acme/topics", admin, nil)
		h.must(200, "GET", "/v1/tenants/acme/topics", short, nil)

		if r := h.call("GET", "/v1/tenants/acme/topics", admin[:len(admin)-4]+"AAAA", nil); r.status != 401 {
			t.Errorf("wrong secret of a cached token: %d %s", r.status, r.raw)
		}
		if n, err := drv.RevokeToken(context.Background(), []string{"acme"}, adminID, h.clock.Now()); err != nil || n != 1 {
			t.Fatalf("revoke: %d %v", n, err)
		}
		// Within the bound the row read before the revocation still
		// serves: this is the documented delay, and what spares a read.
		h.must(200, "GET", "/v1/tenants/acme/topics", admin, nil)
		h.clock.Add(DefaultTokenCacheTTL / 2)
		if r := h.call("GET", "/v1/tenants/acme/topics", short, nil); r.status != 401 || !strings.Contains(r.raw, "expired") {
			t.Errorf("a cached token past its expiry: %d %s", r.status, r.raw)
		}
		h.clock.Add(DefaultTokenCacheTTL / 2)
		if r := h.call("GET", "/v1/tenants/acme/topics", admin, nil); r.status != 401 || !strings.Contains(r.raw, "revoked") {
			t.Errorf("a revoked token once the cache's bound passed: %d %s", r.status, r.raw)
		}
	})
}

// TestTokenCacheOff: with a negative TokenCacheTTL every request reads
// the token's row, so a revocation applies to the next request.
func TestTokenCacheOff(t *testing.T) {
	eachDB(t, func(t *testing.T, drv driver.Driver) {
		h := newHarness(t, drv, harnessOptions{tokenCacheTTL: -1})
		admin, adminID := h.token(RoleAdmin, 0, "acme")
		h.must(200, "GET", "/v1/tenants/acme/topics", admin, nil)
		if _, err := drv.RevokeToken(context.Background(), []string{"acme"}, adminID, h.clock.Now()); err != nil {
			t.Fatal(err)
		}
		if r := h.call("GET", "/v1/tenants/acme/topics", admin, nil); r.status != 401 || !strings.Contains(r.raw, "revoked") {
			t.Errorf("revoked token without a cache: %d %s", r.status, r.raw)
		}
	})
}

// TestTokenCacheSparesReads: within the bound a token's row is read once,
// however many requests it makes; an unknown id is read every time, so a
// token stored a moment ago works at once.
func TestTokenCacheSparesReads(t *testing.T) {
	drv := testdb.Migrated(t, testdb.SQLite(t))
	counted := &countingTokens{Tokens: drv}
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	c := newCachedTokens(counted, time.Second, func() time.Time { return now })
	ctx := context.Background()
	if _, err := c.TokenIn(ctx, "acme", "0123456789abcdef"); !errors.Is(err, driver.ErrNoToken) {
		t.Fatalf("unknown token: %v", err)
	}
	_, id, err := NewToken(ctx, drv, []string{"acme"}, []string{RoleAdmin}, 0, now)
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if _, err := c.TokenIn(ctx, "acme", id); err != nil {
			t.Fatal(err)
		}
	}
	if counted.reads != 2 {
		t.Fatalf("%d reads for an unknown id and five uses of one token within the bound, want 2", counted.reads)
	}
	now = now.Add(time.Second)
	if _, err := c.TokenIn(ctx, "acme", id); err != nil || counted.reads != 3 {
		t.Fatalf("after the bound: %d reads (%v), want 3", counted.reads, err)
	}
}

// countingTokens counts the token reads that reach its store.
type countingTokens struct {
	driver.Tokens
	reads int
}

func (c *countingTokens) TokenIn(ctx context.Context, tenant, id string) (driver.APIToken, error) {
	c.reads++
	return c.Tokens.TokenIn(ctx, tenant, id)
}
