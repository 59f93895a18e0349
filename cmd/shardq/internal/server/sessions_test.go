// SPDX-License-Identifier: Apache-2.0

package server

import (
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shardq/shardq/driver"
)

// state sends a group-state request with a session id.
func (h *harness) state(method, tok, session, body string) reply {
	h.t.Helper()
	req, err := http.NewRequest(method, h.http.URL+groupPath+"/state", strings.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	if session != "" {
		req.Header.Set(sessionHeader, session)
	}
	return h.do(req)
}

// A session over HTTP, as Service Bus's session receiver: accepted with
// hold (require_ready refuses an empty group), kept by acks, renewed and
// closed by visibility changes, with the group's state read and written
// under it; a receipt's visibility extended as SQS's
// ChangeMessageVisibility.
func TestSessionsOverHTTP(t *testing.T) {
	eachDB(t, func(t *testing.T, drv driver.Driver) {
		h := newHarness(t, drv, harnessOptions{})
		tok, _ := h.token(RoleConsume, 0, "acme")
		pub, _ := h.token(RolePublish, 0, "acme")
		h.must(200, "POST", topicPath+"/messages", pub, `{"messages":[{"key":"k","id":"m1","payload":"1"},{"key":"k","id":"m2","payload":"2"},{"id":"u1","payload":"3"}]}`)

		// require_ready: an empty group is not accepted.
		if b := h.must(200, "POST", groupPath+"/receive", tok, `{"key":"e","hold":true,"require_ready":true}`); b["session"] != nil {
			t.Fatalf("require_ready accepted an empty group: %v", b)
		}
		b := h.must(200, "POST", groupPath+"/receive", tok, `{"key":"k","hold":true,"visibility":300}`)
		sess, _ := b["session"].(map[string]any)
		if sess == nil || sess["key"] != "k" || !slices.Equal(ids(received(b)), []string{"m1"}) {
			t.Fatalf("accept = %v", b)
		}
		id := sess["id"].(string)
		if _, err := time.Parse(time.RFC3339Nano, sess["expires_at"].(string)); err != nil {
			t.Fatalf("expires_at: %v", err)
		}
		// The next receive in the session acks m1 and gets m2; the group stays held.
		b = h.must(200, "POST", groupPath+"/receive", tok, map[string]any{"session": id, "ack": receipts(received(b)), "visibility": 300})
		if !slices.Equal(ids(received(b)), []string{"m2"}) || b["acked"] != 1.0 || b["session"].(map[string]any)["id"] != id {
			t.Fatalf("receive in the session = %v", b)
		}
		m2 := receipts(received(b))
		h.must(200, "POST", groupPath+"/ack", tok, map[string]any{"receipts": m2})
		if got := received(h.must(200, "POST", groupPath+"/receive", tok, `{"key":"k"}`)); len(got) != 0 {
			t.Fatalf("a held group went to another receive: %v", got)
		}

		// State under the session.
		if r := h.state("GET", tok, id, ""); r.status != 200 || r.raw != "" {
			t.Fatalf("state before any: %d %q", r.status, r.raw)
		}
		if r := h.state("PUT", tok, id, "step\x002"); r.status != 204 {
			t.Fatalf("set state: %d %s", r.status, r.raw)
		}
		if r := h.state("GET", tok, id, ""); r.status != 200 || r.raw != "step\x002" || r.header.Get("Content-Type") != "application/octet-stream" {
			t.Fatalf("state: %d %q %s", r.status, r.raw, r.header.Get("Content-Type"))
		}
		if r := h.state("GET", tok, "", ""); r.status != 400 || !strings.Contains(r.raw, sessionHeader) {
			t.Fatalf("state without a session: %d %s", r.status, r.raw)
		}
		if r := h.state("GET", tok, m2[0], ""); r.status != 400 {
			t.Fatalf("state by a message's receipt: %d %s", r.status, r.raw)
		}

		// Renewed past its first timeout, then closed.
		h.must(200, "POST", groupPath+"/visibility", tok, map[string]any{"receipts": []string{id}, "visibility": 900})
		h.clock.Add(10 * time.Minute)
		if got := received(h.must(200, "POST", groupPath+"/receive", tok, `{"key":"k"}`)); len(got) != 0 {
			t.Fatalf("a renewed session lost its group: %v", got)
		}
		h.must(200, "POST", groupPath+"/session/close", tok, map[string]any{"session": id})
		if r := h.call("POST", groupPath+"/session/close", tok, map[string]any{"session": id}); r.status != 409 {
			t.Fatalf("close again: %d %s", r.status, r.raw)
		}
		if r := h.call("POST", groupPath+"/receive", tok, map[string]any{"session": id}); r.status != 409 {
			t.Fatalf("receive in a closed session: %d %s", r.status, r.raw)
		}
		if r := h.state("PUT", tok, id, "x"); r.status != 409 {
			t.Fatalf("set state of a closed session: %d %s", r.status, r.raw)
		}

		// A claim's visibility, extended.
		u := receipts(received(h.must(200, "POST", groupPath+"/receive", tok, `{"ungrouped":true,"visibility":5}`)))
		if b := h.must(200, "POST", groupPath+"/visibility", tok, map[string]any{"receipts": u, "visibility": 120}); b["changed"] != 1.0 {
			t.Fatalf("change visibility = %v", b)
		}
		h.clock.Add(time.Minute)
		if got := received(h.must(200, "POST", groupPath+"/receive", tok, `{"ungrouped":true}`)); len(got) != 0 {
			t.Fatalf("an extended claim was taken: %v", got)
		}
		h.must(200, "POST", groupPath+"/ack", tok, map[string]any{"receipts": u})

		// A receive whose session fails its check settles none of its acks.
		h.must(200, "POST", topicPath+"/messages", pub, `{"messages":[{"key":"z","id":"z1","payload":"1"},{"key":"z","id":"z2","payload":"2"}]}`)
		z := receipts(received(h.must(200, "POST", groupPath+"/receive", tok, `{"key":"z"}`)))
		if r := h.call("POST", groupPath+"/receive", tok, map[string]any{"session": z[0], "ack": z}); r.status != 400 || !strings.Contains(r.raw, "session") {
			t.Fatalf("receive with a receipt for a session: %d %s", r.status, r.raw)
		}
		if got := received(h.must(200, "POST", groupPath+"/receive", tok, `{"key":"z"}`)); len(got) != 0 {
			t.Fatalf("the refused request acked z1: z is free again (%v)", got)
		}

		for _, bad := range []string{
			`{"receipts":["` + u[0] + `"]}`, `{"receipts":["` + u[0] + `"],"visibility":-1}`, `{"receipts":["` + u[0] + `"],"visibility":43201}`,
			`{"receipts":[],"visibility":1}`, `{"receipts":["r2.x"],"visibility":1}`,
		} {
			if r := h.call("POST", groupPath+"/visibility", tok, bad); r.status != 400 {
				t.Errorf("visibility %s: %d %s", bad, r.status, r.raw)
			}
		}
		for _, bad := range []string{`{"hold":true}`, `{"key":"k","require_ready":true}`, `{"session":"` + id + `","key":"k"}`, `{"session":"` + u[0] + `"}`} {
			if r := h.call("POST", groupPath+"/receive", tok, bad); r.status != 400 {
				t.Errorf("receive %s: %d %s", bad, r.status, r.raw)
			}
		}
		if r := h.call("POST", groupPath+"/session/close", tok, `{}`); r.status != 400 {
			t.Errorf("close without a session: %d %s", r.status, r.raw)
		}
	})
}

// A message's ttl or expires_at over HTTP: refused when it could never
// be met, shown on a receive, and an expired message never received.
func TestExpiryOverHTTP(t *testing.T) {
	eachDB(t, func(t *testing.T, drv driver.Driver) {
		h := newHarness(t, drv, harnessOptions{})
		tok, _ := h.token(RoleAdmin, 0, "acme")
		for _, bad := range []string{`{"key":"k","ttl":-1}`, `{"key":"k","expires_at":"2020-01-01T00:00:00Z"}`,
			`{"key":"k","ttl":60,"expires_at":"2030-01-01T00:00:00Z"}`, `{"messages":[{"key":"k","ttl":60,"delay":120}]}`} {
			if r := h.call("POST", topicPath+"/messages", tok, bad); r.status != 400 {
				t.Errorf("publish %s: %d %s", bad, r.status, r.raw)
			}
		}
		h.must(200, "POST", topicPath+"/messages", tok, `{"messages":[{"key":"k","id":"gone","ttl":60},{"key":"k","id":"kept","ttl":3600}]}`)
		h.clock.Add(2 * time.Minute)
		got := received(h.must(200, "POST", groupPath+"/receive", tok, `{"key":"k","max":10}`))
		if !slices.Equal(ids(got), []string{"kept"}) {
			t.Fatalf("received %v, want kept only", ids(got))
		}
		at, err := time.Parse(time.RFC3339Nano, got[0]["expires_at"].(string))
		if want := time.Date(2026, 12, 1, 13, 0, 0, 0, time.UTC); err != nil || !at.Equal(want) {
			t.Fatalf("expires_at %v (%v), want %v", got[0]["expires_at"], err, want)
		}
	})
}
