// SPDX-License-Identifier: Apache-2.0

package server

import (
	"net/http"
	"time"

	"github.com/shardq/shardq"
)

// sessionOut is the message group a receive holds as a session.
type sessionOut struct {
	ID        string    `json:"id" description:"pass as session (receive, session/close, visibility) and in the Shardq-Session header (state)"`
	Key       string    `json:"key"`
	ExpiresAt time.Time `json:"expires_at"`
}

// sessionHeader carries a session id to the group-state routes, whose
// bodies are the state's bytes.
const sessionHeader = "Shardq-Session"

type visibilityIn struct {
	Receipts   []string `json:"receipts" required:"true" description:"receipts, or session ids, of this topic and group (1 to 1000, none twice)"`
	Visibility *float64 `json:"visibility" required:"true" minimum:"0" maximum:"43200" description:"seconds from now (0 to 43200); 0 gives the messages, or the session's group, back at once"`
}

// changedOut answers a visibility change.
type changedOut struct {
	Changed int `json:"changed"`
}

// closeSessionIn names the session to close.
type closeSessionIn struct {
	Session string `json:"session" required:"true"`
}

// closedOut answers a session's close.
type closedOut struct {
	Closed bool `json:"closed"`
}

// changeVisibility sets the visibility timeout of receipts' messages (or
// sessions) to visibility seconds from now, as SQS's
// ChangeMessageVisibility; 0 gives them back at once.
func (s *Server) changeVisibility(w http.ResponseWriter, r *http.Request, tenant string) {
	var in visibilityIn
	err := decodeJSON(r.Body, &in)
	if err == nil && in.Visibility == nil {
		err = &shardq.ValidationError{Field: "visibility", Rule: "required: seconds from now, 0 to give the messages back at once"}
	}
	var vis time.Duration
	if err == nil {
		vis, err = seconds("visibility", *in.Visibility, shardq.MaxVisibility)
	}
	if err != nil {
		s.decodeError(w, r, err)
		return
	}
	stale, err := s.cfg.Receipts.ChangeVisibility(r.Context(), shardq.GroupRef{Tenant: tenant, Topic: r.PathValue("topic"), ConsumerGroup: r.PathValue("group")}, in.Receipts, vis)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeReceiptsDone(w, "changed", len(in.Receipts), stale, " (their lease or claim moved on)",
		func(n int) changedOut { return changedOut{Changed: n} })
}

// closeSession gives a session's group back at once.
func (s *Server) closeSession(w http.ResponseWriter, r *http.Request, tenant string) {
	var in closeSessionIn
	err := decodeJSON(r.Body, &in)
	if err == nil && in.Session == "" {
		err = &shardq.ValidationError{Field: "session", Rule: "required"}
	}
	if err != nil {
		s.decodeError(w, r, err)
		return
	}
	if err := s.cfg.Receipts.CloseSession(r.Context(), shardq.GroupRef{Tenant: tenant, Topic: r.PathValue("topic"), ConsumerGroup: r.PathValue("group")}, in.Session); err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, closedOut{Closed: true})
}

// sessionOf reads the session id of a group-state request.
func sessionOf(r *http.Request) (string, error) {
	id := r.Header.Get(sessionHeader)
	if id == "" {
		return "", &shardq.ValidationError{Field: sessionHeader, Rule: "required: the session id a receive with hold returned"}
	}
	return id, nil
}

// groupState answers a session's group state, its bytes as stored (an
// empty body when none was set).
func (s *Server) groupState(w http.ResponseWriter, r *http.Request, tenant string) {
	id, err := sessionOf(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	st, err := s.cfg.Receipts.GroupState(r.Context(), shardq.GroupRef{Tenant: tenant, Topic: r.PathValue("topic"), ConsumerGroup: r.PathValue("group")}, id)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	w.Write(st) //nolint:errcheck // the client went away
}

// setGroupState stores the request's body as a session's group state.
func (s *Server) setGroupState(w http.ResponseWriter, r *http.Request, tenant string) {
	id, err := sessionOf(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	st, err := readBody(r.Body) // bounded by the server's MaxBytesReader
	if err != nil {
		s.decodeError(w, r, err)
		return
	}
	if err := s.cfg.Receipts.SetGroupState(r.Context(), shardq.GroupRef{Tenant: tenant, Topic: r.PathValue("topic"), ConsumerGroup: r.PathValue("group")}, id, st); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
