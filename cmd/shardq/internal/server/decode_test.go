// SPDX-License-Identifier: Apache-2.0

package server

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
)

// repeat is n copies of item joined by commas.
func repeat(item string, n int) string { return strings.TrimSuffix(strings.Repeat(item+",", n), ",") }

// members is n members "<prefix>i":"v" joined by commas.
func members(prefix string, n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"%s%d":"v"`, prefix, i)
	}
	return b.String()
}

// A body is scanned against its bounds before anything is decoded: the
// first array, object or nesting past its bound is refused with its
// field, whatever follows.
func TestDecodeBounds(t *testing.T) {
	for _, c := range []struct {
		name, body, field string
	}{
		{"messages", `{"messages":[` + repeat("{}", 1001) + `]}`, "messages"},
		{"messages of the attack", `{"messages":[` + repeat("{}", 100_000) + `]}`, "messages"},
		{"headers", `{"messages":[{},{},{"headers":{` + members("h", 65) + `}}]}`, "messages[2].headers"},
		{"fields", `{` + members("f", 65) + `}`, "body"},
		{"a name twice", `{"key":"a","key":"b"}`, "body"},
		{"not UTF-8", "{\"key\":\"\xff\"}", "body"},
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
	for _, ok := range []string{`{"messages":[` + repeat(`{"headers":{`+members("h", 64)+`}}`, 1000) + `]}`, ``, ` `, `{"KEY":"k"}`, `{"key":"é"}`,
		`{"headers":{"A":"1","a":"2"}}`} {
		var in publishIn
		if err := decodeJSON(strings.NewReader(ok), &in); err != nil {
			t.Fatalf("%.60q: %v", ok, err)
		}
	}
	// A field matched without regard to case may still be given once.
	var in publishIn
	var ve *shardq.ValidationError
	if err := decodeJSON(strings.NewReader(`{"messages":[{"key":"a"}],"Messages":[{"key":"b"},{"key":"c"}]}`), &in); !errors.As(err, &ve) || ve.Field != "body" {
		t.Fatalf("a field given twice in two cases: %v, decoded %+v; want a refusal", err, in)
	}
}

// What a body holds is charged to the server's budget until the request
// ends: its buffer as the bytes arrive, then what it decodes into. A
// tenant whose requests hold its share of the budget (half of it) gets
// 429 until they end, while another tenant's requests go on; what they
// held is given back when they end.
func TestDecodedFormCharged(t *testing.T) {
	eachDB(t, func(t *testing.T, drv driver.Driver) {
		const budget = 4 << 20
		h := newHarness(t, drv, harnessOptions{maxBody: budget, maxInflightBody: budget})
		evil, _ := h.token(RolePublish, 0, "evil")
		acme, _ := h.token(RolePublish, 0, "acme")
		post := func(tok, tenant string, r io.Reader) int {
			req, _ := http.NewRequest("POST", h.http.URL+"/v1/tenants/"+tenant+"/topics/orders/messages", r)
			req.Header.Set("Authorization", "Bearer "+tok)
			res, err := h.http.Client().Do(req)
			if err != nil {
				return 0
			}
			res.Body.Close()
			return res.StatusCode
		}
		// A body of evil sends 1.5 MiB of blanks and stalls: its buffer
		// holds most of evil's share (2 MiB).
		pr, pw := io.Pipe()
		results := make(chan int, 1)
		go func() { results <- post(evil, "evil", pr) }()
		go pw.Write([]byte(`{"id":"x",` + strings.Repeat(" ", 3<<19)))
		for deadline := time.Now().Add(10 * time.Second); h.srv.limits.reading.Load() < 3<<19; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the stalled bodies hold %d bytes", h.srv.limits.reading.Load())
			}
		}
		// 400 KB of payloads: with their buffer and decoded form, more than
		// evil has left, well within acme's share.
		body := `{"messages":[` + repeat(`{"key":"k","payload":"`+strings.Repeat("y", 1000)+`"}`, 400) + `]}`
		if code := post(evil, "evil", strings.NewReader(body)); code != http.StatusTooManyRequests {
			t.Fatalf("evil's second body while the first holds its share: %d, want 429", code)
		}
		stalled := h.srv.limits.reading.Load()
		for i := range 4 {
			// The request before gives its room back once its handler
			// returns, a moment after its answer.
			for deadline := time.Now().Add(10 * time.Second); h.srv.limits.reading.Load() > stalled && time.Now().Before(deadline); {
				time.Sleep(time.Millisecond)
			}
			if code := post(acme, "acme", strings.NewReader(body)); code != http.StatusOK {
				t.Fatalf("acme's publish %d beside evil's stalled body: %d, want 200", i, code)
			}
		}
		pw.CloseWithError(io.ErrUnexpectedEOF)
		<-results
		h.http.CloseClientConnections()
		for deadline := time.Now().Add(10 * time.Second); h.srv.limits.reading.Load() != 0; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d bytes held after the requests ended", h.srv.limits.reading.Load())
			}
		}
	})
}
