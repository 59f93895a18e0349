// SPDX-License-Identifier: Apache-2.0

package shardq

import (
	"context"
	"fmt"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/admin"
	"github.com/shardq/shardq/internal/ident"
)

// ErrGroupLive refuses to delete a consumer group that has a member with a
// recent heartbeat or an unexpired lease (see Admin.DeleteGroup); the
// error is a *driver.GroupLiveError naming them.
var ErrGroupLive = driver.ErrGroupLive

// GroupInfo is one consumer group of one tenant's topic.
type GroupInfo struct {
	Tenant, Topic, ConsumerGroup string
	// Members counts the group's heartbeat rows in the topic; Live those
	// with a heartbeat within the stale age.
	Members, Live int
	// Partitions counts the partitions the group has a cursor for;
	// Unread those it has none for yet (it starts at its start position).
	Partitions, Unread int
	// Lag sums the messages after the group's position in every
	// partition, each counted up to LagCountLimit (LagCapped: some were
	// more).
	Lag       int64
	LagCapped bool
	// Paused says the group is paused in this tenant's topic (PauseGroup).
	Paused bool
	// LastActivity is the latest of the members' heartbeats and the
	// cursors' commits (zero when there was none).
	LastActivity time.Time
}

// Groups lists the consumer groups of the topics in s (of topic alone
// when it is not ""), sorted by (tenant, topic, group): a group registered
// by a member or receiver, or with a cursor, lease or member there. It
// reads every topic of s, without pages; staleAfter (0: three default
// heartbeat intervals) decides which members are live.
func (a *Admin) Groups(ctx context.Context, s Scope, topic string, staleAfter time.Duration) ([]GroupInfo, error) {
	if err := checkScope(s); err != nil {
		return nil, fmt.Errorf("shardq: admin groups: %w", err)
	}
	if topic != "" {
		if err := ident.Topic(topic); err != nil {
			return nil, fmt.Errorf("shardq: admin groups: %w", err)
		}
	}
	if staleAfter <= 0 {
		staleAfter = 3 * DefaultHeartbeatInterval
	}
	if err := a.c.syncClock(ctx); err != nil {
		return nil, fmt.Errorf("shardq: admin groups: %w", err)
	}
	gs, err := admin.Groups(ctx, a.c.drv, s.toDriver(), topic, a.c.cfg.Clock().Add(-staleAfter))
	if err != nil {
		err = fmt.Errorf("shardq: admin groups: %w", err)
	}
	return mapSlice(gs, func(g admin.GroupInfo) GroupInfo { return GroupInfo(g) }), err
}

// DeleteGroup removes a consumer group from one tenant's topic: its
// registry row, cursors, leases, retry bookkeeping, message-group state,
// ungrouped claims and member rows, so that it no longer holds back
// retention. While a member's heartbeat is within opts.StaleAfter or a
// lease is unexpired it fails with ErrGroupLive, unless opts.Force is
// set: then every token the members hold
// becomes void (their commits fail with ErrLeaseLost), and a member still
// running starts the group anew from its start position, so stop them
// first.
func (a *Admin) DeleteGroup(ctx context.Context, g GroupRef, opts DeleteGroupOptions) error {
	tenant, topic, group, staleAfter := g.Tenant, g.Topic, g.ConsumerGroup, opts.StaleAfter
	if err := validateGroupRef(tenant, topic, group); err != nil {
		return fmt.Errorf("shardq: admin delete group: %w", err)
	}
	if staleAfter <= 0 {
		staleAfter = 3 * DefaultHeartbeatInterval
	}
	if err := a.c.syncClock(ctx); err != nil {
		return fmt.Errorf("shardq: admin delete group: %w", err)
	}
	now := a.c.cfg.Clock()
	if err := a.c.drv.DeleteGroup(ctx, driver.DeleteGroupParams{Group: driver.GroupRef{Tenant: tenant, Topic: topic, ConsumerGroup: group}, LiveSince: now.Add(-staleAfter), Now: now, Force: opts.Force}); err != nil {
		return fmt.Errorf("shardq: admin delete group: %w", err)
	}
	a.c.registered.Delete([3]string{tenant, topic, group})
	return nil
}

// PauseGroup pauses r.ConsumerGroup on r.Topic in the tenants of r.Scope
// (every tenant with the topic, for AllTenants) where the group reads it: within
// one DiscoveryInterval its members deliver nothing more after the
// message in hand and claim no ungrouped message there, keeping their
// leases; messages keep arriving. It reports the tenants paused. A group
// that has never read the topic in a tenant of the scope is refused there
// (a typo), as is one known nowhere.
func (a *Admin) PauseGroup(ctx context.Context, r PauseRequest) ([]string, error) {
	return a.setPaused(ctx, r.Scope, r.Topic, r.ConsumerGroup, true)
}

// ResumeGroup undoes PauseGroup: the members go on where they stopped, in
// order, within one DiscoveryInterval.
func (a *Admin) ResumeGroup(ctx context.Context, r PauseRequest) ([]string, error) {
	return a.setPaused(ctx, r.Scope, r.Topic, r.ConsumerGroup, false)
}

func (a *Admin) setPaused(ctx context.Context, s Scope, topic, group string, paused bool) ([]string, error) {
	op := "resume"
	if paused {
		op = "pause"
	}
	if err := checkScope(s); err != nil {
		return nil, fmt.Errorf("shardq: admin %s: %w", op, err)
	}
	if err := firstInvalid(ident.Topic(topic), ident.ConsumerGroup(group)); err != nil {
		return nil, fmt.Errorf("shardq: admin %s: %w", op, err)
	}
	return admin.SetPaused(ctx, a.c.drv, s.toDriver(), topic, group, paused, a.c.cfg.Clock(), op)
}

// firstInvalid returns the first non-nil error.
func firstInvalid(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
