// SPDX-License-Identifier: Apache-2.0

package server

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/internal/telemetry"
)

// Large messages over HTTP (docs/large.md): an upload streams a request
// body of any size up to MaxLargeBytes into PublishLarge, holding one
// transaction's chunks; a receive hands a large message out as one entry
// whose body_url streams it by its receipt, with its SHA-256 in
// Repr-Digest and Range for a client resuming after a cut. Both hold one
// of MaxLargeTransfers, and each read or write pushes its deadline on by
// ReadTimeout or WriteTimeout, within LargeTransferTimeout in all.

// Defaults of Config's large-message fields.
const (
	DefaultMaxLargeBytes        = 4 << 30
	DefaultMaxLargeTransfers    = 8
	DefaultLargeTransferTimeout = time.Hour
	DefaultMinTransferRate      = 64 << 10
	DefaultTransferRateWindow   = 10 * time.Second
)

// largeOut describes a large message in a receive's answer.
type largeOut struct {
	Bytes  int64  `json:"bytes"`
	Chunks int    `json:"chunks"`
	SHA256 string `json:"sha256" description:"hex"`
}

// bodyURL is where the body of the large message a receipt names is read.
func bodyURL(tenant, topic, group, receipt string) string {
	return "/v1/tenants/" + url.PathEscape(tenant) + "/topics/" + url.PathEscape(topic) + "/groups/" + url.PathEscape(group) +
		"/body?receipt=" + url.QueryEscape(receipt)
}

// reprDigest is an RFC 9530 Repr-Digest field value of a SHA-256 in hex.
func reprDigest(hexSum string) string {
	b, _ := hex.DecodeString(hexSum)
	return "sha-256=:" + base64.StdEncoding.EncodeToString(b) + ":"
}

// wantedDigest reads the SHA-256 an upload's Repr-Digest or
// Content-Digest names (nil: none given).
func wantedDigest(h http.Header) ([]byte, error) {
	for _, name := range []string{"Repr-Digest", "Content-Digest"} {
		v := h.Get(name)
		if v == "" {
			continue
		}
		for item := range strings.SplitSeq(v, ",") {
			alg, val, ok := strings.Cut(strings.TrimSpace(item), "=")
			if !ok || !strings.EqualFold(alg, "sha-256") {
				continue
			}
			sum, err := base64.StdEncoding.DecodeString(strings.Trim(val, ":"))
			if err != nil || len(sum) != sha256.Size || !strings.HasPrefix(val, ":") || !strings.HasSuffix(val, ":") {
				return nil, &shardq.ValidationError{Field: name, Rule: "sha-256 must be a base64 byte sequence of 32 bytes, as :…: (RFC 9530)"}
			}
			return sum, nil
		}
		return nil, &shardq.ValidationError{Field: name, Rule: "only sha-256 is supported"}
	}
	return nil, nil
}

// errDigestMismatch fails an upload whose bytes do not match the digest
// its client sent.
var errDigestMismatch = errors.New("the body does not match its Repr-Digest")

// errBodyCut fails an upload whose body ended before it was whole: short
// of its Content-Length, or a chunked body without its last chunk (the
// client shut its side, or the connection broke). Read as the end of the
// body, it would store a truncated message as complete.
var errBodyCut = errors.New("the body ended before it was complete")

// uploadBody reads an upload: it pushes the connection's read deadline on
// at each read, and at EOF checks the client's digest, failing the read
// (and so the write, which stores an aborted end marker) on a mismatch.
type uploadBody struct {
	r       io.Reader
	rc      *http.ResponseController
	idle    time.Duration
	want    []byte
	sum     hash.Hash
	n       int64
	limited bool // the body passed MaxLargeBytes
}

