// SPDX-License-Identifier: Apache-2.0

package consumer

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/balance"
	"github.com/shardq/shardq/internal/lifecycle"
	"github.com/shardq/shardq/internal/settle"
)

// beat is the liveness loop: heartbeat and lease renewal. It runs apart
// from manage so that a slow discovery tick never lets either go stale.
func (s *Member) beat() {
	lifecycle.Every(s.life.Context(), s.cfg.HeartbeatInterval, false, func() {
		ctx, cancel := context.WithTimeout(s.life.Context(), dbTimeout)
		defer cancel()
		now := s.cfg.Clock()
		if err := s.heartbeat(ctx, now); err != nil && s.life.Context().Err() == nil {
			s.log.Warn("shardq: heartbeat failed; retrying", "tenants", s.cfg.Tenants, "err", err)
		}
		s.renew(ctx, now)
	})
}

// idleFallback × PollInterval is how long an idle worker waits when
// neither the head watcher nor a local publish wakes it.
const idleFallback = 5

// watchHeads wakes idle workers whose partition head moved: every
// PollInterval, one query per tenant reads the heads of all of this
// member's idle partitions, instead of each idle partition polling on its
// own.
func (s *Member) watchHeads() {
	lifecycle.Every(s.life.Context(), s.cfg.PollInterval, false, s.wakeMovedHeads)
}

// wakeMovedHeads is one round of the head watcher.
func (s *Member) wakeMovedHeads() {
	idle := map[string]map[string]*worker{} // tenant → key → worker
	s.mu.Lock()
	for ref, w := range s.workers {
		if w.idleAfter.Load() > 0 {
			if idle[ref.Tenant] == nil {
				idle[ref.Tenant] = map[string]*worker{}
			}
			idle[ref.Tenant][ref.PartitionKey] = w
		}
	}
	s.mu.Unlock()
	for tenant, ws := range idle {
		keys := make([]string, 0, len(ws))
		for k := range ws {
			keys = append(keys, k)
		}
		ctx, cancel := context.WithTimeout(s.life.Context(), dbTimeout)
		heads, err := s.drv.HeadsOf(ctx, tenant, s.cfg.Topic, keys)
		cancel()
		if err != nil {
			if s.life.Context().Err() == nil {
				s.log.Warn("shardq: reading partition heads failed; idle partitions fall back to polling", "tenant", tenant, "err", err)
			}
			continue
		}
		for k, w := range ws {
			if after := w.idleAfter.Load(); after > 0 && heads[k] >= after {
				select {
				case w.wake <- struct{}{}:
				default:
				}
			}
		}
	}
}

// manage is the subscriber's control loop: orphan sweep, discovery and
// rebalancing, once per DiscoveryInterval; the first tick after the join
// window, and the next one after the join window again when a peer took a
// partition this one reached for.
func (s *Member) manage() {
	t := time.NewTimer(s.cfg.JoinWindow)
	defer t.Stop()
	for {
		select {
		case <-s.life.Context().Done():
			return
		case <-t.C:
		}
		next := s.cfg.DiscoveryInterval
		if s.tick() {
			next = s.cfg.JoinWindow
		}
		t.Reset(next)
	}
}

