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
	token = MakeToken()
	id, err = StoreToken(ctx, drv, token, tenants, roles, expires, now)
	if err != nil {
		return "", "", err
	}
	return token, id, nil
}

// MakeToken returns a new random token, stored nowhere: StoreToken stores
// its hash (an operator's bootstrap token, kept in a secret store first).
func MakeToken() string {
	idb, secret := make([]byte, 8), make([]byte, 32)
	rand.Read(idb)
	rand.Read(secret)
	return tokenPrefix + hex.EncodeToString(idb) + "." + b64(secret)
}

// ErrTokenTaken refuses to store a token whose id is stored already with
// another secret, role or tenants.
var ErrTokenTaken = errors.New("a token of this id is stored with another secret, role or tenants")

// StoreToken stores the hash of token (made by MakeToken) for tenants with
// roles and returns its id. Storing the same token with the same role and
// tenants again changes nothing (a deployment's bootstrap runs at every
// upgrade); another token of its id fails with ErrTokenTaken in the
// tenants asked for, and with driver.ErrTokenIDTaken in any other: an id
// names one token everywhere.
func StoreToken(ctx context.Context, drv driver.Tokens, token string, tenants []string, roles []string, expires time.Duration, now time.Time) (string, error) {
	if len(tenants) == 0 {
		return "", &shardq.ValidationError{Field: "tenant", Rule: "at least one is required"}
	}
	for _, t := range tenants {
		if err := ident.Tenant(t); err != nil {
			return "", err
		}
	}
	role, err := JoinRoles(roles)
	if err != nil {
		return "", err
	}
	if expires < 0 {
		return "", &shardq.ValidationError{Field: "expires", Rule: "must not be negative (0: never)"}
	}
	id, secret, ok := parseToken(token)
	if !ok {
		return "", &shardq.ValidationError{Field: "token", Rule: "not a token: want sq_<16 hex digits>.<43 base64url characters>, as shardq token new prints"}
	}
	sum := sha256.Sum256(secret)
	t := driver.APIToken{ID: id, Tenants: slices.Compact(slices.Sorted(slices.Values(tenants))), Role: role, SecretHash: sum[:], CreatedAt: now.UTC()}
	if expires > 0 {
		t.ExpiresAt = now.Add(expires).UTC()
	}
	same := 0
	for _, tenant := range t.Tenants {
		have, err := drv.TokenIn(ctx, tenant, id)
		switch {
		case errors.Is(err, driver.ErrNoToken):
		case err != nil:
			return "", fmt.Errorf("store token %s: %w", id, err)
		case subtle.ConstantTimeCompare(have.SecretHash, sum[:]) != 1 || have.Role != role:
			return "", fmt.Errorf("store token %s in tenant %q: %w", id, tenant, ErrTokenTaken)
		default:
			same++
		}
	}
	switch same {
	case len(t.Tenants):
		return id, nil // stored before, as asked
	case 0:
	default:
		return "", fmt.Errorf("store token %s: %w (some of its tenants have it)", id, ErrTokenTaken)
	}
	switch err := drv.CreateToken(ctx, t); {
	case errors.Is(err, driver.ErrTokenIDTaken):
		return "", fmt.Errorf("%w (make another token: shardq token new)", err)
	case err != nil:
		return "", err
	}
	return id, nil
}

// SharedTokenID is a token id that several tokens hold: rows stored
// before CreateToken checked ids across tenants. Such tokens open nothing
// of each other's (every credential is checked against its own token's
// hash), but they share what is counted per token id (its request rate,
// receives and large transfers in flight), the access log names them
// alike, and token revoke revokes them together.
type SharedTokenID struct {
	ID string
	// Tenants holds the tenants of each token of the id.
	Tenants [][]string
}

// SharedTokenIDs lists the ids that several tokens hold, reading every
// tenant's tokens (serve checks at start).
func SharedTokenIDs(ctx context.Context, drv driver.Tokens) ([]SharedTokenID, error) {
	toks, err := drv.ListTokens(ctx, driver.Scope{AllTenants: true})
	if err != nil {
		return nil, err
	}
	var out []SharedTokenID
	for i, t := range toks { // by id: the tokens of one id are adjacent
		switch {
		case i == 0 || toks[i-1].ID != t.ID:
		case len(out) > 0 && out[len(out)-1].ID == t.ID:
			out[len(out)-1].Tenants = append(out[len(out)-1].Tenants, t.Tenants)
		default:
			out = append(out, SharedTokenID{ID: t.ID, Tenants: [][]string{toks[i-1].Tenants, t.Tenants}})
		}
	}
	return out, nil
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
// constant time), revocation and expiry. It returns the token's id, role
// and stored hash.
func verify(ctx context.Context, drv driver.Tokens, tenant, tok string, now time.Time) (id, role string, hash []byte, err error) {
	id, secret, ok := parseToken(tok)
	if !ok {
		return "", "", nil, errTokenInvalid
	}
	sum := sha256.Sum256(secret)
	t, err := drv.TokenIn(ctx, tenant, id)
	if errors.Is(err, driver.ErrNoToken) {
		return id, "", nil, errTokenTenant
	}
	if err != nil {
		return id, "", nil, err
	}
	if subtle.ConstantTimeCompare(sum[:], t.SecretHash) != 1 {
		return id, "", nil, errTokenInvalid
	}
	switch {
	case !t.RevokedAt.IsZero():
		return id, "", nil, errTokenRevoked
	case !t.ExpiresAt.IsZero() && !now.Before(t.ExpiresAt):
		return id, "", nil, errTokenExpired
	}
	return id, t.Role, t.SecretHash, nil
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
