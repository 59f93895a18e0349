// SPDX-License-Identifier: Apache-2.0

package server

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/testdb"
)

// rawRequest opens a connection to the server and sends a request's head
// (and extra header lines): the test writes the body itself, at its own
// pace, short, or not at all.
func (h *harness) rawRequest(method, path, tok string, header ...string) *net.TCPConn {
	h.t.Helper()
	c, err := net.Dial("tcp", h.http.Listener.Addr().String())
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { c.Close() })
	head := fmt.Sprintf("%s %s HTTP/1.1\r\nHost: shardq\r\nAuthorization: Bearer %s\r\n", method, path, tok)
	for _, l := range header {
		head += l + "\r\n"
	}
	if _, err := io.WriteString(c, head+"\r\n"); err != nil {
		h.t.Fatal(err)
	}
	return c.(*net.TCPConn)
}

// rawReply reads the answer of a rawRequest.
func rawReply(t *testing.T, c net.Conn) reply {
	t.Helper()
	r, err := readReply(c)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// readReply reads the answer of a rawRequest (from any goroutine).
func readReply(c net.Conn) (reply, error) {
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return reply{}, err
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	out := reply{status: res.StatusCode, header: res.Header, raw: string(raw)}
	if strings.Contains(res.Header.Get("Content-Type"), "json") {
		if err := json.Unmarshal(raw, &out.body); err != nil {
			return out, fmt.Errorf("answer %q: %w", raw, err)
		}
	}
	return out, nil
}

// transfers is how many transfer slots the server holds.
func (h *harness) transfers() int {
	h.srv.transferMu.Lock()
	defer h.srv.transferMu.Unlock()
	return h.srv.transferring
}

// waitTransfers waits until the server holds n transfer slots.
func (h *harness) waitTransfers(n int) {
	h.t.Helper()
	for deadline := time.Now().Add(10 * time.Second); h.transfers() != n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			h.t.Fatalf("the server holds %d transfers; want %d", h.transfers(), n)
		}
	}
}

// An upload that trickles (a byte every 5 s of the server's clock) is cut
// once a window passes in which it moved fewer than the least bytes: 408,
// its chunks marked aborted, and its slot free for the next.
func TestSlowUploadIsCut(t *testing.T) {
	eachDB(t, func(t *testing.T, drv driver.Driver) {
		h := newHarness(t, drv, harnessOptions{maxLargeTransfers: 2, minTransferRate: 64 << 10, transferRateWindow: 10 * time.Second})
		pub, _ := h.token(RolePublish, 0, "acme")
		con, _ := h.token(RoleConsume, 0, "acme")
		c := h.rawRequest("POST", "/v1/tenants/acme/topics/files/large?key=k&id=slow", pub, "Content-Length: 1000")
		answered := make(chan reply, 1)
		go func() {
			r, err := readReply(c)
			if err != nil {
				r.raw = err.Error()
			}
			answered <- r
		}()
		var r reply
	trickle:
		for i := 0; i < 1000; i++ {
			if i > 0 {
				h.clock.Add(5 * time.Second)
			}
			if _, err := c.Write([]byte{'x'}); err != nil {
				break
			}
			// Paces the bytes so that the server reads them apart; how
			// many it reads before it cuts does not matter.
			select {
			case r = <-answered:
				break trickle
			case <-time.After(20 * time.Millisecond):
			}
		}
		if r.status == 0 {
			r = <-answered
		}
		if r.status != 408 || r.body["type"] != typeTooSlow || !strings.Contains(r.raw, "65536 bytes in 10s") {
			t.Fatalf("a trickled upload: %d %s; want 408 transfer-too-slow", r.status, r.raw)
		}
		h.waitTransfers(0)
		if r := h.upload("/v1/tenants/acme/topics/files/large?key=k&id=next", pub, strings.NewReader("whole"), nil); r.status != 200 {
			t.Fatalf("an upload after the cut: %d %s", r.status, r.raw)
		}
		ms := received(h.must(200, "POST", "/v1/tenants/acme/topics/files/groups/g/receive", con, map[string]any{"key": "k", "max": 10}))
		if len(ms) != 1 || ms[0]["id"] != "next" {
			t.Fatalf("receive after the cut upload: %v; want only the next one", ids(ms))
		}
	})
}