func (b *uploadBody) Read(p []byte) (int, error) {
	b.rc.SetReadDeadline(time.Now().Add(b.idle)) //nolint:errcheck // not every writer has deadlines
	n, err := b.r.Read(p)
	b.sum.Write(p[:n])
	b.n += int64(n)
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		b.limited = true
	}
	if errors.Is(err, io.ErrUnexpectedEOF) {
		// The cut, not the reader's error, is what the answer names (400).
		return n, fmt.Errorf("%w (%v)", errBodyCut, err)
	}
	if err == io.EOF && b.want != nil && !bytes.Equal(b.sum.Sum(nil), b.want) {
		return n, errDigestMismatch
	}
	return n, err
}

type largeResultOut struct {
	Key       string `json:"key"`
	ID        string `json:"id"`
	Bytes     int64  `json:"bytes"`
	Chunks    int    `json:"chunks"`
	SHA256    string `json:"sha256" description:"hex"`
	EndOffset int64  `json:"end_offset" description:"the end marker's offset: the message is complete from then"`
}

// publishLarge stores the request body as one large message.
func (s *Server) publishLarge(w http.ResponseWriter, r *http.Request, tenant string) {
	q := r.URL.Query()
	msg := shardq.Message{Tenant: tenant, Topic: r.PathValue("topic"), PartitionKey: q.Get("key"), ID: q.Get("id")}
	for name := range q {
		if name != "key" && name != "id" && name != "header" {
			s.fail(w, r, &shardq.ValidationError{Field: name, Rule: "unknown query parameter: want key, id, header"})
			return
		}
	}
	for _, h := range q["header"] {
		k, v, ok := strings.Cut(h, ":")
		if !ok {
			s.fail(w, r, &shardq.ValidationError{Field: "header", Rule: fmt.Sprintf("%q: want name:value", h)})
			return
		}
		if msg.Headers == nil {
			msg.Headers = map[string]string{}
		}
		msg.Headers[k] = v
	}
	want, err := wantedDigest(r.Header)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if r.ContentLength > s.cfg.MaxLargeBytes {
		writeProblem(w, problem{Type: typeTooLarge, Status: http.StatusRequestEntityTooLarge,
			Detail: fmt.Sprintf("a large message of %d bytes; this server takes at most %d", r.ContentLength, s.cfg.MaxLargeBytes)})
		return
	}
	rc := http.NewResponseController(w)
	body := &uploadBody{r: r.Body, rc: rc, idle: s.cfg.ReadTimeout, want: want, sum: sha256.New()}
	res, err := s.cfg.Client.PublishLarge(r.Context(), msg, body, nil)
	// The connection's write deadline was set when the request began: the
	// answer gets its own.
	rc.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout)) //nolint:errcheck // not every writer has deadlines
	const aborted = "nothing was stored (the chunks so far are marked aborted)"
	switch {
	case body.limited:
		writeProblem(w, problem{Type: typeTooLarge, Status: http.StatusRequestEntityTooLarge,
			Detail: fmt.Sprintf("the body passed this server's %d bytes; %s", s.cfg.MaxLargeBytes, aborted)})
	case errors.Is(err, errDigestMismatch):
		writeProblem(w, invalid("Repr-Digest", "the body's SHA-256 differs; nothing was stored (the chunks are marked aborted)"))
	case errors.Is(err, errTransferTooSlow):
		w.Header().Set("Connection", "close")
		writeProblem(w, problem{Type: typeTooSlow, Status: http.StatusRequestTimeout, Detail: fmt.Sprintf("%s; %s", s.tooSlow(), aborted)})
	case errors.Is(err, errBodyCut):
		w.Header().Set("Connection", "close")
		writeProblem(w, problem{Type: typeIncomplete, Status: http.StatusBadRequest,
			Detail: fmt.Sprintf("the body ended after %d bytes, before it was complete (its Content-Length, or a chunked body's last chunk); %s", body.n, aborted)})
	case err != nil && errors.Is(r.Context().Err(), context.DeadlineExceeded):
		w.Header().Set("Connection", "close")
		writeProblem(w, problem{Type: typeTooSlow, Status: http.StatusRequestTimeout,
			Detail: fmt.Sprintf("the upload took longer than this server's %s (--large-transfer-timeout); %s", s.cfg.LargeTransferTimeout, aborted)})
	case err != nil && r.Context().Err() != nil:
		// The server cancels a request whose client shuts its side of
		// the connection: a client that still reads gets an error, never
		// an empty 200.
		w.Header().Set("Connection", "close")
		writeProblem(w, problem{Type: typeIncomplete, Status: http.StatusBadRequest,
			Detail: fmt.Sprintf("the client shut its side of the connection before the upload was stored (after %d bytes); %s", body.n, aborted)})
	case errors.Is(err, shardq.ErrLargeIDTaken), errors.Is(err, shardq.ErrLargeAbandoned):
		writeProblem(w, problem{Type: typeConflict, Status: http.StatusConflict, Detail: err.Error()})
	case err != nil:
		s.fail(w, r, err)
	default:
		w.Header().Set("Repr-Digest", reprDigest(res.SHA256))
		writeJSON(w, http.StatusOK, largeResultOut{Key: res.PartitionKey, ID: res.ID, Bytes: res.Bytes, Chunks: res.Chunks, SHA256: res.SHA256, EndOffset: res.EndOffset})
	}
}

