// SPDX-License-Identifier: Apache-2.0

package server

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/receiptkey"
)

// A dashboard session is a signed cookie, not the token: it names the
// admin token that signed in and when the session ends, under a MAC of
// the database's receipt key, so every server of the database accepts it
// and no client can make one. Each request still reads the token's row
// in the tenant it touches: a revoked or expired token ends its sessions
// at once, and a row of that id holding another token's hash opens
// nothing (Token).
const (
	sessionPrefix = "s2."
	// SessionTTL is how long a dashboard sign-in lasts.
	SessionTTL = 12 * time.Hour
)

type session struct {
	ID string `json:"i"`
	// Token is tokenDigest of the token's stored hash. An id alone does
	// not name one token: rows stored before ids were checked across
	// tenants may give one id to two tokens, and a session naming only
	// the id opened the other token's tenants.
	Token   string `json:"t"`
	Expires int64  `json:"e"` // Unix seconds
}

// tokenDigest is what a session holds of its token's stored hash: a
// digest, so that the cookie does not carry the hash itself.
func tokenDigest(hash []byte) string {
	sum := sha256.Sum256(append([]byte("shardq dashboard session\x00"), hash...))
	return base64.RawURLEncoding.EncodeToString(sum[:])
}

var (
	errSession        = errors.New("no valid dashboard session")
	errSessionExpired = fmt.Errorf("%w: it expired", errSession)
)

func signSession(ctx context.Context, ring *receiptkey.Ring, s session) (string, error) {
	b, _ := json.Marshal(s) // a string and an integer: cannot fail
	enc := base64.RawURLEncoding.EncodeToString(b)
	msg, sum, err := ring.Sign(ctx, func(id int64) []byte { return []byte(sessionPrefix + strconv.FormatInt(id, 10) + "." + enc) })
	if err != nil {
		return "", fmt.Errorf("sign session: %w", err)
	}
	return string(msg) + "." + base64.RawURLEncoding.EncodeToString(sum), nil
}

// openSession checks a session cookie's form, signature and expiry.
func openSession(ctx context.Context, ring *receiptkey.Ring, v string, now time.Time) (session, error) {
	var s session
	rest, ok := strings.CutPrefix(v, sessionPrefix)
	if !ok || len(v) > 512 {
		return s, errSession
	}
	id, rest, ok1 := strings.Cut(rest, ".")
	enc, mac, ok2 := strings.Cut(rest, ".")
	keyID, err := strconv.ParseInt(id, 10, 64)
	if !ok1 || !ok2 || err != nil {
		return s, errSession
	}
	sum, err := base64.RawURLEncoding.Strict().DecodeString(mac)
	if err != nil {
		return s, errSession
	}
	switch err := ring.Verify(ctx, keyID, []byte(v[:len(v)-len(mac)-1]), sum); {
	case errors.Is(err, receiptkey.ErrSignature), errors.Is(err, receiptkey.ErrUnknownKey):
		return s, errSession
	case err != nil:
		return s, err
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(enc)
	if err != nil || json.Unmarshal(b, &s) != nil || s.ID == "" || s.Token == "" {
		return session{}, errSession
	}
	if !now.Before(time.Unix(s.Expires, 0)) {
		return session{}, errSessionExpired
	}
	return s, nil
}

// sessionRole checks the session's token in tenant (its row there, the
// same token's: its hash's digest, compared in constant time; not revoked
// or expired) and returns its roles; the secret was checked at sign-in.
// Every request that a session authenticates goes through it.
func sessionRole(ctx context.Context, drv driver.Tokens, tenant string, s session, now time.Time) (string, error) {
	t, err := drv.TokenIn(ctx, tenant, s.ID)
	switch {
	case errors.Is(err, driver.ErrNoToken):
		return "", errTokenTenant
	case err != nil:
		return "", err
	case subtle.ConstantTimeCompare([]byte(tokenDigest(t.SecretHash)), []byte(s.Token)) != 1:
		return "", errTokenTenant // another token holds the id here
	case !t.RevokedAt.IsZero():
		return "", errTokenRevoked
	case !t.ExpiresAt.IsZero() && !now.Before(t.ExpiresAt):
		return "", errTokenExpired
	}
	return t.Role, nil
}
