// SPDX-License-Identifier: Apache-2.0

package server

import (
	"crypto/sha256"
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

	bodies   *semaphore.Weighted // request body bytes being read and decoded, server-wide
	reading  atomic.Int64        // what bodies holds (the semaphore does not say)
	receives chan struct{}       // a slot per receive in flight, server-wide
	perToken int
	mu       sync.Mutex
	inFlight map[string]int // receives in flight by token id
}

// limiterEntries bounds each limiter map.
const limiterEntries = 10_000

func newLimits(cfg Config) *limits {
	tokens, _ := lru.New[string, *rate.Limiter](limiterEntries) // size > 0: cannot fail
	failures, _ := lru.New[string, *addrLimiter](limiterEntries)
	verified, _ := lru.New[[32]byte, time.Time](limiterEntries)
	return &limits{rate: rate.Limit(cfg.Rate), burst: cfg.Burst, tokens: tokens, failRate: rate.Limit(cfg.AuthFailRate), failures: failures, verified: verified,
		bodies: semaphore.NewWeighted(cfg.MaxInflightBodyBytes), receives: make(chan struct{}, cfg.MaxReceives), perToken: cfg.MaxReceivesPerToken, inFlight: map[string]int{}}
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
// it holds: its Content-Length (or the body limit without one) while it
// is read, then the buffer it was read into and what decodeJSON decodes
// it into, until the request ends (end).
type budgetBody struct {
	io.ReadCloser
	l    *limits
	size int64 // the Content-Length; -1 when unknown
	mu   sync.Mutex
	held int64
}

// hold makes what b holds n bytes: it takes more from the budget or
// gives some back. false: the budget has no room for more; b holds what
// it held.
func (b *budgetBody) hold(n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch d := n - b.held; {
	case d > 0 && !b.l.bodies.TryAcquire(d):
		return false
	case d > 0:
	case d < 0:
		b.l.bodies.Release(-d)
	}
	b.l.reading.Add(n - b.held)
	b.held = n
	return true
}

// end gives back everything the request held.
func (b *budgetBody) end() { b.hold(0) }

// startBody reserves what r's body may take (its Content-Length, or the
// body limit when it has none) and installs the budgetBody that holds it
// as r.Body; the caller ends it when the request ends. false: the server
// holds as many bodies as it may.
func (l *limits) startBody(r *http.Request, limit int64) (*budgetBody, bool) {
	n := limit
	if r.ContentLength >= 0 && r.ContentLength < limit {
		n = r.ContentLength
	}
	b := &budgetBody{ReadCloser: r.Body, l: l, size: r.ContentLength}
	if !b.hold(n) {
		return nil, false
	}
	r.Body = b
	return b, true
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
