// SPDX-License-Identifier: Apache-2.0

package server

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
	receiptform "github.com/shardq/shardq/internal/receipts"
)

// The attacks of issue 29, as written there, each against its fix.

// One receive of large messages stops at the byte budget (and says so),
// escapes nothing it need not, and loses nothing: the rest come next.
func TestReceiveStopsAtByteBudget(t *testing.T) {
	eachDB(t, func(t *testing.T, drv driver.Driver) {
		const budget = 3 << 20
		h := newHarness(t, drv, harnessOptions{maxResponseBytes: budget})
		tok, _ := h.token(RoleAdmin, 0, "acme")
		headers := map[string]string{}
		for i := range 60 {
			headers[fmt.Sprintf("h%02d", i)] = strings.Repeat("<", 8000)
		}
		payload := strings.Repeat("p", 1<<20)
		for i := range 8 {
			for _, key := range []string{"k", ""} { // a message group and ungrouped ones
				if _, err := h.client.Publish(context.Background(), shardq.Message{Tenant: "acme", Topic: "orders", PartitionKey: key,
					ID: fmt.Sprintf("%s%d", key, i), Headers: headers, Payload: []byte(payload)}); err != nil {
					t.Fatal(err)
				}
			}
		}
		for _, mode := range []string{`"key":"k"`, `"ungrouped":true`} {
			var got []string
			for round := 0; len(got) < 8 && round < 20; round++ {
				r := h.call("POST", groupPath+"/receive", tok, `{`+mode+`,"max":20}`)
				if r.status != 200 {
					t.Fatalf("%s: receive: %d %s", mode, r.status, r.raw)
				}
				ms := received(r.body)
				perMessage := len(payload) + 60*(8000+3)
				if len(ms) == 0 || len(ms)*perMessage > budget+perMessage {
					t.Fatalf("%s: %d messages of %d bytes in one receive, budget %d", mode, len(ms), perMessage, budget)
				}
				if len(r.raw) > budget+2*perMessage {
					t.Fatalf("%s: a body of %d bytes, budget %d", mode, len(r.raw), budget)
				}
				if strings.Contains(r.raw, `\u003c`) {
					t.Fatalf("%s: '<' escaped in a JSON answer", mode)
				}
				if len(got)+len(ms) < 8 && r.body["truncated"] != true {
					t.Fatalf("%s: %d of 8 messages and not truncated", mode, len(ms))
				}
				for _, m := range ms {
					got = append(got, m["id"].(string))
				}
				h.must(200, "POST", groupPath+"/ack", tok, map[string]any{"receipts": receipts(ms)})
			}
			if len(got) != 8 {
				t.Fatalf("%s: received %v, want 8 messages", mode, got)
			}
		}
	})
}

// A receive of many small messages stays within the byte budget too:
// their receipts, keys and ids count, not only payloads and headers.
func TestReceiveOfManySmallMessagesStaysInBudget(t *testing.T) {
	eachDB(t, func(t *testing.T, drv driver.Driver) {
		const budget = 64 << 10
		h := newHarness(t, drv, harnessOptions{maxResponseBytes: budget})
		tok, _ := h.token(RoleAdmin, 0, "acme")
		key := strings.Repeat("k", 255)
		msgs := make([]shardq.Message, 300)
		for i := range msgs {
			msgs[i] = shardq.Message{Tenant: "acme", Topic: "orders", PartitionKey: key, ID: fmt.Sprintf("%0255d", i), Payload: []byte("x")}
		}
		if _, err := h.client.Publish(context.Background(), msgs...); err != nil {
			t.Fatal(err)
		}
		var got int
		for round := 0; got < len(msgs) && round < len(msgs); round++ {
			r := h.call("POST", groupPath+"/receive", tok, fmt.Sprintf(`{"key":%q,"max":%d}`, key, shardq.MaxReceiveMessages))
			ms := received(r.body)
			if r.status != 200 || len(ms) == 0 {
				t.Fatalf("receive: %d %s", r.status, r.raw)
			}
			if len(r.raw) > budget {
				t.Fatalf("a body of %d bytes (%d messages), budget %d", len(r.raw), len(ms), budget)
			}
			if got+len(ms) < len(msgs) && r.body["truncated"] != true {
				t.Fatalf("%d of %d messages and not truncated", got+len(ms), len(msgs))
			}
			got += len(ms)
			h.must(200, "POST", groupPath+"/ack", tok, map[string]any{"receipts": receipts(ms)})
		}
		if got != len(msgs) {
			t.Fatalf("received %d of %d", got, len(msgs))
		}
	})
}

