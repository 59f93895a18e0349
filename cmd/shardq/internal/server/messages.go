// SPDX-License-Identifier: Apache-2.0

package server

import (
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"time"
	"unicode/utf8"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/internal/ident"
)

// messageIn is one message of a publish request. The payload is text
// (payload) or bytes (payload_base64); delay is in seconds.
type messageIn struct {
	Key           string            `json:"key" description:"partition key: the ordering unit; empty = ungrouped"`
	ID            string            `json:"id" description:"idempotency key; a UUIDv7 when empty"`
	Headers       map[string]string `json:"headers"`
	Payload       *string           `json:"payload" description:"text payload"`
	PayloadBase64 *string           `json:"payload_base64" description:"binary payload, standard base64"`
	Delay         float64           `json:"delay" minimum:"0" description:"seconds before delivery"`
	NotBefore     *time.Time        `json:"not_before"`
	TTL           float64           `json:"ttl" minimum:"0" description:"seconds until the message expires (never handed out after; dead-lettered when the consumer asks); set ttl or expires_at"`
	ExpiresAt     *time.Time        `json:"expires_at" description:"when the message expires"`
}

// publishIn is a publish request: one message, or {"messages": [...]}.
type publishIn struct {
	messageIn
	Messages []messageIn `json:"messages" minItems:"1" maxItems:"1000"`
}

// Description is PublishRequest's in the OpenAPI document.
func (publishIn) Description() string {
	return `one message, or {"messages": [...]} (at most 1000, one transaction, one tenant)`
}

// decodePublish turns a publish body into messages for tenant and topic,
// checking what the library does not (payload encoding, delay form); the
// library checks the rest before any SQL.
func decodePublish(body io.Reader, tenant, topic string) ([]shardq.Message, error) {
	var in publishIn
	if err := decodeJSON(body, &in); err != nil {
		return nil, err
	}
	list := in.Messages
	single := in.messageIn.Key != "" || in.messageIn.ID != "" || in.messageIn.Headers != nil || in.messageIn.Payload != nil ||
		in.messageIn.PayloadBase64 != nil || in.messageIn.Delay != 0 || in.messageIn.NotBefore != nil || in.messageIn.TTL != 0 || in.messageIn.ExpiresAt != nil
	switch {
	case list != nil && single:
		return nil, &shardq.ValidationError{Field: "body", Rule: `either one message or "messages", not both`}
	case list == nil:
		list = []messageIn{in.messageIn}
	case len(list) == 0:
		return nil, &shardq.ValidationError{Field: "messages", Rule: "must not be empty"}
	}
	out := make([]shardq.Message, len(list))
	for i, m := range list {
		field := func(f string) string {
			if in.Messages == nil {
				return f
			}
			return fmt.Sprintf("messages[%d].%s", i, f)
		}
		msg := shardq.Message{Tenant: tenant, Topic: topic, PartitionKey: m.Key, ID: m.ID, Headers: m.Headers}
		switch {
		case m.Payload != nil && m.PayloadBase64 != nil:
			return nil, &shardq.ValidationError{Field: field("payload"), Rule: "set payload or payload_base64, not both"}
		case m.Payload != nil:
			msg.Payload = []byte(*m.Payload)
		case m.PayloadBase64 != nil:
			p, err := base64.StdEncoding.DecodeString(*m.PayloadBase64)
			if err != nil {
				return nil, &shardq.ValidationError{Field: field("payload_base64"), Rule: "not standard base64"}
			}
			msg.Payload = p
		}
		d, err := seconds(field("delay"), m.Delay, 0)
		if err != nil {
			return nil, err
		}
		msg.Delay = d
		if m.NotBefore != nil {
			msg.NotBefore = *m.NotBefore
		}
		if msg.TTL, err = seconds(field("ttl"), m.TTL, 0); err != nil {
			return nil, err
		}
		if m.ExpiresAt != nil {
			msg.ExpiresAt = *m.ExpiresAt
		}
		out[i] = msg
	}
	return out, nil
}

