// SPDX-License-Identifier: Apache-2.0

package consumer

import (
	"context"
	"log/slog"
	"time"

	"github.com/shardq/shardq/driver"
)

// TickCosts are the durations of discovery ticks (TickCost).
type TickCosts struct {
	First    time.Duration   // the first tick: what moved, and the sweep's first page
	Sweeping []time.Duration // the ticks that read a page of the sweep
	Steady   []time.Duration // the ticks after it: what moved, and what had work
	Work     int             // the partitions with work the last tick saw
}

// TickCost times what discovery ticks of a member of cfg's group read
// (members, held leases, partitions with work: the member's own code,
// tickInputs): the first tick, every tick of the first sweep, and n ticks
// after it. `shardq bench discovery` reports them.
func TickCost(ctx context.Context, d driver.Driver, cfg Config, n int) (TickCosts, error) {
	if cfg.DiscoveryWindow <= 0 {
		cfg.DiscoveryWindow = time.Minute
	}
	if cfg.FullDiscoveryInterval <= 0 {
		cfg.FullDiscoveryInterval = time.Hour
	}
	m := &Member{drv: d, log: slog.New(slog.DiscardHandler), cfg: cfg}
	var c TickCosts
	tick := func() (time.Duration, error) {
		start := time.Now()
		_, _, ps, err := m.tickInputs(ctx, cfg.Tenants)
		c.Work = len(ps)
		return time.Since(start), err
	}
	var err error
	if c.First, err = tick(); err != nil {
		return c, err
	}
	for len(c.Steady) < n {
		sweeping := m.disc.sweep.on
		dt, err := tick()
		if err != nil {
			return c, err
		}
		if sweeping {
			c.Sweeping = append(c.Sweeping, dt)
		} else {
			c.Steady = append(c.Steady, dt)
		}
	}
	return c, nil
}