// A download read too slowly is cut the same way: its body falls short
// of its Content-Length, and its slot is freed.
func TestSlowDownloadIsCut(t *testing.T) {
	drv := testdb.Migrated(t, testdb.SQLite(t))
	h := newHarness(t, drv, harnessOptions{})
	tok, _ := h.token(RoleAdmin, 0, "acme")
	data := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB
	if r := h.upload("/v1/tenants/acme/topics/files/large?key=k&id=big", tok, bytes.NewReader(data), nil); r.status != 200 {
		t.Fatalf("upload: %d %s", r.status, r.raw)
	}
	ms := received(h.must(200, "POST", "/v1/tenants/acme/topics/files/groups/g/receive", tok, map[string]any{"key": "k", "max": 1}))
	// Small socket buffers: the server's writes wait on the client's
	// reads, so that one returns after the clock moved.
	srv, err := New(Config{Client: h.client, Driver: drv, Receipts: h.srv.cfg.Receipts, Rate: 1e6, Burst: 1e6, AuthFailRate: 1e6,
		MinTransferRate: 512 << 20, TransferRateWindow: 10 * time.Second, Logger: h.srv.log, Clock: h.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewUnstartedServer(srv)
	hs.Listener = smallBuffers{hs.Listener}
	hs.Start()
	defer hs.Close()
	h.http, h.srv = hs, srv
	c := h.rawRequest("GET", ms[0]["body_url"].(string), tok)
	if err := setBuffers(c); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReaderSize(c, 4<<10)
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != 200 || res.ContentLength != int64(len(data)) {
		t.Fatalf("download: %d, %d bytes", res.StatusCode, res.ContentLength)
	}
	h.clock.Add(time.Minute) // the client stalls a window and more
	got, err := io.ReadAll(res.Body)
	if err == nil || len(got) >= len(data) {
		t.Fatalf("a download read after a stall: %d of %d bytes, %v; want it cut short", len(got), len(data), err)
	}
	h.waitTransfers(0)
}

// Slots per token and per tenant: one token holds at most its share, so
// does one tenant's tokens together, and another tenant still finds one;
// each refusal says which limit it hit.
func TestTransferSlotsPerTokenAndTenant(t *testing.T) {
	eachDB(t, func(t *testing.T, drv driver.Driver) {
		h := newHarness(t, drv, harnessOptions{maxLargeTransfers: 5, maxTransfersPerToken: 2, maxTransfersPerTenant: 3})
		a1, _ := h.token(RolePublish, 0, "acme")
		a2, _ := h.token(RolePublish, 0, "acme")
		other, _ := h.token(RolePublish, 0, "other")
		// Uploads that send part of their body and wait: each holds a slot.
		hold := func(tok, tenant, id string) *net.TCPConn {
			c := h.rawRequest("POST", "/v1/tenants/"+tenant+"/topics/files/large?key="+id+"&id="+id, tok, "Content-Length: 1000")
			if _, err := c.Write([]byte("part")); err != nil {
				t.Fatal(err)
			}
			return c
		}
		var held []*net.TCPConn
		held = append(held, hold(a1, "acme", "a"), hold(a1, "acme", "b"))
		h.waitTransfers(2)
		refused := func(tok, tenant, want string) {
			t.Helper()
			r := h.upload("/v1/tenants/"+tenant+"/topics/files/large?key=z", tok, strings.NewReader("z"), nil)
			if r.status != 429 || r.header.Get("Retry-After") != "1" || !strings.Contains(r.raw, want) {
				t.Fatalf("an upload past a limit: %d %s; want 429 naming %q", r.status, r.raw, want)
			}
		}
		refused(a1, "acme", "max-large-transfers-per-token")
		held = append(held, hold(a2, "acme", "c"))
		h.waitTransfers(3)
		refused(a2, "acme", "max-large-transfers-per-tenant")
		if r := h.upload("/v1/tenants/other/topics/files/large?key=o&id=o", other, strings.NewReader("mine"), nil); r.status != 200 {
			t.Fatalf("another tenant's upload while acme holds its share: %d %s", r.status, r.raw)
		}
		held = append(held, hold(other, "other", "d"), hold(other, "other", "e"))
		h.waitTransfers(5)
		refused(other, "other", "all 5 large-message transfers")
		for _, c := range held {
			c.Close()
		}
		h.waitTransfers(0)
		if r := h.upload("/v1/tenants/acme/topics/files/large?key=z&id=z", a1, strings.NewReader("z"), nil); r.status != 200 {
			t.Fatalf("an upload once the slots are back: %d %s", r.status, r.raw)
		}
	})
}

// An upload whose client shuts its side of the connection before the
// body is whole is answered with an error, never 200: short of its
// Content-Length, or a chunked body without its last chunk. Nothing of it
// is delivered.
func TestUploadCutShortIsAnError(t *testing.T) {
	eachDB(t, func(t *testing.T, drv driver.Driver) {
		h := newHarness(t, drv, harnessOptions{})
		pub, _ := h.token(RolePublish, 0, "acme")
		con, _ := h.token(RoleConsume, 0, "acme")
		for _, tc := range []struct {
			name, header, body string
		}{
			{"content-length", "Content-Length: 1000", strings.Repeat("x", 500)},
			{"chunked", "Transfer-Encoding: chunked", "1f4\r\n" + strings.Repeat("x", 500) + "\r\n"},
		} {
			c := h.rawRequest("POST", "/v1/tenants/acme/topics/files/large?key=k&id="+tc.name, pub, tc.header)
			if _, err := io.WriteString(c, tc.body); err != nil {
				t.Fatal(err)
			}
			if err := c.CloseWrite(); err != nil {
				t.Fatal(err)
			}
			// The body's end is found short: not read as the end of the
			// message (no chunk is stored for it).
			if r := rawReply(t, c); r.status != 400 || r.body["type"] != typeIncomplete || !strings.Contains(r.raw, "ended after 500 bytes, before it was complete") {
				t.Fatalf("%s: an upload cut short: %d %s; want 400 incomplete-request, the body found short", tc.name, r.status, r.raw)
			}
		}
		h.must(200, "POST", "/v1/tenants/acme/topics/files/messages", pub, map[string]any{"key": "k", "id": "after", "payload": "x"})
		ms := received(h.must(200, "POST", "/v1/tenants/acme/topics/files/groups/g/receive", con, map[string]any{"key": "k", "max": 10}))
		if len(ms) != 1 || ms[0]["id"] != "after" {
			t.Fatalf("receive after the cut uploads: %v; want only the ordinary message", ids(ms))
		}
	})
}

// An upload given up while it waits for its tenant's byte rate gives the
// rate back: the next publish is not refused for bytes never written.
func TestAbortedUploadGivesTheRateBack(t *testing.T) {
	eachDB(t, func(t *testing.T, drv driver.Driver) {
		h := newHarness(t, drv, harnessOptions{})
		op, _ := h.token(RoleOperator, 0, "acme")
		pub, _ := h.token(RolePublish, 0, "acme")
		h.must(200, "PUT", "/v1/tenants/acme/limits", op, `{"publish_byte_rate":65536}`)
		// 16 seconds' worth, sent whole: the server waits for the rate.
		body := strings.Repeat("x", 1<<20)
		c := h.rawRequest("POST", "/v1/tenants/acme/topics/files/large?key=big", pub, fmt.Sprintf("Content-Length: %d", len(body)))
		if _, err := io.WriteString(c, body); err != nil {
			t.Fatal(err)
		}
		// A small publish is refused once the upload holds the rate.
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
			r := h.call("POST", "/v1/tenants/acme/topics/files/messages", pub, map[string]any{"key": "probe"})
			if r.status == 429 {
				break
			}
			if r.status != 200 || time.Now().After(deadline) {
				t.Fatalf("probe: %d %s", r.status, r.raw)
			}
		}
		c.Close() // the client leaves while the upload waits
		h.waitTransfers(0)
		if r := h.call("POST", "/v1/tenants/acme/topics/files/messages", pub, map[string]any{"key": "k", "payload": strings.Repeat("y", 32<<10)}); r.status != 200 {
			t.Fatalf("a publish after the aborted upload: %d %s; want the rate it reserved given back", r.status, r.raw)
		}
	})
}
