// SPDX-License-Identifier: Apache-2.0

package drivertest

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shardq/shardq/driver"
)

var tokenTests = []struct {
	name string
	fn   func(*testing.T, Open)
}{
	{"TokensStoredPerTenant", testTokens},
}

// A token's rows: one per tenant, listed merged, revoked everywhere. An
// id names one token in every tenant: another secret under a stored id
// is refused, in any tenant, before anything is stored; the same token
// may be given more tenants.
func testTokens(t *testing.T, open Open) {
	d := setup(t, open)
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Microsecond)
	tok := driver.APIToken{ID: "id1", Tenants: []string{"a", "b"}, Role: "consume", SecretHash: []byte("0123456789abcdef0123456789abcdef"),
		CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
	if err := d.CreateToken(ctx, tok); err != nil {
		t.Fatal(err)
	}
	got, err := d.TokenIn(ctx, "b", "id1")
	if err != nil || got.Role != "consume" || string(got.SecretHash) != string(tok.SecretHash) || !got.ExpiresAt.Equal(tok.ExpiresAt) ||
		!got.RevokedAt.IsZero() || !slices.Equal(got.Tenants, []string{"b"}) {
		t.Fatalf("token in b: %+v, %v", got, err)
	}
	if _, err := d.TokenIn(ctx, "c", "id1"); !errors.Is(err, driver.ErrNoToken) {
		t.Fatalf("token in c: %v, want ErrNoToken", err)
	}
	if err := d.CreateToken(ctx, tok); err == nil {
		t.Fatal("a second token of one id was stored")
	}
	other := tok
	other.Tenants, other.SecretHash = []string{"c", "d"}, []byte("another secret's hash, 32 bytes!")
	if err := d.CreateToken(ctx, other); !errors.Is(err, driver.ErrTokenIDTaken) || !strings.Contains(err.Error(), `"id1"`) {
		t.Fatalf("another token of id1 in tenants c, d: %v; want ErrTokenIDTaken naming the id", err)
	}
	for _, tenant := range other.Tenants {
		if _, err := d.TokenIn(ctx, tenant, "id1"); !errors.Is(err, driver.ErrNoToken) {
			t.Fatalf("the refused token is stored in %s: %v", tenant, err)
		}
	}
	more := tok
	more.Tenants = []string{"c"}
	if err := d.CreateToken(ctx, more); err != nil {
		t.Fatalf("the same token (its hash) for tenant c: %v", err)
	}
	list, err := d.ListTokens(ctx, driver.Scope{AllTenants: true})
	if err != nil || len(list) != 1 || !slices.Equal(list[0].Tenants, []string{"a", "b", "c"}) || string(list[0].SecretHash) != string(tok.SecretHash) {
		t.Fatalf("list: %+v, %v", list, err)
	}
	if list, err := d.ListTokens(ctx, driver.Scope{Tenants: []string{"b", "d"}}); err != nil || len(list) != 1 || !slices.Equal(list[0].Tenants, []string{"b"}) {
		t.Fatalf("list in b, d: %+v, %v", list, err)
	}
	if n, err := d.RevokeToken(ctx, []string{"d"}, "id1", now); err != nil || n != 0 {
		t.Fatalf("revoke in d: %d, %v; want 0 rows", n, err)
	}
	if n, err := d.RevokeToken(ctx, []string{"a", "b", "c"}, "id1", now); err != nil || n != 3 {
		t.Fatalf("revoke: %d, %v; want 3 rows", n, err)
	}
	if got, err := d.TokenIn(ctx, "a", "id1"); err != nil || !got.RevokedAt.Equal(now) {
		t.Fatalf("revoked token: %+v, %v", got, err)
	}
}
