// SPDX-License-Identifier: Apache-2.0

package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/shardq/shardq"
)

// problem is an RFC 9457 problem document. Field and Rule name what input
// broke, as shardq's validation errors do.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	Field  string `json:"field,omitempty" description:"the input that broke a rule"`
	Rule   string `json:"rule,omitempty"`
	// Quota and Limit name the tenant's quota a publish went over.
	Quota string `json:"quota,omitempty" description:"quota-exceeded: the quota (publish_rate, publish_byte_rate, max_messages, max_bytes, max_partitions)"`
	Limit int64  `json:"limit,omitempty" description:"quota-exceeded: the quota's limit"`
	// Settled and Stale, on a 409 of ack or nack: how many receipts of the
	// request were settled, and the indexes of the stale ones.
	Settled *int  `json:"settled,omitempty" description:"ack/nack: receipts settled"`
	Stale   []int `json:"stale,omitempty" description:"ack/nack: indexes of stale receipts"`
}

// Problem types: a URN per kind, "about:blank" for plain HTTP statuses.
const (
	typeValidation = "urn:shardq:problem:validation"
	typeStale      = "urn:shardq:problem:stale-receipt"
	typeAuth       = "urn:shardq:problem:unauthorized"
	typeForbidden  = "urn:shardq:problem:forbidden"
	typeRate       = "urn:shardq:problem:rate-limited"
	typeTooLarge   = "urn:shardq:problem:body-too-large"
	typeInternal   = "urn:shardq:problem:internal"
	typeNotFound   = "urn:shardq:problem:not-found"
	typeConflict   = "urn:shardq:problem:conflict"
	typeUnavail    = "urn:shardq:problem:unavailable"
	typeSuspended  = "urn:shardq:problem:tenant-suspended"
	typeQuota      = "urn:shardq:problem:quota-exceeded"
	typeTooSlow    = "urn:shardq:problem:transfer-too-slow"
	typeIncomplete = "urn:shardq:problem:incomplete-request"
)

func writeProblem(w http.ResponseWriter, p problem) {
	if p.Title == "" {
		p.Title = http.StatusText(p.Status)
	}
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(p.Status)
	json.NewEncoder(w).Encode(p) //nolint:errcheck // the client went away: nothing to tell it
}

// apiFields turns the library's field names into the API's JSON names.
var apiFields = map[string]string{"partition key": "key", "message id": "id", "consumer group": "group"}

func invalid(field, rule string) problem {
	if f, ok := apiFields[field]; ok {
		field = f
	}
	return problem{Type: typeValidation, Status: http.StatusBadRequest, Title: "invalid request", Field: field, Rule: rule, Detail: field + ": " + rule}
}

