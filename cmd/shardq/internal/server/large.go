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
	"time"

	"github.com/shardq/shardq"
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
)

// largeOut describes a large message in a receive's answer.
type largeOut struct {
	Bytes  int64  `json:"bytes"`
	Chunks int    `json:"chunks"`
	SHA256 string `json:"sha256"`
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

// uploadBody reads an upload: it pushes the connection's read deadline on
// at each read, and at EOF checks the client's digest, failing the read
// (and so the write, which stores an aborted end marker) on a mismatch.
type uploadBody struct {
	r       io.Reader
	rc      *http.ResponseController
	idle    time.Duration
	want    []byte
	sum     hash.Hash
	limited bool // the body passed MaxLargeBytes
}

func (b *uploadBody) Read(p []byte) (int, error) {
	b.rc.SetReadDeadline(time.Now().Add(b.idle)) //nolint:errcheck // not every writer has deadlines
	n, err := b.r.Read(p)
	b.sum.Write(p[:n])
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		b.limited = true
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
	SHA256    string `json:"sha256"`
	EndOffset int64  `json:"end_offset"`
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
	switch {
	case body.limited:
		writeProblem(w, problem{Type: typeTooLarge, Status: http.StatusRequestEntityTooLarge,
			Detail: fmt.Sprintf("the body passed this server's %d bytes; nothing was stored (the chunks so far are marked aborted)", s.cfg.MaxLargeBytes)})
	case errors.Is(err, errDigestMismatch):
		writeProblem(w, invalid("Repr-Digest", "the body's SHA-256 differs; nothing was stored (the chunks are marked aborted)"))
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

// transfer bounds a large upload or download: it holds one of
// MaxLargeTransfers slots, of which one token holds at most half (429
// past either), and lasts at most LargeTransferTimeout.
func (s *Server) transfer(next func(http.ResponseWriter, *http.Request, string)) func(http.ResponseWriter, *http.Request, string) {
	return func(w http.ResponseWriter, r *http.Request, tenant string) {
		id, _ := r.Context().Value(tokenIDKey{}).(string)
		if !s.startTransfer(id) {
			w.Header().Set("Retry-After", "1")
			writeProblem(w, problem{Type: typeRate, Status: http.StatusTooManyRequests,
				Detail: fmt.Sprintf("too many large-message transfers in flight (at most %d on this server, %d per token); try again",
					s.cfg.MaxLargeTransfers, s.perTokenTransfers())})
			return
		}
		defer s.endTransfer(id)
		ctx, cancel := context.WithTimeout(r.Context(), s.cfg.LargeTransferTimeout)
		defer cancel()
		next(w, r.WithContext(ctx), tenant)
	}
}

// perTokenTransfers is how many transfers one token may hold: half the
// server's, at least one, so that one client cannot take them all.
func (s *Server) perTokenTransfers() int { return max(1, s.cfg.MaxLargeTransfers/2) }

func (s *Server) startTransfer(token string) bool {
	s.transferMu.Lock()
	defer s.transferMu.Unlock()
	if s.transferring >= s.cfg.MaxLargeTransfers || s.transfersOf[token] >= s.perTokenTransfers() {
		return false
	}
	s.transferring++
	s.transfersOf[token]++
	return true
}

func (s *Server) endTransfer(token string) {
	s.transferMu.Lock()
	defer s.transferMu.Unlock()
	s.transferring--
	if s.transfersOf[token]--; s.transfersOf[token] == 0 {
		delete(s.transfersOf, token)
	}
}
