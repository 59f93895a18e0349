// SPDX-License-Identifier: Apache-2.0

package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/testdb"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"))
}

// clock is the injected time of a test: receipts' visibility, retries
// and token expiry all read it.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// harness is one server over a real database, reached over HTTP.
type harness struct {
	t      *testing.T
	drv    driver.Driver
	client *shardq.Client
	srv    *Server
	http   *httptest.Server
	clock  *clock
}

type harnessOptions struct {
	tenants     []string
	maxAttempts int
	rate        float64
	burst       int
	maxBody     int64
	// authFailRate is high unless a test sets it: most tests send many
	// unauthenticated requests on purpose.
	authFailRate      float64
	maxResponseBytes  int64
	maxReceives       int
	maxPerToken       int
	metricsAuth       bool
	maxInflightBody   int64
	maxLargeBytes     int64
	maxLargeTransfers int
	// Per token, per tenant; the least bytes per window of a transfer.
	maxTransfersPerToken  int
	maxTransfersPerTenant int
	minTransferRate       int64
	transferRateWindow    time.Duration
	tokenCacheTTL         time.Duration
}

func newHarness(t *testing.T, drv driver.Driver, o harnessOptions) *harness {
	t.Helper()
	clk := &clock{t: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	c, err := shardq.NewClient(drv, &shardq.Config{Clock: clk.Now, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	rc, err := c.Receipts(&shardq.ReceiptOptions{MessageBytes: MessageBytes, Name: "test", MaxAttempts: o.maxAttempts, PollInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if o.authFailRate == 0 {
		o.authFailRate = 1e6
	}
	srv, err := New(Config{Client: c, Driver: drv, Receipts: rc, Tenants: o.tenants, Rate: o.rate, Burst: o.burst, AuthFailRate: o.authFailRate,
		MaxBodyBytes: o.maxBody, MaxInflightBodyBytes: o.maxInflightBody, MaxResponseBytes: o.maxResponseBytes, MaxReceives: o.maxReceives, MaxReceivesPerToken: o.maxPerToken,
		MaxLargeBytes: o.maxLargeBytes, MaxLargeTransfers: o.maxLargeTransfers, MaxLargeTransfersPerToken: o.maxTransfersPerToken,
		MaxLargeTransfersPerTenant: o.maxTransfersPerTenant, MinTransferRate: o.minTransferRate, TransferRateWindow: o.transferRateWindow, TokenCacheTTL: o.tokenCacheTTL, Metrics: testMetrics, MetricsAuth: o.metricsAuth, Logger: log, Clock: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(func() { srv.Drain(); hs.CloseClientConnections(); hs.Close() }) // a failed test may leave a request hanging
	return &harness{t: t, drv: drv, client: c, srv: srv, http: hs, clock: clk}
}

// eachDB runs fn on a migrated SQLite file and a migrated MariaDB
// database.
func eachDB(t *testing.T, fn func(t *testing.T, drv driver.Driver)) {
	t.Run("sqlite", func(t *testing.T) { fn(t, testdb.Migrated(t, testdb.SQLite(t))) })
	t.Run("mariadb", func(t *testing.T) { fn(t, testdb.Migrated(t, testdb.MySQL(t))) })
}

// token makes a token of role in tenants, valid for d (0: forever).
func (h *harness) token(role string, d time.Duration, tenants ...string) (tok, id string) {
	h.t.Helper()
	tok, id, err := NewToken(context.Background(), h.drv, tenants, []string{role}, d, h.clock.Now())
	if err != nil {
		h.t.Fatal(err)
	}
	return tok, id
}

// reply is a decoded answer.
type reply struct {
	status int
	header http.Header
	body   map[string]any
	raw    string
}

// call sends body (a string, or nil) with tok and decodes the answer,
// checking that every error is a problem document.
func (h *harness) call(method, path, tok string, body any) reply {
	h.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			h.t.Fatal(err)
		}
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, h.http.URL+path, rd)
	if err != nil {
		h.t.Fatal(err)
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	res, err := h.http.Client().Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	if err != nil {
		h.t.Fatal(err)
	}
	out := reply{status: res.StatusCode, header: res.Header, raw: string(raw)}
	ct := res.Header.Get("Content-Type")
	if res.StatusCode >= 400 && ct != "application/problem+json" {
		h.t.Fatalf("%s %s: %d with Content-Type %q, want application/problem+json: %s", method, path, res.StatusCode, ct, raw)
	}
	if strings.Contains(ct, "json") {
		if err := json.Unmarshal(raw, &out.body); err != nil {
			h.t.Fatalf("%s %s: answer is not a JSON object: %v: %s", method, path, err, raw)
		}
		checkAnswer(h.t, req, res.StatusCode, raw)
	}
	return out
}

// must calls and requires status want.
func (h *harness) must(want int, method, path, tok string, body any) map[string]any {
	h.t.Helper()
	r := h.call(method, path, tok, body)
	if r.status != want {
		h.t.Fatalf("%s %s: %d, want %d: %s", method, path, r.status, want, r.raw)
	}
	return r.body
}

// received is a receive's messages.
func received(b map[string]any) []map[string]any {
	var out []map[string]any
	for _, m := range b["messages"].([]any) {
		out = append(out, m.(map[string]any))
	}
	return out
}

func ids(ms []map[string]any) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m["id"].(string))
	}
	return out
}

func receipts(ms []map[string]any) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m["receipt"].(string))
	}
	return out
}

func items(b map[string]any) []map[string]any {
	var out []map[string]any
	for _, m := range b["items"].([]any) {
		out = append(out, m.(map[string]any))
	}
	return out
}

const (
	topicPath = "/v1/tenants/acme/topics/orders"
	groupPath = topicPath + "/groups/billing"
)

