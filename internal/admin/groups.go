// SPDX-License-Identifier: Apache-2.0

package admin

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/ident"
)

// GroupInfo is one consumer group of one tenant's topic (shardq.GroupInfo,
// field for field).
type GroupInfo struct {
	Tenant, Topic, ConsumerGroup string
	Members, Live                int
	Partitions, Unread           int
	Lag                          int64
	LagCapped                    bool
	Paused                       bool
	LastActivity                 time.Time
}

// Groups summarises the consumer groups of the topics of s (of topic
// alone when it is not ""), sorted by (tenant, topic, group); a member
// with a heartbeat at or after liveSince is live.
func Groups(ctx context.Context, drv driver.Driver, s driver.Scope, topic string, liveSince time.Time) ([]GroupInfo, error) {
	var out []GroupInfo
	cursors := groupCursors{}
	err := EachTopic(ctx, drv, s, func(t driver.TopicSummary) error {
		if topic != "" && t.Topic != topic {
			return nil
		}
		gs, err := topicGroups(ctx, drv, cursors, t.Tenant, t.Topic, liveSince)
		out = append(out, gs...)
		return err
	})
	return out, err
}

// topicGroups summarises the groups of one tenant's topic.
func topicGroups(ctx context.Context, drv driver.Driver, cursors groupCursors, tenant, topic string, liveSince time.Time) ([]GroupInfo, error) {
	names, err := drv.TopicGroups(ctx, tenant, topic)
	if err != nil {
		return nil, err
	}
	var out []GroupInfo
	for _, g := range names {
		info := GroupInfo{Tenant: tenant, Topic: topic, ConsumerGroup: g}
		paused, err := drv.PausedTenants(ctx, driver.GroupScope{Tenants: []string{tenant}, Topic: topic, ConsumerGroup: g})
		if err != nil {
			return nil, err
		}
		info.Paused = len(paused) > 0
		members, err := drv.Subscribers(ctx, driver.GroupScope{Tenants: []string{tenant}, Topic: topic, ConsumerGroup: g})
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
		rows, err := cursors.of(ctx, drv, tenant, g)
		if err != nil {
			return nil, err
		}
		for _, r := range rows[topic] {
			info.Partitions++
			info.add(r)
		}
		unread, err := drv.UnreadPartitions(ctx, driver.GroupRef{Tenant: tenant, Topic: topic, ConsumerGroup: g}, MaxPageLimit)
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

// SetPaused pauses (or resumes) group on topic in the tenants of s where
// the group reads it (every tenant with the topic, for AllTenants), and
// returns them. A group that has never read the topic in a tenant named
// by s is refused, as is one known nowhere. op names the operation in
// errors.
func SetPaused(ctx context.Context, drv driver.Driver, s driver.Scope, topic, group string, paused bool, now time.Time, op string) ([]string, error) {
	var tenants []string
	if s.AllTenants {
		if err := EachTopic(ctx, drv, s, func(t driver.TopicSummary) error {
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
		groups, err := drv.TopicGroups(ctx, t, topic)
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
	if err := drv.SetGroupPaused(ctx, driver.GroupScope{Tenants: known, Topic: topic, ConsumerGroup: group}, paused, now); err != nil {
		return nil, fmt.Errorf("shardq: admin %s: %w", op, err)
	}
	return known, nil
}