// seconds is a non-negative number of seconds as a duration (limit 0: any
// the library accepts, which it checks).
func seconds(field string, v float64, limit time.Duration) (time.Duration, error) {
	if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) || v > float64(math.MaxInt64/int64(time.Second)) {
		return 0, &shardq.ValidationError{Field: field, Rule: "want a number of seconds, 0 or more"}
	}
	d := time.Duration(v * float64(time.Second))
	if limit > 0 && d > limit {
		return 0, &shardq.ValidationError{Field: field, Rule: fmt.Sprintf("%g seconds, limit %g", v, limit.Seconds())}
	}
	return d, nil
}

// publishOut answers a publish: a result per message, in order.
type publishOut struct {
	Results []publishResultOut `json:"results"`
}

type publishResultOut struct {
	Key       string `json:"key"`
	ID        string `json:"id"`
	Offset    int64  `json:"offset"`
	Duplicate bool   `json:"duplicate"`
}

func (s *Server) publish(w http.ResponseWriter, r *http.Request, tenant string) {
	msgs, err := decodePublish(r.Body, tenant, r.PathValue("topic"))
	if err != nil {
		s.decodeError(w, r, err)
		return
	}
	res, err := s.cfg.Client.Publish(r.Context(), msgs...)
	var me *shardq.MessageError
	if len(msgs) == 1 && errors.As(err, &me) {
		err = me.Err // one message: its fields are the body's own
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := make([]publishResultOut, len(res))
	for i, p := range res {
		out[i] = publishResultOut{Key: p.PartitionKey, ID: p.ID, Offset: p.Offset, Duplicate: p.Duplicate}
	}
	writeJSON(w, http.StatusOK, publishOut{Results: out})
}

// receiveIn is a receive request; wait and visibility are in seconds.
type receiveIn struct {
	Max        int     `json:"max" description:"1 to 1000 [1], and no more than --max-response-bytes holds"`
	Wait       float64 `json:"wait" description:"long polling, seconds, at most 20 [0]"`
	Visibility float64 `json:"visibility" description:"seconds the messages stay invisible to other receives [30], 1 to 43200"`
	Key        string  `json:"key" description:"one message group"`
	NextGroup  bool    `json:"next_group" description:"a free message group whose next message is among the oldest; with ack settling the whole of a group's previous receive, that group while it has more (at most 10 receives after the one that took it)"`
	Ungrouped  bool    `json:"ungrouped" description:"only ungrouped messages (competing consumers); with none of key, next_group and ungrouped: ungrouped messages when there are any, else the next free message group"`
	// Hold accepts the group as a session, RequireReady only while a
	// message of it is ready; Session receives in one (docs/server.md).
	Hold         bool   `json:"hold" description:"accept the message group (key or next_group) as a session: its lease is kept across receives and the response's session names it; a named group is accepted even while empty unless require_ready"`
	RequireReady bool   `json:"require_ready" description:"with hold and key: accept the group only while a message of it is ready"`
	Session      string `json:"session" description:"receive in the session an earlier receive with hold opened (renews its lease to visibility; hands out from the group's cursor); no key, next_group, ungrouped or hold with it"`
	// Ack holds receipts of earlier receives to acknowledge before this
	// one receives: a consumer's loop in one request a turn.
	Ack []string `json:"ack" maxItems:"1000" description:"receipts of earlier receives to acknowledge first, as POST .../ack does; a malformed one refuses the request (400) before anything is settled or received, a stale one is named in the answer's stale"`
}

func decodeReceive(body io.Reader, tenant, topic, group string) (shardq.ReceiveRequest, error) {
	var in receiveIn
	if err := decodeJSON(body, &in); err != nil {
		return shardq.ReceiveRequest{}, err
	}
	wait, err := seconds("wait", in.Wait, shardq.MaxReceiveWait)
	if err != nil {
		return shardq.ReceiveRequest{}, err
	}
	vis, err := seconds("visibility", in.Visibility, shardq.MaxVisibility)
	if err != nil {
		return shardq.ReceiveRequest{}, err
	}
	return shardq.ReceiveRequest{Tenant: tenant, Topic: topic, ConsumerGroup: group, PartitionKey: in.Key, NextGroup: in.NextGroup, Ungrouped: in.Ungrouped,
		Hold: in.Hold, RequireReady: in.RequireReady, Session: in.Session, Max: in.Max, Wait: wait, Visibility: vis, Ack: in.Ack}, nil
}

// messageOut is a delivered message; the payload is text when it is
// valid UTF-8, else payload_base64.
type messageOut struct {
	Key           string            `json:"key"`
	ID            string            `json:"id"`
	Offset        int64             `json:"offset"`
	Headers       map[string]string `json:"headers"`
	Payload       *string           `json:"payload,omitempty" description:"when valid UTF-8"`
	PayloadBase64 *string           `json:"payload_base64,omitempty" description:"otherwise"`
	CreatedAt     time.Time         `json:"created_at"`
	NotBefore     *time.Time        `json:"not_before,omitempty"`
	ExpiresAt     *time.Time        `json:"expires_at,omitempty" description:"when the message expires (absent: never)"`
	Attempt       int               `json:"attempt,omitempty"`
	Receipt       string            `json:"receipt,omitempty" description:"settles the message: ack or nack"`
	// Large and BodyURL, on a received large message (no payload): what
	// its end marker says, and where its body is read by its receipt.
	Large   *largeOut `json:"large,omitempty" description:"on a large message (no payload): what its end marker says"`
	BodyURL string    `json:"body_url,omitempty" description:"on a large message: GET it (with the token) to read the body"`
}

// receiveOut is a receive's answer, as receive streams it: the
// messages, then receiveExtra's fields.
type receiveOut struct {
	Messages  []messageOut `json:"messages"`
	Truncated bool         `json:"truncated" description:"the response's byte budget (--max-response-bytes) ended it before max/limit: more may be ready"`
	receiveExtra
}

// receiveExtra is what a receive answers besides its messages.
type receiveExtra struct {
	Acked   *int        `json:"acked,omitempty" description:"receipts of the request's ack that were settled; present when the request had ack"`
	Stale   []int       `json:"stale,omitempty" description:"indexes into the request's ack of stale receipts (their messages are delivered again); absent when none"`
	Session *sessionOut `json:"session,omitempty" description:"the message group this receive holds as a session"`
}

// messagesOut is a listing of stored messages (browse, dead letters),
// as writeMessages streams it.
type messagesOut struct {
	Items     []messageOut `json:"items"`
	Truncated bool         `json:"truncated" description:"the response's byte budget (--max-response-bytes) ended it before max/limit: more may be ready"`
}

func messageOf(key, id string, offset int64, headers map[string]string, payload []byte, created, notBefore time.Time) messageOut {
	m := messageOut{Key: key, ID: id, Offset: offset, Headers: headers, CreatedAt: created}
	if m.Headers == nil {
		m.Headers = map[string]string{}
	}
	if utf8.Valid(payload) {
		p := string(payload)
		m.Payload = &p
	} else {
		p := base64.StdEncoding.EncodeToString(payload)
		m.PayloadBase64 = &p
	}
	if !notBefore.IsZero() {
		m.NotBefore = &notBefore
	}
	return m
}

// MessageBytes is what a message takes in a response, as messageOf
// writes it: its key, id, headers and payload as JSON strings, escapes
// included (a byte of \x01 is six), the payload as base64 when it is not
// UTF-8. The Receipts a Server is given count messages by it
// (shardq.ReceiptOptions.MessageBytes), so that a response keeps to
// MaxResponseBytes whatever its messages hold.
func MessageBytes(m shardq.StoredMessage) int64 {
	n := jsonLen(m.PartitionKey) + jsonLen(m.ID)
	if utf8.Valid(m.Payload) {
		n += jsonBytesLen(m.Payload)
	} else {
		n += int64(base64.StdEncoding.EncodedLen(len(m.Payload))) + 2
	}
	for k, v := range m.Headers {
		n += jsonLen(k) + jsonLen(v) + 2 // the colon and comma
	}
	return n
}

// jsonLen is the length of s as a JSON string, quotes included, as
// encoding/json writes it without HTML escapes.
func jsonLen(s string) int64 {
	n := int64(2)
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		n += jsonRuneLen(r, size)
		i += size
	}
	return n
}

