// SPDX-License-Identifier: Apache-2.0

package server

import (
	"cmp"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/shardq/shardq"
)

// A tenant's life over HTTP: what it stores, suspend and resume, export
// and delete, each for the URL's tenant with its admin token. Listing
// every tenant reads across tenants, which no token may: that is the
// CLI's (shardq admin tenants).

type tenantOut struct {
	Tenant      string          `json:"tenant"`
	SuspendedAt *time.Time      `json:"suspended_at,omitempty" description:"absent while active"`
	Limits      limitsJSON      `json:"limits"`
	Messages    int64           `json:"messages"`
	Partitions  int64           `json:"partitions" description:"partitions with a message"`
	Bytes       int64           `json:"bytes" description:"stored bytes in every topic: what max_bytes counts"`
	Topics      []topicUsageOut `json:"topics"`
}

// limitsJSON is a tenant's quotas and retention (0: none, the default).
type limitsJSON struct {
	PublishRate     int64 `json:"publish_rate" minimum:"0" description:"messages per second, per server process"`
	PublishByteRate int64 `json:"publish_byte_rate" minimum:"0" description:"message bytes per second (payload, headers as stored, key and id), per server process"`
	MaxMessages     int64 `json:"max_messages" minimum:"0" description:"messages stored"`
	MaxBytes        int64 `json:"max_bytes" minimum:"0" description:"bytes stored: messages (payload, headers, key, id), message-group states, deferred rows and the consumer groups' bookkeeping, as the tenant's bytes report them"`
	MaxPartitions   int64 `json:"max_partitions" minimum:"0" description:"partitions with a message"`
	MinRetentionMS  int64 `json:"min_retention_ms" minimum:"0"`
	MaxRetentionMS  int64 `json:"max_retention_ms" minimum:"0"`
}

// Description is TenantLimits's in the OpenAPI document.
func (limitsJSON) Description() string {
	return "a tenant's quotas and retention; 0: no limit, or the cleaner's default retention"
}

func limitsOut(l shardq.TenantLimits) limitsJSON {
	return limitsJSON{l.PublishRate, l.PublishByteRate, l.MaxMessages, l.MaxBytes, l.MaxPartitions,
		l.Retention.MinRetention.Milliseconds(), l.Retention.MaxRetention.Milliseconds()}
}

// tenantLimits answers the tenant's limits; its own admin may read them.
func (s *Server) tenantLimits(w http.ResponseWriter, r *http.Request, tenant string) {
	if err := onlyParams(r); err != nil {
		s.fail(w, r, err)
		return
	}
	l, err := s.admin.TenantLimits(r.Context(), tenant)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, limitsOut(l))
}

// setLimits replaces the tenant's limits (a field left out: 0); an
// operator's, not the tenant's own admin's.
func (s *Server) setLimits(w http.ResponseWriter, r *http.Request, tenant string) {
	var in limitsJSON
	if err := decodeJSON(r.Body, &in); err != nil {
		s.decodeError(w, r, err)
		return
	}
	const maxMS = int64(1<<63-1) / int64(time.Millisecond)
	for _, f := range []struct {
		name string
		v    int64
	}{{"min_retention_ms", in.MinRetentionMS}, {"max_retention_ms", in.MaxRetentionMS}} {
		if f.v < 0 || f.v > maxMS {
			s.fail(w, r, &shardq.ValidationError{Field: f.name, Rule: fmt.Sprintf("%d: want 0 to %d", f.v, maxMS)})
			return
		}
	}
	l := shardq.TenantLimits{PublishRate: in.PublishRate, PublishByteRate: in.PublishByteRate, MaxMessages: in.MaxMessages,
		MaxBytes: in.MaxBytes, MaxPartitions: in.MaxPartitions, Retention: shardq.RetentionPolicy{
			MinRetention: time.Duration(in.MinRetentionMS) * time.Millisecond, MaxRetention: time.Duration(in.MaxRetentionMS) * time.Millisecond}}
	if err := s.admin.SetTenantLimits(r.Context(), tenant, l); err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, limitsOut(l))
}

type topicUsageOut struct {
	Topic         string `json:"topic"`
	Messages      int64  `json:"messages"`
	Partitions    int64  `json:"partitions" description:"partitions with a message"`
	Bytes         int64  `json:"bytes" description:"stored bytes: each message's payload, headers (as stored, JSON), key and id, and state_bytes, deferred_bytes and group_bytes"`
	StateBytes    int64  `json:"state_bytes" description:"of message-group states: each state, key and consumer group"`
	DeferredBytes int64  `json:"deferred_bytes" description:"of deferred rows: each key and consumer group"`
	GroupBytes    int64  `json:"group_bytes" description:"of the consumer groups' bookkeeping: each lease's, cursor's and registry row's key, consumer group and owner, and 32 bytes of its other columns"`
}

// onlyParams refuses a query parameter outside allowed.
func onlyParams(r *http.Request, allowed ...string) error {
	for name := range r.URL.Query() {
		ok := false
		for _, a := range allowed {
			ok = ok || name == a
		}
		if !ok {
			return &shardq.ValidationError{Field: name, Rule: fmt.Sprintf("unknown query parameter: want one of %v", allowed)}
		}
	}
	return nil
}

