// SPDX-License-Identifier: Apache-2.0

package server

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/testdb"
)

// upload POSTs body to the large-message route and returns the answer.
func (h *harness) upload(path, tok string, body io.Reader, header http.Header) reply {
	h.t.Helper()
	req, err := http.NewRequest("POST", h.http.URL+path, body)
	if err != nil {
		h.t.Fatal(err)
	}
	req.Header = header.Clone()
	if req.Header == nil {
		req.Header = http.Header{}
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Content-Type", "application/octet-stream")
	return h.do(req)
}

// download GETs path and returns the status, headers and raw body.
func (h *harness) download(path, tok, rng string) (*http.Response, []byte) {
	h.t.Helper()
	req, err := http.NewRequest("GET", h.http.URL+path, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	if rng != "" {
		req.Header.Set("Range", rng)
	}
	res, err := h.http.Client().Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body) // a body cut short: the caller checks what came
	return res, b
}

func (h *harness) do(req *http.Request) reply {
	h.t.Helper()
	res, err := h.http.Client().Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	out := reply{status: res.StatusCode, header: res.Header, raw: string(raw)}
	if strings.Contains(res.Header.Get("Content-Type"), "json") {
		if err := json.Unmarshal(raw, &out.body); err != nil {
			h.t.Fatalf("%s %s: %v: %s", req.Method, req.URL.Path, err, raw)
		}
	}
	return out
}

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return "sha-256=:" + base64.StdEncoding.EncodeToString(s[:]) + ":"
}

// A large message goes in over HTTP as a streamed body and comes out of
// a receive as one entry whose body_url streams it whole, with its
// digest, and in ranges for a client resuming after a cut; its ack
// passes every chunk.
func TestLargeMessageOverHTTP(t *testing.T) {
	eachDB(t, func(t *testing.T, drv driver.Driver) {
		h := newHarness(t, drv, harnessOptions{})
		pub, _ := h.token(RolePublish, 0, "acme")
		con, _ := h.token(RoleConsume, 0, "acme")
		data := make([]byte, 3<<20+123)
		rand.NewChaCha8([32]byte{1}).Read(data)
		sum := sha256.Sum256(data)

		r := h.upload("/v1/tenants/acme/topics/files/large?key=k&id=blob&header=kind:video", pub, bytes.NewReader(data), http.Header{"Repr-Digest": {digest(data)}})
		if r.status != 200 || r.body["id"] != "blob" || r.body["key"] != "k" || r.body["bytes"] != float64(len(data)) || r.body["sha256"] != hex.EncodeToString(sum[:]) ||
			r.header.Get("Repr-Digest") != digest(data) {
			t.Fatalf("upload: %d %s", r.status, r.raw)
		}
		h.must(200, "POST", "/v1/tenants/acme/topics/files/messages", pub, map[string]any{"key": "k", "id": "after", "payload": "next"})

		ms := received(h.must(200, "POST", "/v1/tenants/acme/topics/files/groups/g/receive", con, map[string]any{"key": "k", "max": 10}))
		if len(ms) != 1 || ms[0]["id"] != "blob" || ms[0]["payload"] != nil || ms[0]["body_url"] == nil {
			t.Fatalf("receive: %+v; want the large message alone, without a payload", ms)
		}
		lg := ms[0]["large"].(map[string]any)
		if lg["bytes"] != float64(len(data)) || lg["sha256"] != hex.EncodeToString(sum[:]) || ms[0]["headers"].(map[string]any)["kind"] != "video" {
			t.Fatalf("large entry: %+v", ms[0])
		}
		url := ms[0]["body_url"].(string)
		res, got := h.download(url, con, "")
		if res.StatusCode != 200 || !bytes.Equal(got, data) || res.Header.Get("Repr-Digest") != digest(data) {
			t.Fatalf("GET body: %d, %d bytes of %d, Repr-Digest %q", res.StatusCode, len(got), len(data), res.Header.Get("Repr-Digest"))
		}
		res, got = h.download(url, con, "bytes=1000000-")
		if res.StatusCode != 206 || !bytes.Equal(got, data[1000000:]) {
			t.Fatalf("GET body from 1000000: %d, %d bytes", res.StatusCode, len(got))
		}
		// Several ranges would read the body again for each one behind
		// the last: they get the whole.
		if res, got = h.download(url, con, "bytes=3000000-3000009,0-9"); res.StatusCode != 200 || !bytes.Equal(got, data) {
			t.Fatalf("GET body with two ranges: %d, %d bytes", res.StatusCode, len(got))
		}
		if res, _ := h.download(url, pub, ""); res.StatusCode != 403 {
			t.Fatalf("GET body with a publish token: %d", res.StatusCode)
		}
		if res, _ := h.download(strings.Replace(url, "receipt=r3.", "receipt=r3.9", 1), con, ""); res.StatusCode != 400 {
			t.Fatalf("GET body with a forged receipt: %d", res.StatusCode)
		}
		h.must(200, "POST", "/v1/tenants/acme/topics/files/groups/g/ack", con, map[string]any{"receipts": []string{ms[0]["receipt"].(string)}})
		ms = received(h.must(200, "POST", "/v1/tenants/acme/topics/files/groups/g/receive", con, map[string]any{"key": "k", "max": 10}))
		if len(ms) != 1 || ms[0]["id"] != "after" {
			t.Fatalf("after the ack: %+v; want the next message", ms)
		}
	})
}