func TestPublishReceiveAck(t *testing.T) {
	eachDB(t, func(t *testing.T, drv driver.Driver) {
		h := newHarness(t, drv, harnessOptions{})
		pub, _ := h.token(RolePublish, 0, "acme")
		con, _ := h.token(RoleConsume, 0, "acme")

		one := h.must(200, "POST", topicPath+"/messages", pub, `{"key":"k","id":"m1","payload":"one","headers":{"h":"v"}}`)
		if res := one["results"].([]any)[0].(map[string]any); res["offset"] != 1.0 || res["duplicate"] != false || res["id"] != "m1" {
			t.Fatalf("publish one: %v", one)
		}
		many := h.must(200, "POST", topicPath+"/messages", pub, `{"messages":[
			{"key":"k","id":"m2","payload":"two"},
			{"key":"k","id":"m1","payload":"one"},
			{"key":"k2","id":"x","payload_base64":"/w=="}]}`)
		var dup []bool
		for _, r := range many["results"].([]any) {
			dup = append(dup, r.(map[string]any)["duplicate"].(bool))
		}
		if !slices.Equal(dup, []bool{false, true, false}) {
			t.Fatalf("duplicate flags %v, want [false true false] (idempotent by id): %v", dup, many)
		}

		got := received(h.must(200, "POST", groupPath+"/receive", con, `{"key":"k","max":10}`))
		if !slices.Equal(ids(got), []string{"m1", "m2"}) || got[0]["payload"] != "one" || got[0]["headers"].(map[string]any)["h"] != "v" {
			t.Fatalf("receive k: %v", got)
		}
		// In flight: no other receive sees group k, not even next_group.
		if again := received(h.must(200, "POST", groupPath+"/receive", con, `{"key":"k"}`)); len(again) != 0 {
			t.Fatalf("a second receive got group k while it is in flight: %v", again)
		}
		next := received(h.must(200, "POST", groupPath+"/receive", con, `{"next_group":true,"max":10}`))
		if !slices.Equal(ids(next), []string{"x"}) || next[0]["payload_base64"] != "/w==" || next[0]["payload"] != nil {
			t.Fatalf("next_group while k is in flight: %v, want x (bytes as payload_base64)", next)
		}
		// Cumulative: the first ack settles m1 and keeps the group.
		h.must(200, "POST", groupPath+"/ack", con, map[string]any{"receipts": receipts(got[:1])})
		if again := received(h.must(200, "POST", groupPath+"/receive", con, `{"key":"k"}`)); len(again) != 0 {
			t.Fatalf("group k was given back before its last receipt was settled: %v", again)
		}
		if b := h.must(200, "POST", groupPath+"/ack", con, map[string]any{"receipts": append(receipts(got[1:]), receipts(next)...)}); b["settled"] != 2.0 {
			t.Fatalf("ack: %v", b)
		}
		for _, body := range []string{`{"key":"k"}`, `{"key":"k2"}`, `{"next_group":true}`} {
			if again := received(h.must(200, "POST", groupPath+"/receive", con, body)); len(again) != 0 {
				t.Fatalf("receive %s after every ack: %v", body, again)
			}
		}
	})
}

// TestReceiveAcksEarlierReceipts: a receive's "ack" settles receipts of
// earlier receives before it receives, so that a consumer's loop is one
// request a turn; the message group it releases can be received at once.
func TestReceiveAcksEarlierReceipts(t *testing.T) {
	eachDB(t, func(t *testing.T, drv driver.Driver) {
		h := newHarness(t, drv, harnessOptions{})
		tok, _ := h.token(RoleAdmin, 0, "acme")
		h.must(200, "POST", topicPath+"/messages", tok, `{"messages":[
			{"key":"a","id":"a1","payload":"x"}, {"key":"a","id":"a2","payload":"x"},
			{"key":"b","id":"b1","payload":"x"}]}`)
		first := h.must(200, "POST", groupPath+"/receive", tok, `{"next_group":true,"max":1}`)
		if got := received(first); !slices.Equal(ids(got), []string{"a1"}) || first["acked"] != nil {
			t.Fatalf("first receive: %v", first)
		}
		// Acking a1 keeps group a; the same request receives a2 from it.
		second := h.must(200, "POST", groupPath+"/receive", tok, map[string]any{"key": "a", "ack": receipts(received(first))})
		if got := received(second); !slices.Equal(ids(got), []string{"a2"}) || second["acked"] != 1.0 || second["stale"] != nil {
			t.Fatalf("receive with the ack of a1: %v", second)
		}
		third := h.must(200, "POST", groupPath+"/receive", tok, map[string]any{"next_group": true, "max": 10, "ack": receipts(received(second))})
		if got := received(third); !slices.Equal(ids(got), []string{"b1"}) || third["acked"] != 1.0 {
			t.Fatalf("receive with the ack of a2: %v", third)
		}
		// A receipt acked already is stale: the receive goes on and says so.
		again := h.must(200, "POST", groupPath+"/receive", tok, map[string]any{"next_group": true, "ack": append(receipts(received(third)), receipts(received(second))...)})
		if got := received(again); len(got) != 0 || again["acked"] != 1.0 || fmt.Sprint(again["stale"]) != "[1]" {
			t.Fatalf("receive with a fresh and a settled receipt: %v", again)
		}
		// A request refused for its receive part settles none of its acks.
		h.must(200, "POST", topicPath+"/messages", tok, `{"key":"e","id":"e1","payload":"x"}`)
		held := receipts(received(h.must(200, "POST", groupPath+"/receive", tok, `{"key":"e"}`)))
		for _, body := range []map[string]any{{"max": shardq.MaxReceiveMessages + 1, "ack": held}, {"key": "e", "next_group": true, "ack": held}, {"visibility": 0.5, "ack": held}} {
			if r := h.call("POST", groupPath+"/receive", tok, body); r.status != 400 {
				t.Fatalf("receive %v: %d %s, want 400", body, r.status, r.raw)
			}
		}
		if b := h.must(200, "POST", groupPath+"/ack", tok, map[string]any{"receipts": held}); b["settled"] != 1.0 {
			t.Fatalf("the receipt after the refused requests: %v, want it still unsettled", b)
		}
		// A malformed receipt settles nothing and receives nothing.
		h.must(200, "POST", topicPath+"/messages", tok, `{"key":"c","id":"c1","payload":"x"}`)
		bad := h.call("POST", groupPath+"/receive", tok, `{"next_group":true,"ack":["nonsense"]}`)
		if bad.status != 400 || !strings.Contains(bad.raw, "ack[0]") {
			t.Fatalf("malformed ack receipt: %d %s", bad.status, bad.raw)
		}
		if got := received(h.must(200, "POST", groupPath+"/receive", tok, `{"next_group":true}`)); !slices.Equal(ids(got), []string{"c1"}) {
			t.Fatalf("after the refused request: %v, want c1 (nothing was received by it)", got)
		}
	})
}

