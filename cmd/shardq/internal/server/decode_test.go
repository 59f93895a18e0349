// SPDX-License-Identifier: Apache-2.0

package server

import (
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
)

// repeat is n copies of item joined by commas.
func repeat(item string, n int) string { return strings.TrimSuffix(strings.Repeat(item+",", n), ",") }

// A body is scanned against its bounds before anything is decoded: the
// first array, object or nesting past its bound is refused with its
// field, whatever follows.
func TestDecodeBounds(t *testing.T) {
	for _, c := range []struct {
		name, body, field string
	}{
		{"messages", `{"messages":[` + repeat("{}", 1001) + `]}`, "messages"},
		{"messages of the attack", `{"messages":[` + repeat("{}", 100_000) + `]}`, "messages"},
		{"headers", `{"messages":[{},{},{"headers":{` + repeat(`"h":"v"`, 65) + `}}]}`, "messages[2].headers"},
		{"fields", `{` + repeat(`"key":"k"`, 65) + `}`, "body"},
		{"nesting", `{"messages":[{"headers":{"h":{"x":1}}}]}`, "messages[0].headers.h"},
		{"receipts", `{"receipts":[` + repeat(`""`, 1001) + `]}`, "receipts"},
		{"ack", `{"ack":[` + repeat(`"r"`, 1001) + `]}`, "ack"},
		{"trailing", `{} {}`, "body"},
		{"malformed", `{"key":`, "body"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var v map[string]any
			err := decodeJSON(strings.NewReader(c.body), &v)
			var ve *shardq.ValidationError
			if !errors.As(err, &ve) || ve.Field != c.field {
				t.Fatalf("%v, want a refusal of field %q", err, c.field)
			}
			if v != nil {
				t.Fatalf("decoded %d fields of a refused body", len(v))
			}
		})
	}
	for _, ok := range []string{`{"messages":[` + repeat(`{"headers":{`+repeat(`"h":"v"`, 64)+`}}`, 1000) + `]}`, ``, ` `, `{"KEY":"k"}`, `{"key":"a","key":"b"}`} {
		var in publishIn
		if err := decodeJSON(strings.NewReader(ok), &in); err != nil {
			t.Fatalf("%.60q: %v", ok, err)
		}
	}
}

// What a body decodes into is charged to the server's budget with the
// body until the request ends: past the budget a request is refused
// (429) before it is decoded, and what one holds is given back when it
// ends. A receive's room during its long poll is its decoded form's,
// not its body's (TestInflightBodiesCapped).
func TestDecodedFormCharged(t *testing.T) {
	eachDB(t, func(t *testing.T, drv driver.Driver) {
		const budget = 4 << 20
		h := newHarness(t, drv, harnessOptions{maxBody: budget, maxInflightBody: budget})
		tok, _ := h.token(RolePublish, 0, "acme")
		// Strings of 1.5 MiB decode into twice that: with the body, more
		// than the budget.
		big := `{"messages":[{"key":"k","payload":"` + strings.Repeat("x", 3<<19) + `"}]}`
		r := h.call("POST", topicPath+"/messages", tok, big)
		if r.status != http.StatusTooManyRequests {
			t.Fatalf("a body whose decoded form passes the budget: %d %s, want 429", r.status, r.raw)
		}
		if held := h.srv.limits.reading.Load(); held != 0 {
			t.Fatalf("%d bytes held after the request ended", held)
		}
		// Within the budget, concurrent publishes all end, and give back
		// what they held.
		var wg sync.WaitGroup
		for i := range 4 {
			wg.Go(func() {
				body := `{"messages":[` + repeat(`{"key":"k","payload":"`+strings.Repeat("y", 1000)+`"}`, 100) + `]}`
				if r := h.call("POST", topicPath+"/messages", tok, body); r.status != http.StatusOK && r.status != http.StatusTooManyRequests {
					t.Errorf("publish %d: %d %s", i, r.status, r.raw)
				}
			})
		}
		wg.Wait()
		if held := h.srv.limits.reading.Load(); held != 0 {
			t.Fatalf("%d bytes held after the requests ended", held)
		}
	})
}
