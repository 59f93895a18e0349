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

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/ident"
	"github.com/shardq/shardq/internal/receiptkey"
)

// Config configures a Server. Client, Driver and Receipts are required.
type Config struct {
	Client   *shardq.Client
	Driver   driver.Driver
	Receipts *shardq.Receipts
	// Tenants, when set (SHARDQ_TENANTS), are the only tenants served: any
	// other is refused with 403 before any SQL runs.
	Tenants []string
	// Rate bounds each token's requests a second, with bursts of Burst
	// [50 a second, bursts of 100]; it is charged only once the token
	// verified.
	Rate  float64
	Burst int
	// AuthFailRate bounds failed authentications a second per client
	// address, with bursts of 20 [1]: past it, the address is answered
	// 429 before any token is read.
	AuthFailRate float64
	// ClientAddrHeader names the header in which a trusted reverse proxy
	// puts the client's address (X-Forwarded-For: its last entry); empty:
	// the connection's peer.
	ClientAddrHeader string
	// MaxBodyBytes bounds a request body [8 MiB]; MaxInflightBodyBytes
	// the memory of the requests in flight, server-wide [64 MiB]: each
	// holds its body's buffer as the bytes arrive, then the body and what
	// it decodes into (twice its strings' bytes, and 16 to 256 bytes a
	// JSON value) until it ends. Past it, 429. It is at least the largest
	// body; three times that and 16 MiB more let any one body of strings
	// through (the defaults do), less may refuse the largest (413). One
	// tenant's requests hold at most MaxInflightBodyBytesPerTenant of it
	// together [half], though one alone may take it all; a request that
	// would need more than all of it gets 413.
	MaxBodyBytes                  int64
	MaxInflightBodyBytes          int64
	MaxInflightBodyBytesPerTenant int64
	// MaxResponseBytes is the byte budget of a response that carries
	// messages (receive, dead letters, browse, the dashboard's topic
	// page): it stops adding messages there, always carrying at least one,
	// and says so [8 MiB].
	MaxResponseBytes int64
	// MaxReceives caps the receives in flight (long polls included),
	// server-wide [64] and per token [16]: past them, 429.
	MaxReceives         int
	MaxReceivesPerToken int
	// Metrics serves /metrics (nil: 404). With MetricsAuth it needs an
	// admin token of the tenant named by ?tenant=.
	Metrics     http.Handler
	MetricsAuth bool
	// WriteTimeout is the HTTP server's: a receive extends its own
	// response's deadline to its wait plus this [60s].
	WriteTimeout time.Duration
	// ReadTimeout is the HTTP server's: a large message's upload pushes
	// its read deadline on by this at each read [30s].
	ReadTimeout time.Duration
	// MaxLargeBytes bounds one large message's upload [4 GiB];
	// MaxLargeTransfers the uploads, body downloads and exports in
	// flight, server-wide [8] (each holds one transaction's chunks, 4
	// MiB), of which one token holds at most MaxLargeTransfersPerToken and
	// one tenant at most MaxLargeTransfersPerTenant [each half of
	// MaxLargeTransfers, at least 1]; and LargeTransferTimeout how long
	// one may take in all [1h].
	MaxLargeBytes              int64
	MaxLargeTransfers          int
	MaxLargeTransfersPerToken  int
	MaxLargeTransfersPerTenant int
	LargeTransferTimeout       time.Duration
	// MinTransferRate is the fewest bytes a transfer must move in each
	// TransferRateWindow [64 KiB in 10 s], whatever slows it: one that
	// moves fewer is cut and its slot freed. Negative: no minimum.
	MinTransferRate    int64
	TransferRateWindow time.Duration
	// SecureCookies marks the dashboard's cookie Secure even when TLS ends
	// before this process (at a proxy); it is Secure anyway under TLS.
	SecureCookies bool
	// MeterProvider records the HTTP server's metrics [otel's global].
	MeterProvider metric.MeterProvider
	// TracerProvider records a server span per request, the child of the
	// W3C trace context a request's traceparent carries, so that a
	// message published over HTTP carries its caller's trace [otel's
	// global]. Without an SDK there is no span, and the caller's context
	// passes into the messages as it came.
	TracerProvider trace.TracerProvider
	// StaleAfter is when a member's heartbeat counts as stale in listings
	// [15s].
	StaleAfter time.Duration
	// TokenCacheTTL is how long a token's stored row is reused before it
	// is read again [DefaultTokenCacheTTL]: a revocation reaches this
	// server within it. Negative: the row is read at every request.
	TokenCacheTTL time.Duration
	Logger        *slog.Logger
	Clock         func() time.Time
}