// TestReceiveGoesOnWithTheGroup: a next_group receive whose ack settles
// the whole of a group's receive goes on with that group while it has
// more, ahead of an older group; the turn before's receipts go stale.
func TestReceiveGoesOnWithTheGroup(t *testing.T) {
	eachDB(t, func(t *testing.T, drv driver.Driver) {
		h := newHarness(t, drv, harnessOptions{})
		tok, _ := h.token(RoleAdmin, 0, "acme")
		h.must(200, "POST", topicPath+"/messages", tok, `{"messages":[
			{"key":"a","id":"a1","payload":"x"}, {"key":"b","id":"b1","payload":"x"}, {"key":"a","id":"a2","payload":"x"}]}`)
		first := h.must(200, "POST", groupPath+"/receive", tok, `{"next_group":true}`)
		second := h.must(200, "POST", groupPath+"/receive", tok, map[string]any{"next_group": true, "ack": receipts(received(first))})
		if got := received(second); !slices.Equal(ids(got), []string{"a2"}) || second["acked"] != 1.0 {
			t.Fatalf("receive with the ack of a1: %v, want a2 (group a goes on)", second)
		}
		if r := h.call("POST", groupPath+"/ack", tok, map[string]any{"receipts": receipts(received(first))}); r.status != 409 {
			t.Fatalf("ack of the turn before: %d %s, want 409 (stale)", r.status, r.raw)
		}
		third := h.must(200, "POST", groupPath+"/receive", tok, map[string]any{"next_group": true, "ack": receipts(received(second))})
		if got := received(third); !slices.Equal(ids(got), []string{"b1"}) {
			t.Fatalf("receive with the ack of a2: %v, want b1 (a has no more)", third)
		}
	})
}

func TestVisibilityTimeoutAndStaleReceipt(t *testing.T) {
	eachDB(t, func(t *testing.T, drv driver.Driver) {
		h := newHarness(t, drv, harnessOptions{})
		tok, _ := h.token(RoleAdmin, 0, "acme")
		h.must(200, "POST", topicPath+"/messages", tok, `{"key":"k","id":"m1","payload":"one"}`)
		first := received(h.must(200, "POST", groupPath+"/receive", tok, `{"key":"k","visibility":5}`))
		if len(first) != 1 {
			t.Fatalf("receive: %v", first)
		}
		h.clock.Add(4 * time.Second)
		if got := received(h.must(200, "POST", groupPath+"/receive", tok, `{"key":"k"}`)); len(got) != 0 {
			t.Fatalf("delivered again before its visibility timeout: %v", got)
		}
		h.clock.Add(2 * time.Second)
		second := received(h.must(200, "POST", groupPath+"/receive", tok, `{"key":"k","visibility":5}`))
		if !slices.Equal(ids(second), []string{"m1"}) || second[0]["receipt"] == first[0]["receipt"] {
			t.Fatalf("after the visibility timeout: %v, want m1 with a new receipt", second)
		}
		if second[0]["attempt"] != 1.0 {
			t.Fatalf("attempt %v after a timed-out receive, want 1 (a timeout is not a failed attempt)", second[0]["attempt"])
		}
		r := h.call("POST", groupPath+"/ack", tok, map[string]any{"receipts": receipts(first)})
		if r.status != 409 || r.body["type"] != typeStale || r.body["settled"] != 0.0 || fmt.Sprint(r.body["stale"]) != "[0]" {
			t.Fatalf("ack by a stale receipt: %d %v, want 409 stale [0]", r.status, r.body)
		}
		if r := h.call("POST", groupPath+"/nack", tok, map[string]any{"receipts": receipts(first)}); r.status != 409 {
			t.Fatalf("nack by a stale receipt: %d %v, want 409", r.status, r.body)
		}
		// The stale receipt changed nothing: the new one still settles.
		h.must(200, "POST", groupPath+"/ack", tok, map[string]any{"receipts": receipts(second)})
		off := items(h.must(200, "GET", topicPath+"/offsets?group=billing", tok, nil))
		if len(off) != 1 || off[0]["committed_offset"] != 1.0 || off[0]["lag"] != 0.0 {
			t.Fatalf("offsets after the ack: %v", off)
		}
		if r := h.call("POST", groupPath+"/ack", tok, map[string]any{"receipts": receipts(second)}); r.status != 409 {
			t.Fatalf("a second ack of one receipt: %d, want 409", r.status)
		}
	})
}

