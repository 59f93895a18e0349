// SPDX-License-Identifier: Apache-2.0

package consumer

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/balance"
)

// manage is the subscriber's control loop: orphan sweep, discovery and
// rebalancing, once per DiscoveryInterval; the first tick after the join
// window, and the next one after the join window again when a peer took a
// partition this one reached for, or when a wake-up named a partition
// that nobody held at the last tick (a new key).
func (s *Member) manage() {
	t := time.NewTimer(s.cfg.JoinWindow)
	defer t.Stop()
	last := time.Now() // a wake-up never runs the first tick before the join window

	for {
		select {
		case <-s.life.Context().Done():
			return
		case <-t.C:
		case <-s.kick:
			if early := last.Add(s.cfg.JoinWindow); time.Now().Before(early) {
				t.Reset(time.Until(early)) // at most one early tick per JoinWindow
				continue
			}
		}
		last = time.Now()
		next := s.cfg.DiscoveryInterval
		if s.tick() {
			next = s.cfg.JoinWindow
		}
		s.cfg.Metrics.Tick(time.Since(last))
		t.Reset(next)
	}
}

// tick runs one rebalance; it reports whether a peer took a partition this
// subscriber planned to acquire (so that it replans soon).
func (s *Member) tick() (contended bool) {
	ctx, cancel := context.WithTimeout(s.life.Context(), dbTimeout)
	defer cancel()
	now := s.cfg.Clock()
	s.refreshPaused(ctx)
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
	s.mu.Lock()
	previous := s.previous
	spare, spareLeases := map[string]time.Time{}, map[string]time.Time{}
	for _, t := range s.cfg.Tenants {
		from, held := s.spareFrom(t, now)
		spare[t] = from
		if held {
			spareLeases[t] = from
		}
	}
	s.mu.Unlock()
	if s.cfg.Instance != "" {
		if s.rivals(ctx, subs, previous) {
			return false // fenced: the subscription stops the member
		}
		s.mu.Lock()
		previous = s.previous // with any it adopted
		s.mu.Unlock()
	}
	for _, sub := range subs {
		if previous[sub.Name] {
			continue // an earlier incarnation of this static member: gone
		}
		member[sub.Name] = true
		if now.Sub(sub.HeartbeatAt) < s.cfg.StaleAfter || sub.Name == s.cfg.ID {
			live[sub.Tenant] = append(live[sub.Tenant], sub.Name)
			alive[sub.Name] = true
		}
	}
	s.sweep(ctx, leases, member, alive, spare, now)
	held := make(map[[2]string]bool, len(leases))
	for _, l := range leases {
		if l.Owner != "" && l.Owner != s.cfg.ID {
			held[[2]string{l.Tenant, l.PartitionKey}] = true
		}
	}

	// A lease in our name without a worker here is an acquisition whose
	// commit succeeded while we saw an error (a cut connection): offer it
	// to the plan as free, so that we acquire it again (new token) instead
	// of holding it unused forever.
	s.mu.Lock()
	s.heldElsewhere = held
	s.work = work
	if s.stillUnseen(work, held) {
		contended = true // a key a wake-up named is not visible yet: tick again soon
	}
	for i, l := range leases {
		if _, taken := s.taken[l.PartitionRef]; l.Owner == s.cfg.ID && s.workers[l.PartitionRef] == nil && !taken {
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
	plan := balance.Compute(balance.Input{Me: s.cfg.ID, Live: live, Work: refs, Leases: leases, Now: now, Spare: spareLeases})
	for _, p := range plan.Release {
		s.mu.Lock()
		if w := s.workers[p]; w != nil {
			w.handBack()
		}
		s.mu.Unlock()
	}
	// Partitions are handed back to make room only for acquisitions that
	// succeed: a lost race for a lease costs the other tenant nothing.
	victims, acquire := s.fairShare(s.takenFirst(plan.Acquire, plan.Release))
	if len(acquire) > 0 && s.beatStale(s.cfg.Clock()) {
		// The beat loop's writes failed (or the clock moved on): write the
		// heartbeat before acquiring, or what is taken would be swept.
		s.beatOnce(ctx)
	}
	for i, p := range acquire {
		s.mu.Lock()
		_, running := s.workers[p]
		full := s.delivering()-s.stillDelivering(victims) >= s.cfg.MaxPartitions
		s.mu.Unlock()
		if running {
			continue
		}
		if full {
			contended = true // replan soon for the slots being freed
			break
		}
		if s.life.Context().Err() != nil {
			break
		}
		if s.isPaused(p.Tenant) {
			continue // no new work while the group is paused there
		}
		if s.beatStale(s.cfg.Clock(), p.Tenant) {
			continue // our heartbeat there is about to go stale: what we took would be swept
		}
		lapses := s.lapsesIn(p.Tenant)
		l, err := s.drv.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: p, Owner: s.cfg.ID, Now: now, TTL: s.cfg.LeaseTTL})
		if errors.Is(err, driver.ErrLeaseHeld) {
			contended = true // a peer was quicker; replan soon
			continue
		}
		if err != nil && (ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded)) {
			// The tick's deadline passed: every further acquisition would
			// fail the same way. Say so once; the next tick goes on.
			s.tickFailed(fmt.Sprintf("acquiring leases stopped at the tick's deadline with %d of %d partitions left",
				len(acquire)-i, len(acquire)), errors.Join(err, ctx.Err()))
			break
		}
		if err != nil {
			s.tickFailed(fmt.Sprintf("acquiring the lease of tenant %q partition %q failed", p.Tenant, p.PartitionKey), err)
			continue
		}
		s.cfg.Metrics.LeaseAcquired(l.Tenant)
		s.startWorker(l, lapses)
		victims = s.makeRoom(victims)
	}
	return contended
}