// fail answers err as a problem: validation errors name their field and
// rule; a stale receipt is a conflict; what the server cannot say more
// about is logged and answered as an internal error without its text.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	var ve *shardq.ValidationError
	var me *shardq.MessageError
	var qe *shardq.QuotaExceededError
	switch {
	case errors.As(err, &me) && errors.As(me.Err, &ve):
		p := invalid(ve.Field, ve.Rule)
		p.Field = fmt.Sprintf("messages[%d].%s", me.Index, p.Field)
		p.Detail = p.Field + ": " + p.Rule
		writeProblem(w, p)
	case errors.As(err, &ve):
		writeProblem(w, invalid(ve.Field, ve.Rule))
	case errors.Is(err, shardq.ErrStaleReceipt):
		writeProblem(w, problem{Type: typeStale, Status: http.StatusConflict, Title: "stale receipt", Detail: err.Error()})
	case errors.Is(err, shardq.ErrNoMessage):
		writeProblem(w, problem{Type: typeNotFound, Status: http.StatusNotFound, Detail: err.Error()})
	case errors.Is(err, shardq.ErrTenantSuspended):
		// The token is good; the tenant may not act now.
		writeProblem(w, problem{Type: typeSuspended, Status: http.StatusForbidden, Title: "tenant suspended", Detail: err.Error()})
	case errors.As(err, &qe):
		// A rate clears with time: 429 and when. What is stored clears
		// only when the tenant stores less or its quota grows: 409, a
		// state of the tenant to change, not a server's to wait out (507
		// and other 5xx are retried blindly by many clients).
		// A call larger than a second's worth never fits: 413, split it.
		p := problem{Type: typeQuota, Status: http.StatusConflict, Title: "quota exceeded", Detail: err.Error(), Quota: qe.Quota, Limit: qe.Limit}
		switch {
		case qe.Quota != shardq.QuotaPublishRate && qe.Quota != shardq.QuotaPublishByteRate:
		case qe.RetryAfter == 0:
			p.Status = http.StatusRequestEntityTooLarge
		default:
			p.Status = http.StatusTooManyRequests
			w.Header().Set("Retry-After", strconv.FormatInt(int64((qe.RetryAfter+time.Second-1)/time.Second), 10))
		}
		writeProblem(w, p)
	case errors.Is(err, shardq.ErrPartitionLeased), errors.Is(err, shardq.ErrGroupLive), errors.Is(err, shardq.ErrTenantLive):
		writeProblem(w, problem{Type: typeConflict, Status: http.StatusConflict, Detail: err.Error()})
	case errors.Is(err, shardq.ErrNotMigrated):
		writeProblem(w, problem{Type: typeUnavail, Status: http.StatusServiceUnavailable, Detail: "the database is not migrated: run `shardq migrate`"})
	case errors.Is(err, context.Canceled) && r.Context().Err() != nil:
		// The client shut its side of the connection (or left): one that
		// still reads must not take an empty 200 for success.
		writeProblem(w, problem{Type: typeIncomplete, Status: http.StatusBadRequest,
			Detail: "the client shut its side of the connection before the request was served: it was cut short"})
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, shardq.ErrClosed):
		writeProblem(w, problem{Type: typeUnavail, Status: http.StatusServiceUnavailable, Detail: "the database did not answer in time; try again"})
	default:
		s.log.Error("shardq serve: request failed", "method", r.Method, "path", r.URL.Path, "err", err)
		writeProblem(w, problem{Type: typeInternal, Status: http.StatusInternalServerError, Detail: "the server failed; its log says why"})
	}
}

// writeJSON answers v as JSON, HTML escaping off (a JSON API, not a
// page: escaping '<' to six bytes only grows the body).
func writeJSON(w http.ResponseWriter, status int, v any) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		writeProblem(w, problem{Type: typeInternal, Status: http.StatusInternalServerError, Detail: "encoding the response failed"})
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(b.Len()))
	w.WriteHeader(status)
	w.Write(b.Bytes()) //nolint:errcheck // the client went away
}

// writeMessages streams {"<list>": [...], "truncated": bool} and, when
// extra is not nil, extra's fields: each item turned into its view and
// encoded one at a time, so a response holds no more than one item's view
// and encoding besides what the caller holds.
func writeMessages[T, O any](w http.ResponseWriter, list string, items []T, extra any, view func(T) O, truncated bool) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	io.WriteString(w, `{"`+list+`":[`) //nolint:errcheck // the client went away: later writes fail too
	for i, it := range items {
		buf.Reset()
		if i > 0 {
			buf.WriteByte(',')
		}
		if enc.Encode(view(it)) != nil {
			return // our own types: cannot fail
		}
		if _, err := w.Write(bytes.TrimSuffix(buf.Bytes(), []byte("\n"))); err != nil {
			return // the client went away
		}
	}
	fmt.Fprintf(w, "],\"truncated\":%t", truncated)
	if extra != nil {
		buf.Reset()
		if enc.Encode(extra) == nil { // our own types: cannot fail
			fields := bytes.TrimSuffix(bytes.TrimPrefix(bytes.TrimSpace(buf.Bytes()), []byte("{")), []byte("}"))
			if len(fields) > 0 {
				io.WriteString(w, ",") //nolint:errcheck // as above
				w.Write(fields)        //nolint:errcheck
			}
		}
	}
	io.WriteString(w, "}\n") //nolint:errcheck
}