// body streams the body of the large message a receipt names.
func (s *Server) body(w http.ResponseWriter, r *http.Request, tenant string) {
	g := shardq.GroupRef{Tenant: tenant, Topic: r.PathValue("topic"), ConsumerGroup: r.PathValue("group")}
	receipt := r.URL.Query().Get("receipt")
	if receipt == "" {
		s.fail(w, r, &shardq.ValidationError{Field: "receipt", Rule: "required: the receipt of the large message, as its body_url gives it"})
		return
	}
	b, err := s.cfg.Receipts.Body(r.Context(), g, receipt)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	// One range at most: each range behind the last would read the body
	// again from its first chunk. Several are answered with the whole.
	if strings.Contains(r.Header.Get("Range"), ",") {
		r.Header.Del("Range")
	}
	// Each write gets WriteTimeout (paced), the whole
	// LargeTransferTimeout (transfer).
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Repr-Digest", reprDigest(b.SHA256))
	h.Set("ETag", `"`+b.SHA256+`"`)
	h.Set("Cache-Control", "no-store")
	// The trace context the message was published in, so that a client
	// that streams the body continues the producer's trace: parsed as W3C
	// trace context and written again, never copied (a stored header is a
	// publisher's bytes, up to 8 KiB).
	if sc := trace.SpanContextFromContext(traceContext.Extract(context.Background(), propagation.MapCarrier(b.Headers))); sc.IsValid() {
		traceContext.Inject(trace.ContextWithRemoteSpanContext(context.Background(), sc), propagation.HeaderCarrier(h))
		if len(h.Get("tracestate")) > telemetry.MaxTraceHeaderBytes {
			h.Del("tracestate")
		}
	}
	rs := &bodySeeker{size: b.Size, r: b.Reader,
		open: func() (io.Reader, error) {
			b, err := s.cfg.Receipts.Body(r.Context(), g, receipt)
			if err != nil {
				return nil, err
			}
			return b.Reader, nil
		}}
	http.ServeContent(paced{w, http.NewResponseController(w), s.cfg.WriteTimeout}, r, "", time.Time{}, rs)
	if rs.err != nil && r.Context().Err() == nil {
		// The response is cut short: its Content-Length tells the client.
		s.log.Warn("shardq serve: a large message's body failed mid-response", "tenant", tenant, "topic", g.Topic, "group", g.ConsumerGroup, "err", rs.err)
	}
}

// traceContext reads and writes W3C traceparent and tracestate.
var traceContext propagation.TraceContext

// bodySeeker is a large message's body as an io.ReadSeeker for
// http.ServeContent (Range): a seek only moves the position; a read at a
// position behind what was read opens the body again, and one ahead skips
// to it.
type bodySeeker struct {
	size, pos int64
	r         io.Reader // read up to rpos
	rpos      int64
	open      func() (io.Reader, error)
	err       error // the body's failure, for the log
}

