// SPDX-License-Identifier: Apache-2.0

// Package server is `shardq serve`: shardq's HTTP/JSON API under /v1
// (described by /v1/openapi.json), per-tenant bearer tokens, and the web
// dashboard. It is stateless between requests: a receive's messages are
// held by a lease or claims in the database, named by their receipts, so
// any number of servers share one database's consumer groups
// (docs/server.md).
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/ident"
)

// Config configures a Server. Client, Driver and Receipts are required.
type Config struct {
	Client   *shardq.Client
	Driver   driver.Driver
	Receipts *shardq.Receipts
	// Tenants, when set (MQ_TENANTS), are the only tenants served: any
	// other is refused with 403 before any SQL runs.
	Tenants []string
	// Rate bounds each token's requests a second, with bursts of Burst
	// [50 a second, bursts of 100].
	Rate  float64
	Burst int
	// MaxBodyBytes bounds a request body [8 MiB].
	MaxBodyBytes int64
	// Metrics serves /metrics (nil: 404).
	Metrics http.Handler
	// StaleAfter is when a member's heartbeat counts as stale in listings
	// [15s].
	StaleAfter time.Duration
	Logger     *slog.Logger
	Clock      func() time.Time
}

// Server is the HTTP API and dashboard of one shardq database.
type Server struct {
	cfg   Config
	log   *slog.Logger
	mux   *http.ServeMux
	admin *shardq.Admin

	mu       sync.Mutex
	limiters map[string]*rate.Limiter // by token id

	draining  chan struct{} // closed by Drain: long polls answer at once
	drainOnce sync.Once
}

// Drain makes waiting receives answer at once, and later ones not wait:
// call it when shutdown starts, before http.Server.Shutdown waits for the
// requests in flight.
func (s *Server) Drain() { s.drainOnce.Do(func() { close(s.draining) }) }

// Defaults of Config.
const (
	DefaultRate         = 50
	DefaultBurst        = 100
	DefaultMaxBodyBytes = 8 << 20
)

// New returns a Server.
func New(cfg Config) (*Server, error) {
	if cfg.Client == nil || cfg.Driver == nil || cfg.Receipts == nil {
		return nil, errors.New("server: Client, Driver and Receipts are required")
	}
	if cfg.Rate < 0 || cfg.Burst < 0 || cfg.MaxBodyBytes < 0 {
		return nil, &ident.Error{Field: "rate", Rule: "rate, burst and body limits must not be negative"}
	}
	if cfg.Rate == 0 {
		cfg.Rate = DefaultRate
	}
	if cfg.Burst == 0 {
		cfg.Burst = max(DefaultBurst, int(cfg.Rate))
	}
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.StaleAfter == 0 {
		cfg.StaleAfter = 15 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	s := &Server{cfg: cfg, log: cfg.Logger, mux: http.NewServeMux(), admin: cfg.Client.Admin(), limiters: map[string]*rate.Limiter{}, draining: make(chan struct{})}
	s.routes()
	return s, nil
}

// Handler is the server's HTTP handler.
func (s *Server) Handler() http.Handler { return s }

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Content-Type-Options", "nosniff")
	s.mux.ServeHTTP(w, r)
}

// route is one API operation: its pattern, the role it needs ("" for the
// unauthenticated ones) and its handler. The OpenAPI document lists every
// route (a test holds the two together).
type route struct {
	pattern string
	role    string
	handle  func(w http.ResponseWriter, r *http.Request, tenant string)
}

func (s *Server) apiRoutes() []route {
	const t = "/v1/tenants/{tenant}"
	const tp = t + "/topics/{topic}"
	const g = tp + "/groups/{group}"
	return []route{
		{"POST " + tp + "/messages", RolePublish, s.publish},
		{"POST " + g + "/receive", RoleConsume, s.receive},
		{"POST " + g + "/ack", RoleConsume, s.ack},
		{"POST " + g + "/nack", RoleConsume, s.nack},
		{"GET " + t + "/topics", RoleAdmin, s.topics},
		{"GET " + tp + "/offsets", RoleAdmin, s.offsets},
		{"GET " + tp + "/groups", RoleAdmin, s.groups},
		{"GET " + t + "/leases", RoleAdmin, s.leases},
		{"GET " + t + "/subscribers", RoleAdmin, s.subscribers},
		{"GET " + tp + "/dead-letters", RoleAdmin, s.deadLetters},
		{"POST " + tp + "/dead-letters/requeue", RoleAdmin, s.requeue},
		{"GET " + t + "/half-messages", RoleAdmin, s.halfMessages},
		{"GET " + tp + "/messages", RoleAdmin, s.browse},
		{"DELETE " + tp + "/messages", RoleAdmin, s.deleteMessage},
		{"POST " + g + "/reset", RoleAdmin, s.reset},
		{"POST " + g + "/pause", RoleAdmin, s.pause},
		{"POST " + g + "/resume", RoleAdmin, s.resume},
	}
}

