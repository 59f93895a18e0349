// SPDX-License-Identifier: Apache-2.0

package consumer

import (
	"context"
	"slices"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/lifecycle"
)

// Pausing (shardq admin pause): the group's registry row in a tenant's
// topic carries a paused mark. A member reads the marks of its tenants
// once per rebalance tick (one statement; a member taking only ungrouped
// messages reads them on its own, as often). While its tenant is paused a
// partition's worker delivers nothing more after the message in hand,
// commits, and waits, keeping its lease (renewed as always, never
// idle-released): resuming continues on the same members in order, as
// Kafka's pause keeps the assignment. No new lease is taken and no
// ungrouped message claimed in a paused tenant; messages keep arriving.
//
// A suspended tenant (shardq admin tenant suspend: its settings row) is
// read at the same time and held back the same way, except that its
// workers end after the message in hand and release their leases: a
// suspension may last, and the partitions are no longer this member's.

// refreshPaused reads which of the member's tenants are paused and wakes
// the workers of those resumed.
func (s *Member) refreshPaused(ctx context.Context) {
	ts, err := s.drv.PausedTenants(ctx, driver.GroupScope{Tenants: s.cfg.Tenants, Topic: s.cfg.Topic, ConsumerGroup: s.cfg.ConsumerGroup})
	if err != nil {
		if s.life.Context().Err() == nil {
			s.log.Warn("shardq: reading whether the group is paused failed; keeping the last state", "tenants", s.cfg.Tenants, "err", err)
		}
		return
	}
	settings, err := s.drv.TenantSettings(ctx, s.cfg.Tenants)
	if err != nil {
		if s.life.Context().Err() == nil {
			s.log.Warn("shardq: reading whether the tenants are suspended failed; keeping the last state", "tenants", s.cfg.Tenants, "err", err)
		}
		return
	}
	paused := make(map[string]bool, len(ts))
	for _, t := range ts {
		paused[t] = true
	}
	suspended := map[string]bool{}
	for _, st := range settings {
		if !st.SuspendedAt.IsZero() {
			suspended[st.Tenant], paused[st.Tenant] = true, true
		}
	}
	var resumed, newly []string
	var was map[string]bool // nil map reads as empty
	if p := s.paused.Swap(&paused); p != nil {
		was = *p
	}
	for t := range was {
		if !paused[t] {
			resumed = append(resumed, t)
		}
	}
	for t := range paused {
		if !was[t] && !suspended[t] {
			newly = append(newly, t)
		}
	}
	var wasSuspended map[string]bool
	if p := s.suspended.Swap(&suspended); p != nil {
		wasSuspended = *p
	}
	s.mu.Lock()
	for ref, w := range s.workers {
		// Resumed: deliver again; suspended: end now, even while idle.
		if slices.Contains(resumed, ref.Tenant) || suspended[ref.Tenant] {
			signal(w.wake)
		}
	}
	s.mu.Unlock()
	for t := range suspended {
		if !wasSuspended[t] {
			s.log.Info("shardq: tenant suspended; releasing its partitions and delivering nothing until resumed", "tenant", t)
		}
	}
	if len(newly) > 0 {
		s.log.Info("shardq: consumer group paused; delivering nothing until resumed", "tenants", newly)
	}
	if len(resumed) > 0 {
		s.log.Info("shardq: consumer group resumed", "tenants", resumed)
		if s.ungrouped != nil {
			for _, t := range resumed {
				s.ungrouped.Wake(t) // claimed from at once, dry or not
			}
		}
	}
}

// isPaused reports whether the group is paused in tenant, or the tenant
// suspended, as last read.
func (s *Member) isPaused(tenant string) bool {
	p := s.paused.Load()
	return p != nil && (*p)[tenant]
}

// isSuspended reports whether tenant is suspended, as last read.
func (s *Member) isSuspended(tenant string) bool {
	p := s.suspended.Load()
	return p != nil && (*p)[tenant]
}

// watchPaused reads the paused marks every DiscoveryInterval: the tick's
// part for a member that runs no ticks (taking only ungrouped messages).
func (s *Member) watchPaused() {
	lifecycle.Every(s.life.Context(), s.cfg.DiscoveryInterval, true, func() {
		ctx, cancel := context.WithTimeout(s.life.Context(), dbTimeout)
		defer cancel()
		s.refreshPaused(ctx)
	})
}