// paced gives each write to the client its own deadline, idle from its
// start: reading the body from the database between writes does not count
// against the client. It hides the ResponseWriter's ReadFrom, so that
// every write passes through Write.
type paced struct {
	http.ResponseWriter
	rc   *http.ResponseController
	idle time.Duration
}

func (p paced) Write(b []byte) (int, error) {
	p.rc.SetWriteDeadline(time.Now().Add(p.idle)) //nolint:errcheck // not every writer has deadlines
	return p.ResponseWriter.Write(b)
}

func (p paced) Unwrap() http.ResponseWriter { return p.ResponseWriter }

func (b *bodySeeker) Seek(offset int64, whence int) (int64, error) {
	switch whence {
	case io.SeekStart:
	case io.SeekCurrent:
		offset += b.pos
	case io.SeekEnd:
		offset += b.size
	}
	if offset < 0 {
		return 0, errors.New("seek before the start")
	}
	b.pos = offset
	return offset, nil
}

func (b *bodySeeker) Read(p []byte) (int, error) {
	if b.pos >= b.size {
		return 0, io.EOF
	}
	if b.rpos > b.pos {
		r, err := b.open()
		if err != nil {
			b.err = err
			return 0, err
		}
		b.r, b.rpos = r, 0
	}
	if b.rpos < b.pos {
		n, err := io.CopyN(io.Discard, b.r, b.pos-b.rpos)
		b.rpos += n
		if err != nil {
			b.err = err
			return 0, err
		}
	}
	n, err := b.r.Read(p)
	if err == nil && b.rpos+int64(n) == b.size {
		// The last bytes: the body checks its size and SHA-256 on the
		// read after them. A mismatch withholds them, so that the
		// response falls short of its Content-Length.
		if _, err = b.r.Read(nil); err == io.EOF {
			err = nil
		}
	}
	if err != nil && err != io.EOF {
		b.err = err
		return 0, err
	}
	b.rpos += int64(n)
	b.pos += int64(n)
	return n, err
}

// transfer bounds a large upload, body download or export: it holds one
// of MaxLargeTransfers slots, of which one token holds at most
// MaxLargeTransfersPerToken and one tenant MaxLargeTransfersPerTenant
// (429 past any), lasts at most LargeTransferTimeout, and is cut once it
// moves fewer than MinTransferRate bytes in a TransferRateWindow (its
// reads and writes fail, errTransferTooSlow), so that slow clients give
// their slots back.
func (s *Server) transfer(next func(http.ResponseWriter, *http.Request, string)) func(http.ResponseWriter, *http.Request, string) {
	return func(w http.ResponseWriter, r *http.Request, tenant string) {
		id, _ := r.Context().Value(tokenIDKey{}).(string)
		if detail := s.startTransfer(id, tenant); detail != "" {
			w.Header().Set("Retry-After", "1")
			writeProblem(w, problem{Type: typeRate, Status: http.StatusTooManyRequests, Detail: detail})
			return
		}
		defer s.endTransfer(id, tenant)
		ctx, cancel := context.WithTimeout(r.Context(), s.cfg.LargeTransferTimeout)
		defer cancel()
		// Each way on its own: an upload's answer, written once its body
		// is read, is not held to the pace of the body.
		in := &meter{clock: s.cfg.Clock, min: s.cfg.MinTransferRate, window: s.cfg.TransferRateWindow}
		out := &meter{clock: s.cfg.Clock, min: s.cfg.MinTransferRate, window: s.cfg.TransferRateWindow}
		r = r.WithContext(ctx)
		r.Body = meteredBody{r.Body, in}
		next(meteredWriter{w, out}, r, tenant)
		if in.wasCut() || out.wasCut() {
			s.log.Info("shardq serve: a large-message transfer was cut for its pace", "route", r.Pattern, "tenant", tenant, "token_id", id,
				"min_bytes", s.cfg.MinTransferRate, "window", s.cfg.TransferRateWindow)
		}
	}
}