// tick runs one rebalance; it reports whether a peer took a partition this
// subscriber planned to acquire (so that it replans soon).
func (s *Member) tick() (contended bool) {
	ctx, cancel := context.WithTimeout(s.life.Context(), dbTimeout)
	defer cancel()
	now := s.cfg.Clock()
	subs, leases, work, err := s.tickInputs(ctx, s.cfg.Tenants)
	if err != nil {
		// One tenant list failed (a shard down, say): list tenant by
		// tenant, and plan for those that answer.
		var failed []string
		subs, leases, work, failed = nil, nil, nil, nil
		for _, t := range s.cfg.Tenants {
			ts, tl, tw, terr := s.tickInputs(ctx, []string{t})
			if terr != nil {
				failed = append(failed, t)
				s.tickFailed(fmt.Sprintf("tenant %q: listing members, leases or partitions failed", t), terr)
				continue
			}
			subs, leases, work = append(subs, ts...), append(leases, tl...), append(work, tw...)
		}
		if len(failed) == len(s.cfg.Tenants) {
			return false
		}
	}

	live := map[string][]string{}
	alive := map[string]bool{}
	member := map[string]bool{}
	for _, sub := range subs {
		member[sub.Name] = true
		if now.Sub(sub.HeartbeatAt) < s.cfg.StaleAfter || sub.Name == s.cfg.ID {
			live[sub.Tenant] = append(live[sub.Tenant], sub.Name)
			alive[sub.Name] = true
		}
	}
	s.sweep(ctx, leases, member, alive, now)

	// A lease in our name without a worker here is an acquisition whose
	// commit succeeded while we saw an error (a cut connection): offer it
	// to the plan as free, so that we acquire it again (new token) instead
	// of holding it unused forever.
	s.mu.Lock()
	for i, l := range leases {
		if l.Owner == s.cfg.ID && s.workers[l.PartitionRef] == nil {
			leases[i].Owner = ""
		}
	}
	s.mu.Unlock()

	refs := make([]driver.PartitionRef, 0, len(work))
	for _, p := range work {
		if p.PartitionKey == "" {
			continue // ungrouped messages go to per-message claims, never to a lease
		}
		refs = append(refs, driver.PartitionRef{Tenant: p.Tenant, ConsumerGroup: s.cfg.ConsumerGroup, Topic: p.Topic, PartitionKey: p.PartitionKey})
	}
	plan := balance.Compute(balance.Input{Me: s.cfg.ID, Live: live, Work: refs, Leases: leases, Now: now})
	for _, p := range plan.Release {
		s.mu.Lock()
		if w := s.workers[p]; w != nil {
			w.handBack()
		}
		s.mu.Unlock()
	}
	for _, p := range plan.Acquire {
		s.mu.Lock()
		_, running := s.workers[p]
		full := len(s.workers) >= s.cfg.MaxPartitions
		s.mu.Unlock()
		if running {
			continue
		}
		if full || s.life.Context().Err() != nil {
			break
		}
		l, err := s.drv.AcquireLease(ctx, p, s.cfg.ID, now, s.cfg.LeaseTTL)
		if errors.Is(err, driver.ErrLeaseHeld) {
			contended = true // a peer was quicker; replan soon
			continue
		}
		if err != nil {
			s.tickFailed(fmt.Sprintf("acquiring the lease of tenant %q partition %q failed", p.Tenant, p.PartitionKey), err)
			continue
		}
		s.startWorker(l)
	}
	return contended
}

// tickInputs lists, for tenants, the group's members, its lease rows and
// the partitions with work.
func (s *Member) tickInputs(ctx context.Context, tenants []string) ([]driver.Subscriber, []driver.Lease, []driver.Partition, error) {
	subs, err := s.drv.Subscribers(ctx, tenants, s.cfg.ConsumerGroup, s.cfg.Topic)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("listing subscribers: %w", err)
	}
	leases, err := s.drv.ListLeases(ctx, tenants, s.cfg.ConsumerGroup, s.cfg.Topic)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("listing leases: %w", err)
	}
	work, err := s.drv.PartitionsWithWork(ctx, tenants, s.cfg.Topic, s.cfg.ConsumerGroup)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("discovery: %w", err)
	}
	return subs, leases, work, nil
}

// tickFailed logs a failed step of a tick, unless the tick failed because
// the subscriber is stopping.
func (s *Member) tickFailed(what string, err error) {
	if s.life.Context().Err() != nil {
		return
	}
	s.log.Warn("shardq: "+what+"; retrying next tick", "tenants", s.cfg.Tenants, "err", err)
}

