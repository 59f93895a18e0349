// SPDX-License-Identifier: Apache-2.0

package tenants

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardq/shardq/internal/publish"
)

// quotaState is a tenant's rate limiters and last measured usage in one
// client, and what the client admitted that the measure may not hold.
type quotaState struct {
	mu              sync.Mutex
	msgs, bytes     *bucket
	msgRate, byteRt int64 // what the buckets were made for

	usage     atomic.Pointer[storedUsage]
	measuring ctxMutex // held by the call measuring the first usage
	refresh   atomic.Bool
	admitting ctxMutex // orders the storage checks and what they admit

	// acct guards what this client admitted: writes in flight (open),
	// and ended ones by the last measure epoch that may miss them. A
	// write is counted from its check until a measure that started after
	// it ended lands, so no measure drops a write it cannot see.
	acct  sync.Mutex
	epoch int64 // measures started
	open  usageSums
	ended map[int64]usageSums
	// keys are the partitions written to that a measure may not hold yet
	// (only under a partitions quota), any of which may be new.
	keys map[[2]string]*keyUse
}

// usageSums is what writes add to a tenant's stored usage.
type usageSums struct{ messages, bytes int64 }

func (u usageSums) plus(v usageSums) usageSums {
	return usageSums{u.messages + v.messages, u.bytes + v.bytes}
}

func (u usageSums) minus(v usageSums) usageSums {
	return usageSums{u.messages - v.messages, u.bytes - v.bytes}
}

// keyUse is one partition's writes since the measure: open is how many
// are in flight; until the last measure epoch that may miss the ended
// ones; exists that a check found its head row (it is not new).
type keyUse struct {
	open   int
	until  int64
	exists bool
}

// ctxMutex is a mutex whose Lock gives up when ctx ends: its holders may
// wait on the database.
type ctxMutex struct{ ch chan struct{} }

func (m *ctxMutex) init() { m.ch = make(chan struct{}, 1) }

func (m *ctxMutex) lock(ctx context.Context) error {
	select {
	case m.ch <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (m *ctxMutex) unlock() { <-m.ch }

// storedUsage is a measure of what a tenant stores, taken from epoch on:
// it holds every write that ended before its epoch began.
type storedUsage struct {
	at                          time.Time
	epoch                       int64
	messages, bytes, partitions int64 // partitions: head rows
}

// admission is what a check admitted of one write: held against the
// tenant's storage quotas from the check until its end, then until a
// measure that started after the end lands.
type admission struct {
	q    *quotaState
	sums usageSums
	keys [][2]string
	done atomic.Bool
}

// end records how the write ended (publish.End). A write that ends out of
// sight is held until the second measure from now lands: at least
// TenantUsageInterval, since measures start that far apart.
func (a *admission) end(o publish.Outcome) {
	if !a.done.CompareAndSwap(false, true) {
		return
	}
	q := a.q
	q.acct.Lock()
	defer q.acct.Unlock()
	until := q.epoch
	if o == publish.EndsUnseen {
		until++
	}
	q.open = q.open.minus(a.sums)
	if q.ended == nil {
		q.ended = map[int64]usageSums{}
	}
	q.ended[until] = q.ended[until].plus(a.sums)
	for _, k := range a.keys {
		ku := q.keys[k]
		ku.open--
		ku.until = max(ku.until, until)
	}
}

// hold admits sums and keys (each once), in flight until their end;
// exists are those of keys whose head rows a check found.
func (q *quotaState) hold(sums usageSums, keys [][2]string, exists map[[2]string]bool) *admission {
	q.acct.Lock()
	defer q.acct.Unlock()
	q.open = q.open.plus(sums)
	if len(keys) > 0 && q.keys == nil {
		q.keys = map[[2]string]*keyUse{}
	}
	for _, k := range keys {
		ku := q.keys[k]
		if ku == nil {
			ku = &keyUse{until: -1}
			q.keys[k] = ku
		}
		ku.open++
		ku.exists = ku.exists || exists[k]
	}
	return &admission{q: q, sums: sums, keys: keys}
}

// latest is u, or the measure that landed after it: what a later measure
// holds is no longer counted beside it (q.acct held).
func (q *quotaState) latest(u *storedUsage) *storedUsage {
	if cur := q.usage.Load(); cur != nil && cur.epoch > u.epoch {
		return cur
	}
	return u
}

// counted is the measure (u, or a later one) plus what this client
// admitted that it may not hold.
func (q *quotaState) counted(u *storedUsage) usageSums {
	q.acct.Lock()
	defer q.acct.Unlock()
	u = q.latest(u)
	sum := usageSums{u.messages, u.bytes}.plus(q.open)
	for e, s := range q.ended {
		if e >= u.epoch {
			sum = sum.plus(s)
		}
	}
	return sum
}

// startMeasure begins a measure's epoch: writes that end from now on may
// be missing from it.
func (q *quotaState) startMeasure() int64 {
	q.acct.Lock()
	defer q.acct.Unlock()
	q.epoch++
	return q.epoch
}

// land makes u the measure in use (unless a later one landed first) and
// forgets the writes it holds.
func (q *quotaState) land(u *storedUsage) {
	q.acct.Lock()
	defer q.acct.Unlock()
	if cur := q.usage.Load(); cur != nil && cur.epoch > u.epoch {
		return
	}
	q.usage.Store(u)
	for e := range q.ended {
		if e < u.epoch {
			delete(q.ended, e)
		}
	}
	for k, ku := range q.keys {
		if ku.open == 0 && ku.until < u.epoch {
			delete(q.keys, k)
		}
	}
}
