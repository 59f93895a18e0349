// SPDX-License-Identifier: Apache-2.0

package shardq

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/groupreg"
	"github.com/shardq/shardq/internal/ident"
)

// ErrTenantLive refuses to delete a tenant that has a member with a
// recent heartbeat or an unexpired lease (see Admin.DeleteTenant); the
// error is a *TenantLiveError naming them.
var ErrTenantLive = errors.New("tenant is live")

// TenantLiveError names what keeps a tenant live.
type TenantLiveError struct {
	Tenant  string
	Members []string // members with a recent heartbeat, in any group and topic
	Leases  int      // unexpired leases
}

func (e *TenantLiveError) Error() string {
	return fmt.Sprintf("tenant %q is live (%d recent members %v, %d unexpired leases); stop its members or force the delete",
		e.Tenant, len(e.Members), e.Members, e.Leases)
}

// Is makes errors.Is(err, ErrTenantLive) match.
func (e *TenantLiveError) Is(target error) bool { return target == ErrTenantLive }

// DeleteTenantOptions guard Admin.DeleteTenant.
type DeleteTenantOptions struct {
	// Apply deletes; without it DeleteTenant only counts what it would
	// delete (a preview, as ResetOffsets' DryRun is the default of the
	// CLI).
	Apply bool
	// Force deletes while the tenant has live members: their leases go,
	// so their next commit fails with ErrLeaseLost. Stop them first, and
	// restart any process that served the tenant before it is used again.
	Force bool
	// StaleAfter is how long a member may be silent and still count as
	// live [three DefaultHeartbeatIntervals].
	StaleAfter time.Duration
	// BatchSize bounds the rows of one delete statement [1000], so that
	// other tenants' statements keep their latency while it runs.
	BatchSize int
}

// TenantRows is a tenant's row count in one table.
type TenantRows struct {
	Table string
	Rows  int64
}

// DefaultTenantBatch is DeleteTenantOptions.BatchSize's default.
const DefaultTenantBatch = 1000

// DeleteTenant removes every row of one tenant from every table:
// messages and their head rows, cursors, leases, members, retry
// bookkeeping, ungrouped claims, message-group state, half messages,
// tokens and the group registry. Each statement deletes at most
// BatchSize rows of one table, routed by the tenant (on Vitess, to its
// shard), so a crash or a cancelled context leaves part of the tenant,
// and running it again deletes the rest. Without opts.Apply it deletes
// nothing and returns the tenant's row counts per table; with it, the
// rows it deleted per table. While the tenant has a live member or an
// unexpired lease it fails with ErrTenantLive, unless opts.Force is set.
//
// Nothing stops a publisher of the tenant meanwhile: what it publishes
// during the delete may stay. Stop the tenant's publishers first.
func (a *Admin) DeleteTenant(ctx context.Context, tenant string, opts DeleteTenantOptions) ([]TenantRows, error) {
	if err := ident.Tenant(tenant); err != nil {
		return nil, fmt.Errorf("shardq: admin delete tenant: %w", err)
	}
	switch {
	case opts.BatchSize < 0 || opts.BatchSize > MaxPageLimit:
		return nil, fmt.Errorf("shardq: admin delete tenant: %w", &ident.Error{Field: "batch size", Rule: fmt.Sprintf("must be between 1 and %d", MaxPageLimit)})
	case opts.BatchSize == 0:
		opts.BatchSize = DefaultTenantBatch
	}
	if opts.StaleAfter <= 0 {
		opts.StaleAfter = 3 * DefaultHeartbeatInterval
	}
	if !opts.Apply {
		rows, err := a.c.drv.TenantRows(ctx, tenant)
		if err != nil {
			return nil, fmt.Errorf("shardq: admin delete tenant %q: %w", tenant, err)
		}
		return mapSlice(rows, func(r driver.TableRows) TenantRows { return TenantRows(r) }), nil
	}
	if !opts.Force {
		if err := a.c.syncClock(ctx); err != nil {
			return nil, fmt.Errorf("shardq: admin delete tenant %q: %w", tenant, err)
		}
		now := a.c.cfg.Clock()
		members, leases, err := a.c.drv.TenantLive(ctx, tenant, now.Add(-opts.StaleAfter), now)
		if err != nil {
			return nil, fmt.Errorf("shardq: admin delete tenant %q: %w", tenant, err)
		}
		if len(members) > 0 || leases > 0 {
			return nil, fmt.Errorf("shardq: admin delete tenant: %w", &TenantLiveError{Tenant: tenant, Members: members, Leases: leases})
		}
	}
	var deleted []TenantRows
	for {
		table, n, err := a.c.drv.DeleteTenantBatch(ctx, tenant, opts.BatchSize)
		if err != nil {
			return deleted, fmt.Errorf("shardq: admin delete tenant %q: %w", tenant, err)
		}
		if n == 0 {
			break
		}
		if len(deleted) == 0 || deleted[len(deleted)-1].Table != table {
			deleted = append(deleted, TenantRows{Table: table})
		}
		deleted[len(deleted)-1].Rows += n
		a.advance(n)
	}
	a.c.tenants.Forget(tenant)
	a.c.registered.Range(func(k, _ any) bool {
		if k.(groupreg.Key)[0] == tenant {
			a.c.registered.Delete(k)
		}
		return true
	})
	return deleted, nil
}

