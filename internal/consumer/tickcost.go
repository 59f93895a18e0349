// SPDX-License-Identifier: Apache-2.0

package consumer

import (
	"context"
	"log/slog"
	"time"

	"github.com/shardq/shardq/driver"
)

// TickCost times what discovery ticks of a member of cfg's group read
// (members, held leases, partitions with work: the member's own code,
// tickInputs): one full tick, then n incremental ones. It returns their
// durations and the partitions with work the last tick saw. `shardq bench
// discovery` reports them.
func TickCost(ctx context.Context, d driver.Driver, cfg Config, n int) (full time.Duration, incremental []time.Duration, work int, err error) {
	if cfg.DiscoveryWindow <= 0 {
		cfg.DiscoveryWindow = time.Minute
	}
	if cfg.FullDiscoveryInterval <= 0 {
		cfg.FullDiscoveryInterval = time.Hour
	}
	m := &Member{drv: d, log: slog.New(slog.DiscardHandler), cfg: cfg}
	tick := func() (time.Duration, error) {
		start := time.Now()
		_, _, ps, err := m.tickInputs(ctx, cfg.Tenants)
		work = len(ps)
		return time.Since(start), err
	}
	if full, err = tick(); err != nil { // the first tick reads everything
		return 0, nil, 0, err
	}
	for range n {
		dt, err := tick()
		if err != nil {
			return full, incremental, work, err
		}
		incremental = append(incremental, dt)
	}
	return full, incremental, work, nil
}
