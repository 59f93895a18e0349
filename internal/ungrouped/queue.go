// SPDX-License-Identifier: Apache-2.0

package ungrouped

import (
	"slices"
	"sync"
	"time"

	"github.com/shardq/shardq/driver"
)

// claimQueue is a member's local queue of claimed messages, one FIFO per
// tenant, served in turn: the handlers take one claim of each tenant with
// claims queued before a second of any, so a tenant's backlog of hundreds
// of claims does not stand before another tenant's message.
//
// A claim that lapsed while queued (lapseAt by clock) is never handed
// out: pop sets it aside, under the same lock, for the claim loop, which
// gives it back (takeLapsed) before it claims the tenant's messages again.
// Were a handler to give it back instead, the loop's claim could come
// first and count a retry of a delivery no handler saw.
type claimQueue struct {
	mu       sync.Mutex
	nonEmpty *sync.Cond
	tenants  map[string][]driver.Claim
	turns    []string // the tenants with claims, in turn order
	n        int
	lapsed   map[string][]driver.Claim // set aside by pop, for takeLapsed
	closed   bool
	clock    func() time.Time
	lapseAt  func(driver.Claim) time.Time
	// setAside is signalled (without blocking) when pop sets a claim aside.
	setAside chan struct{}
}

func newClaimQueue(clock func() time.Time, lapseAt func(driver.Claim) time.Time) *claimQueue {
	q := &claimQueue{tenants: map[string][]driver.Claim{}, lapsed: map[string][]driver.Claim{},
		clock: clock, lapseAt: lapseAt, setAside: make(chan struct{}, 1)}
	q.nonEmpty = sync.NewCond(&q.mu)
	return q
}

// push queues c behind its tenant's other claims; false once the queue
// is closed.
func (q *claimQueue) push(c driver.Claim) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return false
	}
	t := c.Message.Tenant
	if len(q.tenants[t]) == 0 {
		q.turns = append(q.turns, t)
	}
	q.tenants[t] = append(q.tenants[t], c)
	q.n++
	q.nonEmpty.Signal()
	return true
}

// pop waits for a claim that has not lapsed and takes the next tenant's
// first, setting lapsed ones aside; false once the queue is closed.
func (q *claimQueue) pop() (driver.Claim, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for {
		for q.n == 0 && !q.closed {
			q.nonEmpty.Wait()
		}
		if q.closed {
			return driver.Claim{}, false
		}
		t := q.turns[0]
		cs := q.tenants[t]
		c := cs[0]
		q.tenants[t] = cs[1:]
		q.n--
		q.turns = q.turns[1:]
		if len(q.tenants[t]) > 0 {
			q.turns = append(q.turns, t) // its next turn comes after the others'
		} else {
			delete(q.tenants, t)
		}
		if q.clock().Before(q.lapseAt(c)) {
			return c, true
		}
		q.lapsed[t] = append(q.lapsed[t], c)
		select {
		case q.setAside <- struct{}{}:
		default:
		}
	}
}

// len is the number of claims queued.
func (q *claimQueue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.n
}

// queued is the number of claims of tenant queued.
func (q *claimQueue) queued(tenant string) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.tenants[tenant])
}

// takeLapsed takes the claims that lapse at or before now out of the
// queue (the whole FIFO: a clock may step back), with those pop set
// aside: tenant's, or every tenant's when tenant is "".
func (q *claimQueue) takeLapsed(tenant string, now time.Time) []driver.Claim {
	q.mu.Lock()
	defer q.mu.Unlock()
	var lapsed []driver.Claim
	for t, cs := range q.lapsed {
		if tenant == "" || t == tenant {
			lapsed = append(lapsed, cs...)
			delete(q.lapsed, t)
		}
	}
	for t, cs := range q.tenants {
		if tenant != "" && t != tenant {
			continue
		}
		kept := slices.DeleteFunc(slices.Clone(cs), func(c driver.Claim) bool {
			if now.Before(q.lapseAt(c)) {
				return false
			}
			lapsed = append(lapsed, c)
			return true
		})
		if len(kept) == len(cs) {
			continue
		}
		q.n -= len(cs) - len(kept)
		if q.tenants[t] = kept; len(kept) == 0 {
			delete(q.tenants, t)
			q.turns = slices.DeleteFunc(q.turns, func(x string) bool { return x == t })
		}
	}
	return lapsed
}

// close wakes the handlers (pop returns false) and returns the claims
// never taken, and those set aside.
func (q *claimQueue) close() []driver.Claim {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	q.nonEmpty.Broadcast()
	var left []driver.Claim
	for _, t := range q.turns {
		left = append(left, q.tenants[t]...)
	}
	for _, cs := range q.lapsed {
		left = append(left, cs...)
	}
	q.tenants, q.turns, q.n, q.lapsed = nil, nil, 0, nil
	return left
}
