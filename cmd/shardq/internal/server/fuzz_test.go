// SPDX-License-Identifier: Apache-2.0

package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/internal/receiptkey"
	"github.com/shardq/shardq/internal/testdb"
)

// The request decoders read bytes from the network: they never panic,
// refuse with a ValidationError naming a field, and what they accept is
// in range.

func checkRefusal(t *testing.T, err error) {
	t.Helper()
	var ve *shardq.ValidationError
	var big errBodyTooLarge
	if !errors.As(err, &ve) && !errors.As(err, &big) {
		t.Fatalf("refusal %v is neither a ValidationError nor a body limit", err)
	}
	if ve != nil && (ve.Field == "" || ve.Rule == "") {
		t.Fatalf("refusal %+v names no field or rule", ve)
	}
}

func FuzzDecodePublish(f *testing.F) {
	for _, s := range []string{
		`{"key":"k","id":"m1","payload":"one","headers":{"h":"v"}}`,
		`{"messages":[{"key":"k","payload_base64":"/w=="},{"id":"x","delay":1.5}]}`,
		`{"messages":[]}`, `{"delay":-1}`, `{"not_before":"2026-12-01T00:00:00Z"}`, ``, `[`, `{} {}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		msgs, err := decodePublish(strings.NewReader(body), "acme", "orders")
		if err != nil {
			checkRefusal(t, err)
			return
		}
		if len(msgs) < 1 || len(msgs) > 1000 {
			t.Fatalf("accepted %d messages", len(msgs))
		}
		for _, m := range msgs {
			if m.Tenant != "acme" || m.Topic != "orders" || m.Delay < 0 {
				t.Fatalf("accepted %+v", m)
			}
		}
	})
}

func FuzzDecodeReceive(f *testing.F) {
	for _, s := range []string{`{"max":10,"wait":20,"visibility":30,"key":"k"}`, `{"next_group":true}`, `{"wait":1e308}`, `{"visibility":-1}`, ``,
		`{"next_group":true,"ack":["r1.x","r2.y"]}`, `{"ack":"r1"}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		rq, err := decodeReceive(strings.NewReader(body), "acme", "orders", "g")
		if err == nil {
			err = rq.Validate()
		}
		if err != nil {
			checkRefusal(t, err)
			return
		}
		if rq.Wait < 0 || rq.Wait > 20e9 || rq.Visibility < 0 || rq.Visibility > 12*3600e9 || rq.Tenant != "acme" || len(rq.Ack) > 100 {
			t.Fatalf("accepted %+v, acks %d", rq, len(rq.Ack))
		}
	})
}

func FuzzDecodeSettle(f *testing.F) {
	for _, s := range []string{`{"receipts":["r1.x"]}`, `{"receipts":["a"],"retry_after":5,"reason":"x"}`, `{"receipts":[]}`, `{"retry_after":"NaN"}`} {
		f.Add(s, true)
		f.Add(s, false)
	}
	f.Fuzz(func(t *testing.T, body string, nack bool) {
		in, retry, err := decodeSettle(strings.NewReader(body), nack)
		if err != nil {
			checkRefusal(t, err)
			return
		}
		if len(in.Receipts) == 0 || len(in.Receipts) > shardq.MaxReceiveMessages || retry < 0 || (!nack && (retry != 0 || in.Reason != "")) {
			t.Fatalf("accepted %+v, retry %s", in, retry)
		}
	})
}

// FuzzParseToken: a token parses only in its one form, and then prints
// back to exactly itself (no two spellings of one token).
func FuzzParseToken(f *testing.F) {
	f.Add("sq_0123456789abcdef." + strings.Repeat("A", 43))
	f.Add("sq_0123456789ABCDEF." + strings.Repeat("_", 43))
	f.Add("Bearer x")
	f.Fuzz(func(t *testing.T, tok string) {
		id, secret, ok := parseToken(tok)
		if !ok {
			return
		}
		if len(secret) != 32 || len(id) != 16 {
			t.Fatalf("%q parsed to id %q, %d secret bytes", tok, id, len(secret))
		}
		if again := tokenPrefix + id + "." + b64(secret); again != tok {
			t.Fatalf("%q parsed, but prints back as %q", tok, again)
		}
	})
}

// FuzzOpenSession: a session cookie comes from the network. Opening one
// never panics, and only a cookie this database's key signed opens: a
// fuzzed value that opens is one the seed signed, unchanged.
func FuzzOpenSession(f *testing.F) {
	drv := testdb.Migrated(f, testdb.SQLite(f))
	ring := receiptkey.New(drv, SessionTTL, time.Now)
	good, err := signSession(context.Background(), ring, session{ID: "0123456789abcdef", Token: tokenDigest([]byte("hash")), Expires: time.Now().Add(time.Hour).Unix()})
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{good, good[:len(good)-1] + "A", "s2.1.e30.AAAA", "s2.", "s1.1.e30.AAAA", "r2.1.e30.AAAA", strings.Replace(good, "s2.1.", "s2.2.", 1)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		s, err := openSession(context.Background(), ring, v, time.Now())
		if err != nil {
			if !errors.Is(err, errSession) {
				t.Fatalf("refusal %v is not errSession", err)
			}
			return
		}
		if v != good || s.ID != "0123456789abcdef" {
			t.Fatalf("opened %q as %+v: only the signed seed may open", v, s)
		}
	})
}

// FuzzJSONLen: a string's length as JSON is what the encoder a response
// is written with (no HTML escapes) makes of it, for any bytes.
func FuzzJSONLen(f *testing.F) {
	for _, s := range []string{"", "plain", "\x01\x1f\b\f\n\r\t\"\\", "<&>", "\u2028\u2029", "é€𝄞", "\xff\xfe", "\xe2\x80"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(s); err != nil {
			t.Fatal(err)
		}
		want := int64(buf.Len() - 1) // the newline
		if got := jsonLen(s); got != want {
			t.Fatalf("jsonLen(%q) = %d, encoded %d: %s", s, got, want, buf.Bytes())
		}
		if got := jsonBytesLen([]byte(s)); got != want {
			t.Fatalf("jsonBytesLen(%q) = %d, encoded %d", s, got, want)
		}
	})
}