// Server is the HTTP API and dashboard of one shardq database.
type Server struct {
	cfg   Config
	log   *slog.Logger
	mux   *http.ServeMux
	admin *shardq.Admin

	limits *limits
	tokens driver.Tokens    // the driver's, through a cache of their rows
	keys   *receiptkey.Ring // signs dashboard sessions
	csrf   *http.CrossOriginProtection
	active activeRequests
	// instrumented is the mux within otelhttp: a server span and
	// http.server.request.duration per request.
	instrumented http.Handler

	// transferring counts the large uploads and downloads in flight,
	// byToken and byTenant them by token and by tenant (large.go).
	transferMu   sync.Mutex
	transferring int
	byToken      map[string]int
	byTenant     map[string]int
	draining     chan struct{} // closed by Drain: long polls answer at once
	drainOnce    sync.Once
}

// Drain makes waiting receives answer at once, and later ones not wait:
// call it when shutdown starts, before http.Server.Shutdown waits for the
// requests in flight.
func (s *Server) Drain() { s.drainOnce.Do(func() { close(s.draining) }) }

// Defaults of Config.
const (
	DefaultRate                 = 50
	DefaultBurst                = 100
	DefaultAuthFailRate         = 1
	DefaultMaxBodyBytes         = 8 << 20
	DefaultMaxInflightBodyBytes = 64 << 20
	DefaultMaxResponseBytes     = 8 << 20
	DefaultMaxReceives          = 64
	DefaultMaxReceivesPerToken  = 16
)