// A receipt a client made (a claim row nobody holds: a delayed message)
// or edited (offsets past the head) settles nothing.
func TestForgedAndEditedReceiptsSettleNothing(t *testing.T) {
	eachDB(t, func(t *testing.T, drv driver.Driver) {
		h := newHarness(t, drv, harnessOptions{})
		tok, _ := h.token(RoleAdmin, 0, "acme")
		later := h.must(200, "POST", "/v1/tenants/acme/topics/sched/messages", tok, `{"id":"later","payload":"x","delay":3600}`)
		h.must(200, "POST", "/v1/tenants/acme/topics/sched/messages", tok, `{"id":"now","payload":"y"}`)
		off := int64(later["results"].([]any)[0].(map[string]any)["offset"].(float64))
		first := received(h.must(200, "POST", "/v1/tenants/acme/topics/sched/groups/victim/receive", tok, `{"ungrouped":true,"max":10}`))
		h.must(200, "POST", "/v1/tenants/acme/topics/sched/groups/victim/ack", tok, map[string]any{"receipts": receipts(first)})
		forged, _ := json.Marshal(map[string]any{"t": "acme", "p": "sched", "g": "victim", "w": "anyone", "n": 0, "o": off, "c": true})
		forgedBinary := receiptform.Receipt{Tenant: "acme", Topic: "sched", Group: "victim", Owner: "anyone", Token: 1, Offset: off, Claim: true}
		for _, rcpt := range []string{
			"r1." + base64.RawURLEncoding.EncodeToString(forged),
			"r2.1." + base64.RawURLEncoding.EncodeToString(forged) + "." + base64.RawURLEncoding.EncodeToString(make([]byte, 32)),
			"r3.1." + base64.RawURLEncoding.EncodeToString(forgedBinary.AppendBinary(nil)) + "." + base64.RawURLEncoding.EncodeToString(make([]byte, 32)),
		} {
			for _, op := range []string{"ack", "nack"} {
				body := map[string]any{"receipts": []string{rcpt}}
				if op == "nack" {
					body["retry_after"] = 0
				}
				r := h.call("POST", "/v1/tenants/acme/topics/sched/groups/victim/"+op, tok, body)
				if r.status != 400 || r.body["field"] != "receipts[0]" {
					t.Fatalf("%s of a forged receipt: %d %s, want 400 naming receipts[0]", op, r.status, r.raw)
				}
			}
		}
		// The delayed message is still delayed, and still the group's.
		h.clock.Add(59 * time.Minute)
		if ms := received(h.must(200, "POST", "/v1/tenants/acme/topics/sched/groups/victim/receive", tok, `{"ungrouped":true}`)); len(ms) != 0 {
			t.Fatalf("before its time: %v", ms)
		}
		h.clock.Add(2 * time.Minute)
		if ms := received(h.must(200, "POST", "/v1/tenants/acme/topics/sched/groups/victim/receive", tok, `{"ungrouped":true}`)); len(ms) != 1 || ms[0]["id"] != "later" {
			t.Fatalf("when due: %v, want the delayed message", ms)
		}

		// An edited grouped receipt.
		h.must(200, "POST", topicPath+"/messages", tok, `{"messages":[{"key":"k","id":"a"},{"key":"k","id":"b"}]}`)
		ms := received(h.must(200, "POST", groupPath+"/receive", tok, `{"key":"k","max":1}`))
		parts := strings.Split(ms[0]["receipt"].(string), ".")
		raw, err := base64.RawURLEncoding.DecodeString(parts[2])
		rc, ok := receiptform.ReadBinary(raw)
		if err != nil || !ok {
			t.Fatalf("receipt %s: body %v, binary %v", ms[0]["receipt"], err, ok)
		}
		rc.Offset, rc.Last = 9e18, 9e18
		parts[2] = base64.RawURLEncoding.EncodeToString(rc.AppendBinary(nil))
		if r := h.call("POST", groupPath+"/ack", tok, map[string]any{"receipts": []string{strings.Join(parts, ".")}}); r.status != 400 {
			t.Fatalf("ack of an edited receipt: %d %s, want 400", r.status, r.raw)
		}
		h.must(200, "POST", groupPath+"/ack", tok, map[string]any{"receipts": receipts(ms)})
		if next := received(h.must(200, "POST", groupPath+"/receive", tok, `{"key":"k"}`)); len(next) != 1 || next[0]["id"] != "b" {
			t.Fatalf("after the edited ack: %v, want b", next)
		}
	})
}

// serve sends one request straight to the handler from addr.
func (h *harness) serve(method, path, auth, addr string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, path, strings.NewReader("{}"))
	req.RemoteAddr = net.JoinHostPort(addr, "40000")
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	rec := httptest.NewRecorder()
	h.srv.ServeHTTP(rec, req)
	return rec
}