// renew extends, in one transaction, the leases that have used a third of
// their time (so each gets several chances before it could lapse), and
// stops the partitions whose lease was lost.
func (s *Member) renew(ctx context.Context, now time.Time) {
	s.mu.Lock()
	var due []driver.Lease
	for _, w := range s.workers {
		if w.lease.ExpiresAt.Sub(now) < s.cfg.LeaseTTL*2/3 {
			due = append(due, w.lease)
		}
	}
	s.mu.Unlock()
	if len(due) == 0 {
		return
	}
	renewed, lost, err := s.drv.RenewLeases(ctx, due, now, s.cfg.LeaseTTL)
	if err != nil {
		// One transaction over every tenant fails as a whole when one
		// shard is down: renew tenant by tenant, so that the leases on the
		// shards that answer do not lapse.
		renewed, lost = nil, nil
		byTenant := map[string][]driver.Lease{}
		for _, l := range due {
			byTenant[l.Tenant] = append(byTenant[l.Tenant], l)
		}
		for tenant, ls := range byTenant {
			r, l, terr := s.drv.RenewLeases(ctx, ls, now, s.cfg.LeaseTTL)
			if terr != nil {
				if s.life.Context().Err() == nil {
					s.log.Warn("shardq: lease renewal failed; retrying", "tenant", tenant, "leases", len(ls), "err", terr)
				}
				continue
			}
			renewed, lost = append(renewed, r...), append(lost, l...)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range renewed {
		if w := s.workers[l.PartitionRef]; w != nil && w.lease.Token == l.Token {
			w.lease.ExpiresAt = l.ExpiresAt
		}
	}
	for _, l := range lost {
		if w := s.workers[l.PartitionRef]; w != nil && w.lease.Token == l.Token {
			s.log.Warn("shardq: lease lost; stopping the partition", "tenant", l.Tenant, "partition", l.PartitionKey, "token", l.Token)
			w.lose()
		}
	}
}

// sweep frees the leases of subscribers whose heartbeat went stale.
func (s *Member) sweep(ctx context.Context, leases []driver.Lease, member, alive map[string]bool, now time.Time) {
	deadSet := map[string]bool{}
	for _, l := range leases {
		// Only members whose heartbeat went stale are known dead. An owner
		// without heartbeat rows is a group receiver (AcceptGroup), which
		// renews its lease instead: its lease expires by itself.
		if l.Owner != "" && member[l.Owner] && !alive[l.Owner] {
			deadSet[l.Owner] = true
		}
	}
	if len(deadSet) == 0 {
		return
	}
	var dead []string
	for o := range deadSet {
		dead = append(dead, o)
	}
	n, err := s.drv.SweepLeases(ctx, s.cfg.Tenants, s.cfg.ConsumerGroup, s.cfg.Topic, dead, now)
	if err != nil {
		s.log.Warn("shardq: orphan sweep failed; retrying next tick", "tenants", s.cfg.Tenants, "err", err)
		return
	}
	s.log.Info("shardq: swept leases of dead subscribers", "dead", dead, "leases", n)
}

// worker delivers one leased partition.
type worker struct {
	s            *Member
	lease        driver.Lease                   // ExpiresAt guarded by s.mu
	cursor       int64                          // last settled offset
	commit       int64                          // last committed offset
	states       map[int64]driver.DeliveryState // earlier owners' bookkeeping beyond the cursor, read once
	committedAt  time.Time
	ctx          context.Context
	cancel       context.CancelFunc // cancels the handler: lease lost or hard stop
	handback     chan struct{}      // closed to ask for a graceful hand-back
	handbackOnce sync.Once
	lost         chan struct{} // closed when the lease is lost
	lostOnce     sync.Once
	wake         chan struct{} // a local publish stored messages here, or the head watcher saw the head move
	// idleAfter is cursor+1 while the worker waits idle (0 otherwise):
	// the head watcher wakes it when the partition's head passes cursor.
	idleAfter atomic.Int64
}

func (w *worker) handBack() { w.handbackOnce.Do(func() { close(w.handback) }) }

func (w *worker) lose() {
	w.lostOnce.Do(func() { close(w.lost) })
	w.cancel()
}

func (s *Member) startWorker(l driver.Lease) {
	ctx, cancel := context.WithCancel(s.life.HardContext())
	w := &worker{s: s, lease: l, cursor: l.Committed, commit: l.Committed, committedAt: s.cfg.Clock(), ctx: ctx, cancel: cancel,
		handback: make(chan struct{}), lost: make(chan struct{}), wake: make(chan struct{}, 1)}
	s.mu.Lock()
	s.workers[l.PartitionRef] = w
	s.mu.Unlock()
	if !s.life.Go(w.run) {
		w.finish() // stopping: hand the fresh lease straight back
	}
}

// stopping reports whether the worker should stop taking new messages.
func (w *worker) stopping() bool {
	select {
	case <-w.s.life.Context().Done():
		return true
	case <-w.handback:
		return true
	case <-w.lost:
		return true
	default:
		return false
	}
}

// wait sleeps d unless the worker is asked to stop first.
func (w *worker) wait(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-w.s.life.Context().Done():
	case <-w.handback:
	case <-w.lost:
	}
	return false
}

// idle waits for d or until a local publish wakes the worker.
func (w *worker) idle(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-w.wake:
	case <-w.s.life.Context().Done():
	case <-w.handback:
	case <-w.lost:
	}
}

