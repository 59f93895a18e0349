// SPDX-License-Identifier: Apache-2.0

package server

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/internal/ident"
)

// The dashboard is server-rendered HTML (html/template, embedded) with one
// small script for the lag chart: no build step, no CDN, nothing to fetch
// at run time, and every page is a plain GET that a test (or curl) reads.
// It signs in with an admin token; the cookie (HttpOnly, SameSite=Strict)
// holds a signed session that names the token (its id and a digest of its
// stored hash), never the token. Its
// writes are form POSTs that http.CrossOriginProtection lets through only
// from its own origin, checked before any body is read.

//go:embed templates/*.html static/*
var dashboardFS embed.FS

var pages = template.Must(template.New("").Funcs(template.FuncMap{
	"ago": func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return time.Since(t).Round(time.Second).String()
	},
	"ts": func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return t.UTC().Format("2006-01-02 15:04:05")
	},
	"seg": pathSeg,
	"payload": func(p []byte) string {
		const max = 120
		s := string(p)
		if len(s) > max {
			s = s[:max] + "…"
		}
		return s
	},
}).ParseFS(dashboardFS, "templates/*.html"))

const sessionCookie = "shardq_session"

// pathSeg escapes one path segment: '/' and '%' as url.PathEscape does,
// and '.' too, so that no name (".." or "x%2F..%2Fy") makes a path that
// the router cleans into another resource's.
func pathSeg(v string) string { return strings.ReplaceAll(url.PathEscape(v), ".", "%2E") }

// fromDashboard reports whether a request carrying the session cookie may
// use it on the API: a GET made by the dashboard's own script.
func fromDashboard(r *http.Request) bool {
	return r.Method == http.MethodGet && r.Header.Get("Sec-Fetch-Site") == "same-origin"
}

func (s *Server) dashboardRoutes() {
	static, _ := fs.Sub(dashboardFS, "static")
	s.mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	s.mux.HandleFunc("GET /{$}", s.loginPage)
	s.mux.Handle("POST /login", s.csrf.Handler(http.HandlerFunc(s.login)))
	s.mux.Handle("POST /logout", s.csrf.Handler(http.HandlerFunc(s.logout)))
	s.mux.HandleFunc("GET /ui/{$}", s.switchTenant)
	s.mux.Handle("GET /ui/{tenant}", s.page(s.tenantPage))
	s.mux.Handle("GET /ui/{tenant}/topics/{topic}", s.page(s.topicPage))
	s.mux.Handle("POST /ui/{tenant}/topics/{topic}/requeue", s.page(s.requeueForm))
	s.mux.Handle("POST /ui/{tenant}/topics/{topic}/groups/{group}/{action}", s.page(s.pauseForm))
}

// signInErrors are what the sign-in page may say: the page shows one by
// its code, never text from the URL.
var signInErrors = map[string]string{
	"invalid":   "the token is not valid, revoked or expired",
	"tenant":    "the token may not use this tenant, or the tenant is not served here",
	"admin":     "the dashboard needs an admin token",
	"name":      "the tenant's name is not valid",
	"rate":      "too many failed sign-ins from this address; wait a while",
	"failed":    "the server failed; its log says why",
	"session":   "sign in with an admin token of that tenant",
	"signedout": "signed out",
}

func backToSignIn(w http.ResponseWriter, r *http.Request, code string) {
	http.Redirect(w, r, "/?error="+code, http.StatusSeeOther)
}

func (s *Server) render(w http.ResponseWriter, name string, data any) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Security-Policy", "default-src 'self'; style-src 'self'; script-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'")
	w.Header().Set("Cache-Control", "no-store")
	if err := pages.ExecuteTemplate(w, name, data); err != nil {
		s.log.Warn("shardq serve: rendering a dashboard page failed", "page", name, "err", err)
	}
}

func (s *Server) loginPage(w http.ResponseWriter, r *http.Request) {
	s.render(w, "login.html", map[string]any{"Error": signInErrors[r.URL.Query().Get("error")], "Tenants": s.cfg.Tenants})
}

// login checks an admin token for a tenant and starts a session: a
// signed cookie naming the token by its id and a digest of its hash.
func (s *Server) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 16<<10)
	tenant, tok := r.PostFormValue("tenant"), r.PostFormValue("token")
	if err := ident.Tenant(tenant); err != nil {
		backToSignIn(w, r, "name")
		return
	}
	if s.cfg.Tenants != nil && !slices.Contains(s.cfg.Tenants, tenant) {
		backToSignIn(w, r, "tenant")
		return
	}
	attempt, allowed := s.limits.beginAuth(clientAddr(r, s.cfg.ClientAddrHeader), tok, s.cfg.Clock())
	if !allowed {
		backToSignIn(w, r, "rate")
		return
	}
	id, role, hash, err := verify(r.Context(), s.cfg.Driver, tenant, tok, s.cfg.Clock())
	switch {
	case errors.Is(err, errTokenTenant):
		attempt.failed()
		backToSignIn(w, r, "tenant")
		return
	case errors.Is(err, errTokenInvalid), errors.Is(err, errTokenRevoked), errors.Is(err, errTokenExpired):
		attempt.failed()
		backToSignIn(w, r, "invalid")
		return
	case err != nil:
		attempt.undecided()
		s.log.Error("shardq serve: sign-in failed", "err", err)
		backToSignIn(w, r, "failed")
		return
	}
	attempt.verified()
	switch {
	case !allows(role, RoleAdmin):
		backToSignIn(w, r, "admin")
		return
	}
	exp := s.cfg.Clock().Add(SessionTTL)
	v, err := signSession(r.Context(), s.keys, session{ID: id, Token: tokenDigest(hash), Expires: exp.Unix()})
	if err != nil {
		s.log.Error("shardq serve: sign-in failed", "err", err)
		backToSignIn(w, r, "failed")
		return
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: v, Path: "/", MaxAge: int(SessionTTL / time.Second), HttpOnly: true, Secure: r.TLS != nil || s.cfg.SecureCookies,
		SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, "/ui/"+pathSeg(tenant), http.StatusSeeOther)
}

