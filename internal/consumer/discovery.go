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
// previous tick's start less DiscoveryWindow, (b) again, the partitions
// that had work at the previous tick, and (c) while a sweep is on, the
// next page of every head row; work is those with a head past the
// cursor. A sweep starts with the first tick and then every
// FullDiscoveryInterval, and reads at most sweepRows head rows a tick. A
// publish whose transaction commits within DiscoveryWindow of stamping its
// head (updated_at) is seen by the first tick that starts after its
// commit; one that commits later, and any partition whose head moved
// while (a) failed, is seen by the next sweep. So no partition with work
// is missed for longer than FullDiscoveryInterval plus one sweep (N head
// rows take N/sweepRows ticks).
type discovery struct {
	work  map[[2]string]bool // (tenant, key) with work at the last tick
	since time.Time          // the last tick's start (wall clock)
	sweep sweep
}

// sweep is the read of every head row, spread over ticks: the position
// of the next page.
type sweep struct {
	on        bool
	startedAt time.Time // the current, or last, sweep's start (wall clock)
	// tenants are the member's tenants with partitions of the topic, read
	// at the sweep's start (nil: not yet): tenants without any cost the
	// sweep nothing.
	tenants []string
	tenant  int      // index in tenants
	after   []string // the last key read in that tenant (nil: none yet)
	done    int      // sweeps completed
}

// Rows and statements one tick's sweep may read: the first sweep, at
// start-up and while the member has no work, goes faster so that an old
// backlog is found soon; later ones only catch commits later than the
// window.
// (Variables: the tests shrink them.)
var (
	firstSweepRows = 10_000
	sweepRows      = 2_000
	sweepPages     = 16
)

// discover lists the partitions with work in all of the member's tenants.
// The clock is the wall clock, as the publishers' head stamps are, never
// the injected Clock.
func (s *Member) discover(ctx context.Context) ([]driver.Partition, error) {
	d := &s.disc
	start := time.Now()
	since := d.since
	if d.work == nil {
		since = start
	}
	work, err := s.drv.PartitionsMovedSince(ctx, driver.GroupScope{Tenants: s.cfg.Tenants, Topic: s.cfg.Topic, ConsumerGroup: s.cfg.ConsumerGroup}, since.Add(-s.cfg.DiscoveryWindow))
	if err != nil {
		return nil, err
	}
	seen := make(map[[2]string]bool, len(work))
	for _, p := range work {
		seen[[2]string{p.Tenant, p.PartitionKey}] = true
	}
	again := map[string][]string{} // tenant → keys that had work and did not move
	for k := range d.work {
		if !seen[k] {
			again[k[0]] = append(again[k[0]], k[1])
		}
	}
	for tenant, keys := range again {
		ps, err := s.drv.PartitionsWithWorkOf(ctx, driver.GroupScope{Tenants: []string{tenant}, Topic: s.cfg.Topic, ConsumerGroup: s.cfg.ConsumerGroup}, keys)
		if err != nil {
			return nil, err
		}
		for _, p := range ps {
			seen[[2]string{p.Tenant, p.PartitionKey}] = true
		}
		work = append(work, ps...)
	}
	if !d.sweep.on && (d.work == nil || start.Sub(d.sweep.startedAt) >= s.cfg.FullDiscoveryInterval) {
		d.sweep = sweep{on: true, startedAt: start, done: d.sweep.done}
	}
	if d.sweep.on {
		ps, err := s.sweepStep(ctx, len(work) > 0)
		if err != nil {
			return nil, err
		}
		for _, p := range ps {
			if !seen[[2]string{p.Tenant, p.PartitionKey}] {
				work = append(work, p)
			}
		}
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

// sweepStep reads the sweep's next pages, up to its row and statement
// budget, and returns the partitions with work among them. The first
// sweep reads larger pages while the member has nothing else to do, so
// that a member starting on an old backlog finds it soon; one that
// already has work does not take CPU and cache from it (docs/BENCHMARKS.md,
// statement costs: large pages cost a busy member much of its CPU).
func (s *Member) sweepStep(ctx context.Context, busy bool) ([]driver.Partition, error) {
	sw := &s.disc.sweep
	budget := sweepRows
	if sw.done == 0 && !busy {
		budget = firstSweepRows
	}
	if sw.tenants == nil {
		ts, err := s.drv.TenantsWithPartitions(ctx, s.cfg.Tenants, s.cfg.Topic)
		if err != nil {
			return nil, err
		}
		sw.tenants = append([]string{}, ts...)
	}
	var work []driver.Partition
	for range sweepPages {
		if budget == 0 || !sw.on {
			break
		}
		if sw.tenant == len(sw.tenants) { // none had partitions
			sw.on, sw.tenant, sw.tenants = false, 0, nil
			sw.done++
			break
		}
		tenant := sw.tenants[sw.tenant]
		page, err := s.drv.HeadsPage(ctx, driver.GroupRef{Tenant: tenant, Topic: s.cfg.Topic, ConsumerGroup: s.cfg.ConsumerGroup}, sw.after, budget)
		if err != nil {
			return nil, err
		}
		for _, p := range page {
			if p.HeadOffset > p.CommittedOffset {
				work = append(work, p)
			}
		}
		budget -= len(page)
		if len(page) > 0 {
			sw.after = []string{page[len(page)-1].PartitionKey}
		}
		if budget > 0 { // the tenant's last page
			sw.tenant, sw.after = sw.tenant+1, nil
			if sw.tenant == len(sw.tenants) {
				sw.on, sw.tenant, sw.tenants = false, 0, nil
				sw.done++
			}
		}
	}
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
