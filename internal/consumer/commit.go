// SPDX-License-Identifier: Apache-2.0

package consumer

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/shardq/shardq/driver"
)

// commits commits the member's settled cursors every CommitInterval, all
// of a tenant's in one transaction: a member's partitions cost one write
// transaction an interval and tenant, not one each, and no worker waits
// for it while it delivers. On SQLite, where every process's writers
// queue for the file's one write lock, a commit per partition each second
// was what held up publishers and deliveries in other processes
// (docs/performance.md). A worker commits on its own only before it
// waits, hands back or stops (commitCursor).
func (s *Member) commits() {
	t := time.NewTicker(s.cfg.CommitInterval)
	defer t.Stop()
	for {
		select {
		case <-s.life.Context().Done():
			return // each worker's finish commits what it settled
		case <-t.C:
		}
		s.commitSettled()
	}
}

// commitSettled commits the cursors settled past their commit, one
// transaction per tenant (a tenant is one shard on Vitess, and one whose
// shard fails holds up no other's). When a lease was lost the shared
// transaction changes nothing, and each is committed on its own: the lost
// ones stop their workers.
func (s *Member) commitSettled() {
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	byTenant := map[string][]*worker{}
	batches := map[string][]driver.OffsetCommit{}
	s.mu.Lock()
	for _, w := range s.workers {
		if c := w.settled.Load(); c > w.commit.Load() {
			t := w.lease.Tenant
			byTenant[t] = append(byTenant[t], w)
			batches[t] = append(batches[t], driver.OffsetCommit{Lease: w.lease, Offset: c})
		}
	}
	s.mu.Unlock()
	now := s.cfg.Clock()
	for tenant, ws := range byTenant {
		s.commitTenant(tenant, ws, batches[tenant], now)
	}
}

// commitTenant commits one tenant's batch, each lease alone when one of
// them was lost.
func (s *Member) commitTenant(tenant string, ws []*worker, batch []driver.OffsetCommit, now time.Time) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(s.life.Context()), dbTimeout)
	defer cancel()
	err := s.drv.CommitOffsets(ctx, batch, now)
	switch {
	case err == nil:
		for i, w := range ws {
			raise(&w.commit, batch[i].Offset)
		}
	case errorsIsLost(err):
		for i, w := range ws {
			w.committed(batch[i].Offset, s.drv.CommitOffset(ctx, batch[i].Lease, batch[i].Offset, now))
		}
	default:
		s.log.Warn("shardq: committing cursors failed; will retry", "tenant", tenant, "group", s.cfg.ConsumerGroup, "topic", s.cfg.Topic,
			"partitions", len(batch), "err", err)
	}
}

// committed applies the result of committing w's cursor at offset: the
// commit moves up, or a lost lease stops the worker (false), or a failure
// is logged and the next commit tries again.
func (w *worker) committed(offset int64, err error) bool {
	switch {
	case errorsIsLost(err):
		if w.commit.Load() < offset { // else the lapsed worker's own commit landed first (commitLost)
			w.s.log.Warn("shardq: lease lost at commit; the new owner redelivers", w.logArgs("offset", offset)...)
		}
		w.lose()
		return false
	case err != nil:
		w.s.log.Warn("shardq: commit failed; will retry", w.logArgs("offset", offset, "err", err)...)
		return true
	}
	raise(&w.commit, offset)
	return true
}

// raise sets a to v unless it holds more already.
func raise(a *atomic.Int64, v int64) {
	for {
		cur := a.Load()
		if cur >= v || a.CompareAndSwap(cur, v) {
			return
		}
	}
}