// SuspendTenant suspends a tenant: its publishes, receives and accepts,
// and its consumers' other writes (a group's state, a deferral, a receive
// of deferred messages, a longer visibility) fail with
// ErrTenantSuspended, its members release its partitions after the
// message in hand and take no more, and nothing stored changes. Settling
// what was handed out (ack, nack, dead-letter, a visibility of 0) goes
// on. It takes
// effect in this client at once, in other clients within their
// Config.TenantSettingsTTL and in members at their next rebalance tick
// (DiscoveryInterval). A transactional message sent before the suspension
// may still be committed into the tenant.
func (a *Admin) SuspendTenant(ctx context.Context, tenant string) error {
	return a.setSuspended(ctx, tenant, true)
}

// ResumeTenant ends a tenant's suspension (none: nothing changes).
func (a *Admin) ResumeTenant(ctx context.Context, tenant string) error {
	return a.setSuspended(ctx, tenant, false)
}

func (a *Admin) setSuspended(ctx context.Context, tenant string, suspended bool) error {
	verb := map[bool]string{true: "suspend", false: "resume"}[suspended]
	if err := ident.Tenant(tenant); err != nil {
		return fmt.Errorf("shardq: admin %s tenant: %w", verb, err)
	}
	defer a.c.tenants.Forget(tenant)
	if err := a.c.drv.SetTenantSuspended(ctx, tenant, suspended, a.c.cfg.Clock()); err != nil {
		return fmt.Errorf("shardq: admin %s tenant %q: %w", verb, tenant, err)
	}
	return nil
}

// TenantInfo is one tenant as Admin.Tenants lists it.
type TenantInfo struct {
	Tenant      string
	SuspendedAt time.Time // zero: active
	Limits      TenantLimits
	Messages    int64 // in every topic
	Partitions  int64 // with a message, in every topic
	Bytes       int64 // stored, in every topic (TopicUsage.Bytes): what MaxBytes bounds
	Topics      []TopicUsage
}

// TenantLimits are a tenant's quotas and its topics' retention
// (docs/tenants.md); zero is no limit, and for retention the cleaner's
// default. Rates hold per client (as Kafka's quotas hold per broker),
// each allowing a second's worth at once; what is stored is checked
// against a measure at most Config.TenantUsageInterval old.
type TenantLimits struct {
	PublishRate     int64 // messages per second
	PublishByteRate int64 // message bytes per second (payload, headers, key and id)
	MaxMessages     int64 // messages stored
	MaxBytes        int64 // bytes stored: messages', message-group states' and deferred rows' (TopicUsage.Bytes)
	MaxPartitions   int64 // partitions with a message
	// Retention is the tenant's default, between RetentionConfig.Default
	// and a topic's own (RetentionConfig.Topics); dead-letter topics keep
	// RetentionConfig.DeadLetters. A field left zero is the default's.
	Retention RetentionPolicy
}

