// SPDX-License-Identifier: Apache-2.0

package shardq

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

// ErrTenantSuspended refuses a publish, receive or accept in a suspended
// tenant, and a consumer's write that keeps or adds something (a group's
// state, a deferral, a longer visibility) (Admin.SuspendTenant); the
// error is a *TenantSuspendedError.
var ErrTenantSuspended = errors.New("tenant is suspended")

// TenantSuspendedError names the suspended tenant and since when.
type TenantSuspendedError struct {
	Tenant string
	Since  time.Time
}

func (e *TenantSuspendedError) Error() string {
	return fmt.Sprintf("tenant %q is suspended since %s; an operator resumes it (shardq admin tenant resume)",
		e.Tenant, e.Since.UTC().Format(time.RFC3339))
}

// Is makes errors.Is(err, ErrTenantSuspended) match.
func (e *TenantSuspendedError) Is(target error) bool { return target == ErrTenantSuspended }

// maxTenantStates bounds the tenants whose settings a client remembers:
// past it, the entries read longest ago are dropped first.
const maxTenantStates = 10_000

// tenantStates is what a client knows of tenants' settings rows
// (queue_tenants). Each tenant's row is read at most once per ttl by
// whichever call finds it stale; the others read the last snapshot without
// a lock. So a suspension reaches this client's publishes and receives
// within ttl (Config.TenantSettingsTTL).
type tenantStates struct {
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
	known map[string]*tenantState
}

type tenantState struct {
	snap    atomic.Pointer[tenantSnapshot]
	reading sync.Mutex // held by the call reading the row
	quota   quotaState
}

type tenantSnapshot struct {
	readAt      time.Time
	suspendedAt time.Time // zero: active
	limits      driver.TenantLimits
}

func newTenantStates(drv driver.Driver, cfg Config, tel *telemetry.T) *tenantStates {
	life, stop := context.WithCancel(context.Background())
	return &tenantStates{drv: drv, ttl: cfg.TenantSettingsTTL, usageEvery: cfg.TenantUsageInterval, clock: cfg.Clock,
		tel: tel, log: cfg.Logger, life: life, stop: stop, known: map[string]*tenantState{}}
}

// close ends the background usage measures and waits for them.
func (ts *tenantStates) close() {
	ts.bgMu.Lock()
	ts.stop()
	ts.bgMu.Unlock()
	ts.bg.Wait()
}

func (ts *tenantStates) entry(tenant string) *tenantState {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if st := ts.known[tenant]; st != nil {
		return st
	}
	if len(ts.known) >= maxTenantStates {
		ts.evict()
	}
	st := &tenantState{}
	st.quota.measuring.init()
	st.quota.admitting.init()
	ts.known[tenant] = st
	return st
}

// evict drops the stale entries, or when none is stale, one of those read
// longest ago; ts.mu is held.
func (ts *tenantStates) evict() {
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
	if len(ts.known) >= maxTenantStates {
		delete(ts.known, oldest)
	}
}

// forget drops what is known of tenant's row and stores: the next check
// reads the row and measures again. What this client admitted stays
// counted until a measure holds it.
func (ts *tenantStates) forget(tenant string) {
	ts.mu.Lock()
	st := ts.known[tenant]
	ts.mu.Unlock()
	if st != nil {
		st.snap.Store(nil)
		st.quota.usage.Store(nil)
	}
}

// check fails with a *TenantSuspendedError when tenant is suspended, as
// last read within ttl.
func (ts *tenantStates) check(ctx context.Context, tenant string) error {
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
func (ts *tenantStates) read(ctx context.Context, tenant string) (*tenantState, *tenantSnapshot, error) {
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
	s := &tenantSnapshot{readAt: now}
	for _, r := range rows {
		s.suspendedAt, s.limits = r.SuspendedAt, r.Limits
	}
	st.snap.Store(s)
	return st, s, nil
}

// activeTenants is tenants without the suspended ones; when every one is
// suspended it fails with the first one's *TenantSuspendedError.
func (c *Client) activeTenants(ctx context.Context, tenants []string) ([]string, error) {
	var active []string
	var first error
	for _, t := range tenants {
		switch err := c.tenants.check(ctx, t); {
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