// jsonBytesLen is jsonLen of b.
func jsonBytesLen(b []byte) int64 {
	n := int64(2)
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		n += jsonRuneLen(r, size)
		i += size
	}
	return n
}

// jsonRuneLen is what r, size bytes of a string, takes in JSON: a quote,
// a backslash and the short control escapes two bytes; other control
// bytes, invalid UTF-8 and U+2028/U+2029 six (\uXXXX).
func jsonRuneLen(r rune, size int) int64 {
	switch {
	case r == '"' || r == '\\' || r == '\b' || r == '\f' || r == '\n' || r == '\r' || r == '\t':
		return 2
	case r < 0x20 || r == utf8.RuneError && size == 1 || r == '\u2028' || r == '\u2029':
		return 6
	}
	return int64(size)
}

// responseBytesPerMessage bounds what a received message adds to a
// response besides MessageBytes: its receipt (about 2.9 KiB at the
// longest names, TestLongestReceiptSettles), offset, times and the JSON
// around them.
const responseBytesPerMessage = 4 << 10

func (s *Server) receive(w http.ResponseWriter, r *http.Request, tenant string) {
	rq, err := decodeReceive(r.Body, tenant, r.PathValue("topic"), r.PathValue("group"))
	if err == nil {
		err = s.cfg.Receipts.Check(r.Context(), rq) // before the acks: a refused request settles nothing
	}
	if err != nil {
		s.decodeError(w, r, err)
		return
	}
	id, _ := r.Context().Value(tokenIDKey{}).(string)
	done, ok := s.limits.startReceive(id)
	if !ok {
		w.Header().Set("Retry-After", "1")
		writeProblem(w, problem{Type: typeRate, Status: http.StatusTooManyRequests,
			Detail: fmt.Sprintf("too many receives in flight (at most %d on this server, %d per token)", s.cfg.MaxReceives, s.cfg.MaxReceivesPerToken)})
		return
	}
	defer done()
	// A long poll may outlast the server's WriteTimeout: this response's
	// deadline is its wait plus that timeout.
	rc := http.NewResponseController(w)
	rc.SetWriteDeadline(time.Now().Add(rq.Wait + s.cfg.WriteTimeout)) //nolint:errcheck // not every writer has deadlines (tests' recorders)
	rq.Done = s.draining
	// A message's receipt, offset, times and JSON come on top of what
	// MaxBytes counts (MessageBytes): room is kept for them, so that a
	// response of many small messages stays within MaxResponseBytes as
	// one of a few large ones does.
	asked := rq.Max
	rq.Max = min(rq.Max, max(1, int(s.cfg.MaxResponseBytes/(2*responseBytesPerMessage))))
	rq.MaxBytes = max(1, s.cfg.MaxResponseBytes-int64(rq.Max)*responseBytesPerMessage)
	// The acks go first (in Receive), so that the message group they
	// release may be received again at once, or goes on with this
	// receive; a stale receipt does not fail the receive, the answer
	// names it. A malformed one fails it, and settles nothing.
	got, err := s.cfg.Receipts.Receive(r.Context(), rq)
	var settled receiveExtra // Acked is present when the request acked
	if len(rq.Ack) > 0 {
		settled.Acked, settled.Stale = &got.Acked, got.Stale
	}
	if errors.Is(err, shardq.ErrStaleReceipt) && settled.Acked != nil {
		// The session ended; the acks before it stand.
		writeProblem(w, problem{Type: typeStale, Status: http.StatusConflict, Title: "session ended", Detail: err.Error(),
			Settled: settled.Acked, Stale: settled.Stale})
		return
	}
	if errors.Is(err, shardq.ErrTenantSuspended) && settled.Acked != nil {
		// Settling goes on in a suspended tenant: the acks stand.
		writeProblem(w, problem{Type: typeSuspended, Status: http.StatusForbidden, Title: "tenant suspended", Detail: err.Error(),
			Settled: settled.Acked, Stale: settled.Stale})
		return
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if rq.Max < asked && len(got.Messages) == rq.Max {
		got.Truncated = true // the byte budget lowered max: more may be ready
	}
	if gs := got.Session; gs != nil {
		settled.Session = &sessionOut{ID: gs.ID, Key: gs.PartitionKey, ExpiresAt: gs.ExpiresAt}
	}
	writeMessages(w, "messages", got.Messages, settled, func(m shardq.ReceivedMessage) messageOut {
		out := messageOf(m.PartitionKey, m.ID, m.Offset, m.Headers, m.Payload, m.CreatedAt, m.NotBefore)
		out.Attempt, out.Receipt = m.Attempt, m.Receipt
		if !m.ExpiresAt.IsZero() {
			out.ExpiresAt = &m.ExpiresAt
		}
		if m.IsLarge() {
			out.Payload, out.PayloadBase64 = nil, nil
			out.Large = &largeOut{Bytes: m.Size, Chunks: m.Chunks, SHA256: m.SHA256}
			out.BodyURL = bodyURL(tenant, rq.Topic, rq.ConsumerGroup, m.Receipt)
		}
		return out
	}, got.Truncated)
}

// settleIn is an ack or nack request; retry_after is in seconds.
type settleIn struct {
	Receipts   []string `json:"receipts" required:"true" minItems:"1" maxItems:"1000"`
	RetryAfter float64  `json:"retry_after" minimum:"0" maximum:"43200" description:"nack: seconds before the message is delivered again"`
	Reason     string   `json:"reason" description:"nack: recorded as the last error"`
}

// settledOut answers an ack or nack.
type settledOut struct {
	Settled int `json:"settled"`
}

func decodeSettle(body io.Reader, nack bool) (settleIn, time.Duration, error) {
	var in settleIn
	if err := decodeJSON(body, &in); err != nil {
		return in, 0, err
	}
	if err := checkReceipts(in.Receipts); err != nil {
		return in, 0, err
	}
	switch {
	case !nack && (in.RetryAfter != 0 || in.Reason != ""):
		return in, 0, &shardq.ValidationError{Field: "retry_after", Rule: "only a nack takes retry_after and reason"}
	case len(in.Reason) > ident.MaxHeaderValueBytes || !utf8.ValidString(in.Reason):
		return in, 0, &shardq.ValidationError{Field: "reason", Rule: fmt.Sprintf("valid UTF-8 of at most %d bytes", ident.MaxHeaderValueBytes)}
	}
	d, err := seconds("retry_after", in.RetryAfter, shardq.MaxVisibility)
	return in, d, err
}

// checkReceipts refuses a request's list of receipts when it is empty or
// longer than a request may name.
func checkReceipts(receipts []string) error {
	switch {
	case len(receipts) == 0:
		return &shardq.ValidationError{Field: "receipts", Rule: "must not be empty"}
	case len(receipts) > shardq.MaxReceiveMessages:
		return &shardq.ValidationError{Field: "receipts", Rule: fmt.Sprintf("%d receipts, limit %d a request", len(receipts), shardq.MaxReceiveMessages)}
	}
	return nil
}

func (s *Server) ack(w http.ResponseWriter, r *http.Request, tenant string) {
	s.settle(w, r, tenant, false)
}

func (s *Server) nack(w http.ResponseWriter, r *http.Request, tenant string) {
	s.settle(w, r, tenant, true)
}

// settle acks or nacks the receipts. A malformed receipt settles none of
// them (400); stale ones change nothing, and the answer is then 409,
// saying which.
func (s *Server) settle(w http.ResponseWriter, r *http.Request, tenant string, nack bool) {
	in, retry, err := decodeSettle(r.Body, nack)
	if err != nil {
		s.decodeError(w, r, err)
		return
	}
	topic, group := r.PathValue("topic"), r.PathValue("group")
	var stale []int
	if nack {
		stale, err = s.cfg.Receipts.NackAll(r.Context(), shardq.GroupRef{Tenant: tenant, Topic: topic, ConsumerGroup: group}, in.Receipts, shardq.NackOptions{RetryAfter: retry, Reason: in.Reason})
	} else {
		stale, err = s.cfg.Receipts.AckAll(r.Context(), shardq.GroupRef{Tenant: tenant, Topic: topic, ConsumerGroup: group}, in.Receipts)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeReceiptsDone(w, "settled", len(in.Receipts), stale, " (their lease or claim moved on: the messages are delivered again)",
		func(n int) settledOut { return settledOut{Settled: n} })
}

// writeReceiptsDone answers a call on n receipts: out of those done
// (what their verb says), or 409 naming the stale ones (why: what that
// means) when there are any.
func writeReceiptsDone[T any](w http.ResponseWriter, verb string, n int, stale []int, why string, out func(done int) T) {
	done := n - len(stale)
	if len(stale) > 0 {
		writeProblem(w, problem{Type: typeStale, Status: http.StatusConflict, Title: "stale receipt",
			Detail:  fmt.Sprintf("%d of %d receipts are stale%s; the others were %s", len(stale), n, why, verb),
			Settled: &done, Stale: stale})
		return
	}
	writeJSON(w, http.StatusOK, out(done))
}