func (w *worker) leaseNow() driver.Lease {
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	return w.lease
}

// leaseLive reports whether the lease is unexpired by this member's clock;
// when it is not, the worker stops: a message is never handed out after
// the lease may have expired (a frozen process, a renewal that kept
// failing), even if nobody has taken it yet. The partition is acquired
// again, with a new token, by the next tick that plans it.
func (w *worker) leaseLive() bool {
	l := w.leaseNow()
	if w.s.cfg.Clock().Before(l.ExpiresAt) {
		return true
	}
	w.s.log.Warn("shardq: lease expired before delivery; stopping the partition", w.logArgs("token", l.Token, "expired_at", l.ExpiresAt)...)
	w.lose()
	return false
}

func (w *worker) logArgs(args ...any) []any {
	return append([]any{"tenant", w.lease.Tenant, "partition", w.lease.PartitionKey}, args...)
}

func (w *worker) run() {
	s := w.s
	defer w.finish()
	idleSince := s.cfg.Clock()
	for !w.stopping() {
		msgs, err := w.fetch()
		if err != nil {
			s.log.Warn("shardq: fetch failed; retrying", w.logArgs("err", err)...)
			w.wait(s.cfg.PollInterval)
			continue
		}
		if len(msgs) == 0 {
			if !w.commitCursor() {
				return
			}
			if s.cfg.Clock().Sub(idleSince) >= s.cfg.IdleRelease {
				return // idle release: finish() commits and releases
			}
			// The head watcher checks every PollInterval, for all idle
			// partitions at once; a worker fetches on its own only as a
			// fallback.
			w.idleAfter.Store(w.cursor + 1)
			w.idle(idleFallback * s.cfg.PollInterval)
			w.idleAfter.Store(0)
			continue
		}
		idleSince = s.cfg.Clock()
		if !w.deliver(msgs) {
			return
		}
		if !w.commitCursor() {
			return
		}
	}
}

func (w *worker) fetch() ([]driver.Message, error) {
	ctx, cancel := context.WithTimeout(w.ctx, dbTimeout)
	defer cancel()
	return w.s.drv.FetchAfter(ctx, w.lease.Tenant, w.lease.Topic, w.lease.PartitionKey, w.cursor, w.s.cfg.BatchSize)
}

// commitCursor commits settled progress; false when the lease is lost.
func (w *worker) commitCursor() bool {
	if w.cursor <= w.commit {
		return true
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(w.ctx), dbTimeout)
	defer cancel()
	err := w.s.drv.CommitOffset(ctx, w.leaseNow(), w.cursor, w.s.cfg.Clock())
	switch {
	case errorsIsLost(err):
		w.s.log.Warn("shardq: lease lost at commit; the new owner redelivers", w.logArgs("offset", w.cursor)...)
		w.lose()
		return false
	case err != nil:
		w.s.log.Warn("shardq: commit failed; will retry", w.logArgs("offset", w.cursor, "err", err)...)
		return true
	}
	w.commit, w.committedAt = w.cursor, w.s.cfg.Clock()
	return true
}

// finish commits and releases the lease, unless it was lost.
func (w *worker) finish() {
	s := w.s
	defer func() {
		s.mu.Lock()
		delete(s.workers, w.lease.PartitionRef)
		s.mu.Unlock()
		w.cancel()
	}()
	select {
	case <-w.lost:
		return
	default:
	}
	if !w.commitCursor() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), dbTimeout)
	defer cancel()
	if err := s.drv.ReleaseLease(ctx, w.leaseNow(), s.cfg.Clock()); err != nil && !errorsIsLost(err) {
		s.log.Warn("shardq: releasing a lease failed; it expires on its own", w.logArgs("err", err)...)
	}
}