// New returns a Server.
func New(cfg Config) (*Server, error) {
	if cfg.Client == nil || cfg.Driver == nil || cfg.Receipts == nil {
		return nil, errors.New("server: Client, Driver and Receipts are required")
	}
	if cfg.Rate < 0 || cfg.Burst < 0 || cfg.MaxBodyBytes < 0 || cfg.AuthFailRate < 0 || cfg.MaxResponseBytes < 0 || cfg.MaxReceives < 0 || cfg.MaxReceivesPerToken < 0 {
		return nil, &shardq.ValidationError{Field: "rate", Rule: "rates, bursts, sizes and caps must not be negative"}
	}
	if cfg.AuthFailRate == 0 {
		cfg.AuthFailRate = DefaultAuthFailRate
	}
	if cfg.MaxInflightBodyBytes < 0 {
		return nil, &shardq.ValidationError{Field: "max inflight body", Rule: "must not be negative"}
	}
	if cfg.MaxInflightBodyBytes == 0 {
		cfg.MaxInflightBodyBytes = DefaultMaxInflightBodyBytes
	}
	if cfg.MaxResponseBytes == 0 {
		cfg.MaxResponseBytes = DefaultMaxResponseBytes
	}
	if cfg.MaxReceives == 0 {
		cfg.MaxReceives = DefaultMaxReceives
	}
	if cfg.MaxReceivesPerToken == 0 {
		cfg.MaxReceivesPerToken = DefaultMaxReceivesPerToken
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = 60 * time.Second
	}
	if cfg.ReadTimeout <= 0 {
		cfg.ReadTimeout = 30 * time.Second
	}
	if cfg.MaxLargeBytes < 0 || cfg.MaxLargeTransfers < 0 || cfg.MaxLargeTransfersPerToken < 0 || cfg.MaxLargeTransfersPerTenant < 0 ||
		cfg.LargeTransferTimeout < 0 || cfg.TransferRateWindow < 0 {
		return nil, &shardq.ValidationError{Field: "max large bytes", Rule: "large-message limits must not be negative"}
	}
	if cfg.MaxLargeBytes == 0 {
		cfg.MaxLargeBytes = DefaultMaxLargeBytes
	}
	if cfg.MaxLargeTransfers == 0 {
		cfg.MaxLargeTransfers = DefaultMaxLargeTransfers
	}
	// Half each by default, so that one token or tenant leaves the other
	// half to the rest.
	half := max(1, cfg.MaxLargeTransfers/2)
	for _, f := range []struct {
		v     *int
		field string
	}{{&cfg.MaxLargeTransfersPerToken, "max large transfers per token"}, {&cfg.MaxLargeTransfersPerTenant, "max large transfers per tenant"}} {
		switch {
		case *f.v == 0:
			*f.v = half
		case *f.v > cfg.MaxLargeTransfers:
			return nil, &shardq.ValidationError{Field: f.field, Rule: fmt.Sprintf("%d is more than the server's %d", *f.v, cfg.MaxLargeTransfers)}
		}
	}
	if cfg.LargeTransferTimeout == 0 {
		cfg.LargeTransferTimeout = DefaultLargeTransferTimeout
	}
	if cfg.MinTransferRate == 0 {
		cfg.MinTransferRate = DefaultMinTransferRate
	}
	if cfg.TransferRateWindow == 0 {
		cfg.TransferRateWindow = DefaultTransferRateWindow
	}
	if cfg.MeterProvider == nil {
		cfg.MeterProvider = otel.GetMeterProvider()
	}
	if cfg.TracerProvider == nil {
		cfg.TracerProvider = otel.GetTracerProvider()
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
	// A body of the largest size must at least be read.
	cfg.MaxInflightBodyBytes = max(cfg.MaxInflightBodyBytes, cfg.MaxBodyBytes)
	switch {
	case cfg.MaxInflightBodyBytesPerTenant < 0:
		return nil, &shardq.ValidationError{Field: "max inflight body per tenant", Rule: "must not be negative"}
	case cfg.MaxInflightBodyBytesPerTenant == 0:
		cfg.MaxInflightBodyBytesPerTenant = cfg.MaxInflightBodyBytes / 2
	}
	cfg.MaxInflightBodyBytesPerTenant = min(cfg.MaxInflightBodyBytesPerTenant, cfg.MaxInflightBodyBytes)
	if cfg.StaleAfter == 0 {
		cfg.StaleAfter = 15 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.TokenCacheTTL == 0 {
		cfg.TokenCacheTTL = DefaultTokenCacheTTL
	}
	s := &Server{cfg: cfg, log: cfg.Logger, mux: http.NewServeMux(), admin: cfg.Client.Admin(), limits: newLimits(cfg),
		tokens: newCachedTokens(cfg.Driver, cfg.TokenCacheTTL, cfg.Clock),
		keys:   receiptkey.New(cfg.Driver, SessionTTL, cfg.Clock), csrf: http.NewCrossOriginProtection(), draining: make(chan struct{}),
		byToken: map[string]int{}, byTenant: map[string]int{}}
	var err error
	if s.active, err = newActiveRequests(cfg.MeterProvider); err != nil {
		return nil, err
	}
	s.routes()
	s.instrumented = instrument(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mux.ServeHTTP(w, r)
		// otelhttp hands the mux a copy of the request, on which the mux
		// notes the route: the access log reads it there.
		if a, ok := r.Context().Value(accessKey{}).(*access); ok {
			a.routed = r
		}
	}), cfg.MeterProvider, cfg.TracerProvider)
	return s, nil
}

// Handler is the server's HTTP handler.
func (s *Server) Handler() http.Handler { return s }

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	start := time.Now()
	acc := &access{}
	r = r.WithContext(context.WithValue(r.Context(), accessKey{}, acc))
	done := s.active.start(r)
	sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
	defer func() {
		done()
		routed := r
		if acc.routed != nil {
			routed = acc.routed
		}
		s.logAccess(routed, sw.status, time.Since(start), acc)
	}()
	s.instrumented.ServeHTTP(sw, r)
}

