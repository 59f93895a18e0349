// SPDX-License-Identifier: Apache-2.0

package ident

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestASCIIRules(t *testing.T) {
	cases := []struct {
		in, want string // want "" means valid
	}{
		{"acme", ""},
		{strings.Repeat("a", 255), ""},
		{"", "tenant: must not be empty"},
		{strings.Repeat("a", 256), "tenant: 256 bytes, limit 255"},
		{"a\x00b", "tenant: byte 0x00 not allowed"},
		{"café", "tenant: byte 0xc3 at index 3 is not ASCII"},
		{"Acme Corp/eu-1", ""}, // spaces and punctuation are fine: opaque bytes
		{"acme ", "tenant: must not end with a space (MySQL collations ignore trailing spaces)"},
		{" acme\t", ""},
	}
	for _, c := range cases {
		err := Tenant(c.in)
		if c.want == "" {
			if err != nil {
				t.Errorf("Tenant(%q) = %v, want nil", c.in, err)
			}
			continue
		}
		if err == nil || err.Error() != c.want {
			t.Errorf("Tenant(%q) = %v, want %q", c.in, err, c.want)
		}
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("Tenant(%q): error does not match ErrInvalid", c.in)
		}
	}
	if err := Topic("\x00"); err == nil || err.Error() != "topic: byte 0x00 not allowed" {
		t.Errorf("Topic NUL = %v", err)
	}
	if err := ConsumerGroup(""); err == nil || err.Error() != "consumer group: must not be empty" {
		t.Errorf("ConsumerGroup empty = %v", err)
	}
	if err := ConsumerGroup("$retention"); err == nil || err.Error() != "consumer group: names starting with '$' are reserved for shardq" {
		t.Errorf("reserved group = %v", err)
	}
	if err := SubscriberName(""); err == nil || err.Error() != "subscriber name: must not be empty" {
		t.Errorf("SubscriberName empty = %v", err)
	}
}

func TestPartitionKeyAndMessageID(t *testing.T) {
	if err := PartitionKey(""); err != nil {
		t.Errorf("empty partition key (ungrouped) rejected: %v", err)
	}
	if err := PartitionKey(strings.Repeat("é", 255)); err != nil {
		t.Errorf("255 two-byte characters rejected: %v", err)
	}
	if err := PartitionKey(strings.Repeat("é", 256)); err == nil || err.Error() != "partition key: 256 characters, limit 255" {
		t.Errorf("256 characters = %v", err)
	}
	if err := PartitionKey("ab\xffc"); err == nil || err.Error() != "partition key: invalid UTF-8 at byte 2" {
		t.Errorf("invalid UTF-8 = %v", err)
	}
	if err := PartitionKey("a\x00"); err == nil || err.Error() != "partition key: byte 0x00 not allowed" {
		t.Errorf("NUL = %v", err)
	}
	if err := PartitionKey("k "); err == nil || err.Error() != "partition key: must not end with a space (MySQL collations ignore trailing spaces)" {
		t.Errorf("trailing space = %v", err)
	}
	if err := MessageID(""); err == nil || err.Error() != "message id: must not be empty" {
		t.Errorf("empty id = %v", err)
	}
	if err := MessageID(strings.Repeat("𝄞", 255)); err != nil {
		t.Errorf("255 four-byte characters rejected: %v", err)
	}
}

func TestHeadersAndPayload(t *testing.T) {
	if err := Headers(map[string]string{"trace": "abc"}); err != nil {
		t.Fatal(err)
	}
	if err := Headers(map[string]string{"": "x"}); err == nil || err.Error() != `header "": the key must not be empty` {
		t.Errorf("empty key = %v", err)
	}
	long := strings.Repeat("k", MaxHeaderKeyBytes+1)
	if err := Headers(map[string]string{long: "x"}); err == nil ||
		err.Error() != `header key "`+long[:40]+`…": 256 bytes, limit 255` {
		t.Errorf("long key = %v", err)
	}
	if err := Headers(map[string]string{"a\xffb": "x"}); err == nil || err.Error() != `header key "a\xffb": invalid UTF-8 at byte 1` {
		t.Errorf("bad key = %v", err)
	}
	if err := Headers(map[string]string{"k": strings.Repeat("v", MaxHeaderValueBytes+1)}); err == nil ||
		err.Error() != `header "k": value 8193 bytes, limit 8192` {
		t.Errorf("long value = %v", err)
	}
	if err := Headers(map[string]string{"k": "\xff"}); err == nil || err.Error() != `header "k": value is not valid UTF-8` {
		t.Errorf("bad value = %v", err)
	}
	many := map[string]string{}
	for i := 0; i <= MaxHeaders; i++ {
		many[strings.Repeat("k", i+1)] = ""
	}
	if err := Headers(many); err == nil || err.Error() != "headers: 65 entries, limit 64" {
		t.Errorf("too many = %v", err)
	}
	if err := Payload(make([]byte, 11), 10); err == nil || err.Error() != "payload: 11 bytes, limit 10" {
		t.Errorf("payload = %v", err)
	}
}

// The fuzz targets check the validators against an independent statement of
// each rule: whatever they accept must fit the column it is stored in.