func TestNackRetryDeadLetterRequeue(t *testing.T) {
	eachDB(t, func(t *testing.T, drv driver.Driver) {
		h := newHarness(t, drv, harnessOptions{maxAttempts: 2})
		tok, _ := h.token(RoleAdmin, 0, "acme")
		h.must(200, "POST", topicPath+"/messages", tok, `{"key":"k","id":"m1","payload":"one"}`)
		got := received(h.must(200, "POST", groupPath+"/receive", tok, `{"key":"k"}`))
		h.must(200, "POST", groupPath+"/nack", tok, map[string]any{"receipts": receipts(got), "retry_after": 10, "reason": "db down"})
		if again := received(h.must(200, "POST", groupPath+"/receive", tok, `{"key":"k"}`)); len(again) != 0 {
			t.Fatalf("redelivered before retry_after: %v", again)
		}
		h.clock.Add(11 * time.Second)
		got = received(h.must(200, "POST", groupPath+"/receive", tok, `{"key":"k"}`))
		if len(got) != 1 || got[0]["attempt"] != 2.0 {
			t.Fatalf("after retry_after: %v, want m1 at attempt 2", got)
		}
		h.must(200, "POST", groupPath+"/nack", tok, map[string]any{"receipts": receipts(got), "reason": "still down"})
		h.clock.Add(time.Minute)
		if again := received(h.must(200, "POST", groupPath+"/receive", tok, `{"key":"k"}`)); len(again) != 0 {
			t.Fatalf("delivered after its last attempt: %v", again)
		}
		dead := items(h.must(200, "GET", topicPath+"/dead-letters", tok, nil))
		if len(dead) != 1 || dead[0]["id"] != "m1" || dead[0]["headers"].(map[string]any)["dlq_last_error"] != "still down" {
			t.Fatalf("dead letters: %v", dead)
		}
		if r := h.call("POST", topicPath+"/dead-letters/requeue", tok, `{"key":"k","id":"nope"}`); r.status != 404 {
			t.Fatalf("requeue of a missing dead letter: %d", r.status)
		}
		h.must(200, "POST", topicPath+"/dead-letters/requeue", tok, `{"key":"k","id":"m1"}`)
		got = received(h.must(200, "POST", groupPath+"/receive", tok, `{"key":"k"}`))
		if !slices.Equal(ids(got), []string{"m1"}) || got[0]["payload"] != "one" {
			t.Fatalf("after requeue: %v", got)
		}
		h.must(200, "POST", groupPath+"/ack", tok, map[string]any{"receipts": receipts(got)})
		if dead := items(h.must(200, "GET", topicPath+"/dead-letters", tok, nil)); len(dead) != 0 {
			t.Fatalf("dead letters after requeue: %v", dead)
		}
	})
}

func TestUngroupedCompetingReceives(t *testing.T) {
	eachDB(t, func(t *testing.T, drv driver.Driver) {
		h := newHarness(t, drv, harnessOptions{})
		tok, _ := h.token(RoleAdmin, 0, "acme")
		h.must(200, "POST", topicPath+"/messages", tok, `{"messages":[{"id":"a","payload":"1"},{"id":"b","payload":"2"},{"id":"c","payload":"3"}]}`)
		one := received(h.must(200, "POST", groupPath+"/receive", tok, `{"max":2,"visibility":5}`))
		two := received(h.must(200, "POST", groupPath+"/receive", tok, `{"max":2}`))
		all := slices.Sorted(slices.Values(append(ids(one), ids(two)...)))
		if len(one) != 2 || !slices.Equal(all, []string{"a", "b", "c"}) {
			t.Fatalf("two competing receives got %v and %v, want a, b, c once", ids(one), ids(two))
		}
		h.must(200, "POST", groupPath+"/ack", tok, map[string]any{"receipts": receipts(two)})
		h.must(200, "POST", groupPath+"/ack", tok, map[string]any{"receipts": receipts(one[:1])})
		// one[1] times out and is delivered again; its old receipt is stale.
		h.clock.Add(6 * time.Second)
		again := received(h.must(200, "POST", groupPath+"/receive", tok, `{"max":5}`))
		if !slices.Equal(ids(again), ids(one[1:])) {
			t.Fatalf("after the visibility timeout: %v, want %v", ids(again), ids(one[1:]))
		}
		if r := h.call("POST", groupPath+"/ack", tok, map[string]any{"receipts": receipts(one[1:])}); r.status != 409 {
			t.Fatalf("stale claim receipt: %d, want 409", r.status)
		}
		h.must(200, "POST", groupPath+"/ack", tok, map[string]any{"receipts": receipts(again)})
		if got := received(h.must(200, "POST", groupPath+"/receive", tok, `{"max":5}`)); len(got) != 0 {
			t.Fatalf("after every ack: %v", got)
		}
	})
}

func TestWaitingReceive(t *testing.T) {
	eachDB(t, func(t *testing.T, drv driver.Driver) {
		h := newHarness(t, drv, harnessOptions{})
		tok, _ := h.token(RoleAdmin, 0, "acme")
		done := make(chan reply, 1)
		go func() { done <- h.call("POST", groupPath+"/receive", tok, `{"key":"k","wait":20}`) }()
		// The long poll sees a message published while it waits.
		for {
			h.must(200, "POST", topicPath+"/messages", tok, `{"key":"k","id":"late","payload":"x"}`)
			select {
			case r := <-done:
				if r.status != 200 || !slices.Equal(ids(received(r.body)), []string{"late"}) {
					t.Fatalf("waiting receive: %d %v", r.status, r.body)
				}
			case <-time.After(50 * time.Millisecond):
				continue
			}
			break
		}
		// Drain answers a waiting receive at once, with nothing.
		go func() { done <- h.call("POST", groupPath+"/receive", tok, `{"key":"other","wait":20}`) }()
		h.waitReceives(1) // until it waits; a late start would still end at once
		h.srv.Drain()
		if r := <-done; r.status != 200 || len(received(r.body)) != 0 {
			t.Fatalf("receive during drain: %d %v", r.status, r.body)
		}
	})
}

