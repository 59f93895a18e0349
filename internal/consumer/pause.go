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
	paused := make(map[string]bool, len(ts))
	for _, t := range ts {
		paused[t] = true
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
		if !was[t] {
			newly = append(newly, t)
		}
	}
	s.mu.Lock()
	for ref, w := range s.workers {
		if slices.Contains(resumed, ref.Tenant) {
			signal(w.wake)
		}
	}
	s.mu.Unlock()
	if len(newly) > 0 {
		s.log.Info("shardq: consumer group paused; delivering nothing until resumed", "tenants", newly)
	}
	if len(resumed) > 0 {
		s.log.Info("shardq: consumer group resumed", "tenants", resumed)
		if s.ungrouped != nil {
			s.ungrouped.Rescan()
		}
	}
}

// isPaused reports whether the group is paused in tenant, as last read.
func (s *Member) isPaused(tenant string) bool {
	p := s.paused.Load()
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
