// SPDX-License-Identifier: Apache-2.0

package server

import (
	"net"
	"net/http"
	"strings"
	"sync"

	lru "github.com/hashicorp/golang-lru/v2"
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

	receives chan struct{} // a slot per receive in flight, server-wide
	perToken int
	mu       sync.Mutex
	inFlight map[string]int // receives in flight by token id
}

// limiterEntries bounds each limiter map.
const limiterEntries = 10_000

func newLimits(cfg Config) *limits {
	tokens, _ := lru.New[string, *rate.Limiter](limiterEntries) // size > 0: cannot fail
	failures, _ := lru.New[string, *rate.Limiter](limiterEntries)
	return &limits{rate: rate.Limit(cfg.Rate), burst: cfg.Burst, tokens: tokens, failRate: rate.Limit(cfg.AuthFailRate), failures: failures,
		receives: make(chan struct{}, cfg.MaxReceives), perToken: cfg.MaxReceivesPerToken, inFlight: map[string]int{}}
}

func take(c *lru.Cache[string, *rate.Limiter], key string, r rate.Limit, burst int) bool {
	l, ok := c.Get(key)
	if !ok {
		l = rate.NewLimiter(r, burst)
		c.Add(key, l)
	}
	return l.Allow()
}

// allowToken takes one request from a verified token's bucket.
func (l *limits) allowToken(id string) bool { return take(l.tokens, id, l.rate, l.burst) }

// mayAuthenticate reports whether addr has failed authentication less
// than its rate allows (it takes nothing).
func (l *limits) mayAuthenticate(addr string) bool {
	f, ok := l.failures.Peek(addr)
	return !ok || f.Tokens() >= 1
}

// failed charges addr for a failed authentication.
func (l *limits) failed(addr string) { take(l.failures, addr, l.failRate, failBurst) }

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

// clientAddr is the address failed authentications are counted against:
// the peer's IP or, behind a trusted proxy, the last address that proxy
// put in header (a client can prepend anything; the proxy appends the
// address it saw).
func clientAddr(r *http.Request, header string) string {
	if header != "" {
		if v := r.Header.Values(header); len(v) > 0 {
			parts := strings.Split(v[len(v)-1], ",")
			if a := strings.TrimSpace(parts[len(parts)-1]); a != "" {
				return a
			}
		}
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}