func TestAdminEndpoints(t *testing.T) {
	eachDB(t, func(t *testing.T, drv driver.Driver) {
		h := newHarness(t, drv, harnessOptions{})
		tok, _ := h.token(RoleAdmin, 0, "acme")
		ctx := context.Background()
		h.must(200, "POST", topicPath+"/messages", tok, `{"messages":[{"key":"k","id":"m1","payload":"1"},{"key":"k","id":"m2","payload":"2"},{"key":"k","id":"m3","payload":"3"},{"key":"j","id":"n1","payload":"4"}]}`)
		got := received(h.must(200, "POST", groupPath+"/receive", tok, `{"key":"k","max":1,"visibility":60}`))
		h.must(200, "POST", groupPath+"/ack", tok, map[string]any{"receipts": receipts(got)})
		held := received(h.must(200, "POST", groupPath+"/receive", tok, `{"key":"k","max":1,"visibility":60}`))
		if err := drv.Heartbeat(ctx, driver.GroupScope{Tenants: []string{"acme"}, Topic: "orders", ConsumerGroup: "billing"}, "worker-1#a", h.clock.Now()); err != nil {
			t.Fatal(err)
		}
		half := &driver.HalfMessage{InsertMessage: driver.InsertMessage{Tenant: "acme", Topic: "orders", PartitionKey: "k", ID: "h1", Payload: []byte("h"),
			CreatedAt: h.clock.Now()}, ProducerGroup: "pg", NextCheckAt: h.clock.Now().Add(time.Minute)}
		if err := drv.InsertHalf(ctx, half); err != nil {
			t.Fatal(err)
		}

		if ts := items(h.must(200, "GET", "/v1/tenants/acme/topics", tok, nil)); len(ts) != 1 || ts[0]["topic"] != "orders" || ts[0]["partitions"] != 2.0 {
			t.Fatalf("topics: %v", ts)
		}
		off := items(h.must(200, "GET", topicPath+"/offsets?group=billing", tok, nil))
		lag := map[string]any{}
		for _, o := range off {
			lag[o["key"].(string)] = o["lag"]
		}
		if lag["k"] != 2.0 || lag["j"] != 1.0 {
			t.Fatalf("offsets: %v, want lag k 2, j 1", off)
		}
		if gs := items(h.must(200, "GET", topicPath+"/groups", tok, nil)); len(gs) != 1 || gs[0]["group"] != "billing" || gs[0]["lag"] != 3.0 || gs[0]["paused"] != false {
			t.Fatalf("groups: %v", gs)
		}
		if ls := items(h.must(200, "GET", "/v1/tenants/acme/leases", tok, nil)); len(ls) != 1 || ls[0]["key"] != "k" || !strings.HasPrefix(ls[0]["owner"].(string), "test#") {
			t.Fatalf("leases: %v (the receive in flight holds k)", ls)
		}
		if ms := items(h.must(200, "GET", "/v1/tenants/acme/subscribers", tok, nil)); len(ms) != 1 || ms[0]["id"] != "worker-1#a" {
			t.Fatalf("subscribers: %v", ms)
		}
		if hs := items(h.must(200, "GET", "/v1/tenants/acme/half-messages", tok, nil)); len(hs) != 1 || hs[0]["id"] != "h1" || hs[0]["producer_group"] != "pg" {
			t.Fatalf("half messages: %v", hs)
		}
		if ms := items(h.must(200, "GET", topicPath+"/messages?key=k&after=1&limit=1", tok, nil)); len(ms) != 1 || ms[0]["id"] != "m2" {
			t.Fatalf("browse k after 1: %v", ms)
		}
		if ms := items(h.must(200, "GET", topicPath+"/messages", tok, nil)); len(ms) != 4 {
			t.Fatalf("browse all: %v", ms)
		}

		h.must(200, "DELETE", topicPath+"/messages?key=k&id=m3", tok, nil)
		if r := h.call("DELETE", topicPath+"/messages?key=k&id=m3", tok, nil); r.status != 404 {
			t.Fatalf("second delete: %d", r.status)
		}
		if r := h.call("DELETE", topicPath+"/messages?key=k", tok, nil); r.status != 400 || r.body["field"] != "id" {
			t.Fatalf("delete without id: %d %v", r.status, r.body)
		}

		// Reset: a preview changes nothing; execute moves the cursor.
		// The lease held by the receive in flight blocks it without force.
		h.must(200, "POST", groupPath+"/ack", tok, map[string]any{"receipts": receipts(held)})
		prev := h.must(200, "POST", groupPath+"/reset", tok, `{"to":"earliest"}`)
		if prev["executed"] != false || len(prev["changes"].([]any)) != 2 {
			t.Fatalf("reset preview: %v", prev)
		}
		if o := items(h.must(200, "GET", topicPath+"/offsets?group=billing", tok, nil)); o[slices.IndexFunc(o, func(m map[string]any) bool { return m["key"] == "k" })]["committed_offset"] != 2.0 {
			t.Fatalf("a preview moved the cursor: %v", o)
		}
		if r := h.call("POST", groupPath+"/reset", tok, `{"to":"earliest","key":"k"}`); r.status != 400 || r.body["field"] != "key" {
			t.Fatalf("reset to earliest with a key: %d %v", r.status, r.body)
		}
		h.must(200, "POST", groupPath+"/reset", tok, `{"to":"offset","key":"k","offset":0,"execute":true}`)
		again := received(h.must(200, "POST", groupPath+"/receive", tok, `{"key":"k","max":10}`))
		if !slices.Equal(ids(again), []string{"m1", "m2"}) {
			t.Fatalf("after reset to earliest: %v, want m1 m2 again (m3 deleted)", ids(again))
		}
		h.must(200, "POST", groupPath+"/ack", tok, map[string]any{"receipts": receipts(again)})
		if r := h.call("POST", groupPath+"/reset", tok, `{"to":"sideways"}`); r.status != 400 || r.body["field"] != "to" {
			t.Fatalf("reset to sideways: %d %v", r.status, r.body)
		}

		h.must(200, "POST", groupPath+"/pause", tok, nil)
		if gs := items(h.must(200, "GET", topicPath+"/groups", tok, nil)); gs[0]["paused"] != true {
			t.Fatalf("groups after pause: %v", gs)
		}
		h.must(200, "POST", groupPath+"/resume", tok, nil)
		if gs := items(h.must(200, "GET", topicPath+"/groups", tok, nil)); gs[0]["paused"] != false {
			t.Fatalf("groups after resume: %v", gs)
		}
		if r := h.call("GET", "/v1/tenants/acme/topics?limit=0", tok, nil); r.status != 400 || r.body["field"] != "limit" {
			t.Fatalf("limit 0: %d %v", r.status, r.body)
		}
	})
}