// access is what the access log learns while a request is served: the
// verified token's id (never the token).
type access struct {
	token  string
	routed *http.Request // the request the mux routed (its Pattern, PathValue)
}

type accessKey struct{}

// noteToken records the verified token's id for the access log.
func noteToken(r *http.Request, id string) {
	if a, ok := r.Context().Value(accessKey{}).(*access); ok {
		a.token = id
	}
}

// logAccess writes one access-log line at INFO (serve --log-level info):
// method, route template (never the raw path, which carries client
// input), status, duration, tenant (when it is a valid name) and token
// id. The probes and metric scrapes are left out: they would drown the
// rest.
func (s *Server) logAccess(r *http.Request, status int, d time.Duration, a *access) {
	if r.Pattern == "GET /healthz" || r.Pattern == "GET /readyz" || r.Pattern == "GET /metrics" || !s.log.Enabled(r.Context(), slog.LevelInfo) {
		return
	}
	tenant := r.PathValue("tenant")
	if ident.Tenant(tenant) != nil {
		tenant = "" // not a tenant's name: a client's bytes, not logged
	}
	route := r.Pattern
	if route == "" {
		route = "unmatched"
	}
	s.log.LogAttrs(context.WithoutCancel(r.Context()), slog.LevelInfo, "shardq serve: request",
		slog.String("method", knownMethod(r.Method)), slog.String("route", route), slog.Int("status", status),
		slog.Float64("duration_ms", float64(d.Microseconds())/1000), slog.String("tenant", tenant),
		slog.String("token_id", a.token))
}

// route is one API operation: its pattern, the role it needs ("" for the
// unauthenticated ones) and its handler. apiDocs describes each by the
// same pattern, and the OpenAPI document is generated from the two
// (openapi.go).
type route struct {
	pattern string
	role    string
	handle  func(w http.ResponseWriter, r *http.Request, tenant string)
	// large streams a large message's body in or out (large.go): bounded
	// by the large-message limits instead of MaxBodyBytes.
	large bool
}

// The paths of a tenant, a topic and a consumer group, under which the
// API's routes are.
const (
	tenantRoute = "/v1/tenants/{tenant}"
	topicRoute  = tenantRoute + "/topics/{topic}"
	groupRoute  = topicRoute + "/groups/{group}"
)

func (s *Server) apiRoutes() []route {
	const t, tp, g = tenantRoute, topicRoute, groupRoute
	return []route{
		{"POST " + tp + "/messages", RolePublish, s.publish, false},
		{"POST " + tp + "/large", RolePublish, s.publishLarge, true},
		{"POST " + g + "/receive", RoleConsume, s.receive, false},
		{"GET " + g + "/body", RoleConsume, s.body, true},
		{"POST " + g + "/ack", RoleConsume, s.ack, false},
		{"POST " + g + "/nack", RoleConsume, s.nack, false},
		{"POST " + g + "/visibility", RoleConsume, s.changeVisibility, false},
		{"POST " + g + "/session/close", RoleConsume, s.closeSession, false},
		{"POST " + g + "/defer", RoleConsume, s.deferMessages, false},
		{"POST " + g + "/deferred/receive", RoleConsume, s.receiveDeferred, false},
		{"GET " + g + "/deferred", RoleConsume, s.listDeferred, false},
		{"GET " + g + "/state", RoleConsume, s.groupState, false},
		{"PUT " + g + "/state", RoleConsume, s.setGroupState, false},
		{"GET " + t + "/topics", RoleAdmin, s.topics, false},
		{"GET " + tp + "/offsets", RoleAdmin, s.offsets, false},
		{"GET " + tp + "/groups", RoleAdmin, s.groups, false},
		{"GET " + t + "/leases", RoleAdmin, s.leases, false},
		{"GET " + t + "/subscribers", RoleAdmin, s.subscribers, false},
		{"GET " + tp + "/dead-letters", RoleAdmin, s.deadLetters, false},
		{"POST " + tp + "/dead-letters/requeue", RoleAdmin, s.requeue, false},
		{"GET " + t + "/half-messages", RoleAdmin, s.halfMessages, false},
		{"GET " + tp + "/messages", RoleAdmin, s.browse, false},
		{"DELETE " + tp + "/messages", RoleAdmin, s.deleteMessage, false},
		{"POST " + g + "/reset", RoleAdmin, s.reset, false},
		{"POST " + g + "/pause", RoleAdmin, s.pause, false},
		{"POST " + g + "/resume", RoleAdmin, s.resume, false},
		{"GET " + t, RoleAdmin, s.tenant, false},
		{"POST " + t + "/suspend", RoleOperator, s.suspend, false},
		{"POST " + t + "/resume", RoleOperator, s.resumeTenant, false},
		{"GET " + t + "/limits", RoleAdmin, s.tenantLimits, false},
		{"PUT " + t + "/limits", RoleOperator, s.setLimits, false},
		{"GET " + t + "/export", RoleAdmin, s.export, true},
		{"POST " + t + "/delete", RoleAdmin, s.deleteTenant, false},
	}
}