func FuzzASCII(f *testing.F) {
	for _, s := range []string{"", "acme", "a\x00", "café", strings.Repeat("x", 256)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		err := ASCII("tenant", s)
		ok := len(s) >= 1 && len(s) <= 255 && !strings.ContainsRune(s, 0) && !strings.HasSuffix(s, " ")
		for i := 0; i < len(s); i++ {
			ok = ok && s[i] < 0x80
		}
		if (err == nil) != ok {
			t.Fatalf("ASCII(%q) = %v, rule says valid=%v", s, err, ok)
		}
		if err != nil && !strings.HasPrefix(err.Error(), "tenant: ") {
			t.Fatalf("error %q does not name the field", err)
		}
	})
}

func FuzzPartitionKey(f *testing.F) {
	for _, s := range []string{"", "order-1", "é", "\xff", "a\x00", strings.Repeat("𝄞", 256)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		err := PartitionKey(s)
		ok := utf8.ValidString(s) && utf8.RuneCountInString(s) <= 255 && !strings.ContainsRune(s, 0) && !strings.HasSuffix(s, " ")
		if (err == nil) != ok {
			t.Fatalf("PartitionKey(%q) = %v, rule says valid=%v", s, err, ok)
		}
		idErr := MessageID(s)
		if (idErr == nil) != (ok && s != "") {
			t.Fatalf("MessageID(%q) = %v", s, idErr)
		}
		if err != nil && !strings.HasPrefix(err.Error(), "partition key: ") {
			t.Fatalf("error %q does not name the field", err)
		}
	})
}

func FuzzHeaders(f *testing.F) {
	f.Add("k", "v")
	f.Add("", "v")
	f.Add("k\x00", "\xff")
	f.Fuzz(func(t *testing.T, k, v string) {
		err := Headers(map[string]string{k: v})
		ok := k != "" && len(k) <= MaxHeaderKeyBytes && utf8.ValidString(k) && !strings.ContainsRune(k, 0) && !strings.HasSuffix(k, " ") &&
			len(v) <= MaxHeaderValueBytes && utf8.ValidString(v)
		if (err == nil) != ok {
			t.Fatalf("Headers(%q: %q) = %v, rule says valid=%v", k, v, err, ok)
		}
	})
}

func TestTenantList(t *testing.T) {
	got, err := TenantList("SHARDQ_TENANTS", " acme, globex ,\tinitech")
	if err != nil || len(got) != 3 || got[0] != "acme" || got[1] != "globex" || got[2] != "initech" {
		t.Fatalf("TenantList = %q, %v", got, err)
	}
	for in, want := range map[string]string{
		"":          "SHARDQ_TENANTS: empty tenant list",
		"  ":        "SHARDQ_TENANTS: empty tenant list",
		"a,,b":      "SHARDQ_TENANTS: entry 2: tenant: must not be empty",
		"a,b,a":     `SHARDQ_TENANTS: entry 3: tenant "a" appears twice`,
		"a,caf\xc3": "SHARDQ_TENANTS: entry 2: tenant: byte 0xc3 at index 3 is not ASCII",
	} {
		if _, err := TenantList("SHARDQ_TENANTS", in); err == nil || err.Error() != want {
			t.Errorf("TenantList(%q) = %v, want %q", in, err, want)
		}
	}
	if err := Tenants("tenants", nil); err == nil || err.Error() != "tenants: empty tenant list" {
		t.Errorf("Tenants(nil) = %v", err)
	}
	if err := Tenants("tenants", []string{"a", "a"}); err == nil {
		t.Error("Tenants accepted a repeat")
	}
}

func FuzzTenantList(f *testing.F) {
	for _, s := range []string{"a", "a,b", " a , b ", "a,,b", "a,a", "", "\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ts, err := TenantList("SHARDQ_TENANTS", s)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "SHARDQ_TENANTS: ") {
				t.Fatalf("error %q does not name the field", err)
			}
			return
		}
		if len(ts) == 0 {
			t.Fatal("accepted an empty list")
		}
		if err := Tenants("tenants", ts); err != nil {
			t.Fatalf("TenantList(%q) = %q, which Tenants rejects: %v", s, ts, err)
		}
		if len(ts) != strings.Count(s, ",")+1 {
			t.Fatalf("TenantList(%q) = %q lost or added entries", s, ts)
		}
	})
}

// Two identities are one static instance's only when both are its
// incarnations: "@" and 8 hex digits after the same instance id.
func TestSameInstance(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want bool
	}{
		{"a@0123abcd", "a@ffff0000", true},
		{"a@0123abcd", "a@0123abcd", true},
		{"a@b@0123abcd", "a@b@ffff0000", true},
		{"a@0123abcd", "b@0123abcd", false},
		{"a@0123abcd", "a#0123abcd", false},
		{"a#0123abcd", "a#ffff0000", false},
		{"a@0123abcd", "a@0123abcZ", false},
		{"@0123abcd", "@ffff0000", false},
		{"a@short", "a@short", false},
	} {
		if got := SameInstance(c.a, c.b); got != c.want {
			t.Errorf("SameInstance(%q, %q) = %v, want %v", c.a, c.b, got, c.want)
		}
	}
}