func TestTokenScope(t *testing.T) {
	eachDB(t, func(t *testing.T, drv driver.Driver) {
		h := newHarness(t, drv, harnessOptions{})
		pub, _ := h.token(RolePublish, 0, "acme", "beta")
		con, _ := h.token(RoleConsume, 0, "acme")
		admin, adminID := h.token(RoleAdmin, 0, "acme")
		short, _ := h.token(RolePublish, time.Hour, "acme")
		msg := `{"key":"k","id":"m","payload":"x"}`

		h.must(200, "POST", "/v1/tenants/beta/topics/orders/messages", pub, msg)
		h.must(200, "POST", topicPath+"/messages", admin, msg) // admin may do everything in its tenants
		for _, c := range []struct {
			name, method, path, tok string
			want                    int
		}{
			{"wrong tenant", "POST", "/v1/tenants/gamma/topics/orders/messages", pub, 403},
			{"admin token, wrong tenant", "GET", "/v1/tenants/beta/topics", admin, 403},
			{"publish token receives", "POST", groupPath + "/receive", pub, 403},
			{"consume token publishes", "POST", topicPath + "/messages", con, 403},
			{"consume token reads admin", "GET", "/v1/tenants/acme/topics", con, 403},
			{"no token", "POST", topicPath + "/messages", "", 401},
			{"garbage token", "POST", topicPath + "/messages", "hunter2", 401},
			{"right id, wrong secret", "POST", topicPath + "/messages", admin[:len(admin)-4] + "AAAA", 401},
		} {
			r := h.call(c.method, c.path, c.tok, msg)
			if r.status != c.want {
				t.Errorf("%s: %d, want %d: %s", c.name, r.status, c.want, r.raw)
			}
			if c.want == 401 && !strings.HasPrefix(r.header.Get("WWW-Authenticate"), "Bearer") {
				t.Errorf("%s: 401 without WWW-Authenticate: %v", c.name, r.header)
			}
		}
		h.must(200, "POST", topicPath+"/messages", short, msg)
		h.clock.Add(time.Hour)
		if r := h.call("POST", topicPath+"/messages", short, msg); r.status != 401 || !strings.Contains(r.body["detail"].(string), "expired") {
			t.Errorf("expired token: %d %v", r.status, r.body)
		}
		if n, err := h.drv.RevokeToken(context.Background(), []string{"acme"}, adminID, h.clock.Now()); err != nil || n != 1 {
			t.Fatalf("revoke: %d %v", n, err)
		}
		if r := h.call("GET", "/v1/tenants/acme/topics", admin, nil); r.status != 401 || !strings.Contains(r.body["detail"].(string), "revoked") {
			t.Errorf("revoked token: %d %v", r.status, r.body)
		}
	})
}

// TestServedTenantsRefusedBeforeSQL: with SHARDQ_TENANTS set, another tenant
// is refused even when the database is gone, so no SQL ran for it.
func TestServedTenantsRefusedBeforeSQL(t *testing.T) {
	drv := testdb.Migrated(t, testdb.SQLite(t))
	h := newHarness(t, drv, harnessOptions{tenants: []string{"acme"}})
	tok, _ := h.token(RoleAdmin, 0, "acme")
	h.must(200, "GET", "/v1/tenants/acme/topics", tok, nil)
	if err := drv.Close(); err != nil {
		t.Fatal(err)
	}
	r := h.call("POST", "/v1/tenants/other/topics/orders/messages", tok, `{"key":"k","id":"m"}`)
	if r.status != 403 || !strings.Contains(r.body["detail"].(string), "SHARDQ_TENANTS") {
		t.Fatalf("tenant outside SHARDQ_TENANTS: %d %v, want 403 naming SHARDQ_TENANTS", r.status, r.body)
	}
	if r := h.call("GET", "/v1/tenants/acme/topics", tok, nil); r.status == 403 || r.status == 200 {
		t.Fatalf("served tenant on a closed database: %d, want a server error (the check reached SQL)", r.status)
	}
	if r := h.call("GET", "/v1/tenants/b%C3%BC/topics", tok, nil); r.status != 400 || r.body["field"] != "tenant" {
		t.Fatalf("invalid tenant: %d %v", r.status, r.body)
	}
}

