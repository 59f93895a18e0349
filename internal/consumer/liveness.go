// SPDX-License-Identifier: Apache-2.0

package consumer

import (
	"context"
	"sync"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/lifecycle"
)

// beat writes the member's heartbeat every HeartbeatInterval, and
// renewals renew its leases as often, each on its own goroutine and apart
// from manage: a renewal may wait on a row lock that another member's
// transaction holds (a frozen process's, until the server ends its
// session), and a heartbeat never waits behind it (docs/leases.md,
// "Bounded waits").
func (s *Member) beat() {
	lifecycle.Every(s.life.Context(), s.cfg.HeartbeatInterval, false, func() {
		s.beatOnce(s.life.Context()) // fenced, the subscription stops the member and renew finds its leases lost
	})
}

func (s *Member) renewals() {
	lifecycle.Every(s.life.Context(), s.cfg.HeartbeatInterval, false, func() {
		ctx, cancel := context.WithTimeout(s.life.Context(), dbTimeout)
		defer cancel()
		s.renew(ctx, s.cfg.Clock()) // a lost lease cancels its handler at once
	})
}

// beatOnce writes the member's heartbeat rows. A static member refreshes
// its rows and adds one back only once takenOver found no later
// incarnation (which deleted it): it reports whether one did. One write
// at a time, stamped when it starts, so that the rows' time never goes
// back (the beat loop, a tick and a stop may each write). A write runs to
// its end, bounded by the shorter of HeartbeatInterval and dbTimeout
// (and so a stop by two of them past its context), whether or not the member stops
// meanwhile: a write cancelled on the client may still land in the
// database after Stop has deleted the rows, and leave the stopped member
// counted as live until it goes stale.
func (s *Member) beatOnce(ctx context.Context) (fenced bool) {
	s.beatMu.Lock()
	defer s.beatMu.Unlock()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(s.cfg.HeartbeatInterval, dbTimeout))
	defer cancel()
	now := s.cfg.Clock()
	if s.cfg.Instance != "" {
		n, err := s.drv.RefreshHeartbeat(ctx, s.scope(), s.cfg.ID, now)
		if err != nil {
			if s.life.Context().Err() == nil {
				s.log.Warn("shardq: heartbeat failed; retrying", "tenants", s.cfg.Tenants, "err", err)
			}
			return false // never written back unchecked
		}
		if n == int64(len(s.cfg.Tenants)) {
			s.beaten(s.cfg.Tenants, now)
			return false
		}
		if fenced, known := s.takenOver(ctx); fenced || !known {
			return fenced
		}
	}
	if err := s.heartbeat(ctx, now); err != nil && s.life.Context().Err() == nil {
		s.log.Warn("shardq: heartbeat failed; retrying", "tenants", s.cfg.Tenants, "err", err)
	}
	return false
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
			s.log.Warn("shardq: lease lost; stopping the partition", "tenant", l.Tenant, "partition_key", l.PartitionKey, "token", l.Token)
			w.lose()
		}
	}
}

// renewUntil writes the member's heartbeat and renews its leases every
// HeartbeatInterval, each on its own goroutine as beat and renewals do,
// until done closes: while a stopping member's handlers drain (a stale
// heartbeat would let the others sweep its leases, and stop its workers:
// worker.giveUpAt).
func (s *Member) renewUntil(done <-chan struct{}) {
	// A write in flight when done closes ends with it: Stop is bounded
	// by its caller's context (a beat by its interval, beatOnce).
	base, cancelBase := context.WithCancel(context.Background())
	defer cancelBase()
	go func() {
		select {
		case <-done:
			cancelBase()
		case <-base.Done():
		}
	}()
	every := func(fn func(ctx context.Context)) {
		t := time.NewTicker(s.cfg.HeartbeatInterval)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				select {
				case <-done: // both were ready: drained wins
					return
				default:
				}
				ctx, cancel := context.WithTimeout(base, dbTimeout)
				fn(ctx)
				cancel()
			}
		}
	}
	var wg sync.WaitGroup
	wg.Go(func() { every(func(ctx context.Context) { s.beatOnce(ctx) }) })
	every(func(ctx context.Context) { s.renew(ctx, s.cfg.Clock()) })
	wg.Wait()
}
