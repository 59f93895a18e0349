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
type claimQueue struct {
	mu       sync.Mutex
	nonEmpty *sync.Cond
	tenants  map[string][]driver.Claim
	turns    []string // the tenants with claims, in turn order
	n        int
	closed   bool
}

func newClaimQueue() *claimQueue {
	q := &claimQueue{tenants: map[string][]driver.Claim{}}
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

// pop waits for a claim and takes the next tenant's first; false once the
// queue is closed.
func (q *claimQueue) pop() (driver.Claim, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
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
	return c, true
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

// takeLapsed takes the claims that lapse by lapseAt(c) at or before now
// out of the queue. A tenant's claims were queued in the order they were
// taken, each for the same visibility, so only the head of each FIFO is
// looked at.
func (q *claimQueue) takeLapsed(now time.Time, lapseAt func(driver.Claim) time.Time) []driver.Claim {
	q.mu.Lock()
	defer q.mu.Unlock()
	var lapsed []driver.Claim
	for t, cs := range q.tenants {
		i := 0
		for i < len(cs) && !now.Before(lapseAt(cs[i])) {
			i++
		}
		if i == 0 {
			continue
		}
		lapsed = append(lapsed, cs[:i]...)
		q.n -= i
		if q.tenants[t] = cs[i:]; len(cs) == i {
			delete(q.tenants, t)
			q.turns = slices.DeleteFunc(q.turns, func(x string) bool { return x == t })
		}
	}
	return lapsed
}

// close wakes the handlers (pop returns false) and returns the claims
// never taken.
func (q *claimQueue) close() []driver.Claim {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	q.nonEmpty.Broadcast()
	var left []driver.Claim
	for _, t := range q.turns {
		left = append(left, q.tenants[t]...)
	}
	q.tenants, q.turns, q.n = nil, nil, 0
	return left
}