func TestBadInputStoresNothing(t *testing.T) {
	eachDB(t, func(t *testing.T, drv driver.Driver) {
		h := newHarness(t, drv, harnessOptions{maxBody: 4096})
		tok, _ := h.token(RoleAdmin, 0, "acme")
		big := `{"key":"k","id":"big","payload":"` + strings.Repeat("x", 5000) + `"}`
		long := strings.Repeat("k", 300)
		for _, c := range []struct {
			name, method, path, body string
			status                   int
			field                    string
		}{
			{"malformed JSON", "POST", topicPath + "/messages", `{"key":`, 400, "body"},
			{"unknown field", "POST", topicPath + "/messages", `{"kee":"k","id":"m"}`, 400, "body"},
			{"two objects", "POST", topicPath + "/messages", `{"id":"a"} {"id":"b"}`, 400, "body"},
			{"not an object", "POST", topicPath + "/messages", `[1,2]`, 400, "body"},
			{"both payloads", "POST", topicPath + "/messages", `{"id":"m","payload":"a","payload_base64":"YQ=="}`, 400, "payload"},
			{"bad base64", "POST", topicPath + "/messages", `{"id":"m","payload_base64":"***"}`, 400, "payload_base64"},
			{"negative delay", "POST", topicPath + "/messages", `{"id":"m","delay":-1}`, 400, "delay"},
			{"message and list", "POST", topicPath + "/messages", `{"id":"m","messages":[{"id":"n"}]}`, 400, "body"},
			{"empty list", "POST", topicPath + "/messages", `{"messages":[]}`, 400, "messages"},
			{"key too long", "POST", topicPath + "/messages", `{"key":"` + long + `","id":"m"}`, 400, "key"},
			{"second message invalid", "POST", topicPath + "/messages", `{"messages":[{"key":"k","id":"ok"},{"key":"k","id":"x "}]}`, 400, "messages[1].id"},
			{"invalid topic", "POST", "/v1/tenants/acme/topics/or%C3%BC/messages", `{"id":"m"}`, 400, "topic"},
			{"oversize body", "POST", topicPath + "/messages", big, 413, ""},
			{"receive max", "POST", groupPath + "/receive", fmt.Sprintf(`{"max":%d}`, shardq.MaxReceiveMessages+1), 400, "max"},
			{"receive wait", "POST", groupPath + "/receive", `{"wait":60}`, 400, "wait"},
			{"receive visibility", "POST", groupPath + "/receive", `{"visibility":-5}`, 400, "visibility"},
			{"receive two modes", "POST", groupPath + "/receive", `{"ungrouped":true,"next_group":true}`, 400, "key"},
			{"receive too many acks", "POST", groupPath + "/receive", `{"ack":[` + strings.TrimSuffix(strings.Repeat(`"",`, shardq.MaxReceiveMessages+1), ",") + `]}`, 400, "ack"},
			{"receive forged ack", "POST", groupPath + "/receive", `{"ack":["r1.bm9wZQ"]}`, 400, "ack[0]"},
			{"invalid group", "POST", "/v1/tenants/acme/topics/orders/groups/b%C3%BC/receive", `{}`, 400, "group"},
			{"ack nothing", "POST", groupPath + "/ack", `{}`, 400, "receipts"},
			{"ack garbage", "POST", groupPath + "/ack", `{"receipts":["r1.bm9wZQ"]}`, 400, "receipts[0]"},
			{"ack repeated", "POST", groupPath + "/ack", `{"receipts":["r2.1.a.b","r2.1.c.d","r2.1.a.b"]}`, 400, "receipts[2]"},
			{"receive ack repeated", "POST", groupPath + "/receive", `{"ack":["r2.1.a.b","r2.1.a.b"]}`, 400, "ack[1]"},
			{"nack repeated", "POST", groupPath + "/nack", `{"receipts":["r2.1.a.b","r2.1.a.b"]}`, 400, "receipts[1]"},
			{"visibility repeated", "POST", groupPath + "/visibility", `{"receipts":["r2.1.a.b","r2.1.a.b"],"visibility":5}`, 400, "receipts[1]"},
			{"defer repeated", "POST", groupPath + "/defer", `{"receipts":["r2.1.a.b","r2.1.a.b"]}`, 400, "receipts[1]"},
			{"ack retry_after", "POST", groupPath + "/ack", `{"receipts":["x"],"retry_after":3}`, 400, "retry_after"},
			{"requeue nothing", "POST", topicPath + "/dead-letters/requeue", `{}`, 400, "id"},
			{"browse after", "GET", topicPath + "/messages?after=-1", "", 400, "after"},
		} {
			r := h.call(c.method, c.path, "Bearer-less", nil) // every bad request is still authenticated first
			if r.status != 401 {
				t.Fatalf("%s without a valid token: %d, want 401", c.name, r.status)
			}
			var body any
			if c.body != "" {
				body = c.body
			}
			r = h.call(c.method, c.path, tok, body)
			if r.status != c.status || (c.field != "" && r.body["field"] != c.field) {
				t.Errorf("%s: %d %v, want %d naming field %q", c.name, r.status, r.body, c.status, c.field)
			}
			if c.field != "" && (r.body["type"] != typeValidation || r.body["rule"] == "") {
				t.Errorf("%s: %v, want a validation problem with its rule", c.name, r.body)
			}
		}
		if ms := items(h.must(200, "GET", topicPath+"/messages", tok, nil)); len(ms) != 0 {
			t.Fatalf("bad requests stored messages: %v", ms)
		}
		if ts := items(h.must(200, "GET", "/v1/tenants/acme/topics", tok, nil)); len(ts) != 0 {
			t.Fatalf("bad requests made topics: %v", ts)
		}
	})
}

func TestRateLimitPerToken(t *testing.T) {
	h := newHarness(t, testdb.Migrated(t, testdb.SQLite(t)), harnessOptions{rate: 0.001, burst: 2})
	a, _ := h.token(RoleAdmin, 0, "acme")
	b, _ := h.token(RoleAdmin, 0, "acme")
	h.must(200, "GET", "/v1/tenants/acme/topics", a, nil)
	h.must(200, "GET", "/v1/tenants/acme/topics", a, nil)
	r := h.call("GET", "/v1/tenants/acme/topics", a, nil)
	if r.status != 429 || r.header.Get("Retry-After") == "" || r.body["type"] != typeRate {
		t.Fatalf("third request in the burst: %d %v %v", r.status, r.header, r.body)
	}
	h.must(200, "GET", "/v1/tenants/acme/topics", b, nil) // another token has its own budget
}

func TestHealthAndReadiness(t *testing.T) {
	drv := testdb.SQLite(t)
	h := newHarness(t, drv, harnessOptions{})
	if b := h.must(200, "GET", "/healthz", "", nil); b["status"] != "ok" {
		t.Fatalf("healthz: %v", b)
	}
	if r := h.call("GET", "/readyz", "", nil); r.status != 503 || !strings.Contains(r.body["detail"].(string), "migrate") {
		t.Fatalf("readyz before migrate: %d %v", r.status, r.body)
	}
	testdb.Migrated(t, drv)
	if b := h.must(200, "GET", "/readyz", "", nil); b["status"] != "ready" {
		t.Fatalf("readyz: %v", b)
	}
	if r := h.call("GET", "/v2/nothing", "", nil); r.status != 404 || r.body["type"] != typeNotFound {
		t.Fatalf("unknown path: %d %v", r.status, r.body)
	}
}