// Rate buckets are charged only after a token verified; failed
// authentications are limited per client address; no flood of values
// clears anyone's bucket.
func TestAuthenticateBeforeRateLimits(t *testing.T) {
	eachDB(t, func(t *testing.T, drv driver.Driver) {
		// A bucket refills once in 100 s: what the test spends stays spent
		// however long the flood below takes on a loaded machine.
		h := newHarness(t, drv, harnessOptions{rate: 0.01, burst: 3, authFailRate: 0.001})
		tok, id := h.token(RoleAdmin, 0, "acme")
		path := "/v1/tenants/acme/topics"
		// Someone who knows the id but not the secret, from elsewhere.
		fake := "Bearer sq_" + id + "." + strings.Repeat("A", 43)
		for i := range failBurst {
			if rec := h.serve("GET", path, fake, "192.0.2.1"); rec.Code != 401 {
				t.Fatalf("wrong secret #%d: %d, want 401", i, rec.Code)
			}
		}
		if rec := h.serve("GET", path, fake, "192.0.2.1"); rec.Code != 429 {
			t.Fatalf("the %d-th failure from one address: %d, want 429", failBurst+1, rec.Code)
		}
		// The real token, from its own address, has its whole burst.
		for i := range 3 {
			if rec := h.serve("GET", path, "bearer "+tok, "192.0.2.2"); rec.Code != 200 { // the scheme is case-insensitive
				t.Fatalf("real token #%d after the attack: %d %s", i, rec.Code, rec.Body)
			}
		}
		if rec := h.serve("GET", path, "Bearer "+tok, "192.0.2.2"); rec.Code != 429 {
			t.Fatalf("past its burst: %d, want 429", rec.Code)
		}
		// Concurrent failures from one address: the limit holds them all,
		// not only those that come after the first ones were charged.
		var wg sync.WaitGroup
		codes := make(chan int, 60)
		for range 60 {
			wg.Go(func() { codes <- h.serve("GET", path, fake, "192.0.2.9").Code })
		}
		wg.Wait()
		close(codes)
		read := 0
		for c := range codes {
			if c != 429 {
				read++
			}
		}
		if read > failBurst {
			t.Fatalf("%d of 60 concurrent bad tokens from one address were read, limit %d", read, failBurst)
		}
		// Authentications that succeed are not charged: many first uses
		// from one address (a NAT) all pass.
		for i := range 2 * failBurst {
			tok, _ := h.token(RoleAdmin, 0, "acme")
			if rec := h.serve("GET", path, "Bearer "+tok, "192.0.2.50"); rec.Code != 200 {
				t.Fatalf("first use #%d of a valid token from one address: %d, want 200", i, rec.Code)
			}
		}
		// A token that verified lately is not locked out by a bad client
		// behind the same address (a NAT); IPv6 counts by /64.
		other, _ := h.token(RoleAdmin, 0, "acme")
		if rec := h.serve("GET", path, "Bearer "+other, "2001:db8::1"); rec.Code != 200 {
			t.Fatalf("other token: %d", rec.Code)
		}
		for range failBurst + 1 {
			h.serve("GET", path, fake, "2001:db8::2") // the same /64
		}
		if rec := h.serve("GET", path, fake, "2001:db8::3"); rec.Code != 429 {
			t.Fatalf("another address of the /64: %d, want 429", rec.Code)
		}
		if rec := h.serve("GET", path, "Bearer "+other, "2001:db8::1"); rec.Code != 200 {
			t.Fatalf("a token that verified lately, behind an address locked out: %d, want 200", rec.Code)
		}
		// A flood of malformed values from many addresses evicts no
		// token's bucket: it stays spent.
		for i := range limiterEntries + 50 {
			h.serve("GET", path, fmt.Sprintf("Bearer garbage-%d", i), fmt.Sprintf("198.51.%d.%d", i/250, i%250))
		}
		if rec := h.serve("GET", path, "Bearer "+tok, "192.0.2.2"); rec.Code != 429 {
			t.Fatalf("after a flood of garbage: %d, want 429 (the bucket kept)", rec.Code)
		}
	})
}

// A token may hold several roles.
func TestTokenWithSeveralRoles(t *testing.T) {
	eachDB(t, func(t *testing.T, drv driver.Driver) {
		h := newHarness(t, drv, harnessOptions{})
		tok, _, err := NewToken(context.Background(), drv, []string{"acme"}, []string{RolePublish, RoleConsume, RolePublish}, 0, h.clock.Now())
		if err != nil {
			t.Fatal(err)
		}
		h.must(200, "POST", topicPath+"/messages", tok, `{"key":"k","id":"m"}`)
		h.must(200, "POST", groupPath+"/receive", tok, `{"key":"k"}`)
		h.must(403, "GET", "/v1/tenants/acme/topics", tok, nil)
		if _, err := JoinRoles([]string{"publish", "root"}); err == nil {
			t.Fatal("an unknown role was accepted")
		}
	})
}

