// SPDX-License-Identifier: Apache-2.0

package server

import (
	"crypto/sha256"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"golang.org/x/sync/semaphore"
	"golang.org/x/time/rate"
)

// limits holds what bounds one client's share of a server: a request rate
// per token that verified, a rate of failed authentications per client
// address, and caps on concurrent receives. Each map is an LRU of bounded
// size: a flood of new keys evicts the least recently used, never all.
type limits struct {
	rate     rate.Limit
	burst    int
	tokens   *lru.Cache[string, *rate.Limiter] // by token id, after it verified
	failRate rate.Limit
	failures *lru.Cache[string, *addrLimiter] // by client address
	verified *lru.Cache[[32]byte, time.Time]  // SHA-256 of credentials that verified lately, and when

	bodies  *semaphore.Weighted // request body bytes being read and decoded, server-wide
	reading atomic.Int64        // what bodies holds (the semaphore does not say)
	// tenantBody is what each tenant's bodies hold of bodies (under mu),
	// at most perTenantBody.
	tenantBody    map[string]int64
	perTenantBody int64
	budget        int64         // MaxInflightBodyBytes
	receives      chan struct{} // a slot per receive in flight, server-wide
	perToken      int
	mu            sync.Mutex
	inFlight      map[string]int // receives in flight by token id
}

// limiterEntries bounds each limiter map.
const limiterEntries = 10_000

func newLimits(cfg Config) *limits {
	tokens, _ := lru.New[string, *rate.Limiter](limiterEntries) // size > 0: cannot fail
	failures, _ := lru.New[string, *addrLimiter](limiterEntries)
	verified, _ := lru.New[[32]byte, time.Time](limiterEntries)
	return &limits{rate: rate.Limit(cfg.Rate), burst: cfg.Burst, tokens: tokens, failRate: rate.Limit(cfg.AuthFailRate), failures: failures, verified: verified,
		bodies: semaphore.NewWeighted(cfg.MaxInflightBodyBytes), tenantBody: map[string]int64{}, perTenantBody: cfg.MaxInflightBodyBytesPerTenant, budget: cfg.MaxInflightBodyBytes, receives: make(chan struct{}, cfg.MaxReceives), perToken: cfg.MaxReceivesPerToken, inFlight: map[string]int{}}
}

// limiter is key's limiter in c, made on first use (concurrent first
// uses share one).
func limiter(c *lru.Cache[string, *rate.Limiter], key string, r rate.Limit, burst int) *rate.Limiter {
	if l, ok := c.Get(key); ok {
		return l
	}
	l := rate.NewLimiter(r, burst)
	if prev, found, _ := c.PeekOrAdd(key, l); found {
		return prev
	}
	return l
}

func take(c *lru.Cache[string, *rate.Limiter], key string, r rate.Limit, burst int) bool {
	return limiter(c, key, r, burst).Allow()
}

// allowToken takes one request from a verified token's bucket.
func (l *limits) allowToken(id string) bool { return take(l.tokens, id, l.rate, l.burst) }

// verifiedFor is how long a credential that verified passes the address
// limiter: one bad client must not lock out the good ones behind the same
// address (a NAT, a proxy).
const verifiedFor = 5 * time.Minute

// addrLimiter bounds one address's failed authentications: the limiter
// is charged only when an attempt fails, and attempts in flight count
// against what it has left, so concurrent attempts cannot overrun it (a
// rate.Reservation cannot be handed back once it took effect).
type addrLimiter struct {
	mu      sync.Mutex
	lim     *rate.Limiter
	pending int
}

// authAttempt is one authentication under way: exactly one of its
// methods ends it.
type authAttempt struct {
	l          *limits
	sum        [32]byte
	credential bool
	addr       *addrLimiter // nil: a credential that verified lately
	now        time.Time
}

// beginAuth admits an authentication from addr when addr's failures in
// flight and past leave room for one more; a credential that verified
// lately skips the check. false: addr has failed too often, and nothing
// is to be read.
func (l *limits) beginAuth(addr, credential string, now time.Time) (authAttempt, bool) {
	a := authAttempt{l: l, sum: sha256.Sum256([]byte(credential)), credential: credential != "", now: now}
	if at, ok := l.verified.Get(a.sum); ok && a.credential && now.Sub(at) < verifiedFor {
		return a, true
	}
	al, ok := l.failures.Get(addr)
	if !ok {
		al = &addrLimiter{lim: rate.NewLimiter(l.failRate, failBurst)}
		if prev, found, _ := l.failures.PeekOrAdd(addr, al); found {
			al = prev
		}
	}
	al.mu.Lock()
	defer al.mu.Unlock()
	if al.lim.Tokens()-float64(al.pending) < 1 {
		return a, false
	}
	al.pending++
	a.addr = al
	return a, true
}

func (a authAttempt) end(charge bool) {
	if a.addr == nil {
		return
	}
	a.addr.mu.Lock()
	a.addr.pending--
	if charge {
		a.addr.lim.Allow()
	}
	a.addr.mu.Unlock()
}