// switchTenant opens another tenant's page with the session's token (the
// header's form); the page checks that the token is an admin there.
func (s *Server) switchTenant(w http.ResponseWriter, r *http.Request) {
	tenant := r.URL.Query().Get("tenant")
	if err := ident.Tenant(tenant); err != nil {
		backToSignIn(w, r, "name")
		return
	}
	http.Redirect(w, r, "/ui/"+pathSeg(tenant), http.StatusSeeOther)
}

func (s *Server) logout(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, Secure: r.TLS != nil || s.cfg.SecureCookies,
		SameSite: http.SameSiteStrictMode})
	backToSignIn(w, r, "signedout")
}

// page wraps a dashboard page: the session's token must be an admin of
// the URL's tenant (else back to the sign-in), and a POST must come from
// the dashboard itself (checked before its body is read).
func (s *Server) page(next func(w http.ResponseWriter, r *http.Request, tenant string)) http.Handler {
	return s.csrf.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tenant := r.PathValue("tenant")
		if ident.Tenant(tenant) != nil || (s.cfg.Tenants != nil && !slices.Contains(s.cfg.Tenants, tenant)) {
			backToSignIn(w, r, "tenant")
			return
		}
		var cookie string
		if c, err := r.Cookie(sessionCookie); err == nil {
			cookie = c.Value
		}
		attempt, allowed := s.limits.beginAuth(clientAddr(r, s.cfg.ClientAddrHeader), cookie, s.cfg.Clock())
		if !allowed {
			backToSignIn(w, r, "rate")
			return
		}
		sess, err := s.session(r)
		var role string
		if err == nil {
			role, err = sessionRole(r.Context(), s.cfg.Driver, tenant, sess, s.cfg.Clock())
		}
		switch {
		case err != nil && !errors.Is(err, errSession) && !errors.Is(err, errTokenTenant) && !errors.Is(err, errTokenRevoked) && !errors.Is(err, errTokenExpired):
			attempt.undecided()
			s.pageError(w, r, err)
			return
		case cookie == "" || errors.Is(err, errSessionExpired):
			attempt.undecided() // nothing to judge: a visit before signing in, or after the session ended
			backToSignIn(w, r, "session")
			return
		case err != nil || !allows(role, RoleAdmin):
			attempt.failed()
			backToSignIn(w, r, "session")
			return
		}
		attempt.verified()
		if !s.limits.allowToken(sess.ID) {
			writeProblem(w, problem{Type: typeRate, Status: http.StatusTooManyRequests, Detail: "too many requests with this token"})
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, 16<<10)
		ctx, cancel := context.WithTimeout(r.Context(), s.cfg.WriteTimeout)
		defer cancel()
		next(w, r.WithContext(ctx), tenant)
	}))
}

func (s *Server) pageError(w http.ResponseWriter, r *http.Request, err error) {
	s.log.Warn("shardq serve: dashboard page failed", "path", r.URL.Path, "err", err)
	w.WriteHeader(http.StatusInternalServerError)
	s.render(w, "error.html", map[string]string{"Error": err.Error()})
}

func (s *Server) tenantPage(w http.ResponseWriter, r *http.Request, tenant string) {
	ctx := r.Context()
	sc := shardq.Scope{Tenants: []string{tenant}}
	topics, err := s.admin.Topics(ctx, sc)
	if err != nil {
		s.pageError(w, r, err)
		return
	}
	groups, err := s.admin.Groups(ctx, sc, "", s.cfg.StaleAfter)
	if err != nil {
		s.pageError(w, r, err)
		return
	}
	halves, err := s.admin.PendingHalves(ctx, sc)
	if err != nil {
		s.pageError(w, r, err)
		return
	}
	s.render(w, "tenant.html", map[string]any{"Tenant": tenant, "Topics": topics, "Groups": groups, "Halves": halves})
}

