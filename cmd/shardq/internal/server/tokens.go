// SPDX-License-Identifier: Apache-2.0

package server

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/ident"
)

// Roles a token may have. operator may do everything in its tenants,
// what a tenant may not do to itself included (its limits, resuming it);
// admin everything else; publish only publishes; consume receives and
// settles.
const (
	RolePublish  = "publish"
	RoleConsume  = "consume"
	RoleAdmin    = "admin"
	RoleOperator = "operator"
)

// Roles lists the roles, for flags and errors.
var Roles = []string{RolePublish, RoleConsume, RoleAdmin, RoleOperator}

// JoinRoles checks roles and returns them as stored: sorted, without
// repeats, comma-separated ("operator" or "admin" alone when among them:
// each does what the others do).
func JoinRoles(roles []string) (string, error) {
	if len(roles) == 0 {
		return "", &shardq.ValidationError{Field: "role", Rule: "at least one is required: " + strings.Join(Roles, ", ")}
	}
	for _, r := range roles {
		if !slices.Contains(Roles, r) {
			return "", &shardq.ValidationError{Field: "role", Rule: fmt.Sprintf("%q: want one of %s", r, strings.Join(Roles, ", "))}
		}
	}
	for _, all := range []string{RoleOperator, RoleAdmin} {
		if slices.Contains(roles, all) {
			return all, nil
		}
	}
	return strings.Join(slices.Compact(slices.Sorted(slices.Values(roles))), ","), nil
}

// A token is "sq_" + its id (16 hex digits, public: list and revoke name
// it) + "." + its secret (32 random bytes, base64url). Only the secret's
// SHA-256 is stored: the secret has 256 bits of entropy, so a fast hash
// is enough (no password-hashing work factor is needed against guessing).
const tokenPrefix = "sq_"

// NewToken makes a token for tenants with roles, stores its hash and
// returns the token (shown once) and its id.
func NewToken(ctx context.Context, drv driver.Tokens, tenants []string, roles []string, expires time.Duration, now time.Time) (token, id string, err error) {
	if len(tenants) == 0 {
		return "", "", &shardq.ValidationError{Field: "tenant", Rule: "at least one is required"}
	}
	for _, t := range tenants {
		if err := ident.Tenant(t); err != nil {
			return "", "", err
		}
	}
	role, err := JoinRoles(roles)
	if err != nil {
		return "", "", err
	}
	if expires < 0 {
		return "", "", &shardq.ValidationError{Field: "expires", Rule: "must not be negative (0: never)"}
	}
	idb, secret := make([]byte, 8), make([]byte, 32)
	rand.Read(idb)
	rand.Read(secret)
	id = hex.EncodeToString(idb)
	sum := sha256.Sum256(secret)
	t := driver.APIToken{ID: id, Tenants: slices.Compact(slices.Sorted(slices.Values(tenants))), Role: role, SecretHash: sum[:], CreatedAt: now.UTC()}
	if expires > 0 {
		t.ExpiresAt = now.Add(expires).UTC()
	}
	if err := drv.CreateToken(ctx, t); err != nil {
		return "", "", fmt.Errorf("create token: %w", err)
	}
	return tokenPrefix + id + "." + b64(secret), id, nil
}

// secretEncoding is strict: the spare bits of the last character must be
// zero, so no two spellings carry one secret.
var secretEncoding = base64.RawURLEncoding.Strict()

func b64(secret []byte) string { return secretEncoding.EncodeToString(secret) }

// parseToken splits a bearer token into its id and secret, or fails.
func parseToken(tok string) (id string, secret []byte, ok bool) {
	rest, ok := strings.CutPrefix(tok, tokenPrefix)
	if !ok {
		return "", nil, false
	}
	id, enc, ok := strings.Cut(rest, ".")
	if !ok || len(id) != 16 || len(enc) != 43 {
		return "", nil, false
	}
	if strings.ToLower(id) != id {
		return "", nil, false // one spelling per token: ids are lower-case hex
	}
	if _, err := hex.DecodeString(id); err != nil {
		return "", nil, false
	}
	secret, err := secretEncoding.DecodeString(enc)
	if err != nil || len(secret) != 32 {
		return "", nil, false
	}
	return id, secret, true
}

// Why a token is refused.
var (
	errTokenInvalid = errors.New("the token is not valid")
	errTokenRevoked = errors.New("the token was revoked")
	errTokenExpired = errors.New("the token has expired")
	errTokenTenant  = errors.New("the token may not use this tenant")
)

// verify checks tok for tenant: its row there, its secret (compared in
// constant time), revocation and expiry. It returns the token's role.
func verify(ctx context.Context, drv driver.Tokens, tenant, tok string, now time.Time) (id, role string, err error) {
	id, secret, ok := parseToken(tok)
	if !ok {
		return "", "", errTokenInvalid
	}
	sum := sha256.Sum256(secret)
	t, err := drv.TokenIn(ctx, tenant, id)
	if errors.Is(err, driver.ErrNoToken) {
		return id, "", errTokenTenant
	}
	if err != nil {
		return id, "", err
	}
	if subtle.ConstantTimeCompare(sum[:], t.SecretHash) != 1 {
		return id, "", errTokenInvalid
	}
	switch {
	case !t.RevokedAt.IsZero():
		return id, "", errTokenRevoked
	case !t.ExpiresAt.IsZero() && !now.Before(t.ExpiresAt):
		return id, "", errTokenExpired
	}
	return id, t.Role, nil
}

// allows reports whether a token of roles (as stored) may do what needs
// want.
func allows(roles, want string) bool {
	for r := range strings.SplitSeq(roles, ",") {
		if r == want || r == RoleOperator || r == RoleAdmin && want != RoleOperator {
			return true
		}
	}
	return false
}