// Receives in flight are capped per token and server-wide.
func TestConcurrentReceivesCapped(t *testing.T) {
	eachDB(t, func(t *testing.T, drv driver.Driver) {
		h := newHarness(t, drv, harnessOptions{maxReceives: 2, maxPerToken: 1})
		a, _ := h.token(RoleConsume, 0, "acme")
		b, _ := h.token(RoleConsume, 0, "acme")
		c, _ := h.token(RoleConsume, 0, "acme")
		done := make(chan reply, 2)
		poll := func(tok, key string, holders int) {
			go func() { done <- h.call("POST", groupPath+"/receive", tok, `{"key":"`+key+`","wait":20}`) }()
			h.waitReceives(holders) // until the long poll holds its slot
		}
		poll(a, "k", 1)
		r := h.call("POST", groupPath+"/receive", a, `{"key":"j"}`)
		if r.status != 429 || r.header.Get("Retry-After") == "" || !strings.Contains(r.raw, "1 per token") {
			t.Fatalf("a second receive of one token while its first waits: %d %s, want 429 with Retry-After", r.status, r.raw)
		}
		h.must(200, "POST", groupPath+"/receive", b, `{"key":"j"}`) // another token is not held back
		poll(b, "i", 2)
		if r := h.call("POST", groupPath+"/receive", c, `{"key":"h"}`); r.status != 429 {
			t.Fatalf("a third receive with the server's two slots taken: %d %s, want 429", r.status, r.raw)
		}
		h.srv.Drain() // the waiting ones answer
		for range 2 {
			if r := <-done; r.status != 200 {
				t.Fatalf("a long poll: %d %s", r.status, r.raw)
			}
		}
	})
}

