// SPDX-License-Identifier: Apache-2.0

package server

import (
	"crypto/sha256"
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
	failures *lru.Cache[string, *rate.Limiter] // by client address
	verified *lru.Cache[[32]byte, time.Time]   // SHA-256 of credentials that verified lately, and when

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
	failures, _ := lru.New[string, *rate.Limiter](limiterEntries)
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

// authAttempt is one authentication under way: exactly one of its
// methods ends it.
type authAttempt struct {
	l          *limits
	sum        [32]byte
	credential bool
	reserved   *rate.Reservation // nil: a credential that verified lately
	now        time.Time
}

// beginAuth reserves a failed authentication for addr before a
// credential is read, so that concurrent attempts cannot all pass a check
// charged only afterwards; a credential that verified lately skips it.
// false: addr has failed too often, and nothing is to be read.
func (l *limits) beginAuth(addr, credential string, now time.Time) (authAttempt, bool) {
	a := authAttempt{l: l, sum: sha256.Sum256([]byte(credential)), credential: credential != "", now: now}
	if at, ok := l.verified.Get(a.sum); ok && a.credential && now.Sub(at) < verifiedFor {
		return a, true
	}
	a.reserved = limiter(l.failures, addr, l.failRate, failBurst).Reserve()
	if !a.reserved.OK() || a.reserved.Delay() > 0 {
		a.reserved.Cancel()
		return a, false
	}
	return a, true
}

// verified gives the reservation back and remembers the credential.
func (a authAttempt) verified() {
	if a.reserved != nil {
		a.reserved.Cancel()
	}
	if a.credential {
		a.l.verified.Add(a.sum, a.now)
	}
}

// failed keeps the reservation: the address is charged.
func (a authAttempt) failed() { a.l.verified.Remove(a.sum) }

// undecided gives the reservation back: the server, not the credential,
// failed.
func (a authAttempt) undecided() {
	if a.reserved != nil {
		a.reserved.Cancel()
	}
}

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

// startBody reserves what r's body may take (its Content-Length, or the
// body limit when it has none) among the bodies in flight; the returned
// func gives it back. false: the server reads as many bodies as it may.
func (l *limits) startBody(r *http.Request, limit int64) (func(), bool) {
	n := limit
	if r.ContentLength >= 0 && r.ContentLength < limit {
		n = r.ContentLength
	}
	if n == 0 {
		return func() {}, true
	}
	if !l.bodies.TryAcquire(n) {
		return nil, false
	}
	l.reading.Add(n)
	return func() { l.reading.Add(-n); l.bodies.Release(n) }, true
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