func (l TenantLimits) check() error {
	for _, f := range []struct {
		name string
		v    int64
	}{{"publish rate", l.PublishRate}, {"publish byte rate", l.PublishByteRate}, {"max messages", l.MaxMessages},
		{"max bytes", l.MaxBytes}, {"max partitions", l.MaxPartitions},
		{"min retention", int64(l.Retention.MinRetention)}, {"max retention", int64(l.Retention.MaxRetention)}} {
		if f.v < 0 {
			return &ident.Error{Field: f.name, Rule: fmt.Sprintf("%d: must not be negative (0: no limit)", f.v)}
		}
	}
	r := l.Retention
	if r.MaxRetention > 0 && r.MinRetention > r.MaxRetention {
		return &ident.Error{Field: "retention", Rule: fmt.Sprintf("minimum %s is longer than maximum %s", r.MinRetention, r.MaxRetention)}
	}
	if r.MinRetention%time.Millisecond != 0 || r.MaxRetention%time.Millisecond != 0 {
		return &ident.Error{Field: "retention", Rule: "whole milliseconds"}
	}
	return nil
}

func (l TenantLimits) driver() driver.TenantLimits {
	return driver.TenantLimits{PublishRate: l.PublishRate, PublishByteRate: l.PublishByteRate, MaxMessages: l.MaxMessages,
		MaxBytes: l.MaxBytes, MaxPartitions: l.MaxPartitions, MinRetention: l.Retention.MinRetention, MaxRetention: l.Retention.MaxRetention}
}

func tenantLimits(l driver.TenantLimits) TenantLimits {
	return TenantLimits{PublishRate: l.PublishRate, PublishByteRate: l.PublishByteRate, MaxMessages: l.MaxMessages,
		MaxBytes: l.MaxBytes, MaxPartitions: l.MaxPartitions, Retention: RetentionPolicy{MinRetention: l.MinRetention, MaxRetention: l.MaxRetention}}
}

// TenantLimits reads a tenant's quotas and retention (zero: none set).
func (a *Admin) TenantLimits(ctx context.Context, tenant string) (TenantLimits, error) {
	if err := ident.Tenant(tenant); err != nil {
		return TenantLimits{}, fmt.Errorf("shardq: admin tenant limits: %w", err)
	}
	settings, err := a.c.drv.TenantSettings(ctx, []string{tenant})
	if err != nil {
		return TenantLimits{}, fmt.Errorf("shardq: admin tenant limits of %q: %w", tenant, err)
	}
	var l TenantLimits
	for _, s := range settings {
		l = tenantLimits(s.Limits)
	}
	return l, nil
}

// SetTenantLimits replaces a tenant's quotas and retention (the zero
// value removes them). Publishing over a quota fails with
// ErrQuotaExceeded. It takes effect in this client at once and in others
// within their Config.TenantSettingsTTL; retention at the next pass.
func (a *Admin) SetTenantLimits(ctx context.Context, tenant string, limits TenantLimits) error {
	if err := ident.Tenant(tenant); err != nil {
		return fmt.Errorf("shardq: admin set tenant limits: %w", err)
	}
	if err := limits.check(); err != nil {
		return fmt.Errorf("shardq: admin set tenant limits of %q: %w", tenant, err)
	}
	defer a.c.tenants.Forget(tenant)
	if err := a.c.drv.SetTenantLimits(ctx, tenant, limits.driver(), a.c.cfg.Clock()); err != nil {
		return fmt.Errorf("shardq: admin set tenant limits of %q: %w", tenant, err)
	}
	return nil
}

