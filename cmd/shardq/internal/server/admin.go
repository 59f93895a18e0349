// SPDX-License-Identifier: Apache-2.0

package server

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/shardq/shardq"
)

// The admin endpoints are the CLI's admin commands, scoped to the URL's
// tenant. Listings are pages: ?limit= (at most shardq.MaxPageLimit) and
// ?after= (the sort key's last value, repeated per column).

func (s *Server) scope(q url.Values, tenant string) (shardq.Scope, error) {
	sc := shardq.Scope{Tenants: []string{tenant}, After: q["after"]}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > shardq.MaxPageLimit {
			return sc, &shardq.ValidationError{Field: "limit", Rule: fmt.Sprintf("%q: want 1 to %d", v, shardq.MaxPageLimit)}
		}
		sc.Limit = n
	}
	return sc, nil
}

// list runs a listing of the URL's tenant and answers {"items": [...]}.
func list[T, O any](s *Server, w http.ResponseWriter, r *http.Request, tenant string, read func(shardq.Scope) ([]T, error), view func(T) O) {
	sc, err := s.scope(r.URL.Query(), tenant)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	rows, err := read(sc)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := make([]O, len(rows))
	for i, x := range rows {
		out[i] = view(x)
	}
	writeJSON(w, http.StatusOK, listOut[O]{Items: out})
}

// listOut is a listing's page.
type listOut[O any] struct {
	Items []O `json:"items"`
}

type topicOut struct {
	Topic      string `json:"topic"`
	Partitions int    `json:"partitions"`
	HeadOffset int64  `json:"head_offset"`
}

func (s *Server) topics(w http.ResponseWriter, r *http.Request, tenant string) {
	list(s, w, r, tenant, func(sc shardq.Scope) ([]shardq.TopicInfo, error) { return s.admin.Topics(r.Context(), sc) },
		func(t shardq.TopicInfo) topicOut { return topicOut{t.Topic, t.Partitions, t.HeadOffset} })
}

type offsetOut struct {
	Key              string     `json:"key"`
	Group            string     `json:"group"`
	HeadOffset       int64      `json:"head_offset"`
	CommittedOffset  int64      `json:"committed_offset"`
	Lag              int64      `json:"lag"`
	LagCapped        bool       `json:"lag_capped,omitempty"`
	Scheduled        int64      `json:"scheduled,omitempty"`
	OldestUnconsumed *time.Time `json:"oldest_unconsumed,omitempty"`
	NoCursor         bool       `json:"no_cursor,omitempty"`
	Deferred         int64      `json:"deferred,omitempty"`
}

func offsetView(o shardq.GroupOffset) offsetOut {
	v := offsetOut{Key: o.PartitionKey, Group: o.ConsumerGroup, HeadOffset: o.HeadOffset, CommittedOffset: o.CommittedOffset,
		Lag: o.Lag, LagCapped: o.LagCapped, Scheduled: o.Scheduled, NoCursor: o.NoCursor, Deferred: o.Deferred}
	if !o.OldestUnconsumed.IsZero() {
		t := o.OldestUnconsumed
		v.OldestUnconsumed = &t
	}
	return v
}

// offsets lists the topic's cursors (of ?group=, or all groups).
func (s *Server) offsets(w http.ResponseWriter, r *http.Request, tenant string) {
	topic, group := r.PathValue("topic"), r.URL.Query().Get("group")
	list(s, w, r, tenant, func(sc shardq.Scope) ([]shardq.GroupOffset, error) {
		all, err := s.admin.Offsets(r.Context(), sc, group)
		var out []shardq.GroupOffset
		for _, o := range all {
			if o.Topic == topic {
				out = append(out, o)
			}
		}
		return out, err
	}, offsetView)
}

type groupOut struct {
	Group        string     `json:"group"`
	Members      int        `json:"members"`
	Live         int        `json:"live"`
	Partitions   int        `json:"partitions"`
	Unread       int        `json:"unread"`
	Lag          int64      `json:"lag"`
	LagCapped    bool       `json:"lag_capped,omitempty"`
	Paused       bool       `json:"paused"`
	LastActivity *time.Time `json:"last_activity,omitempty"`
}

func groupView(g shardq.GroupInfo) groupOut {
	v := groupOut{g.ConsumerGroup, g.Members, g.Live, g.Partitions, g.Unread, g.Lag, g.LagCapped, g.Paused, nil}
	if !g.LastActivity.IsZero() {
		t := g.LastActivity
		v.LastActivity = &t
	}
	return v
}

