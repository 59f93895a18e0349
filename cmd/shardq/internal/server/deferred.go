// SPDX-License-Identifier: Apache-2.0

package server

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/shardq/shardq"
)

// deferredCountOut answers a defer.
type deferredCountOut struct {
	Deferred int `json:"deferred"`
}

// deferMessages sets the messages of receipts aside (Receipts.Defer).
func (s *Server) deferMessages(w http.ResponseWriter, r *http.Request, tenant string) {
	// A settle's body, so that one body serves ack and defer; a nack's
	// retry_after and reason are refused.
	in, _, err := decodeSettle(r.Body, false)
	if err != nil {
		s.decodeError(w, r, err)
		return
	}
	stale, err := s.cfg.Receipts.Defer(r.Context(), shardq.GroupRef{Tenant: tenant, Topic: r.PathValue("topic"), ConsumerGroup: r.PathValue("group")}, in.Receipts)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeReceiptsDone(w, "deferred", len(in.Receipts), stale, " (their lease or claim moved on, or a later ack settled them: the messages are delivered again or settled)",
		func(n int) deferredCountOut { return deferredCountOut{Deferred: n} })
}

// deferredReceiveIn names deferred messages by offset; visibility is in
// seconds.
type deferredReceiveIn struct {
	Offsets    []int64  `json:"offsets" required:"true" minItems:"1" maxItems:"100" description:"offsets of messages this group deferred (1 to 100, and no more than --max-response-bytes holds of the largest message)"`
	Visibility *float64 `json:"visibility" description:"seconds the messages are held (1 to 43200) [30]"`
}

// deferredMessagesOut is a deferred receive's answer, as
// receiveDeferred streams it.
type deferredMessagesOut struct {
	Messages  []messageOut `json:"messages" description:"those of offsets that are deferred, stored, and held by no other receive, in offset order"`
	Truncated bool         `json:"truncated" description:"always false: offsets past the response's byte budget are left deferred, and only those handed out are listed"`
}

// maxDeferredOffsets is how many deferred messages one request may name:
// as many of the largest message as MaxResponseBytes holds, at least
// one. Their JSON may take more (MessageBytes): those past the budget
// are left deferred, and the answer lists only those handed out.
func (s *Server) maxDeferredOffsets() int {
	return int(min(int64(shardq.MaxDeferredOffsets), max(1, s.cfg.MaxResponseBytes/s.cfg.Client.MaxMessageBytes())))
}

// receiveDeferred hands out deferred messages by offset, with receipts.
func (s *Server) receiveDeferred(w http.ResponseWriter, r *http.Request, tenant string) {
	var in deferredReceiveIn
	err := decodeJSON(r.Body, &in)
	if n := s.maxDeferredOffsets(); err == nil && len(in.Offsets) > n {
		err = &shardq.ValidationError{Field: "offsets", Rule: fmt.Sprintf("%d offsets, limit %d a request (the response's byte limit)", len(in.Offsets), n)}
	}
	var vis time.Duration
	if err == nil && in.Visibility != nil {
		if vis, err = seconds("visibility", *in.Visibility, shardq.MaxVisibility); err == nil && vis == 0 {
			err = &shardq.ValidationError{Field: "visibility", Rule: "must be positive"}
		}
	}
	if err != nil {
		s.decodeError(w, r, err)
		return
	}
	got, err := s.cfg.Receipts.ReceiveDeferred(r.Context(), shardq.DeferredRequest{Tenant: tenant, Topic: r.PathValue("topic"),
		ConsumerGroup: r.PathValue("group"), Offsets: in.Offsets, Visibility: vis,
		MaxBytes: max(1, s.cfg.MaxResponseBytes-int64(len(in.Offsets))*responseBytesPerMessage)})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeMessages(w, "messages", got, nil, func(m shardq.ReceivedMessage) messageOut {
		out := messageOf(m.PartitionKey, m.ID, m.Offset, m.Headers, m.Payload, m.CreatedAt, m.NotBefore)
		out.Attempt, out.Receipt = m.Attempt, m.Receipt
		if !m.ExpiresAt.IsZero() {
			out.ExpiresAt = &m.ExpiresAt
		}
		return out
	}, false)
}

type deferredOut struct {
	Key        string     `json:"key"`
	ID         string     `json:"id"`
	Offset     int64      `json:"offset"`
	CreatedAt  time.Time  `json:"created_at"`
	DeferredAt time.Time  `json:"deferred_at"`
	Attempts   int        `json:"attempts" description:"deliveries since it was deferred"`
	HeldBy     string     `json:"held_by,omitempty" description:"the receive that holds it, until held_until"`
	HeldUntil  *time.Time `json:"held_until,omitempty"`
}

// deferredListOut lists a group's deferred messages.
type deferredListOut struct {
	Deferred []deferredOut `json:"deferred"`
}

// listDeferred lists a group's deferred messages (?after=offset&limit=n).
func (s *Server) listDeferred(w http.ResponseWriter, r *http.Request, tenant string) {
	q := r.URL.Query()
	var after int64
	limit := shardq.DefaultPageLimit
	var err error
	if v := q.Get("after"); v != "" {
		if after, err = strconv.ParseInt(v, 10, 64); err != nil || after < 0 {
			err = &shardq.ValidationError{Field: "after", Rule: "want an offset, 0 or more"}
		}
	}
	if v := q.Get("limit"); err == nil && v != "" {
		if limit, err = strconv.Atoi(v); err != nil || limit < 1 || limit > shardq.MaxPageLimit {
			err = &shardq.ValidationError{Field: "limit", Rule: fmt.Sprintf("want 1 to %d", shardq.MaxPageLimit)}
		}
	}
	if err != nil {
		s.decodeError(w, r, err)
		return
	}
	list, err := s.admin.Deferred(r.Context(), shardq.GroupRef{Tenant: tenant, Topic: r.PathValue("topic"), ConsumerGroup: r.PathValue("group")}, after, limit)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := make([]deferredOut, len(list))
	for i, d := range list {
		out[i] = deferredOut{Key: d.PartitionKey, ID: d.ID, Offset: d.Offset, CreatedAt: d.CreatedAt, DeferredAt: d.DeferredAt, Attempts: d.Attempts, HeldBy: d.HeldBy}
		if !d.HeldUntil.IsZero() {
			out[i].HeldUntil = &d.HeldUntil
		}
	}
	writeJSON(w, http.StatusOK, deferredListOut{Deferred: out})
}