func (s *Server) tenant(w http.ResponseWriter, r *http.Request, tenant string) {
	if err := onlyParams(r); err != nil {
		s.fail(w, r, err)
		return
	}
	info, err := s.admin.Tenant(r.Context(), tenant)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := tenantOut{Tenant: info.Tenant, Limits: limitsOut(info.Limits), Messages: info.Messages, Partitions: info.Partitions, Bytes: info.Bytes, Topics: []topicUsageOut{}}
	if !info.SuspendedAt.IsZero() {
		at := info.SuspendedAt.UTC()
		out.SuspendedAt = &at
	}
	for _, u := range info.Topics {
		out.Topics = append(out.Topics, topicUsageOut{u.Topic, u.Messages, u.Partitions, u.Bytes, u.StateBytes, u.DeferredBytes, u.GroupBytes})
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) suspend(w http.ResponseWriter, r *http.Request, tenant string) {
	s.suspendOrResume(w, r, tenant, true)
}

func (s *Server) resumeTenant(w http.ResponseWriter, r *http.Request, tenant string) {
	s.suspendOrResume(w, r, tenant, false)
}

func (s *Server) suspendOrResume(w http.ResponseWriter, r *http.Request, tenant string, suspend bool) {
	if err := decodeJSON(r.Body, &emptyIn{}); err != nil {
		s.decodeError(w, r, err)
		return
	}
	op := s.admin.ResumeTenant
	if suspend {
		op = s.admin.SuspendTenant
	}
	if err := op(r.Context(), tenant); err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, suspendedOut{Suspended: suspend})
}

// suspendedOut answers a tenant's suspend or resume.
type suspendedOut struct {
	Suspended bool `json:"suspended"`
}

// export streams the tenant's export as JSON lines: a transfer (one of
// MaxLargeTransfers, each write within WriteTimeout, the whole within
// LargeTransferTimeout). An answer cut short has no "end" line; ?after=
// resumes it.
func (s *Server) export(w http.ResponseWriter, r *http.Request, tenant string) {
	q := r.URL.Query()
	opts := shardq.ExportOptions{After: q.Get("after")}
	if err := onlyParams(r, "after", "batch"); err != nil {
		s.fail(w, r, err)
		return
	}
	if v := q.Get("batch"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > shardq.MaxPageLimit {
			s.fail(w, r, &shardq.ValidationError{Field: "batch", Rule: fmt.Sprintf("%q: want 1 to %d", v, shardq.MaxPageLimit)})
			return
		}
		opts.BatchSize = n
	}
	// A page of rows is held in memory: at most MaxResponseBytes of
	// payloads at the client's largest message size.
	opts.BatchSize = min(cmp.Or(opts.BatchSize, shardq.DefaultExportBatch), max(1, int(s.cfg.MaxResponseBytes/s.cfg.Client.MaxMessageBytes())))
	pw := &pendingWriter{w: paced{w, http.NewResponseController(w), s.cfg.WriteTimeout}}
	_, err := s.admin.ExportTenant(r.Context(), tenant, pw, opts)
	switch {
	case err != nil && !pw.started:
		s.fail(w, r, err) // nothing written yet: a proper answer
	case err != nil && r.Context().Err() == nil:
		// Cut short: the missing end line tells the client.
		s.log.Warn("shardq serve: a tenant's export failed mid-response", "tenant", tenant, "err", err)
	}
}

// pendingWriter sets the export's headers on its first write, so that a
// failure before it can still answer with a problem.
type pendingWriter struct {
	w       paced
	started bool
}

func (p *pendingWriter) Write(b []byte) (int, error) {
	if !p.started {
		p.started = true
		p.w.Header().Set("Content-Type", "application/x-ndjson")
		p.w.Header().Set("Cache-Control", "no-store")
		p.w.WriteHeader(http.StatusOK)
	}
	return p.w.Write(b)
}

type deleteTenantIn struct {
	Execute    bool    `json:"execute"`
	Force      bool    `json:"force"`
	Batch      int     `json:"batch" description:"rows per statement (1 to 10000, default 1000)"`
	StaleAfter float64 `json:"stale_after" minimum:"0" description:"seconds: a heartbeat older than this is not live (0: 9)"`
}

type tableRowsOut struct {
	Table string `json:"table"`
	Rows  int64  `json:"rows"`
}

// deleteTenantOut answers a tenant's deletion: rows per table, deleted
// or previewed.
type deleteTenantOut struct {
	Executed bool           `json:"executed"`
	Tables   []tableRowsOut `json:"tables"`
}

// deleteTenant previews, or with "execute" makes, the deletion of every
// row of the tenant (its tokens too: the token of the request stops
// working here at once, on other servers within their TokenCacheTTL). A
// deletion cut short by the request's deadline is resumed by sending it
// again.
func (s *Server) deleteTenant(w http.ResponseWriter, r *http.Request, tenant string) {
	var in deleteTenantIn
	if err := decodeJSON(r.Body, &in); err != nil {
		s.decodeError(w, r, err)
		return
	}
	opts := shardq.DeleteTenantOptions{Apply: in.Execute, Force: in.Force, BatchSize: in.Batch}
	stale, err := seconds("stale_after", in.StaleAfter, 0)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	opts.StaleAfter = stale
	rows, err := s.admin.DeleteTenant(r.Context(), tenant, opts)
	if c, ok := s.tokens.(*cachedTokens); ok && in.Execute {
		c.forgetTenant(tenant) // even when cut short: its token rows may be gone
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := make([]tableRowsOut, len(rows))
	for i, t := range rows {
		out[i] = tableRowsOut{t.Table, t.Rows}
	}
	writeJSON(w, http.StatusOK, deleteTenantOut{Executed: in.Execute, Tables: out})
}