func (s *Server) routes() {
	for _, rt := range s.apiRoutes() {
		h := rt.handle
		if rt.large {
			h = s.transfer(h)
		}
		s.mux.Handle(rt.pattern, s.authorized(rt.role, h, rt.large))
	}
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, 200, healthOut{Status: "ok"}) })
	s.mux.HandleFunc("GET /readyz", s.ready)
	s.mux.HandleFunc("GET /v1/openapi.json", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write(openAPI) //nolint:errcheck // the client went away
	})
	if s.cfg.Metrics != nil {
		s.mux.Handle("GET /metrics", s.metrics())
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
		writeJSON(w, http.StatusOK, readyOut{Status: "ready", SchemaVersion: cur})
	}
}

// healthOut answers /healthz.
type healthOut struct {
	Status string `json:"status" enum:"ok"`
}

// readyOut answers /readyz.
type readyOut struct {
	Status        string `json:"status" enum:"ready"`
	SchemaVersion int    `json:"schema_version" description:"the database's migration"`
}

// authorized checks, in this order and before any other SQL: the
// tenant's form, the served tenants (SHARDQ_TENANTS), the credential's form
// (a bearer token, or the dashboard's session on its own GETs), the
// client address's rate of failed authentications, then the credential
// itself (one row read) and its role, and only then the token's rate, so
// that nobody can spend another's. The request body is bounded.
func (s *Server) authorized(role string, next func(http.ResponseWriter, *http.Request, string), large bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tenant := r.PathValue("tenant")
		if err := ident.Tenant(tenant); err != nil {
			s.fail(w, r, err)
			return
		}
		if s.cfg.Tenants != nil && !slices.Contains(s.cfg.Tenants, tenant) {
			writeProblem(w, problem{Type: typeForbidden, Status: http.StatusForbidden,
				Detail: fmt.Sprintf("tenant %q is not served here (SHARDQ_TENANTS)", tenant)})
			return
		}
		id, got, ok := s.authenticate(w, r, tenant, true)
		if !ok {
			return
		}
		if !allows(got, role) {
			writeProblem(w, problem{Type: typeForbidden, Status: http.StatusForbidden,
				Detail: fmt.Sprintf("this needs the %s role; the token has %s", role, got)})
			return
		}
		if !s.limits.allowToken(id) {
			w.Header().Set("Retry-After", "1")
			writeProblem(w, problem{Type: typeRate, Status: http.StatusTooManyRequests, Detail: fmt.Sprintf("more than %g requests a second with this token", s.cfg.Rate)})
			return
		}
		if large {
			// A stream: bounded by MaxLargeBytes, a transfer slot and
			// LargeTransferTimeout (transfer).
			r.Body = http.MaxBytesReader(w, r.Body, s.cfg.MaxLargeBytes)
			next(w, r.WithContext(context.WithValue(r.Context(), tokenIDKey{}, id)), tenant)
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes)
		defer s.limits.startBody(r, tenant, s.cfg.MaxBodyBytes).end() // r.Body: holds its share until the request ends
		// Every request's work is bounded in time, the database's included:
		// the longest wait a receive may ask for, plus WriteTimeout.
		ctx, cancel := context.WithTimeout(context.WithValue(r.Context(), tokenIDKey{}, id), shardq.MaxReceiveWait+s.cfg.WriteTimeout)
		defer cancel()
		next(w, r.WithContext(ctx), tenant)
	})
}