// deliver hands msgs to the handler in order and settles each. It returns
// false when the worker must stop (lease lost, stop, hand-back mid-retry).
func (w *worker) deliver(msgs []driver.Message) bool {
	if w.states == nil {
		// Retry bookkeeping is written only under the partition's lease,
		// so what exists beyond the cursor now is all there is besides our
		// own attempts (which settle tracks): read it once per lease.
		ctx, cancel := context.WithTimeout(w.ctx, dbTimeout)
		states, err := w.s.drv.DeliveryStates(ctx, w.lease.PartitionRef, w.cursor, math.MaxInt64)
		cancel()
		if err != nil {
			w.s.log.Warn("shardq: reading retry state failed; retrying", w.logArgs("err", err)...)
			return w.wait(w.s.cfg.PollInterval)
		}
		w.states = states
	}
	states := w.states
	if w.s.cfg.Batch {
		return w.settle(msgs, states[msgs[0].Offset])
	}
	for i := range msgs {
		if i > 0 && w.stopping() {
			return false // the rest is redelivered by the next owner
		}
		if !w.settle(msgs[i:i+1], states[msgs[i].Offset]) {
			return false
		}
		if w.s.cfg.Clock().Sub(w.committedAt) >= w.s.cfg.CommitInterval && !w.commitCursor() {
			return false
		}
	}
	return true
}

// settle delivers msgs (one, or one batch) until acked or dead-lettered.
func (w *worker) settle(msgs []driver.Message, st driver.DeliveryState) bool {
	s := w.s
	first, last := msgs[0].Offset, msgs[len(msgs)-1].Offset
	attempt := st.Attempts + 1
	if wait := st.NextAttemptAt.Sub(s.cfg.Clock()); wait > 0 {
		if !w.commitCursor() || !w.wait(wait) {
			return false
		}
	}
	for {
		if !w.leaseLive() {
			return false
		}
		err := w.call(msgs, attempt)
		if err == nil {
			w.cursor = last
			return true
		}
		if w.ctx.Err() != nil {
			return false // lease lost or hard stop: the next owner redelivers
		}
		v := s.cfg.Policy.Decide(err, attempt)
		if v.DeadLetter {
			if !w.deadLetter(msgs, attempt, v.Cause) {
				return false
			}
			w.cursor, w.commit = last, last
			return true
		}
		delay := v.Delay
		now := s.cfg.Clock()
		ctx, cancel := context.WithTimeout(context.WithoutCancel(w.ctx), dbTimeout)
		rerr := s.drv.RecordAttempt(ctx, w.leaseNow(), first,
			driver.DeliveryState{Attempts: attempt, NextAttemptAt: now.Add(delay), LastError: settle.ErrText(err)}, now)
		cancel()
		if errorsIsLost(rerr) {
			w.lose()
			return false
		}
		if rerr != nil {
			s.log.Warn("shardq: recording a failed attempt failed", w.logArgs("offset", first, "err", rerr)...)
		}
		s.log.Info("shardq: handler failed; retrying after backoff", w.logArgs("offset", first, "attempt", attempt, "delay", delay, "err", err)...)
		if !w.commitCursor() || !w.wait(delay) {
			return false
		}
		attempt++
	}
}

// call hands msgs to the handler as their attempt-th delivery.
func (w *worker) call(msgs []driver.Message, attempt int) error {
	return w.s.cfg.Handle(w.ctx, msgs, attempt)
}

// deadLetter copies msgs to the dead-letter topic and passes the cursor
// over them, one message per fenced transaction.
func (w *worker) deadLetter(msgs []driver.Message, attempts int, cause error) bool {
	s := w.s
	for _, m := range msgs {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(w.ctx), dbTimeout)
		err := s.drv.DeadLetter(ctx, w.leaseNow(), settle.DeadLetterCopy(m, s.cfg.DLQSuffix, attempts, cause), m.Offset, s.cfg.Clock())
		cancel()
		if errorsIsLost(err) {
			w.lose()
			return false
		}
		if err != nil {
			s.log.Warn("shardq: dead-lettering failed; retrying", w.logArgs("offset", m.Offset, "err", err)...)
			return w.wait(s.cfg.PollInterval) && w.deadLetter(msgs, attempts, cause)
		}
		s.log.Warn("shardq: message dead-lettered", w.logArgs("offset", m.Offset, "id", m.ID, "attempts", attempts, "err", cause)...)
	}
	return true
}