// A waiting receive wakes on the change feed when another process (here:
// another client) publishes, not at its next poll.
func TestLongPollWakesOnFeed(t *testing.T) {
	eachDB(t, func(t *testing.T, drv driver.Driver) {
		ctx := context.Background()
		c, err := shardq.NewClient(drv, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		const never = time.Hour
		rc, err := c.Receipts(&shardq.ReceiptOptions{MessageBytes: MessageBytes, PollInterval: never, FeedPollInterval: never})
		if err != nil {
			t.Fatal(err)
		}
		other, err := shardq.NewClient(drv, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer other.Close()
		for _, rq := range []shardq.ReceiveRequest{{PartitionKey: "k"}, {Ungrouped: true}, {}} {
			rq.Tenant, rq.Topic, rq.ConsumerGroup, rq.Wait = "acme", "orders", "g", 15*time.Second
			got := make(chan shardq.ReceiveResult, 1)
			go func() {
				res, err := rc.Receive(ctx, rq)
				if err != nil {
					t.Error(err)
				}
				got <- res
			}()
			// Publish until the receive has it: the first publishes may
			// come before it waits, and find it later (bounded by Wait).
			key := rq.PartitionKey
			var res shardq.ReceiveResult
			for i := 0; ; i++ {
				if _, err := other.Publish(ctx, shardq.Message{Tenant: "acme", Topic: "orders", PartitionKey: key, ID: fmt.Sprintf("%s-%v-%d", key, rq.Ungrouped, i)}); err != nil {
					t.Fatal(err)
				}
				select {
				case res = <-got:
				case <-time.After(200 * time.Millisecond):
					if i < 40 {
						continue
					}
					res = <-got
				}
				break
			}
			if len(res.Messages) == 0 {
				t.Fatalf("%+v: the waiting receive got nothing (no wake-up from the feed)", rq)
			}
			var rcpts []string
			for _, m := range res.Messages {
				rcpts = append(rcpts, m.Receipt)
			}
			if _, err := rc.AckAll(ctx, shardq.GroupRef{Tenant: "acme", Topic: "orders", ConsumerGroup: "g"}, rcpts); err != nil {
				t.Fatal(err)
			}
			// Drain what the extra publishes left.
			for {
				more, err := rc.Receive(ctx, shardq.ReceiveRequest{Tenant: "acme", Topic: "orders", ConsumerGroup: "g", Max: 100})
				if err != nil || len(more.Messages) == 0 {
					break
				}
				rcpts = rcpts[:0]
				for _, m := range more.Messages {
					rcpts = append(rcpts, m.Receipt)
				}
				if _, err := rc.AckAll(ctx, shardq.GroupRef{Tenant: "acme", Topic: "orders", ConsumerGroup: "g"}, rcpts); err != nil {
					t.Fatal(err)
				}
			}
		}
	})
}

// The dashboard: names escaped in every path, no framing, a session that
// is not the token, sign-in errors never taken from the URL, and a
// cross-origin POST refused before its body is read.
func TestDashboardHardening(t *testing.T) {
	eachDB(t, func(t *testing.T, drv driver.Driver) {
		h := newHarness(t, drv, harnessOptions{})
		tok, _ := h.token(RoleAdmin, 0, "acme")
		h.must(200, "POST", topicPath+"/messages", tok, `{"key":"k","id":"m"}`)
		evil := "x%2F..%2Fbilling"
		h.must(200, "POST", "/v1/tenants/acme/topics/orders/groups/"+url.PathEscape(evil)+"/receive", tok, `{"key":"k"}`)

		cl := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		form := url.Values{"tenant": {"acme"}, "token": {tok}}
		req, _ := http.NewRequest("POST", h.http.URL+"/login", strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Sec-Fetch-Site", "same-origin")
		res, err := cl.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		var cookie *http.Cookie
		for _, c := range res.Cookies() {
			if c.Name == sessionCookie {
				cookie = c
			}
		}
		if res.StatusCode != http.StatusSeeOther || cookie == nil || strings.Contains(cookie.Value, tok) || strings.Contains(cookie.Value, "sq_") || !cookie.HttpOnly {
			t.Fatalf("sign-in: %d, cookie %+v: want a session that is not the token", res.StatusCode, cookie)
		}
		page := func(path string, c *http.Cookie) (*http.Response, string) {
			req, _ := http.NewRequest("GET", h.http.URL+path, nil)
			req.AddCookie(c)
			res, err := cl.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			b, _ := io.ReadAll(res.Body)
			return res, string(b)
		}
		res, body := page("/ui/acme/topics/orders", cookie)
		if res.StatusCode != 200 {
			t.Fatalf("topic page: %d", res.StatusCode)
		}
		if csp := res.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "frame-ancestors 'none'") {
			t.Fatalf("CSP %q lacks frame-ancestors 'none'", csp)
		}
		if !strings.Contains(body, "/groups/x%252F%2E%2E%252Fbilling/pause") || strings.Contains(body, "/groups/x%2F..%2Fbilling/") {
			t.Fatalf("the group's pause form path is not escaped:\n%s", body)
		}
		// A session cookie a client made or edited is refused.
		forged := *cookie
		forged.Value = cookie.Value[:len(cookie.Value)-2] + "AA"
		if res, _ := page("/ui/acme", &forged); res.StatusCode != http.StatusSeeOther {
			t.Fatalf("forged session: %d, want a redirect to the sign-in", res.StatusCode)
		}
		// Sign-in errors come from a fixed list.
		_, body = page("/?error="+url.QueryEscape("<b>call 555</b>"), cookie)
		if strings.Contains(body, "call 555") {
			t.Fatal("the sign-in page shows text from its URL")
		}
		// A cross-origin POST is refused before its body is read: the body
		// never ends, and the answer comes anyway.
		pr, pw := io.Pipe()
		defer pw.Close()
		req, _ = http.NewRequest("POST", h.http.URL+"/login", pr)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Sec-Fetch-Site", "cross-site")
		req.ContentLength = 1 << 20
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		res, err = cl.Do(req.WithContext(ctx))
		if err != nil {
			t.Fatalf("cross-origin sign-in with an endless body: %v (the server read the body first)", err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusForbidden {
			t.Fatalf("cross-origin sign-in: %d, want 403", res.StatusCode)
		}
	})
}

// /metrics behind an admin token, when asked.
func TestMetricsAuth(t *testing.T) {
	eachDB(t, func(t *testing.T, drv driver.Driver) {
		h := newHarness(t, drv, harnessOptions{metricsAuth: true})
		admin, _ := h.token(RoleAdmin, 0, "acme")
		pub, _ := h.token(RolePublish, 0, "acme")
		if r := h.call("GET", "/metrics?tenant=acme", "", nil); r.status != 401 {
			t.Fatalf("/metrics without a token: %d", r.status)
		}
		if r := h.call("GET", "/metrics?tenant=acme", pub, nil); r.status != 403 {
			t.Fatalf("/metrics with a publish token: %d", r.status)
		}
		if r := h.call("GET", "/metrics?tenant=acme", admin, nil); r.status != 200 || !strings.Contains(r.raw, "shardq metrics") {
			t.Fatalf("/metrics with an admin token: %d %s", r.status, r.raw)
		}
	})
}

// Request bodies are charged to the server's budget as their bytes
// arrive, not by what they announce: bodies that stall hold only what came
// and shut nobody out. One tenant's requests hold at most half the
// budget: its bodies, however many and however slow, leave the rest to
// the other tenants; a request that would need more than that share gets
// 413, not a 429 it could never get past.
func TestInflightBodiesCapped(t *testing.T) {
	eachDB(t, func(t *testing.T, drv driver.Driver) {
		const body = 1 << 20
		h := newHarness(t, drv, harnessOptions{maxBody: body, maxInflightBody: 4 * body})
		evil, _ := h.token(RoleAdmin, 0, "evil")
		acme, _ := h.token(RolePublish, 0, "acme")
		post := func(tok, tenant string, r io.Reader, n int64) (*http.Response, error) {
			req, _ := http.NewRequest("POST", h.http.URL+"/v1/tenants/"+tenant+"/topics/orders/messages", r)
			req.Header.Set("Authorization", "Bearer "+tok)
			req.ContentLength = n
			return h.http.Client().Do(req)
		}
		// Eight slow bodies announcing 1 MiB each, twice the budget, send a
		// few bytes and stall.
		var pipes []*io.PipeWriter
		results := make(chan int, 8)
		for range 8 {
			pr, pw := io.Pipe()
			pipes = append(pipes, pw)
			go func() {
				res, err := post(evil, "evil", pr, body)
				if err != nil {
					results <- 0
					return
				}
				res.Body.Close()
				results <- res.StatusCode
			}()
			pw.Write([]byte(`{"id":"x","payload":"`)) // a start, then nothing for a while
		}
		for deadline := time.Now().Add(10 * time.Second); h.srv.limits.reading.Load() == 0; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the slow bodies were never read")
			}
		}
		if held := h.srv.limits.reading.Load(); held > 8*4096 {
			t.Fatalf("eight stalled bodies hold %d bytes; want what came", held)
		}
		// Another tenant's publish goes through.
		res, err := post(acme, "acme", strings.NewReader(`{"id":"y","payload":"`+strings.Repeat("y", body/4)+`"}`), -1)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != 200 {
			t.Fatalf("acme's publish beside evil's stalled bodies: %d, want 200", res.StatusCode)
		}
		for _, pw := range pipes {
			pw.CloseWithError(io.ErrUnexpectedEOF)
		}
		h.http.CloseClientConnections()
		for range 8 {
			<-results
		}

		// A tenant's share is half the budget (1 MiB of 2 here), but a
		// request alone may take the whole budget: one that needs 1.5 MiB
		// goes through. One whose decoded form needs more than the whole
		// budget (its buffer and twice its strings) can never be served:
		// 413.
		h2 := newHarness(t, drv, harnessOptions{maxBody: body, maxInflightBody: 2 * body})
		tok2, _ := h2.token(RolePublish, 0, "acme")
		if r := h2.call("POST", topicPath+"/messages", tok2, `{"id":"w","payload":"`+strings.Repeat("w", body/3)+`"}`); r.status != 200 {
			t.Fatalf("a body needing more than a tenant's share, alone: %d %s, want 200", r.status, r.raw)
		}
		r := h2.call("POST", topicPath+"/messages", tok2, `{"id":"z","payload":"`+strings.Repeat("z", body-40)+`"}`)
		if r.status != http.StatusRequestEntityTooLarge {
			t.Fatalf("a body needing more than the whole budget: %d %s, want 413", r.status, r.raw)
		}
		if held := h2.srv.limits.reading.Load(); held != 0 {
			t.Fatalf("%d bytes held after the requests ended", held)
		}
	})
}

// A response's budget counts messages as they are written: a payload of
// control bytes takes six bytes a byte in JSON. Receives (of a group, of
// ungrouped messages, of deferred ones) and listings stop at the budget
// by that measure, and nothing is lost: the rest come next.
func TestResponseBudgetCountsEscapes(t *testing.T) {
	eachDB(t, func(t *testing.T, drv driver.Driver) {
		// Room for four of the largest messages' bytes, so that a deferred
		// receive may name four; one of these takes 6 MB as JSON.
		const budget = 13 << 19
		h := newHarness(t, drv, harnessOptions{maxResponseBytes: budget})
		tok, _ := h.token(RoleAdmin, 0, "acme")
		payload := strings.Repeat("\x01", 1_000_000)
		for i := range 4 {
			for _, key := range []string{"k", ""} {
				if _, err := h.client.Publish(context.Background(), shardq.Message{Tenant: "acme", Topic: "orders", PartitionKey: key,
					ID: fmt.Sprintf("%s%d", key, i), Payload: []byte(payload)}); err != nil {
					t.Fatal(err)
				}
			}
		}
		one := int(MessageBytes(shardq.StoredMessage{PartitionKey: "k", ID: "k0", Payload: []byte(payload)}))
		check := func(what string, r reply, n int) {
			t.Helper()
			if n != 1 || len(r.raw) > one+responseBytesPerMessage {
				t.Fatalf("%s: %d messages, %d bytes: want one message of %d bytes (the budget, %d, holds none)", what, n, len(r.raw), one, budget)
			}
		}
		var deferred []any
		for _, mode := range []string{`"key":"k"`, `"ungrouped":true`} {
			for i := range 4 {
				r := h.call("POST", groupPath+"/receive", tok, `{`+mode+`,"max":4}`)
				ms := received(r.body)
				check(mode, r, len(ms))
				if i < 3 && r.body["truncated"] != true {
					t.Fatalf("%s: receive %d not truncated", mode, i)
				}
				if mode == `"ungrouped":true` {
					deferred = append(deferred, ms[0]["offset"])
					h.must(200, "POST", groupPath+"/defer", tok, map[string]any{"receipts": receipts(ms)})
				} else {
					h.must(200, "POST", groupPath+"/ack", tok, map[string]any{"receipts": receipts(ms)})
				}
			}
		}
		for len(deferred) > 0 {
			r := h.call("POST", groupPath+"/deferred/receive", tok, map[string]any{"offsets": deferred})
			ms := received(r.body)
			check("deferred", r, len(ms))
			deferred = deferred[1:]
			h.must(200, "POST", groupPath+"/ack", tok, map[string]any{"receipts": receipts(ms)})
		}
		r := h.call("GET", topicPath+"/messages?limit=10", tok, nil)
		check("browse", r, len(items(r.body)))
	})
}

// A visibility change cannot hold a message past 12 h from the receive
// that handed it out, however often it is repeated (SQS's cap, and the
// receipt key's rotation grace): a change past it is refused before
// anything changes; one within it goes on.
func TestVisibilityHeldAtMostMaxHold(t *testing.T) {
	eachDB(t, func(t *testing.T, drv driver.Driver) {
		h := newHarness(t, drv, harnessOptions{})
		tok, _ := h.token(RoleAdmin, 0, "acme")
		for _, key := range []string{"k", ""} {
			h.must(200, "POST", topicPath+"/messages", tok, map[string]any{"key": key, "id": "m" + key})
		}
		for _, mode := range []string{`"key":"k"`, `"ungrouped":true`} {
			ms := received(h.must(200, "POST", groupPath+"/receive", tok, `{`+mode+`,"visibility":43200}`))
			h.clock.Add(time.Second) // MySQL counts an UPDATE that changes nothing as no row
			change := func(vis float64) reply {
				return h.call("POST", groupPath+"/visibility", tok, map[string]any{"receipts": receipts(ms), "visibility": vis})
			}
			if r := change(43200 - 1); r.status != 200 {
				t.Fatalf("%s: 12 h from the receive: %d %s", mode, r.status, r.raw)
			}
			h.clock.Add(time.Hour)
			if r := change(43200); r.status != 400 || r.body["field"] != "receipts[0]" {
				t.Fatalf("%s: 12 h more an hour after the receive: %d %s", mode, r.status, r.raw)
			}
			if r := change(11*3600 - 1); r.status != 200 {
				t.Fatalf("%s: up to 12 h from the receive: %d %s", mode, r.status, r.raw)
			}
			h.clock.Add(11 * time.Hour)
			if r := change(1); r.status != 400 {
				t.Fatalf("%s: a second past 12 h from the receive: %d %s", mode, r.status, r.raw)
			}
			h.must(200, "POST", groupPath+"/ack", tok, map[string]any{"receipts": receipts(ms)})
		}
		// A session id is held the same way from the receive that opened
		// it; receives in the session still renew it.
		held := h.must(200, "POST", groupPath+"/receive", tok, `{"key":"s","hold":true,"visibility":43200}`)
		id := held["session"].(map[string]any)["id"].(string)
		h.clock.Add(time.Hour)
		if r := h.call("POST", groupPath+"/visibility", tok, map[string]any{"receipts": []string{id}, "visibility": 43200}); r.status != 400 {
			t.Fatalf("a session id held 12 h more an hour after its receive: %d %s", r.status, r.raw)
		}
		h.must(200, "POST", groupPath+"/receive", tok, map[string]any{"session": id, "visibility": 43200})
	})
}

// Issue 58: a token id chosen by someone else opened another tenant. evil
// stores acme's (public) token id with a secret of its own; the store
// refuses it. A row stored before ids were checked across tenants (put
// in here by hand) still signs in to evil, but its session opens neither
// acme's pages nor acme's API (export: 403), because a session binds its
// token's hash, not only its id. acme's own session, and one of a token
// of two tenants, open each of theirs; a session naming only an id opens
// nothing.
func TestSessionBindsItsToken(t *testing.T) {
	eachDB(t, func(t *testing.T, drv driver.Driver) {
		ctx := context.Background()
		h := newHarness(t, drv, harnessOptions{})
		acmeTok, acmeID := h.token(RoleAdmin, 0, "acme")
		h.must(200, "POST", topicPath+"/messages", acmeTok, `{"key":"k","id":"acme-private","payload":"acme's"}`)

		secret := make([]byte, 32)
		rand.Read(secret)
		evilTok := tokenPrefix + acmeID + "." + b64(secret)
		_, err := StoreToken(ctx, drv, evilTok, []string{"evil"}, []string{RoleAdmin}, 0, h.clock.Now())
		if !errors.Is(err, driver.ErrTokenIDTaken) || !strings.Contains(err.Error(), acmeID) {
			t.Fatalf("storing acme's id with another secret for evil: %v; want ErrTokenIDTaken naming the id", err)
		}
		if _, err := drv.TokenIn(ctx, "evil", acmeID); !errors.Is(err, driver.ErrNoToken) {
			t.Fatalf("the refused token has a row in evil: %v", err)
		}
		sum := sha256.Sum256(secret)
		if _, err := drv.DB().ExecContext(ctx, "INSERT INTO queue_api_tokens (tenant, token_id, secret_hash, role, created_at) "+
			"SELECT 'evil', token_id, ?, role, created_at FROM queue_api_tokens WHERE tenant = 'acme' AND token_id = ?", sum[:], acmeID); err != nil {
			t.Fatal(err)
		}

		cl := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		signIn := func(tenant, tok string) *http.Cookie {
			t.Helper()
			req, _ := http.NewRequest("POST", h.http.URL+"/login", strings.NewReader(url.Values{"tenant": {tenant}, "token": {tok}}.Encode()))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			req.Header.Set("Sec-Fetch-Site", "same-origin")
			res, err := cl.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			for _, c := range res.Cookies() {
				if c.Name == sessionCookie && res.Header.Get("Location") == "/ui/"+tenant {
					return c
				}
			}
			t.Fatalf("sign-in to %s: %d to %q, no session", tenant, res.StatusCode, res.Header.Get("Location"))
			return nil
		}
		// get reads path with the session as the dashboard's own page or
		// script does, and returns the status, Location and body.
		get := func(path string, c *http.Cookie) (int, string, string) {
			t.Helper()
			req, _ := http.NewRequest("GET", h.http.URL+path, nil)
			req.Header.Set("Sec-Fetch-Site", "same-origin")
			req.AddCookie(c)
			res, err := cl.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			b, _ := io.ReadAll(res.Body)
			return res.StatusCode, res.Header.Get("Location"), string(b)
		}
		opens := func(who string, c *http.Cookie, tenant string) {
			t.Helper()
			if code, _, body := get("/ui/"+tenant, c); code != 200 || !strings.Contains(body, tenant) {
				t.Fatalf("%s's session on /ui/%s: %d; want the page", who, tenant, code)
			}
			if code, _, _ := get("/v1/tenants/"+tenant+"/export", c); code != 200 {
				t.Fatalf("%s's session on %s's export: %d; want 200", who, tenant, code)
			}
		}
		refused := func(who string, c *http.Cookie, tenant string, apiStatus int) {
			t.Helper()
			for _, page := range []string{"/ui/" + tenant, "/ui/" + tenant + "/topics/orders"} {
				if code, loc, body := get(page, c); code != http.StatusSeeOther || loc != "/?error=session" || strings.Contains(body, "acme-private") {
					t.Fatalf("%s's session on %s: %d to %q; want the sign-in", who, page, code, loc)
				}
			}
			for _, api := range []string{"/export", "/topics", "/topics/orders/messages"} {
				if code, _, body := get("/v1/tenants/"+tenant+api, c); code != apiStatus || strings.Contains(body, "acme-private") {
					t.Fatalf("%s's session on %s's %s: %d %s; want %d", who, tenant, api, code, body, apiStatus)
				}
			}
		}

		evil := signIn("evil", evilTok)
		opens("evil", evil, "evil")
		refused("evil", evil, "acme", http.StatusForbidden)
		if r := h.call("GET", "/v1/tenants/acme/export", evilTok, nil); r.status != http.StatusUnauthorized {
			t.Fatalf("evil's token on acme's export: %d; want 401", r.status)
		}

		acme := signIn("acme", acmeTok)
		opens("acme", acme, "acme")
		if _, _, body := get("/v1/tenants/acme/export", acme); !strings.Contains(body, "acme-private") {
			t.Fatalf("acme's export lacks its message:\n%s", body)
		}
		refused("acme", acme, "evil", http.StatusForbidden) // evil's row of the id is another token's

		twoTok, _ := h.token(RoleAdmin, 0, "acme", "globex")
		two := signIn("acme", twoTok)
		opens("a token of two tenants", two, "acme")
		opens("a token of two tenants", two, "globex")

		// A session of the former form names only the id.
		idOnly, err := signSession(ctx, h.srv.keys, session{ID: acmeID, Expires: h.clock.Now().Add(time.Hour).Unix()})
		if err != nil {
			t.Fatal(err)
		}
		refused("an id-only", &http.Cookie{Name: sessionCookie, Value: idOnly}, "acme", http.StatusUnauthorized)
	})
}