// verified ends the attempt uncharged and remembers the credential.
func (a authAttempt) verified() {
	a.end(false)
	if a.credential {
		a.l.verified.Add(a.sum, a.now)
	}
}

// failed charges the address.
func (a authAttempt) failed() {
	a.end(true)
	a.l.verified.Remove(a.sum)
}

// undecided ends the attempt uncharged: the server failed, or there was
// nothing to judge.
func (a authAttempt) undecided() { a.end(false) }

// failBurst is how many failed authentications an address may make at once.
const failBurst = 20

// startReceive takes a receive slot, server-wide and of token id; the
// returned func gives them back. false: the caps are reached.
func (l *limits) startReceive(id string) (func(), bool) {
	select {
	case l.receives <- struct{}{}:
	default:
		return nil, false
	}
	l.mu.Lock()
	if l.inFlight[id] >= l.perToken {
		l.mu.Unlock()
		<-l.receives
		return nil, false
	}
	l.inFlight[id]++
	l.mu.Unlock()
	return func() {
		l.mu.Lock()
		if l.inFlight[id]--; l.inFlight[id] == 0 {
			delete(l.inFlight, id)
		}
		l.mu.Unlock()
		<-l.receives
	}, true
}

// budgetBody is a request's body with the share of the server's budget
// it holds: the buffer it is read into, charged as its bytes arrive (a
// body that stalls holds only what came), then what decodeJSON decodes it
// into, until the request ends (end). One tenant's requests hold at most
// perTenant of the budget together, so that no tenant's bodies shut the
// others out.
type budgetBody struct {
	io.ReadCloser
	l      *limits
	tenant string
	limit  int64 // the body's bound: its buffer grows no further
	mu     sync.Mutex
	held   int64
}

// errNeverFits refuses a body whose decoded form would need more than the
// whole budget: it would never be served.
type errNeverFits struct{ need, budget int64 }

func (e errNeverFits) Error() string {
	return fmt.Sprintf("the request needs %d bytes of the server's memory for bodies, more than all of it (%d)", e.need, e.budget)
}

// hold makes what b holds n bytes: it takes more from the budget or
// gives some back. A tenant's requests hold at most perTenantBody
// together, but one alone may take the whole budget (as the largest body
// needs). errNeverFits: n is over the budget; errBusy: the budget, or the
// tenant's share, has no room for it now. Either way b holds what it
// held.
func (b *budgetBody) hold(n int64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	l := b.l
	d := n - b.held
	switch {
	case d > 0 && n > l.budget:
		return errNeverFits{need: n, budget: l.budget}
	case d > 0:
		// The share is checked and taken in one step: concurrent requests
		// of a tenant see each other's.
		l.mu.Lock()
		held := l.tenantBody[b.tenant]
		if others := held - b.held; others > 0 && held+d > l.perTenantBody {
			l.mu.Unlock()
			return errBusy
		}
		l.tenantBody[b.tenant] = held + d
		l.mu.Unlock()
		if !l.bodies.TryAcquire(d) {
			l.untake(b.tenant, d)
			return errBusy
		}
	case d < 0:
		l.bodies.Release(-d)
		l.untake(b.tenant, -d)
	}
	l.reading.Add(d)
	b.held = n
	return nil
}

// untake gives d bytes of tenant's share back.
func (l *limits) untake(tenant string, d int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.tenantBody[tenant] -= d; l.tenantBody[tenant] <= 0 {
		delete(l.tenantBody, tenant)
	}
}

// end gives back everything the request held.
func (b *budgetBody) end() { b.hold(0) } //nolint:errcheck // giving back cannot fail

// startBody installs the budgetBody of tenant's request r, bounded by
// limit, as r.Body; the caller ends it when the request ends.
func (l *limits) startBody(r *http.Request, tenant string, limit int64) *budgetBody {
	b := &budgetBody{ReadCloser: r.Body, l: l, tenant: tenant, limit: limit}
	r.Body = b
	return b
}

// clientAddr is the address failed authentications are counted against:
// the peer's IP or, behind a trusted proxy, the last address that proxy
// put in header (a client can prepend anything; the proxy appends the
// address it saw), when it is an IP. An IPv6 address counts by its /64,
// which one host may hold whole.
func clientAddr(r *http.Request, header string) string {
	var addr netip.Addr
	if header != "" {
		if v := r.Header.Values(header); len(v) > 0 {
			parts := strings.Split(v[len(v)-1], ",")
			addr, _ = netip.ParseAddr(strings.TrimSpace(parts[len(parts)-1]))
		}
	}
	if !addr.IsValid() {
		ap, err := netip.ParseAddrPort(r.RemoteAddr)
		if err != nil {
			return r.RemoteAddr
		}
		addr = ap.Addr()
	}
	addr = addr.Unmap()
	if addr.Is6() {
		p, _ := addr.Prefix(64)
		return p.String()
	}
	return addr.String()
}