// tokenIDKey carries the verified token's id in a request's context.
type tokenIDKey struct{}

// bearer returns the Authorization header's bearer token (the scheme is
// case-insensitive, RFC 9110).
func bearer(r *http.Request) (string, bool) {
	scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	tok = strings.TrimSpace(tok)
	return tok, tok != ""
}

// authenticate verifies the request's bearer token (or, with cookies,
// the dashboard session on one of its GETs) for tenant and returns the
// token's id and roles; it has answered the request when ok is false.
// A failure is charged to the client's address, and an address past its
// rate of failures is refused before anything is read.
func (s *Server) authenticate(w http.ResponseWriter, r *http.Request, tenant string, cookies bool) (id, roles string, ok bool) {
	tok, hasBearer := bearer(r)
	credential := tok
	if !hasBearer && cookies {
		if c, err := r.Cookie(sessionCookie); err == nil {
			credential = c.Value
		}
	}
	attempt, allowed := s.limits.beginAuth(clientAddr(r, s.cfg.ClientAddrHeader), credential, s.cfg.Clock())
	if !allowed {
		w.Header().Set("Retry-After", "1")
		writeProblem(w, problem{Type: typeRate, Status: http.StatusTooManyRequests, Detail: "too many failed authentications from this address"})
		return "", "", false
	}
	var err error
	switch {
	case hasBearer:
		id, roles, _, err = verify(r.Context(), s.tokens, tenant, tok, s.cfg.Clock())
	case cookies && fromDashboard(r):
		var sess session
		if sess, err = s.session(r); err == nil {
			id = sess.ID
			roles, err = sessionRole(r.Context(), s.cfg.Driver, tenant, sess, s.cfg.Clock())
		}
	default:
		attempt.failed()
		w.Header().Set("WWW-Authenticate", `Bearer realm="shardq"`)
		writeProblem(w, problem{Type: typeAuth, Status: http.StatusUnauthorized, Detail: "an Authorization: Bearer token is required (shardq token create)"})
		return "", "", false
	}
	switch {
	case err == nil:
		attempt.verified()
		noteToken(r, id)
		return id, roles, true
	case errors.Is(err, errTokenTenant):
		attempt.failed()
		writeProblem(w, problem{Type: typeForbidden, Status: http.StatusForbidden, Detail: fmt.Sprintf("%v %q", err, tenant)})
	case errors.Is(err, errTokenInvalid), errors.Is(err, errTokenRevoked), errors.Is(err, errTokenExpired), errors.Is(err, errSession):
		attempt.failed()
		w.Header().Set("WWW-Authenticate", `Bearer realm="shardq", error="invalid_token"`)
		writeProblem(w, problem{Type: typeAuth, Status: http.StatusUnauthorized, Detail: err.Error()})
	default:
		attempt.undecided()
		s.fail(w, r, err)
	}
	return "", "", false
}

// session opens the request's dashboard session cookie.
func (s *Server) session(r *http.Request) (session, error) {
	c, err := r.Cookie(sessionCookie)
	if err != nil {
		return session{}, errSession
	}
	return openSession(r.Context(), s.keys, c.Value, s.cfg.Clock())
}

// metrics serves /metrics, behind an admin token of ?tenant= when
// MetricsAuth is set.
func (s *Server) metrics() http.Handler {
	if !s.cfg.MetricsAuth {
		return s.cfg.Metrics
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tenant := r.URL.Query().Get("tenant")
		if err := ident.Tenant(tenant); err != nil {
			s.fail(w, r, err)
			return
		}
		if _, roles, ok := s.authenticate(w, r, tenant, false); !ok {
			return
		} else if !allows(roles, RoleAdmin) {
			writeProblem(w, problem{Type: typeForbidden, Status: http.StatusForbidden, Detail: "/metrics needs an admin token"})
			return
		}
		s.cfg.Metrics.ServeHTTP(w, r)
	})
}