// An upload that does not match its digest, passes the server's limit,
// or comes without the publish role stores nothing a reader sees.
func TestLargeUploadRefused(t *testing.T) {
	eachDB(t, func(t *testing.T, drv driver.Driver) {
		h := newHarness(t, drv, harnessOptions{maxLargeBytes: 1 << 20, maxLargeTransfers: 2, maxTransfersPerTenant: 2})
		pub, _ := h.token(RolePublish, 0, "acme")
		con, _ := h.token(RoleConsume, 0, "acme")
		data := bytes.Repeat([]byte("z"), 600<<10)
		if r := h.upload("/v1/tenants/acme/topics/files/large?key=k&id=a", pub, bytes.NewReader(data), http.Header{"Repr-Digest": {digest([]byte("other"))}}); r.status != 400 || r.body["field"] != "Repr-Digest" {
			t.Fatalf("upload with a wrong digest: %d %s", r.status, r.raw)
		}
		big := io.MultiReader(bytes.NewReader(data), bytes.NewReader(data)) // no Content-Length: found while reading
		if r := h.upload("/v1/tenants/acme/topics/files/large?key=k&id=b", pub, big, nil); r.status != 413 {
			t.Fatalf("upload over the limit: %d %s", r.status, r.raw)
		}
		if r := h.upload("/v1/tenants/acme/topics/files/large?key=k&id=c", con, bytes.NewReader(data), nil); r.status != 403 {
			t.Fatalf("upload with a consume token: %d %s", r.status, r.raw)
		}
		if r := h.upload("/v1/tenants/acme/topics/files/large?key=k&id=d&bogus=1", pub, bytes.NewReader(data), nil); r.status != 400 || r.body["field"] != "bogus" {
			t.Fatalf("upload with an unknown parameter: %d %s", r.status, r.raw)
		}
		// One token holds at most half the transfer slots.
		stall := make(chan struct{})
		held := make(chan error, 1)
		go func() {
			req, err := http.NewRequest("POST", h.http.URL+"/v1/tenants/acme/topics/files/large?key=k&id=e", io.MultiReader(bytes.NewReader(data[:1000]),
				readerFunc(func([]byte) (int, error) { <-stall; return 0, errors.New("client gone") })))
			if err == nil {
				req.Header.Set("Authorization", "Bearer "+pub)
				var res *http.Response
				if res, err = h.http.Client().Do(req); err == nil {
					res.Body.Close()
					err = fmt.Errorf("answered %d", res.StatusCode)
				}
			}
			held <- err
		}()
		for deadline := time.Now().Add(10 * time.Second); ; {
			h.srv.transferMu.Lock()
			n := h.srv.transferring
			h.srv.transferMu.Unlock()
			if n == 1 || time.Now().After(deadline) {
				break
			}
			time.Sleep(time.Millisecond)
		}
		if r := h.upload("/v1/tenants/acme/topics/files/large?key=k2&id=f", pub, bytes.NewReader(data), nil); r.status != 429 {
			t.Fatalf("a second upload of one token while its first holds a slot: %d %s", r.status, r.raw)
		}
		pub2, _ := h.token(RolePublish, 0, "acme")
		if r := h.upload("/v1/tenants/acme/topics/files/large?key=k2&id=g", pub2, bytes.NewReader(data[:1000]), nil); r.status != 200 {
			t.Fatalf("another token's upload meanwhile: %d %s", r.status, r.raw)
		}
		close(stall)
		if err := <-held; err == nil {
			t.Fatal("the cut upload succeeded")
		}
		h.must(200, "POST", "/v1/tenants/acme/topics/files/messages", pub, map[string]any{"key": "k", "id": "only", "payload": "x"})
		ms := received(h.must(200, "POST", "/v1/tenants/acme/topics/files/groups/g/receive", con, map[string]any{"key": "k", "max": 10}))
		if len(ms) != 1 || ms[0]["id"] != "only" {
			t.Fatalf("receive after refused uploads: %+v; want only the ordinary message", ms)
		}
	})
}