// TestOpenAPIDescribesEveryRoute holds the OpenAPI document and the
// routes together: every route is described, and nothing else is.
func TestOpenAPIDescribesEveryRoute(t *testing.T) {
	var doc struct {
		OpenAPI string                               `json:"openapi"`
		Paths   map[string]map[string]map[string]any `json:"paths"`
	}
	if err := json.Unmarshal(openAPI, &doc); err != nil {
		t.Fatalf("openapi.json: %v", err)
	}
	if !strings.HasPrefix(doc.OpenAPI, "3.") {
		t.Fatalf("openapi version %q", doc.OpenAPI)
	}
	var described []string
	for path, ops := range doc.Paths {
		for method, op := range ops {
			if method == "parameters" {
				continue
			}
			described = append(described, strings.ToUpper(method)+" "+path)
			if op["operationId"] == nil || op["responses"] == nil {
				t.Errorf("%s %s: no operationId or responses", method, path)
			}
		}
	}
	want := []string{"GET /healthz", "GET /readyz", "GET /metrics", "GET /v1/openapi.json"}
	s := &Server{}
	for _, rt := range s.apiRoutes() {
		want = append(want, rt.pattern)
	}
	slices.Sort(described)
	slices.Sort(want)
	if !slices.Equal(described, want) {
		t.Fatalf("OpenAPI paths and routes differ:\n described %q\n routes    %q", described, want)
	}
	h := newHarness(t, testdb.Migrated(t, testdb.SQLite(t)), harnessOptions{})
	r := h.call("GET", "/v1/openapi.json", "", nil)
	if r.status != 200 || r.body["openapi"] != doc.OpenAPI {
		t.Fatalf("GET /v1/openapi.json: %d", r.status)
	}
}

// A malformed receipt among good ones settles none of them; acks of one
// receive coalesce into one cursor commit at the highest offset.
func TestSettleChecksEveryReceiptFirst(t *testing.T) {
	eachDB(t, func(t *testing.T, drv driver.Driver) {
		h := newHarness(t, drv, harnessOptions{})
		tok, _ := h.token(RoleAdmin, 0, "acme")
		h.must(200, "POST", topicPath+"/messages", tok, `{"messages":[{"key":"k","id":"m1","payload":"1"},{"key":"k","id":"m2","payload":"2"},{"id":"u1","payload":"3"}]}`)
		grouped := received(h.must(200, "POST", groupPath+"/receive", tok, `{"key":"k","max":2}`))
		claimed := received(h.must(200, "POST", groupPath+"/receive", tok, `{"ungrouped":true}`))
		all := append(receipts(grouped), receipts(claimed)...)
		for _, path := range []string{"/ack", "/nack"} {
			r := h.call("POST", groupPath+path, tok, map[string]any{"receipts": append(slices.Clone(all), "r1.bm9wZQ")})
			if r.status != 400 || r.body["field"] != "receipts[3]" {
				t.Fatalf("%s with a malformed last receipt: %d %v", path, r.status, r.body)
			}
		}
		if off := items(h.must(200, "GET", topicPath+"/offsets?group=billing", tok, nil)); len(off) == 0 || off[0]["committed_offset"] != 0.0 {
			t.Fatalf("offsets after the refused acks: %v, want nothing committed", off)
		}
		if r := h.must(200, "POST", groupPath+"/ack", tok, map[string]any{"receipts": all}); r["settled"] != 3.0 {
			t.Fatalf("ack: %v", r)
		}
		off := items(h.must(200, "GET", topicPath+"/offsets?group=billing", tok, nil))
		for _, o := range off {
			if o["key"] == "k" && (o["committed_offset"] != 2.0 || o["lag"] != 0.0) {
				t.Fatalf("k after the ack: %v", o)
			}
		}
		if got := received(h.must(200, "POST", groupPath+"/receive", tok, `{"max":10}`)); len(got) != 0 {
			t.Fatalf("after acking everything: %v", got)
		}

		// A nack of a whole receive fails its first message; the rest
		// wait behind it and come back with it, no attempt counted.
		h.must(200, "POST", topicPath+"/messages", tok, `{"messages":[{"key":"k","id":"m3","payload":"3"},{"key":"k","id":"m4","payload":"4"}]}`)
		got := received(h.must(200, "POST", groupPath+"/receive", tok, `{"key":"k","max":2}`))
		if r := h.must(200, "POST", groupPath+"/nack", tok, map[string]any{"receipts": receipts(got)}); r["settled"] != 2.0 {
			t.Fatalf("nack of a whole receive: %v", r)
		}
		again := received(h.must(200, "POST", groupPath+"/receive", tok, `{"key":"k","max":2}`))
		if !slices.Equal(ids(again), []string{"m3", "m4"}) || again[0]["attempt"] != 2.0 || again[1]["attempt"] != 1.0 {
			t.Fatalf("after the nack: %v, want m3 at attempt 2, m4 at attempt 1", again)
		}
	})
}

// testMetrics stands in for the CLI's Prometheus handler: what it serves
// is the CLI's concern (tested there); these tests check who may read it.
var testMetrics = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "# shardq metrics\n") })

// waitReceives waits until n tokens hold receives in flight (the
// limiter's count).
func (h *harness) waitReceives(n int) {
	h.t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		h.srv.limits.mu.Lock()
		held := len(h.srv.limits.inFlight)
		h.srv.limits.mu.Unlock()
		if held == n {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("%d tokens hold receives after 10 s, want %d", held, n)
		}
	}
}