// startTransfer takes a slot for token in tenant, or says why not.
func (s *Server) startTransfer(token, tenant string) string {
	s.transferMu.Lock()
	defer s.transferMu.Unlock()
	switch {
	case s.transferring >= s.cfg.MaxLargeTransfers:
		return fmt.Sprintf("all %d large-message transfers of this server are in use (uploads, body downloads, exports); try again", s.cfg.MaxLargeTransfers)
	case s.byToken[token] >= s.cfg.MaxLargeTransfersPerToken:
		return fmt.Sprintf("this token holds %d large-message transfers, the most one token may (--max-large-transfers-per-token); try again when one ends", s.byToken[token])
	case s.byTenant[tenant] >= s.cfg.MaxLargeTransfersPerTenant:
		return fmt.Sprintf("tenant %q holds %d large-message transfers, the most one tenant may (--max-large-transfers-per-tenant); try again when one ends", tenant, s.byTenant[tenant])
	}
	s.transferring++
	s.byToken[token]++
	s.byTenant[tenant]++
	return ""
}

func (s *Server) endTransfer(token, tenant string) {
	s.transferMu.Lock()
	defer s.transferMu.Unlock()
	s.transferring--
	for m, k := range map[*map[string]int]string{&s.byToken: token, &s.byTenant: tenant} {
		if (*m)[k]--; (*m)[k] == 0 {
			delete(*m, k)
		}
	}
}

// errTransferTooSlow fails a transfer's reads and writes once it moved
// fewer than MinTransferRate bytes in a TransferRateWindow.
var errTransferTooSlow = errors.New("the transfer is too slow")

// tooSlow says why a transfer was cut.
func (s *Server) tooSlow() string {
	return fmt.Sprintf("the transfer moved fewer than %d bytes in %s, this server's least (--min-transfer-rate, --transfer-rate-window): it was cut",
		s.cfg.MinTransferRate, s.cfg.TransferRateWindow)
}

// meter is a transfer's progress one way, checked at each read or write
// from the first: once a window has passed since the last check that
// passed, the bytes moved since must be at least min per window, on
// average. Whatever slows the transfer counts (the client, the database,
// the tenant's own publish_byte_rate): a slot is held only by a transfer
// that moves. A transfer that does not move at all is cut by its read or
// write deadline (ReadTimeout, WriteTimeout).
type meter struct {
	clock  func() time.Time
	min    int64 // < 0: no minimum
	window time.Duration

	mu    sync.Mutex
	start time.Time
	moved int64
	cut   bool
}

// add counts n bytes moved and reports whether the transfer is cut.
func (m *meter) add(n int) bool {
	if m.min < 0 {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cut {
		return true
	}
	now := m.clock()
	if m.start.IsZero() {
		m.start, m.moved = now, int64(n)
		return false
	}
	m.moved += int64(n)
	elapsed := now.Sub(m.start)
	if elapsed < m.window {
		return false
	}
	if float64(m.moved) < float64(m.min)*elapsed.Seconds()/m.window.Seconds() {
		m.cut = true
		return true
	}
	m.start, m.moved = now, 0
	return false
}

func (m *meter) wasCut() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cut
}

// meteredBody is a transfer's request body, cut when it is too slow.
type meteredBody struct {
	io.ReadCloser
	m *meter
}

func (b meteredBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if b.m.add(n) {
		return n, errTransferTooSlow
	}
	return n, err
}

// meteredWriter is a transfer's response, cut when it is too slow: the
// response falls short of its length, which tells the client.
type meteredWriter struct {
	http.ResponseWriter
	m *meter
}

func (w meteredWriter) Write(b []byte) (int, error) {
	if w.m.add(0) {
		return 0, errTransferTooSlow
	}
	n, err := w.ResponseWriter.Write(b)
	if err == nil && w.m.add(n) {
		return n, errTransferTooSlow
	}
	return n, err
}

func (w meteredWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
