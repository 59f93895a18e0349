// SPDX-License-Identifier: Apache-2.0

// Package ident validates the queue's identifiers, headers and payloads in
// the process, before any SQL runs. Every error names the field and the rule
// it broke, so a caller can fix the input without reading the schema.
//
// The limits follow the schema: ASCII identifiers are VARCHAR(255) in an
// ascii charset (255 bytes); partition keys and message ids are VARCHAR(255)
// in utf8mb4 (255 characters, that is code points).
//
// No identifier or key may end with a space. MySQL's ascii_bin and
// utf8mb4_bin are PAD SPACE collations: they ignore trailing spaces, so "k"
// and "k " would be one key on MySQL and two on SQLite. Without trailing
// spaces, PAD SPACE equality is exact equality on every database.
package ident

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Limits of the stored forms.
const (
	MaxIdentBytes       = 255 // tenant, topic, consumer group, subscriber name
	MaxKeyChars         = 255 // partition key and message id, in characters
	MaxHeaders          = 64
	MaxHeaderKeyBytes   = 255
	MaxHeaderValueBytes = 8 << 10
)

// ErrInvalid is matched by every validation error (errors.Is).
var ErrInvalid = errors.New("invalid argument")

// Error is a validation failure: Field is what was checked ("tenant",
// "partition key", `header "trace"`), Rule what it broke.
type Error struct {
	Field string
	Rule  string
}

func (e *Error) Error() string        { return e.Field + ": " + e.Rule }
func (e *Error) Is(target error) bool { return target == ErrInvalid }

func fail(field, format string, args ...any) error {
	return &Error{Field: field, Rule: fmt.Sprintf(format, args...)}
}

// ASCII checks an identifier stored as ASCII VARCHAR(255): tenant, topic,
// consumer group, subscriber name. Comparison is byte for byte, so no case
// folding or trimming happens here.
func ASCII(field, v string) error {
	if v == "" {
		return fail(field, "must not be empty")
	}
	if len(v) > MaxIdentBytes {
		return fail(field, "%d bytes, limit %d", len(v), MaxIdentBytes)
	}
	for i := 0; i < len(v); i++ {
		switch b := v[i]; {
		case b == 0:
			return fail(field, "byte 0x00 not allowed")
		case b >= utf8.RuneSelf:
			return fail(field, "byte 0x%02x at index %d is not ASCII", b, i)
		}
	}
	return noTrailingSpace(field, v)
}

func noTrailingSpace(field, v string) error {
	if v != "" && v[len(v)-1] == ' ' {
		return fail(field, "must not end with a space (MySQL collations ignore trailing spaces)")
	}
	return nil
}

// Tenant, Topic, ConsumerGroup and SubscriberName name the field for ASCII.
func Tenant(v string) error { return ASCII("tenant", v) }
func Topic(v string) error  { return ASCII("topic", v) }
func ConsumerGroup(v string) error {
	if err := ASCII("consumer group", v); err != nil {
		return err
	}
	if v[0] == '$' { // $retention holds retention claims
		return fail("consumer group", "names starting with '$' are reserved for shardq")
	}
	return nil
}
func SubscriberName(v string) error { return MemberName("subscriber name", v) }

// memberSuffix is what MemberID appends to a name: "#" and 8 hex digits.
const memberSuffix = 9

// MaxMemberNameBytes bounds a member's name (subscriber, receiver,
// producer, cleaner), so that its identity (MemberID) fits 255 bytes.
const MaxMemberNameBytes = MaxIdentBytes - memberSuffix

// MemberName checks a member's name: an ASCII identifier of at most
// MaxMemberNameBytes.
func MemberName(field, v string) error {
	if err := ASCII(field, v); err != nil {
		return err
	}
	if len(v) > MaxMemberNameBytes {
		return fail(field, "%d bytes, limit %d (the instance suffix takes the rest)", len(v), MaxMemberNameBytes)
	}
	return nil
}

// MemberID is the identity of one running instance named name: name, "#"
// and 8 random hex digits. Names are for people and may repeat; two
// instances given one name never share an identity, so they never both
// hold one lease (a lease's owner is an identity).
func MemberID(name string) string {
	var b [4]byte
	rand.Read(b[:]) // never fails (crypto/rand)
	return name + "#" + hex.EncodeToString(b[:])
}

// InstanceMemberID is the identity of one incarnation of the static
// member instance (SubscriberConfig.InstanceID): instance, "@" and 8
// random hex digits. A member's identity without an instance ends in "#"
// and 8 hex digits, so the two never match (IsIncarnation).
func InstanceMemberID(instance string) string {
	var b [4]byte
	rand.Read(b[:]) // never fails (crypto/rand)
	return instance + "@" + hex.EncodeToString(b[:])
}