// topicPage shows a topic: partitions with head, cursors and lag per
// group, the lag chart, the groups with members and leases, dead letters
// and a message browser.
func (s *Server) topicPage(w http.ResponseWriter, r *http.Request, tenant string) {
	ctx := r.Context()
	topic := r.PathValue("topic")
	sc := shardq.Scope{Tenants: []string{tenant}}
	var offsets []shardq.GroupOffset
	var leases []shardq.Lease
	var members []shardq.Member
	var dead, msgs []shardq.StoredMessage
	groups, err := s.admin.Groups(ctx, sc, topic, s.cfg.StaleAfter)
	// One group's offsets include the partitions it has not read yet.
	for _, g := range groups {
		if err != nil {
			break
		}
		var all []shardq.GroupOffset
		all, err = s.admin.Offsets(ctx, sc, g.ConsumerGroup)
		for _, o := range all {
			if o.Topic == topic {
				offsets = append(offsets, o)
			}
		}
	}
	if err == nil {
		var ls []shardq.Lease
		ls, err = s.admin.Leases(ctx, sc)
		for _, l := range ls {
			if l.Topic == topic && l.Owner != "" {
				leases = append(leases, l)
			}
		}
	}
	if err == nil {
		var ms []shardq.Member
		ms, err = s.admin.Subscribers(ctx, sc)
		for _, m := range ms {
			if m.Topic == topic {
				members = append(members, m)
			}
		}
	}
	var deadCut, msgsCut bool
	if err == nil {
		dead, deadCut, err = s.deadLettersWithin(ctx, tenant, topic, nil, 100, s.cfg.MaxResponseBytes/2)
	}
	br := shardq.BrowseRequest{Tenant: tenant, Topic: topic, Limit: 50}
	q := r.URL.Query()
	if _, ok := q["key"]; ok {
		br.OnePartition, br.PartitionKey = true, q.Get("key")
	}
	if after, aerr := strconv.ParseInt(q.Get("after"), 10, 64); aerr == nil && after > 0 {
		br.AfterOffset = after
	}
	if err == nil {
		msgs, msgsCut, err = s.browseWithin(ctx, br, s.cfg.MaxResponseBytes/2)
	}
	if err != nil {
		s.pageError(w, r, err)
		return
	}
	var next int64
	if len(msgs) == br.Limit || msgsCut {
		next = msgs[len(msgs)-1].Offset
	}
	s.render(w, "topic.html", map[string]any{"Tenant": tenant, "Topic": topic, "Offsets": offsets, "Groups": groups, "Leases": leases,
		"Members": members, "Dead": dead, "DeadCut": deadCut, "Messages": msgs, "Browse": br, "Next": next, "Notice": notice(q)})
}

// A form's outcome travels to the page it redirects to as a code and the
// names it concerns: the page words it, so no text in a URL is shown as
// the server's.
func notice(q url.Values) string {
	switch q.Get("notice") {
	case "requeued":
		return fmt.Sprintf("requeued %s at offset %s", q.Get("id"), q.Get("offset"))
	case "nosuch":
		return "no such dead letter: " + q.Get("id")
	case "paused", "resumed":
		return q.Get("notice") + " " + q.Get("group")
	case "failed":
		return "the action failed; the server's log says why"
	}
	return ""
}

func (s *Server) topicURL(tenant, topic string, q url.Values) string {
	return "/ui/" + pathSeg(tenant) + "/topics/" + pathSeg(topic) + "?" + q.Encode()
}

func (s *Server) requeueForm(w http.ResponseWriter, r *http.Request, tenant string) {
	topic := r.PathValue("topic")
	ref := shardq.MessageRef{Tenant: tenant, Topic: topic, PartitionKey: r.PostFormValue("key"), ID: r.PostFormValue("id")}
	q := url.Values{"id": {ref.ID}}
	switch res, err := s.admin.Requeue(r.Context(), ref, ""); {
	case err != nil:
		s.log.Warn("shardq serve: dashboard requeue failed", "tenant", tenant, "topic", topic, "partition_key", ref.PartitionKey, "id", ref.ID, "err", err)
		q.Set("notice", "failed")
	case res != nil:
		q.Set("notice", "requeued")
		q.Set("offset", strconv.FormatInt(res.Offset, 10))
	default:
		q.Set("notice", "nosuch")
	}
	http.Redirect(w, r, s.topicURL(tenant, topic, q), http.StatusSeeOther)
}

func (s *Server) pauseForm(w http.ResponseWriter, r *http.Request, tenant string) {
	topic, group, action := r.PathValue("topic"), r.PathValue("group"), r.PathValue("action")
	op := s.admin.PauseGroup
	switch action {
	case "pause":
	case "resume":
		op = s.admin.ResumeGroup
	default:
		s.notFound(w, r)
		return
	}
	q := url.Values{"notice": {action + "d"}, "group": {group}}
	if _, err := op(r.Context(), shardq.PauseRequest{Scope: shardq.Scope{Tenants: []string{tenant}}, Topic: topic, ConsumerGroup: group}); err != nil {
		s.log.Warn("shardq serve: dashboard "+action+" failed", "tenant", tenant, "topic", topic, "group", group, "err", err)
		q = url.Values{"notice": {"failed"}}
	}
	http.Redirect(w, r, s.topicURL(tenant, topic, q), http.StatusSeeOther)
}
