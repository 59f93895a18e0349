// SPDX-License-Identifier: Apache-2.0

// Package tenants is a client's runtime of its tenants' settings rows
// (queue_tenants): the cache of each tenant's suspension and limits
// (States), the quotas it enforces on publishes and on consumers' writes
// (Admit, Writes), and the errors a refusal returns, which the shardq
// package re-exports.
package tenants

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/telemetry"
)

// maxStates bounds the tenants whose settings a client remembers:
// past it, the entries read longest ago are dropped first.
const maxStates = 10_000

// States is what a client knows of tenants' settings rows
// (queue_tenants). Each tenant's row is read at most once per ttl by
// whichever call finds it stale; the others read the last snapshot without
// a lock. So a suspension reaches this client's publishes and receives
// within ttl (Options.TTL: Config.TenantSettingsTTL).
type States struct {
	drv        driver.Driver
	ttl        time.Duration
	usageEvery time.Duration
	clock      func() time.Time
	tel        *telemetry.T
	log        *slog.Logger

	// life ends the background usage measures (quotas.go) at close; bg
	// counts them.
	life context.Context
	stop context.CancelFunc
	bgMu sync.Mutex // orders starting a measure against close
	bg   sync.WaitGroup

	mu    sync.Mutex
	known map[string]*state
}

// Options are what States takes from the client's Config, defaults
// applied.
type Options struct {
	TTL        time.Duration    // Config.TenantSettingsTTL: how long a settings row read holds
	UsageEvery time.Duration    // Config.TenantUsageInterval: how often what a tenant stores is measured
	Clock      func() time.Time // Config.Clock
	Tel        *telemetry.T     // the client's metrics: quota refusals
	Log        *slog.Logger     // Config.Logger: failed background measures
}

type state struct {
	snap    atomic.Pointer[snapshot]
	reading sync.Mutex // held by the call reading the row
	quota   quotaState
}

type snapshot struct {
	readAt      time.Time
	suspendedAt time.Time // zero: active
	limits      driver.TenantLimits
}

// New returns the states of the tenants of drv; Close ends what it runs in
// the background.
func New(drv driver.Driver, o Options) *States {
	life, stop := context.WithCancel(context.Background())
	return &States{drv: drv, ttl: o.TTL, usageEvery: o.UsageEvery, clock: o.Clock,
		tel: o.Tel, log: o.Log, life: life, stop: stop, known: map[string]*state{}}
}

// Close ends the background usage measures and waits for them.
func (ts *States) Close() {
	ts.bgMu.Lock()
	ts.stop()
	ts.bgMu.Unlock()
	ts.bg.Wait()
}

func (ts *States) entry(tenant string) *state {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if st := ts.known[tenant]; st != nil {
		return st
	}
	if len(ts.known) >= maxStates {
		ts.evict()
	}
	st := &state{}
	st.quota.measuring.init()
	st.quota.admitting.init()
	ts.known[tenant] = st
	return st
}

// evict drops the stale entries, or when none is stale, one of those read
// longest ago; ts.mu is held.
func (ts *States) evict() {
	now := ts.clock()
	var oldest string
	var oldestAt time.Time
	for t, st := range ts.known {
		s := st.snap.Load()
		if s == nil || now.Sub(s.readAt) >= ts.ttl {
			delete(ts.known, t)
			continue
		}
		if oldest == "" || s.readAt.Before(oldestAt) {
			oldest, oldestAt = t, s.readAt
		}
	}
	if len(ts.known) >= maxStates {
		delete(ts.known, oldest)
	}
}

// Forget drops what is known of tenant's row and stores: the next check
// reads the row and measures again. What this client admitted stays
// counted until a measure holds it.
func (ts *States) Forget(tenant string) {
	ts.mu.Lock()
	st := ts.known[tenant]
	ts.mu.Unlock()
	if st != nil {
		st.snap.Store(nil)
		st.quota.usage.Store(nil)
	}
}

// Check fails with a *TenantSuspendedError when tenant is suspended, as
// last read within ttl.
func (ts *States) Check(ctx context.Context, tenant string) error {
	_, s, err := ts.read(ctx, tenant)
	if err != nil {
		return err
	}
	if !s.suspendedAt.IsZero() {
		return &TenantSuspendedError{Tenant: tenant, Since: s.suspendedAt}
	}
	return nil
}

// read returns the tenant's entry and its settings as read within ttl.
func (ts *States) read(ctx context.Context, tenant string) (*state, *snapshot, error) {
	st := ts.entry(tenant)
	if s := st.snap.Load(); s != nil && ts.clock().Sub(s.readAt) < ts.ttl {
		return st, s, nil
	}
	st.reading.Lock()
	defer st.reading.Unlock()
	now := ts.clock()
	if s := st.snap.Load(); s != nil && now.Sub(s.readAt) < ts.ttl {
		return st, s, nil // read by the call this one waited for
	}
	rows, err := ts.drv.TenantSettings(ctx, []string{tenant})
	if err != nil {
		return nil, nil, fmt.Errorf("read the settings of tenant %q: %w", tenant, err)
	}
	s := &snapshot{readAt: now}
	for _, r := range rows {
		s.suspendedAt, s.limits = r.SuspendedAt, r.Limits
	}
	st.snap.Store(s)
	return st, s, nil
}

// Active is tenants without the suspended ones; when every one is
// suspended it fails with the first one's *TenantSuspendedError.
func (ts *States) Active(ctx context.Context, tenants []string) ([]string, error) {
	var active []string
	var first error
	for _, t := range tenants {
		switch err := ts.Check(ctx, t); {
		case err == nil:
			active = append(active, t)
		case errors.Is(err, ErrTenantSuspended):
			first = cmp.Or(first, err)
		default:
			return nil, err
		}
	}
	if len(active) == 0 {
		return nil, first
	}
	return active, nil
}