// unseenFor is how long the control loop keeps ticking early for a key a
// wake-up named and no tick has seen: the time a commit the feed reported
// may take to become visible to readers, with room for a loaded server.
const unseenFor = 2 * time.Second

// stillUnseen drops from s.unseen the keys work holds (or another member
// holds) and those named longer than unseenFor ago, and reports whether
// any is left. s.mu is held.
func (s *Member) stillUnseen(work []driver.Partition, held map[[2]string]bool) bool {
	if len(s.unseen) == 0 {
		return false
	}
	for _, p := range work {
		delete(s.unseen, [2]string{p.Tenant, p.PartitionKey})
	}
	for k, at := range s.unseen {
		if held[k] || time.Since(at) > unseenFor {
			delete(s.unseen, k)
		}
	}
	return len(s.unseen) > 0
}

// fairShare applies fairPlan to the member's workers and the balance
// plan's acquisitions (in paused tenants, none): what to hand back, and
// what to acquire in turn.
func (s *Member) fairShare(offered []driver.PartitionRef) (handBack, acquire []driver.PartitionRef) {
	s.mu.Lock()
	defer s.mu.Unlock()
	held := map[string][]heldPartition{}
	for ref, w := range s.workers {
		if !w.leaving() {
			held[ref.Tenant] = append(held[ref.Tenant], heldPartition{ref: ref, idle: w.idleAfter.Load() != 0})
		}
	}
	for _, hs := range held { // map order is random: plans are repeatable
		slices.SortFunc(hs, func(a, b heldPartition) int { return a.ref.Compare(b.ref) })
	}
	want := map[string][]driver.PartitionRef{}
	for _, p := range offered {
		if _, running := s.workers[p]; running || s.isPaused(p.Tenant) {
			continue
		}
		want[p.Tenant] = append(want[p.Tenant], p)
	}
	s.turn++
	return fairPlan(s.cfg.MaxPartitions, held, want, s.turn)
}