func (s *Server) groups(w http.ResponseWriter, r *http.Request, tenant string) {
	list(s, w, r, tenant, func(sc shardq.Scope) ([]shardq.GroupInfo, error) {
		return s.admin.Groups(r.Context(), shardq.Scope{Tenants: sc.Tenants}, r.PathValue("topic"), s.cfg.StaleAfter)
	}, groupView)
}

type leaseOut struct {
	Topic     string    `json:"topic"`
	Group     string    `json:"group"`
	Key       string    `json:"key"`
	Owner     string    `json:"owner"`
	Token     int64     `json:"token"`
	ExpiresAt time.Time `json:"expires_at"`
}

func (s *Server) leases(w http.ResponseWriter, r *http.Request, tenant string) {
	list(s, w, r, tenant, func(sc shardq.Scope) ([]shardq.Lease, error) { return s.admin.Leases(r.Context(), sc) },
		func(l shardq.Lease) leaseOut {
			return leaseOut{l.Topic, l.ConsumerGroup, l.PartitionKey, l.Owner, l.Token, l.ExpiresAt}
		})
}

type memberOut struct {
	Topic       string    `json:"topic"`
	Group       string    `json:"group"`
	ID          string    `json:"id"`
	StartedAt   time.Time `json:"started_at"`
	HeartbeatAt time.Time `json:"heartbeat_at"`
}

func (s *Server) subscribers(w http.ResponseWriter, r *http.Request, tenant string) {
	list(s, w, r, tenant, func(sc shardq.Scope) ([]shardq.Member, error) { return s.admin.Subscribers(r.Context(), sc) },
		func(m shardq.Member) memberOut {
			return memberOut{m.Topic, m.ConsumerGroup, m.ID, m.StartedAt, m.HeartbeatAt}
		})
}

func storedView(m shardq.StoredMessage) messageOut {
	return messageOf(m.PartitionKey, m.ID, m.Offset, m.Headers, m.Payload, m.CreatedAt, m.NotBefore)
}

func (s *Server) deadLetters(w http.ResponseWriter, r *http.Request, tenant string) {
	sc, err := s.scope(r.URL.Query(), tenant)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	limit := sc.Limit
	if limit == 0 {
		limit = shardq.DefaultPageLimit
	}
	ms, cut, err := s.deadLettersWithin(r.Context(), tenant, r.PathValue("topic"), sc.After, limit, s.cfg.MaxResponseBytes)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeMessages(w, "items", ms, nil, storedView, cut)
}

// Reads of stored messages within a byte budget: pages no larger than
// what the budget left can hold at the largest message size, so that a
// response never holds more than the budget (or one message, the first,
// whatever its size); cut says the budget stopped it before limit.
func (s *Server) pagesWithin(limit int, budget int64, page func(n int, last *shardq.StoredMessage) ([]shardq.StoredMessage, error)) (out []shardq.StoredMessage, cut bool, err error) {
	largest := s.cfg.Client.MaxMessageBytes()
	var used int64
	for len(out) < limit {
		n := int(min(int64(limit-len(out)), (budget-used)/largest))
		if n <= 0 {
			if len(out) > 0 {
				return out, true, nil
			}
			n = 1
		}
		var last *shardq.StoredMessage
		if len(out) > 0 {
			last = &out[len(out)-1]
		}
		ms, err := page(n, last)
		if err != nil {
			return nil, false, err
		}
		for i, m := range ms {
			// A page is sized by the largest message's bytes; its JSON may
			// take more: what passes the budget is left for the next page.
			if used += MessageBytes(m); used > budget && len(out) > 0 {
				return out, true, nil
			}
			out = append(out, ms[i])
		}
		if len(ms) < n {
			return out, false, nil
		}
	}
	return out, false, nil
}

// deadLettersWithin reads the topic's dead letters after after (the
// listing's sort key: tenant, offset) within budget.
func (s *Server) deadLettersWithin(ctx context.Context, tenant, topic string, after []string, limit int, budget int64) ([]shardq.StoredMessage, bool, error) {
	return s.pagesWithin(limit, budget, func(n int, last *shardq.StoredMessage) ([]shardq.StoredMessage, error) {
		sc := shardq.Scope{Tenants: []string{tenant}, After: after, Limit: n}
		if last != nil {
			sc.After = []string{last.Tenant, strconv.FormatInt(last.Offset, 10)}
		}
		return s.admin.DeadLetters(ctx, shardq.DeadLetterRequest{Scope: sc, Topic: topic, Suffix: ""})
	})
}

