// SPDX-License-Identifier: Apache-2.0

// Package keepalive keeps an explicitly held lease (a group receiver's)
// alive: it renews the lease once a third of its TTL has passed, reports
// it lost when a renewal is refused (taken over, or expired: an expired
// lease is not renewed, see docs/leases.md), and gives it up when its
// holder has been idle too long. The root package's GroupReceiver is its
// holder.
package keepalive

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/lifecycle"
)

// Config is the service's settings; every field is required.
type Config struct {
	TTL, IdleTimeout time.Duration
	Timeout          time.Duration // bounds one renewal
	Clock            func() time.Time
	Log              *slog.Logger
	// Done is closed when the holder closes; the service then ends.
	Done <-chan struct{}
	// State reads the holder's lease and whether it is idle at now
	// (nothing in hand, no activity for IdleTimeout).
	State func(now time.Time) (l driver.Lease, idle bool)
	// Renewed stores a renewed lease; Idle gives the lease up; Lost
	// closes the holder after a refused renewal.
	Renewed func(driver.Lease)
	Idle    func(driver.Lease)
	Lost    func(error)
}

// Service runs the keep-alive loop.
type Service struct{ life *lifecycle.Group }

// Start runs the loop until Done is closed or Stop.
func Start(leases driver.Leases, cfg Config) *Service {
	s := &Service{life: lifecycle.New(context.Background())}
	s.life.Go(func() { loop(s.life.Context(), leases, cfg) })
	return s
}

// Stop ends the loop and waits for it.
func (s *Service) Stop(ctx context.Context) { s.life.Stop(ctx) }

// Period is how often the loop looks at a lease of ttl whose holder
// goes idle after idle: at most a tenth of ttl, so that a renewal that
// failed (it waited on a row lock that a frozen process held until the
// server ended its session) is tried again well before the lease could
// lapse (docs/leases.md, "Bounded waits").
func Period(ttl, idle time.Duration) time.Duration {
	return min(ttl/10, max(idle/10, time.Millisecond))
}

func loop(ctx context.Context, leases driver.Leases, cfg Config) {
	t := time.NewTicker(Period(cfg.TTL, cfg.IdleTimeout))
	defer t.Stop()
	renewed := cfg.Clock()
	for {
		select {
		case <-cfg.Done:
			return
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := cfg.Clock()
		l, idle := cfg.State(now)
		if idle {
			cfg.Idle(l)
			return
		}
		if now.Sub(renewed) < cfg.TTL/3 {
			continue
		}
		rctx, cancel := context.WithTimeout(context.Background(), cfg.Timeout)
		nl, err := leases.RenewLease(rctx, l, now, cfg.TTL)
		cancel()
		switch {
		case errors.Is(err, driver.ErrLeaseLost):
			cfg.Lost(err)
			return
		case err != nil:
			cfg.Log.Warn("shardq: renewing the group lease failed; retrying", "err", err)
		default:
			renewed = now
			cfg.Renewed(nl)
		}
	}
}
