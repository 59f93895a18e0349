// SPDX-License-Identifier: Apache-2.0

package consumer

import (
	"context"
	"errors"
	"maps"
	"slices"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/ident"
)

// ErrInstanceFenced ends a static member that a later process with the
// same InstanceID took over.
var ErrInstanceFenced = errors.New("another process took over this static member (same InstanceID); this one stopped")

// A static member (Config.Instance) keeps its partitions across a
// restart, as Kafka's static membership does:
//
//	start ──► takeOver: the leases of earlier incarnations of the
//	          instance move to this one (next token: their writes fail)
//	          and their heartbeat rows are replaced by its own, in one
//	          transaction per tenant; the peers see the same number of
//	          members, so their quotas, and their partitions, stay.
//	tick  ──► the taken-over partitions are acquired first; each worker
//	          hands out nothing before the expiry its earlier holder
//	          knew: a holder that still runs hands out nothing past it
//	          by its own clock (it cannot renew), so no two deliver one
//	          partition at once (invariant 3).
//	beat  ──► RefreshHeartbeat: a static member refreshes its rows and
//	          never adds one back unchecked. One missing, and a row of
//	          an incarnation it did not take over (takenOver): a later
//	          process took this one over (in the transaction that deleted
//	          the row), and it stops (ErrInstanceFenced) without beating
//	          again. A row of one it took over is deleted again. A
//	          failed read skips the beat.
//	tick  ──► two incarnations that started together (neither took the
//	          other over): the one that started later stays (rivals).
//	stop  ──► a graceful stop keeps its place: its heartbeat rows stay,
//	          its leases end now in its name (not while a taken-over one
//	          is not yet due: they lapse by themselves), for its next
//	          process to take over; it renews its leases while its
//	          handlers drain. A fenced one frees what it still holds.
//
// The tick leaves the incarnations it took over out of the live members.

func (s *Member) scope() driver.GroupScope {
	return driver.GroupScope{Tenants: s.cfg.Tenants, Topic: s.cfg.Topic, ConsumerGroup: s.cfg.ConsumerGroup}
}

// incarnations lists the heartbeat rows of the instance's other
// incarnations, by name, with their tenants.
func (s *Member) incarnations(ctx context.Context) (map[string][]string, error) {
	subs, err := s.drv.Subscribers(ctx, s.scope())
	if err != nil {
		return nil, err
	}
	out := map[string][]string{}
	for _, sub := range subs {
		if sub.Name != s.cfg.ID && ident.IsIncarnation(s.cfg.Instance, sub.Name) {
			out[sub.Name] = append(out[sub.Name], sub.Tenant)
		}
	}
	return out, nil
}

// takeOver takes over the earlier incarnations of a static member.
func (s *Member) takeOver(ctx context.Context) error {
	if s.cfg.Instance == "" {
		return nil
	}
	others, err := s.incarnations(ctx)
	if err != nil || len(others) == 0 {
		return err
	}
	return s.adopt(ctx, slices.Collect(maps.Keys(others)))
}

// adopt takes over the incarnations names: their leases and heartbeat
// rows.
func (s *Member) adopt(ctx context.Context, names []string) error {
	var taken []driver.Lease
	// Each attempt moves what is left (tenant by tenant): keep every
	// attempt's leases, and record them even when the last one fails.
	err := s.retrying(ctx, func() error {
		ls, err := s.drv.TakeOverMember(ctx, driver.TakeOverMemberParams{Group: s.scope(), Previous: names, Member: s.cfg.ID, Now: s.cfg.Clock(), TTL: s.cfg.LeaseTTL})
		taken = append(taken, ls...)
		return err
	})
	defer s.log.Info("shardq: static member took over its earlier incarnations", "instance", s.cfg.Instance, "previous", names, "leases", len(taken), "err", err)
	s.mu.Lock()
	// A new map: readers use the one they read under mu without it.
	previous := maps.Clone(s.previous)
	if previous == nil {
		previous = map[string]bool{}
	}
	for _, name := range names {
		previous[name] = true
	}
	s.previous = previous
	if s.taken == nil {
		s.taken = make(map[driver.PartitionRef]time.Time, len(taken))
	}
	for _, l := range taken {
		s.taken[l.PartitionRef] = l.ExpiresAt
	}
	s.mu.Unlock()
	return err
}

// fence stops a static member that a later incarnation took over.
func (s *Member) fence(by string) {
	s.fenceOnce.Do(func() {
		s.log.Error("shardq: another process took over this static member; stopping", "instance", s.cfg.Instance, "by", by)
		close(s.fenced)
	})
}