// slowReader yields r in pieces of n bytes (the last may be shorter),
// waiting d before each.
type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }

type slowReader struct {
	r io.Reader
	n int
	d time.Duration
}

func (s slowReader) Read(p []byte) (int, error) {
	time.Sleep(s.d)
	n, err := io.ReadFull(s.r, p[:min(len(p), s.n)])
	if err == io.ErrUnexpectedEOF && n > 0 {
		err = nil // the last piece; the next read says EOF
	}
	return n, err
}

// A large upload or download may take far longer than the server's read
// and write timeouts, as long as each read or write comes within them.
func TestLargeTransfersOutlastTheTimeouts(t *testing.T) {
	drv := testdb.Migrated(t, testdb.SQLite(t))
	h := newHarness(t, drv, harnessOptions{})
	lines := &testdb.LogLines{}
	// The timeouts leave a client paused by a loaded machine (the race
	// detector, parallel packages) seconds between reads; each transfer
	// still lasts about twice as long.
	const timeout = 3 * time.Second
	srv, err := New(Config{Client: h.client, Driver: drv, Receipts: h.srv.cfg.Receipts, Rate: 1e6, Burst: 1e6, AuthFailRate: 1e6,
		ReadTimeout: timeout, WriteTimeout: timeout, Logger: slog.New(lines), Clock: h.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewUnstartedServer(srv)
	hs.Config.ReadTimeout, hs.Config.WriteTimeout = timeout, timeout
	// Small socket buffers on both ends keep the bytes in flight to a few
	// pieces, so that the server's reads and writes wait on the client's
	// pace rather than fill the kernel's buffers up front.
	hs.Listener = smallBuffers{hs.Listener}
	hs.Start()
	defer hs.Close()
	hs.Client().Transport.(*http.Transport).DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err == nil {
			err = setBuffers(c)
		}
		return c, err
	}
	h.http = hs
	defer func() {
		if t.Failed() {
			t.Logf("the server's log:\n%s", strings.Join(lines.All(), "\n"))
		}
	}()
	tok, _ := h.token(RoleAdmin, 0, "acme")
	// 128 pieces of 32 KiB, one each 50 ms: about 6.4 s each way.
	const piece, pause = 32 << 10, 50 * time.Millisecond
	data := make([]byte, 128*piece)
	rand.NewChaCha8([32]byte{2}).Read(data)
	start := time.Now()
	r := h.upload("/v1/tenants/acme/topics/files/large?key=k&id=slow", tok, slowReader{bytes.NewReader(data), piece, pause}, nil)
	if r.status != 200 {
		t.Fatalf("slow upload after %v: %d %s", time.Since(start), r.status, r.raw)
	}
	ms := received(h.must(200, "POST", "/v1/tenants/acme/topics/files/groups/g/receive", tok, map[string]any{"key": "k", "max": 1}))
	req, err := http.NewRequest("GET", hs.URL+ms[0]["body_url"].(string), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	start = time.Now()
	res, err := hs.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	got, err := io.ReadAll(slowReader{res.Body, piece, pause})
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("slow download after %v: %d of %d bytes, %v", time.Since(start), len(got), len(data), err)
	}
}

// smallBuffers gives each accepted connection a small send buffer.
type smallBuffers struct{ net.Listener }

func (l smallBuffers) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		err = setBuffers(c)
	}
	return c, err
}

// setBuffers shrinks a TCP connection's socket buffers to 16 KiB each way.
func setBuffers(c net.Conn) error {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return fmt.Errorf("not a TCP connection: %T", c)
	}
	return errors.Join(tc.SetReadBuffer(16<<10), tc.SetWriteBuffer(16<<10))
}

// A pause between writes longer than the write timeout (the body read from
// a slow database) does not cut the response: the deadline covers each
// write from its start.
func TestPacedWritesDeadlineEachWrite(t *testing.T) {
	const idle = 200 * time.Millisecond
	hs := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := paced{w, http.NewResponseController(w), idle}
		for range 3 {
			time.Sleep(2 * idle)
			if _, err := p.Write(make([]byte, 1<<10)); err != nil {
				return
			}
			p.rc.Flush() //nolint:errcheck
		}
	}))
	hs.Config.WriteTimeout = idle
	hs.Start()
	defer hs.Close()
	res, err := hs.Client().Get(hs.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	got, err := io.ReadAll(res.Body)
	if err != nil || len(got) != 3<<10 {
		t.Fatalf("read %d of %d bytes: %v", len(got), 3<<10, err)
	}
}