// browseWithin reads br's page within budget.
func (s *Server) browseWithin(ctx context.Context, br shardq.BrowseRequest, budget int64) ([]shardq.StoredMessage, bool, error) {
	limit := br.Limit
	if limit == 0 {
		limit = shardq.DefaultPageLimit
	}
	return s.pagesWithin(limit, budget, func(n int, last *shardq.StoredMessage) ([]shardq.StoredMessage, error) {
		b := br
		b.Limit = n
		if last != nil {
			b.AfterOffset, b.FromTime = last.Offset, time.Time{}
		}
		return s.admin.Messages(ctx, b)
	})
}

// requeueIn names one dead letter (key and id) or all of them.
type requeueIn struct {
	Key string `json:"key"`
	ID  string `json:"id"`
	All bool   `json:"all"`
}

// requeuedOut answers a requeue: how many, and the offset of one.
type requeuedOut struct {
	Requeued int    `json:"requeued"`
	Offset   *int64 `json:"offset,omitempty" description:"where the one dead letter named went: absent with all"`
}

func (s *Server) requeue(w http.ResponseWriter, r *http.Request, tenant string) {
	var in requeueIn
	if err := decodeJSON(r.Body, &in); err != nil {
		s.decodeError(w, r, err)
		return
	}
	topic := r.PathValue("topic")
	switch {
	case in.All && (in.ID != "" || in.Key != ""):
		s.fail(w, r, &shardq.ValidationError{Field: "all", Rule: "set all, or key and id, not both"})
	case in.All:
		n, err := s.admin.RequeueAll(r.Context(), shardq.TopicRef{Tenant: tenant, Topic: topic}, "")
		if err != nil {
			s.fail(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, requeuedOut{Requeued: n})
	case in.ID == "":
		s.fail(w, r, &shardq.ValidationError{Field: "id", Rule: "must not be empty (or set all)"})
	default:
		res, err := s.admin.Requeue(r.Context(), shardq.MessageRef{Tenant: tenant, Topic: topic, PartitionKey: in.Key, ID: in.ID}, "")
		if err != nil {
			s.fail(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, requeuedOut{Requeued: 1, Offset: &res.Offset})
	}
}

type halfOut struct {
	Topic         string    `json:"topic"`
	Key           string    `json:"key"`
	ID            string    `json:"id"`
	ProducerGroup string    `json:"producer_group"`
	CreatedAt     time.Time `json:"created_at"`
	Checks        int       `json:"checks"`
	NextCheckAt   time.Time `json:"next_check_at"`
	ClaimOwner    string    `json:"claim_owner,omitempty"`
	Overdue       bool      `json:"overdue"`
}

func (s *Server) halfMessages(w http.ResponseWriter, r *http.Request, tenant string) {
	list(s, w, r, tenant, func(sc shardq.Scope) ([]shardq.PendingHalf, error) { return s.admin.PendingHalves(r.Context(), sc) },
		func(h shardq.PendingHalf) halfOut {
			return halfOut{h.Topic, h.PartitionKey, h.ID, h.ProducerGroup, h.CreatedAt, h.Checks, h.NextCheckAt, h.ClaimOwner, h.Overdue}
		})
}

// browse reads messages as stored: ?key= (one partition), ?after=
// (offset), ?limit=.
func (s *Server) browse(w http.ResponseWriter, r *http.Request, tenant string) {
	q := r.URL.Query()
	br := shardq.BrowseRequest{Tenant: tenant, Topic: r.PathValue("topic")}
	if _, ok := q["key"]; ok {
		br.OnePartition, br.PartitionKey = true, q.Get("key")
	}
	if v := q.Get("after"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			s.fail(w, r, &shardq.ValidationError{Field: "after", Rule: fmt.Sprintf("%q: want an offset, 0 or more", v)})
			return
		}
		br.AfterOffset = n
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > shardq.MaxPageLimit {
			s.fail(w, r, &shardq.ValidationError{Field: "limit", Rule: fmt.Sprintf("%q: want 1 to %d", v, shardq.MaxPageLimit)})
			return
		}
		br.Limit = n
	}
	ms, cut, err := s.browseWithin(r.Context(), br, s.cfg.MaxResponseBytes)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeMessages(w, "items", ms, nil, storedView, cut)
}

// deleteMessage deletes one message by identity: ?key= and ?id=.
func (s *Server) deleteMessage(w http.ResponseWriter, r *http.Request, tenant string) {
	q := r.URL.Query()
	if q.Get("id") == "" {
		s.fail(w, r, &shardq.ValidationError{Field: "id", Rule: "the query parameter id is required (and key, for a message group)"})
		return
	}
	ok, err := s.admin.Delete(r.Context(), shardq.MessageRef{Tenant: tenant, Topic: r.PathValue("topic"), PartitionKey: q.Get("key"), ID: q.Get("id")})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if !ok {
		writeProblem(w, problem{Type: typeNotFound, Status: http.StatusNotFound, Detail: "no such message"})
		return
	}
	writeJSON(w, http.StatusOK, deletedOut{Deleted: 1})
}

// deletedOut answers a message's deletion.
type deletedOut struct {
	Deleted int `json:"deleted"`
}

// resetIn moves a group's cursors; without execute it only previews.
type resetIn struct {
	To      string     `json:"to" enum:"earliest,latest,offset,time"`
	Key     string     `json:"key" description:"with offset"`
	Offset  int64      `json:"offset"`
	Time    *time.Time `json:"time"`
	Force   bool       `json:"force"`
	Create  bool       `json:"create"`
	Execute bool       `json:"execute"`
}

type changeOut struct {
	Key    string `json:"key"`
	From   int64  `json:"from"`
	To     int64  `json:"to"`
	Replay int64  `json:"replay"`
	Skip   int64  `json:"skip"`
	Capped bool   `json:"capped,omitempty"`
}

func (s *Server) reset(w http.ResponseWriter, r *http.Request, tenant string) {
	var in resetIn
	if err := decodeJSON(r.Body, &in); err != nil {
		s.decodeError(w, r, err)
		return
	}
	rq := shardq.ResetRequest{Tenant: tenant, Topic: r.PathValue("topic"), ConsumerGroup: r.PathValue("group"), Key: in.Key, Offset: in.Offset,
		Force: in.Force, Create: in.Create, DryRun: !in.Execute}
	if in.Key != "" && in.To != "offset" {
		s.fail(w, r, &shardq.ValidationError{Field: "key", Rule: `only with "to": "offset"; the other targets move every partition's cursor`})
		return
	}
	switch in.To {
	case "earliest":
		rq.To = shardq.ResetToEarliest
	case "latest":
		rq.To = shardq.ResetToLatest
	case "offset":
		rq.To = shardq.ResetToOffset
	case "time":
		rq.To = shardq.ResetToTime
		if in.Time == nil {
			s.fail(w, r, &shardq.ValidationError{Field: "time", Rule: `required with "to": "time"`})
			return
		}
		rq.Time = *in.Time
	default:
		s.fail(w, r, &shardq.ValidationError{Field: "to", Rule: fmt.Sprintf("%q: want earliest, latest, offset or time", in.To)})
		return
	}
	changes, err := s.admin.ResetOffsets(r.Context(), rq)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := make([]changeOut, len(changes))
	for i, c := range changes {
		out[i] = changeOut{c.PartitionKey, c.From, c.To, c.Replay, c.Skip, c.Capped}
	}
	writeJSON(w, http.StatusOK, resetOut{Executed: in.Execute, Changes: out})
}

// resetOut answers a reset: the cursors' moves, made or previewed.
type resetOut struct {
	Executed bool        `json:"executed"`
	Changes  []changeOut `json:"changes"`
}

func (s *Server) pause(w http.ResponseWriter, r *http.Request, tenant string) {
	s.pauseOrResume(w, r, tenant, true)
}

func (s *Server) resume(w http.ResponseWriter, r *http.Request, tenant string) {
	s.pauseOrResume(w, r, tenant, false)
}

func (s *Server) pauseOrResume(w http.ResponseWriter, r *http.Request, tenant string, pause bool) {
	if err := decodeJSON(r.Body, &emptyIn{}); err != nil {
		s.decodeError(w, r, err)
		return
	}
	op := s.admin.ResumeGroup
	if pause {
		op = s.admin.PauseGroup
	}
	if _, err := op(r.Context(), shardq.PauseRequest{Scope: shardq.Scope{Tenants: []string{tenant}}, Topic: r.PathValue("topic"), ConsumerGroup: r.PathValue("group")}); err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, pausedOut{Paused: pause})
}

// pausedOut answers a pause or resume of a group.
type pausedOut struct {
	Paused bool `json:"paused"`
}

// emptyIn is the body of a request that takes none: nothing, or {}.
type emptyIn struct{}