// TopicUsage is what one topic of a tenant stores. Bytes is what
// TenantLimits.MaxBytes counts: each message's payload, headers (as
// stored: JSON), partition key and id; each message-group state's state,
// partition key and consumer group (StateBytes); each deferred row's
// partition key and consumer group (DeferredBytes; the message it keeps
// counts as a message); the consumer groups' bookkeeping, which consuming
// makes (GroupBytes: each lease's, cursor's and registry row's partition
// key, consumer group and owner, and 32 bytes of its other columns).
type TopicUsage struct {
	Topic         string
	Messages      int64
	Partitions    int64 // with a message
	Bytes         int64 // all of the below, and the messages'
	StateBytes    int64 // of message-group states
	DeferredBytes int64 // of deferred rows
	GroupBytes    int64 // of leases, cursors and registry rows
}

// Tenants lists up to limit tenants after after, in order: those with a
// partition or a settings row (a suspension), each with its messages and
// stored bytes per topic (TopicUsage). Listing the tenants reads every shard; counting
// one tenant's messages reads all of them on its shard (a full count, not
// an estimate), so keep pages small on large databases. limit 0 means
// DefaultTenantPage.
func (a *Admin) Tenants(ctx context.Context, after string, limit int) ([]TenantInfo, error) {
	switch {
	case limit < 0 || limit > MaxPageLimit:
		return nil, fmt.Errorf("shardq: admin tenants: %w", &ident.Error{Field: "limit", Rule: fmt.Sprintf("%d: want 1 to %d (0: %d)", limit, MaxPageLimit, DefaultTenantPage)})
	case limit == 0:
		limit = DefaultTenantPage
	}
	if after != "" {
		if err := ident.Tenant(after); err != nil {
			return nil, fmt.Errorf("shardq: admin tenants: after: %w", err)
		}
	}
	names, err := a.c.drv.ListTenants(ctx, after, limit)
	if err != nil {
		return nil, fmt.Errorf("shardq: admin tenants: %w", err)
	}
	settings, err := a.c.drv.TenantSettings(ctx, names)
	if err != nil {
		return nil, fmt.Errorf("shardq: admin tenants: %w", err)
	}
	byTenant := map[string]driver.TenantSettings{}
	for _, s := range settings {
		byTenant[s.Tenant] = s
	}
	out := make([]TenantInfo, len(names))
	for i, t := range names {
		if out[i], err = a.tenantUsage(ctx, t, byTenant[t]); err != nil {
			return nil, fmt.Errorf("shardq: admin tenants: %w", err)
		}
	}
	return out, nil
}

// Tenant describes one tenant as Tenants does (zero counts when it has
// nothing stored).
func (a *Admin) Tenant(ctx context.Context, tenant string) (TenantInfo, error) {
	if err := ident.Tenant(tenant); err != nil {
		return TenantInfo{}, fmt.Errorf("shardq: admin tenant: %w", err)
	}
	settings, err := a.c.drv.TenantSettings(ctx, []string{tenant})
	if err != nil {
		return TenantInfo{}, fmt.Errorf("shardq: admin tenant: %w", err)
	}
	var set driver.TenantSettings
	for _, s := range settings {
		set = s
	}
	info, err := a.tenantUsage(ctx, tenant, set)
	if err != nil {
		return TenantInfo{}, fmt.Errorf("shardq: admin tenant: %w", err)
	}
	return info, nil
}

func (a *Admin) tenantUsage(ctx context.Context, tenant string, set driver.TenantSettings) (TenantInfo, error) {
	usage, err := a.c.drv.TenantUsage(ctx, tenant)
	if err != nil {
		return TenantInfo{}, err
	}
	info := TenantInfo{Tenant: tenant, SuspendedAt: set.SuspendedAt, Limits: tenantLimits(set.Limits),
		Topics: mapSlice(usage, func(u driver.TopicUsage) TopicUsage { return TopicUsage(u) })}
	for _, u := range usage {
		info.Messages += u.Messages
		info.Partitions += u.Partitions
		info.Bytes += u.Bytes
	}
	return info, nil
}

// DefaultTenantPage is Admin.Tenants' default page.
const DefaultTenantPage = 100