// takenOver reports whether a later incarnation took this static member
// over (and then fences it), and whether it could tell (the membership
// read succeeded); it deletes the rows of earlier ones that beat again.
func (s *Member) takenOver(ctx context.Context) (fenced, known bool) {
	others, err := s.incarnations(ctx)
	if err != nil {
		s.log.Warn("shardq: reading a static member's incarnations failed; not beating until it succeeds", "err", err)
		return false, false
	}
	s.mu.Lock()
	previous := s.previous
	s.mu.Unlock()
	for name, tenants := range others {
		if !previous[name] {
			s.fence(name)
			return true, true
		}
		g := s.scope()
		g.Tenants = tenants
		if err := s.drv.RemoveHeartbeat(ctx, g, name); err != nil {
			s.log.Warn("shardq: removing an earlier incarnation's heartbeat failed; retrying", "previous", name, "err", err)
		}
	}
	return false, true
}

// rivals settles two incarnations that neither took the other over (two
// processes started together): the one that started later stays and
// takes the other over; the other is fenced. It reports whether this
// one is.
func (s *Member) rivals(ctx context.Context, subs []driver.Subscriber, previous map[string]bool) bool {
	var mine time.Time
	for _, sub := range subs {
		if sub.Name == s.cfg.ID && (mine.IsZero() || sub.StartedAt.Before(mine)) {
			mine = sub.StartedAt
		}
	}
	others := map[string]time.Time{} // each rival's earliest start
	for _, sub := range subs {
		if sub.Name == s.cfg.ID || previous[sub.Name] || !ident.IsIncarnation(s.cfg.Instance, sub.Name) {
			continue
		}
		if at, ok := others[sub.Name]; !ok || sub.StartedAt.Before(at) {
			others[sub.Name] = sub.StartedAt
		}
	}
	var older []string
	for name, at := range others {
		if at.After(mine) || at.Equal(mine) && name > s.cfg.ID {
			s.fence(name)
			return true
		}
		older = append(older, name)
	}
	if len(older) > 0 {
		if err := s.adopt(ctx, older); err != nil {
			// It fences itself once it sees this one, and frees what it holds.
			s.log.Warn("shardq: taking over an earlier incarnation failed; it stops when it sees this one", "previous", older, "err", err)
		}
	}
	return false
}

func (s *Member) isFenced() bool {
	select {
	case <-s.fenced:
		return true
	default:
		return false
	}
}

// takenFirst puts the partitions taken over and not yet worked (which
// the plan counts as held: mine) before acquire, except those the plan
// hands back, so that they get workers before any other partition.
func (s *Member) takenFirst(acquire, release []driver.PartitionRef) []driver.PartitionRef {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.taken) == 0 {
		return acquire
	}
	var first []driver.PartitionRef
	for p := range s.taken {
		if s.workers[p] == nil && !slices.Contains(release, p) && !slices.Contains(acquire, p) {
			first = append(first, p)
		}
	}
	slices.SortFunc(first, driver.PartitionRef.Compare)
	return append(first, acquire...)
}

// takenUntil returns the expiry the earlier holder of p knew when this
// member took it over (zero: not taken over); doneWaiting forgets it
// once a worker waited it out, so that a worker ended before that waits
// again.
func (s *Member) takenUntil(p driver.PartitionRef) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.taken[p]
}

func (s *Member) doneWaiting(p driver.PartitionRef) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.taken, p)
}

// pendingTakeover reports whether a partition taken over is not yet due.
func (s *Member) pendingTakeover(now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, until := range s.taken {
		if now.Before(until) {
			return true
		}
	}
	return false
}

// Fenced is closed when a later incarnation of this static member took
// it over.
func (s *Member) Fenced() <-chan struct{} { return s.fenced }

// abandon undoes, as far as it can, the place of a static member whose
// start failed: its leases end and its heartbeat rows go.
func (s *Member) abandon() {
	ctx, cancel := context.WithTimeout(context.Background(), dbTimeout)
	defer cancel()
	if !s.pendingTakeover(s.cfg.Clock()) {
		if _, err := s.drv.ExpireLeases(ctx, s.scope(), s.cfg.ID, s.cfg.Clock()); err != nil {
			s.log.Warn("shardq: ending the leases of a static member that failed to start failed; they lapse by themselves", "err", err)
		}
	}
	if err := s.drv.RemoveHeartbeat(ctx, s.scope(), s.cfg.ID); err != nil {
		s.log.Warn("shardq: removing the heartbeat of a static member that failed to start failed", "err", err)
	}
}