func (s *Server) routes() {
	for _, rt := range s.apiRoutes() {
		s.mux.Handle(rt.pattern, s.authorized(rt.role, rt.handle))
	}
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, 200, map[string]string{"status": "ok"}) })
	s.mux.HandleFunc("GET /readyz", s.ready)
	s.mux.HandleFunc("GET /v1/openapi.json", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write(openAPI) //nolint:errcheck // the client went away
	})
	if s.cfg.Metrics != nil {
		s.mux.Handle("GET /metrics", s.cfg.Metrics)
	}
	s.dashboardRoutes()
	s.mux.HandleFunc("/", s.notFound)
}

func (s *Server) notFound(w http.ResponseWriter, r *http.Request) {
	writeProblem(w, problem{Type: typeNotFound, Status: http.StatusNotFound, Detail: fmt.Sprintf("no such resource: %s %s (see /v1/openapi.json)", r.Method, r.URL.Path)})
}

// ready answers 200 when the database answers and is migrated.
func (s *Server) ready(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
	defer cancel()
	cur, latest, err := s.cfg.Driver.SchemaVersion(ctx)
	switch {
	case err != nil:
		s.log.Warn("shardq serve: readiness check failed", "err", err)
		writeProblem(w, problem{Type: typeUnavail, Status: http.StatusServiceUnavailable, Detail: "the database does not answer"})
	case cur < latest:
		writeProblem(w, problem{Type: typeUnavail, Status: http.StatusServiceUnavailable,
			Detail: fmt.Sprintf("the database is at migration %d of %d: run `shardq migrate`", cur, latest)})
	default:
		writeJSON(w, http.StatusOK, map[string]any{"status": "ready", "schema_version": cur})
	}
}

// authorized checks, in this order and before any other SQL: the
// tenant's form, the served tenants (MQ_TENANTS), the bearer token's
// form, the token's rate, then the token itself (one row read) and its
// role. The request body is bounded.
func (s *Server) authorized(role string, next func(http.ResponseWriter, *http.Request, string)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tenant := r.PathValue("tenant")
		if err := ident.Tenant(tenant); err != nil {
			s.fail(w, r, err)
			return
		}
		if s.cfg.Tenants != nil && !slices.Contains(s.cfg.Tenants, tenant) {
			writeProblem(w, problem{Type: typeForbidden, Status: http.StatusForbidden,
				Detail: fmt.Sprintf("tenant %q is not served here (MQ_TENANTS)", tenant)})
			return
		}
		tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || tok == "" {
			if c, err := r.Cookie(sessionCookie); err == nil && fromDashboard(r) {
				tok = c.Value // the dashboard's own calls
			} else {
				w.Header().Set("WWW-Authenticate", `Bearer realm="shardq"`)
				writeProblem(w, problem{Type: typeAuth, Status: http.StatusUnauthorized, Detail: "an Authorization: Bearer token is required (shardq token create)"})
				return
			}
		}
		if !s.allow(tok) {
			w.Header().Set("Retry-After", "1")
			writeProblem(w, problem{Type: typeRate, Status: http.StatusTooManyRequests, Detail: fmt.Sprintf("more than %g requests a second with this token", s.cfg.Rate)})
			return
		}
		_, got, err := verify(r.Context(), s.cfg.Driver, tenant, tok, s.cfg.Clock())
		switch {
		case errors.Is(err, errTokenTenant):
			writeProblem(w, problem{Type: typeForbidden, Status: http.StatusForbidden, Detail: fmt.Sprintf("%v %q", err, tenant)})
			return
		case errors.Is(err, errTokenInvalid), errors.Is(err, errTokenRevoked), errors.Is(err, errTokenExpired):
			w.Header().Set("WWW-Authenticate", `Bearer realm="shardq", error="invalid_token"`)
			writeProblem(w, problem{Type: typeAuth, Status: http.StatusUnauthorized, Detail: err.Error()})
			return
		case err != nil:
			s.fail(w, r, err)
			return
		}
		if !allows(got, role) {
			writeProblem(w, problem{Type: typeForbidden, Status: http.StatusForbidden,
				Detail: fmt.Sprintf("this needs the %s role; the token has %s", role, got)})
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes)
		next(w, r, tenant)
	})
}

// allow takes one request from the token's bucket. Buckets are keyed by
// the token's id when it has the token's form, else by the raw value's
// first bytes (garbage is limited too). The map is bounded: when full, it
// starts over.
func (s *Server) allow(tok string) bool {
	key := tok
	if id, _, ok := parseToken(tok); ok {
		key = id
	} else if len(key) > 32 {
		key = key[:32]
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.limiters[key]
	if l == nil {
		if len(s.limiters) >= 10_000 {
			clear(s.limiters)
		}
		l = rate.NewLimiter(rate.Limit(s.cfg.Rate), s.cfg.Burst)
		s.limiters[key] = l
	}
	return l.Allow()
}