// SameInstance reports whether identities a and b are two incarnations
// of one static member instance.
func SameInstance(a, b string) bool {
	i := strings.LastIndexByte(a, '@')
	return i > 0 && IsIncarnation(a[:i], a) && IsIncarnation(a[:i], b)
}

// IsIncarnation reports whether identity is one of InstanceMemberID(instance).
func IsIncarnation(instance, identity string) bool {
	suffix, ok := strings.CutPrefix(identity, instance+"@")
	if !ok || len(suffix) != 8 {
		return false
	}
	for _, c := range []byte(suffix) {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// utf8Text checks valid UTF-8 of at most maxChars code points with no NUL.
func utf8Text(field, v string, maxChars int) error {
	if !utf8.ValidString(v) {
		for i := 0; i < len(v); {
			r, size := utf8.DecodeRuneInString(v[i:])
			if r == utf8.RuneError && size <= 1 {
				return fail(field, "invalid UTF-8 at byte %d", i)
			}
			i += size
		}
	}
	n := 0
	for i := 0; i < len(v); i++ {
		if v[i] == 0 {
			return fail(field, "byte 0x00 not allowed")
		}
		if v[i]&0xC0 != 0x80 { // count the first byte of each code point
			n++
		}
	}
	if n > maxChars {
		return fail(field, "%d characters, limit %d", n, maxChars)
	}
	return noTrailingSpace(field, v)
}

// PartitionKey checks a partition key: valid UTF-8, at most 255 characters,
// no NUL, no trailing space. The empty key is allowed and means "ungrouped".
func PartitionKey(v string) error { return utf8Text("partition key", v, MaxKeyChars) }

// MessageID checks a message id: valid UTF-8, 1 to 255 characters, no NUL,
// no trailing space.
func MessageID(v string) error {
	if v == "" {
		return fail("message id", "must not be empty")
	}
	return utf8Text("message id", v, MaxKeyChars)
}

// Headers checks message headers: at most MaxHeaders entries, keys valid
// UTF-8 of 1..255 bytes without NUL, values valid UTF-8 of at most 8 KiB.
// Headers are stored as a JSON object, which cannot carry invalid UTF-8
// without changing it, hence the UTF-8 rule for values.
func Headers(h map[string]string) error {
	if len(h) > MaxHeaders {
		return fail("headers", "%d entries, limit %d", len(h), MaxHeaders)
	}
	for k, v := range h {
		if k == "" {
			return fail(`header ""`, "the key must not be empty")
		}
		// The field names the key, cut short: a key too long to store is
		// too long to print whole.
		field := fmt.Sprintf("header key %q", clip(k, 40))
		if len(k) > MaxHeaderKeyBytes {
			return fail(field, "%d bytes, limit %d", len(k), MaxHeaderKeyBytes)
		}
		if err := utf8Text(field, k, MaxHeaderKeyBytes); err != nil {
			return err
		}
		field = fmt.Sprintf("header %q", k)
		if len(v) > MaxHeaderValueBytes {
			return fail(field, "value %d bytes, limit %d", len(v), MaxHeaderValueBytes)
		}
		if !utf8.ValidString(v) {
			return fail(field, "value is not valid UTF-8")
		}
	}
	return nil
}

// clip is s cut to at most n bytes, with "…" when cut.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// Payload checks a payload against the configured limit.
func Payload(p []byte, limit int) error {
	if len(p) > limit {
		return fail("payload", "%d bytes, limit %d", len(p), limit)
	}
	return nil
}

// TenantList parses a comma-separated tenant list (SHARDQ_TENANTS): entries are
// trimmed of surrounding spaces and tabs, each must be a valid tenant, a
// repeat is an error, and the list must not be empty.
func TenantList(field, s string) ([]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, fail(field, "empty tenant list")
	}
	var out []string
	seen := map[string]bool{}
	for i, part := range strings.Split(s, ",") {
		t := strings.Trim(part, " \t")
		if err := Tenant(t); err != nil {
			return nil, fail(field, "entry %d: %s", i+1, err.Error())
		}
		if seen[t] {
			return nil, fail(field, "entry %d: tenant %q appears twice", i+1, t)
		}
		seen[t] = true
		out = append(out, t)
	}
	return out, nil
}

// Tenants checks an explicit tenant list the same way.
func Tenants(field string, ts []string) error {
	if len(ts) == 0 {
		return fail(field, "empty tenant list")
	}
	seen := map[string]bool{}
	for i, t := range ts {
		if err := Tenant(t); err != nil {
			return fail(field, "entry %d: %s", i+1, err.Error())
		}
		if seen[t] {
			return fail(field, "entry %d: tenant %q appears twice", i+1, t)
		}
		seen[t] = true
	}
	return nil
}