// makeRoom hands back victims, in order, while more than MaxPartitions
// workers deliver, and returns the victims left.
func (s *Member) makeRoom(victims []driver.PartitionRef) []driver.PartitionRef {
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(victims) > 0 && s.delivering() > s.cfg.MaxPartitions {
		if w := s.workers[victims[0]]; w != nil {
			w.handBack()
		}
		victims = victims[1:]
	}
	return victims
}

// stillDelivering counts the victims whose workers still deliver: the
// room they can make. s.mu is held.
func (s *Member) stillDelivering(victims []driver.PartitionRef) int {
	n := 0
	for _, p := range victims {
		if w := s.workers[p]; w != nil && !w.leaving() {
			n++
		}
	}
	return n
}

// delivering is the number of workers that take new messages (not
// handing back, not lost). s.mu is held.
func (s *Member) delivering() int {
	n := 0
	for _, w := range s.workers {
		if !w.leaving() {
			n++
		}
	}
	return n
}

// tickInputs lists, for tenants, the group's members, its held leases and
// the partitions with work.
func (s *Member) tickInputs(ctx context.Context, tenants []string) ([]driver.Subscriber, []driver.Lease, []driver.Partition, error) {
	subs, err := s.drv.Subscribers(ctx, driver.GroupScope{Tenants: tenants, Topic: s.cfg.Topic, ConsumerGroup: s.cfg.ConsumerGroup})
	if err != nil {
		return nil, nil, nil, fmt.Errorf("listing subscribers: %w", err)
	}
	leases, err := s.drv.HeldLeases(ctx, driver.GroupScope{Tenants: tenants, Topic: s.cfg.Topic, ConsumerGroup: s.cfg.ConsumerGroup})
	if err != nil {
		return nil, nil, nil, fmt.Errorf("listing leases: %w", err)
	}
	var work []driver.Partition
	if len(tenants) == len(s.cfg.Tenants) {
		work, err = s.discover(ctx)
	} else {
		// Listing tenant by tenant after a failure: read them whole, and
		// leave what discovery remembers as it was.
		work, err = s.drv.PartitionsWithWork(ctx, driver.GroupScope{Tenants: tenants, Topic: s.cfg.Topic, ConsumerGroup: s.cfg.ConsumerGroup})
	}
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

// sweep frees the leases of subscribers whose heartbeat went stale,
// sparing, per tenant, those that beat after spare (spareFrom).
func (s *Member) sweep(ctx context.Context, leases []driver.Lease, member, alive map[string]bool, spare map[string]time.Time, now time.Time) {
	dead := map[string]map[string]bool{} // tenant → owners
	for _, l := range leases {
		// Only members whose heartbeat went stale are known dead. An owner
		// without heartbeat rows is a group receiver (AcceptGroup), which
		// renews its lease instead: its lease expires by itself.
		if l.Owner != "" && member[l.Owner] && !alive[l.Owner] {
			if dead[l.Tenant] == nil {
				dead[l.Tenant] = map[string]bool{}
			}
			dead[l.Tenant][l.Owner] = true
		}
	}
	for _, tenant := range slices.Sorted(maps.Keys(dead)) {
		owners := slices.Sorted(maps.Keys(dead[tenant]))
		// The statement re-reads the heartbeats: one that waited for a
		// lock still spares what beat after the mark (a held-up peer).
		before := now.Add(-s.cfg.StaleAfter)
		if m := spare[tenant]; m.Before(before) {
			before = m
		}
		n, err := s.drv.SweepLeases(ctx, driver.SweepLeasesParams{Group: driver.GroupScope{Tenants: []string{tenant}, Topic: s.cfg.Topic, ConsumerGroup: s.cfg.ConsumerGroup},
			Owners: owners, StaleBefore: before, Now: now})
		if n > 0 {
			s.log.Info("shardq: swept leases of dead subscribers", "tenant", tenant, "dead", owners, "leases", n)
		}
		if err != nil {
			s.log.Warn("shardq: orphan sweep failed; retrying next tick", "tenant", tenant, "err", err)
		}
	}
}
