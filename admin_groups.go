// SPDX-License-Identifier: Apache-2.0

package shardq

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/shardq/shardq/driver"
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
	now := a.c.cfg.Clock()
	var out []GroupInfo
	cursors := groupCursors{}
	err := a.eachTopic(ctx, s, func(t driver.TopicSummary) error {
		if topic != "" && t.Topic != topic {
			return nil
		}
		gs, err := a.topicGroups(ctx, cursors, t.Tenant, t.Topic, now.Add(-staleAfter))
		out = append(out, gs...)
		return err
	})
	if err != nil {
		return out, fmt.Errorf("shardq: admin groups: %w", err)
	}
	return out, nil
}

// topicGroups summarises the groups of one tenant's topic.
func (a *Admin) topicGroups(ctx context.Context, cursors groupCursors, tenant, topic string, liveSince time.Time) ([]GroupInfo, error) {
	names, err := a.c.drv.TopicGroups(ctx, tenant, topic)
	if err != nil {
		return nil, err
	}
	var out []GroupInfo
	for _, g := range names {
		info := GroupInfo{Tenant: tenant, Topic: topic, ConsumerGroup: g}
		paused, err := a.c.drv.PausedTenants(ctx, []string{tenant}, topic, g)
		if err != nil {
			return nil, err
		}
		info.Paused = len(paused) > 0
		members, err := a.c.drv.Subscribers(ctx, []string{tenant}, g, topic)
		if err != nil {
			return nil, err
		}
		for _, m := range members {
			info.Members++
			if !m.HeartbeatAt.Before(liveSince) {
				info.Live++
			}
			info.LastActivity = later(info.LastActivity, m.HeartbeatAt)
		}
		rows, err := cursors.of(ctx, a.c.drv, tenant, g)
		if err != nil {
			return nil, err
		}
		for _, r := range rows[topic] {
			info.Partitions++
			info.add(r)
		}
		unread, err := a.c.drv.UnreadPartitions(ctx, tenant, topic, g, MaxPageLimit)
		if err != nil {
			return nil, err
		}
		for _, r := range unread {
			if r.HeadOffset > r.CommittedOffset {
				info.Unread++
				info.add(r)
			}
		}
		out = append(out, info)
	}
	return out, nil
}

// groupCursors holds, per (tenant, group), the group's cursor rows by
// topic: the offset report lists a group's cursors in every topic of a
// tenant, so it is read once per tenant and group, not once per topic.
type groupCursors map[[2]string]map[string][]driver.OffsetRow

func (c groupCursors) of(ctx context.Context, drv driver.Driver, tenant, group string) (map[string][]driver.OffsetRow, error) {
	if byTopic, ok := c[[2]string{tenant, group}]; ok {
		return byTopic, nil
	}
	byTopic := map[string][]driver.OffsetRow{}
	page := driver.Scope{Tenants: []string{tenant}, Limit: MaxPageLimit}
	for {
		rows, err := drv.OffsetReport(ctx, page, group)
		if err != nil {
			return nil, err
		}
		for _, r := range rows {
			byTopic[r.Topic] = append(byTopic[r.Topic], r)
		}
		if len(rows) < page.Limit {
			break
		}
		last := rows[len(rows)-1]
		page.After = []string{last.Tenant, last.Topic, last.ConsumerGroup, last.PartitionKey}
	}
	c[[2]string{tenant, group}] = byTopic
	return byTopic, nil
}

func (g *GroupInfo) add(r driver.OffsetRow) {
	g.Lag += r.Lag
	g.LagCapped = g.LagCapped || r.LagCapped
	g.LastActivity = later(g.LastActivity, r.CommittedAt)
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// DeleteGroup removes a consumer group from one tenant's topic: its
// registry row, cursors, leases, retry bookkeeping, message-group state,
// ungrouped claims and member rows, so that it no longer holds back
// retention. While a member's heartbeat is within staleAfter (0: three
// default heartbeat intervals) or a lease is unexpired it fails with
// ErrGroupLive, unless force is set: then every token the members hold
// becomes void (their commits fail with ErrLeaseLost), and a member still
// running starts the group anew from its start position, so stop them
// first.
func (a *Admin) DeleteGroup(ctx context.Context, tenant, topic, group string, staleAfter time.Duration, force bool) error {
	if err := validateGroupRef(tenant, topic, group); err != nil {
		return fmt.Errorf("shardq: admin delete group: %w", err)
	}
	if staleAfter <= 0 {
		staleAfter = 3 * DefaultHeartbeatInterval
	}
	now := a.c.cfg.Clock()
	if err := a.c.drv.DeleteGroup(ctx, tenant, topic, group, now.Add(-staleAfter), now, force); err != nil {
		return fmt.Errorf("shardq: admin delete group: %w", err)
	}
	a.c.registered.Delete([3]string{tenant, topic, group})
	return nil
}

// PauseGroup pauses consumer group on topic in the tenants of s (every
// tenant with the topic, for AllTenants) where the group reads it: within
// one DiscoveryInterval its members deliver nothing more after the
// message in hand and claim no ungrouped message there, keeping their
// leases; messages keep arriving. It reports the tenants paused. A group
// that has never read the topic in a tenant of s is refused there (a
// typo), as is one known nowhere.
func (a *Admin) PauseGroup(ctx context.Context, s Scope, topic, group string) ([]string, error) {
	return a.setPaused(ctx, s, topic, group, true)
}

// ResumeGroup undoes PauseGroup: the members go on where they stopped, in
// order, within one DiscoveryInterval.
func (a *Admin) ResumeGroup(ctx context.Context, s Scope, topic, group string) ([]string, error) {
	return a.setPaused(ctx, s, topic, group, false)
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
	var tenants []string
	if s.AllTenants {
		if err := a.eachTopic(ctx, s, func(t driver.TopicSummary) error {
			if t.Topic == topic {
				tenants = append(tenants, t.Tenant)
			}
			return nil
		}); err != nil {
			return nil, fmt.Errorf("shardq: admin %s: %w", op, err)
		}
	} else {
		tenants = s.Tenants
	}
	var known []string
	for _, t := range tenants {
		groups, err := a.c.drv.TopicGroups(ctx, t, topic)
		if err != nil {
			return nil, fmt.Errorf("shardq: admin %s: %w", op, err)
		}
		switch {
		case slices.Contains(groups, group):
			known = append(known, t)
		case !s.AllTenants:
			return nil, fmt.Errorf("shardq: admin %s: %w", op, &ident.Error{Field: "consumer group",
				Rule: fmt.Sprintf("%q has never read tenant %q topic %q (known: %s)", group, t, topic, strings.Join(groups, ", "))})
		}
	}
	if len(known) == 0 {
		return nil, fmt.Errorf("shardq: admin %s: %w", op, &ident.Error{Field: "consumer group",
			Rule: fmt.Sprintf("%q reads topic %q in none of the tenants", group, topic)})
	}
	if err := a.c.drv.SetGroupPaused(ctx, known, topic, group, paused, a.c.cfg.Clock()); err != nil {
		return nil, fmt.Errorf("shardq: admin %s: %w", op, err)
	}
	return known, nil
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
