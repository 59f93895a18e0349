// SPDX-License-Identifier: Apache-2.0

package consumer

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/shardq/shardq/driver"
)

// discovery is what a member remembers between ticks so that a tick reads
// what changed, not every partition ever used (docs/consumers.md,
// "Discovery"). Only the control loop touches it.
//
// A tick reads (a) the partitions whose head moved at or after the
// previous tick's start less DiscoveryWindow, and (b) again, the
// partitions that had work at the previous tick; work is those with a
// head past the cursor. A publish whose transaction commits within
// DiscoveryWindow of stamping its head (updated_at) is seen by the first
// tick that starts after its commit; one that commits later, and any
// partition whose head moved while (a) failed, is seen by the full read
// every FullDiscoveryInterval. So no partition with work is missed for
// longer than FullDiscoveryInterval plus a tick.
type discovery struct {
	work   map[[2]string]bool // (tenant, key) with work at the last tick
	since  time.Time          // the last tick's start (wall clock)
	fullAt time.Time          // the last full read's start (wall clock)
}

// discover lists the partitions with work in all of the member's tenants.
// The clock is the wall clock, as the publishers' head stamps are, never
// the injected Clock.
func (s *Member) discover(ctx context.Context) ([]driver.Partition, error) {
	d := &s.disc
	start := time.Now()
	if d.work == nil || start.Sub(d.fullAt) >= s.cfg.FullDiscoveryInterval {
		work, err := s.drv.PartitionsWithWork(ctx, s.cfg.Tenants, s.cfg.Topic, s.cfg.ConsumerGroup)
		if err != nil {
			return nil, err
		}
		d.remember(work, start)
		d.fullAt = start
		return work, nil
	}
	work, err := s.drv.PartitionsMovedSince(ctx, s.cfg.Tenants, s.cfg.Topic, s.cfg.ConsumerGroup, d.since.Add(-s.cfg.DiscoveryWindow))
	if err != nil {
		return nil, err
	}
	moved := make(map[[2]string]bool, len(work))
	for _, p := range work {
		moved[[2]string{p.Tenant, p.PartitionKey}] = true
	}
	again := map[string][]string{} // tenant → keys that had work and did not move
	for k := range d.work {
		if !moved[k] {
			again[k[0]] = append(again[k[0]], k[1])
		}
	}
	for tenant, keys := range again {
		ps, err := s.drv.PartitionsWithWorkOf(ctx, tenant, s.cfg.Topic, s.cfg.ConsumerGroup, keys)
		if err != nil {
			return nil, err
		}
		work = append(work, ps...)
	}
	slices.SortFunc(work, func(a, b driver.Partition) int {
		if c := strings.Compare(a.Tenant, b.Tenant); c != 0 {
			return c
		}
		return strings.Compare(a.PartitionKey, b.PartitionKey)
	})
	d.remember(work, start)
	return work, nil
}

// remember keeps work as the partitions with work as of a tick that
// started at start.
func (d *discovery) remember(work []driver.Partition, start time.Time) {
	d.work = make(map[[2]string]bool, len(work))
	for _, p := range work {
		d.work[[2]string{p.Tenant, p.PartitionKey}] = true
	}
	d.since = start
}
