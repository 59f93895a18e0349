// SPDX-License-Identifier: Apache-2.0

package sqlcommon

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/shardq/shardq/driver"
)

// lifecycle is the lifecycle statements.
func (d *Store) lifecycle() *lifecycleSQL { return &d.sql().lifecycle }

// RetentionHeads reads a page of a topic's head rows in key order, each
// with its oldest remaining message: one probe of the message index per
// row, so a pass learns which partitions have anything to delete, or are
// drained, without a statement per partition.
func (d *Store) RetentionHeads(ctx context.Context, in driver.RetentionHeadsParams) ([]driver.RetentionHead, error) {
	tenant, topic, after, limit := in.Tenant, in.Topic, in.After, in.Limit
	op := fmt.Sprintf("retention: read heads of tenant %q topic %q", tenant, topic)
	stmt, args := d.lifecycle().heads, Args{"tenant": tenant, "topic": topic, "limit": limit}
	if len(after) > 0 {
		stmt, args["after"] = d.lifecycle().headsAfter, after[0]
	}
	rows, err := d.query(ctx, d.Read, stmt, args)
	if err != nil {
		return nil, d.Wrap(op, err)
	}
	defer rows.Close()
	var out []driver.RetentionHead
	for rows.Next() {
		var h driver.RetentionHead
		var moved, firstAt any
		var first sql.NullInt64
		if err := rows.Scan(&h.PartitionKey, &h.HeadOffset, &moved, &first, &firstAt); err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		if h.MovedAt, err = d.DecodeTime(moved); err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		if first.Valid {
			h.FirstOffset = first.Int64
			if h.FirstCreatedAt, err = d.DecodeTime(firstAt); err != nil {
				return nil, fmt.Errorf("%s: %w", op, err)
			}
		}
		out = append(out, h)
	}
	if err := rows.Err(); err != nil {
		return nil, d.Wrap(op, err)
	}
	return out, nil
}

// TopicGroups lists the consumer groups that read a tenant's topic: the
// registered ones and any with a cursor, a lease or a member there,
// sorted. Retention's own claim group is not one.
func (d *Store) TopicGroups(ctx context.Context, tenant, topic string) ([]string, error) {
	op := fmt.Sprintf("list consumer groups of tenant %q topic %q", tenant, topic)
	var out []string
	for _, stmt := range d.lifecycle().groups {
		rows, err := d.query(ctx, d.Read, stmt, Args{"tenant": tenant, "topic": topic, "internal": driver.RetentionGroup})
		if err != nil {
			return nil, d.Wrap(op, err)
		}
		gs, err := scanStrings(rows, op)
		if err != nil {
			return nil, err
		}
		out = append(out, gs...)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

func scanStrings(rows *sql.Rows, op string) ([]string, error) {
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	return out, nil
}

// RegisterGroup adds group's registry row in each of tenants that lacks
// one. A new row starts at 0 (earliest) unless latest is set and the
// group has no cursor in that tenant's topic: then at the topic's
// highest head, so the group reads only what comes after it. A row that
// exists is kept: the first member decides, as a committed offset wins
// over auto.offset.reset in Kafka.
func (d *Store) RegisterGroup(ctx context.Context, g driver.GroupScope, latest bool, now time.Time) error {
	tenants, topic, group := g.Tenants, g.Topic, g.ConsumerGroup
	op := fmt.Sprintf("register consumer group %q of topic %q", group, topic)
	st := d.lifecycle()
	rows, err := d.query(ctx, d.Read, st.registered, Args{"tenants": textList(tenants), "topic": topic, "group": group})
	if err != nil {
		return d.Wrap(op, err)
	}
	have, err := scanStrings(rows, op)
	if err != nil {
		return err
	}
	var add Rows
	for _, t := range tenants {
		if slices.Contains(have, t) {
			continue
		}
		var start int64
		if latest {
			key := Args{"tenant": t, "topic": topic, "group": group}
			var one int
			switch err := d.queryRow(ctx, d.Read, st.hasCursor, key).Scan(&one); {
			case errors.Is(err, sql.ErrNoRows):
				if err := d.queryRow(ctx, d.Read, st.topicHead, key).Scan(&start); err != nil {
					return d.Wrap(fmt.Sprintf("%s in tenant %q: read the topic's head", op, t), err)
				}
			case err != nil:
				return d.Wrap(fmt.Sprintf("%s in tenant %q", op, t), err)
			}
		}
		add = append(add, []any{t, topic, group, start, d.EncodeTime(now)})
	}
	if len(add) == 0 {
		return nil
	}
	if _, err := d.exec(ctx, d.Write, st.register, Args{"rows": add}); err != nil {
		return d.Wrap(op, err)
	}
	return nil
}

// StaleLeaseKeys lists the partition keys of a topic whose lease rows,
// of groups, were freed or expired before before: with the keys of
// cursors, what retention checks for rows left behind by a removed
// partition.
func (d *Store) StaleLeaseKeys(ctx context.Context, in driver.StaleLeaseKeysParams) ([]string, error) {
	tenant, topic, groups, before := in.Tenant, in.Topic, in.Groups, in.Before
	if len(groups) == 0 {
		return nil, nil
	}
	op := fmt.Sprintf("retention: list stale leases of tenant %q topic %q", tenant, topic)
	rows, err := d.query(ctx, d.Read, d.lifecycle().staleKeys, Args{"tenant": tenant, "topic": topic, "groups": textList(groups),
		"before": d.EncodeTime(before)})
	if err != nil {
		return nil, d.Wrap(op, err)
	}
	return scanStrings(rows, op)
}

// RemovePartitions removes, in one transaction fenced by the retention
// claim, every partition of keys that is drained: no message left, its
// head (if any) idle since before idleBefore, and no lease of groups
// unexpired by now. It deletes the head row, every cursor, and the lease
// rows, retry bookkeeping and message-group state of groups (and their
// ungrouped claims when "" goes), and returns the keys it removed.
//
// Head rows are locked first, as a publisher locks them before it
// inserts: a publish that got there first has moved the head (not idle)
// or left a message; one that comes after waits and then creates the
// partition anew. Lease rows are locked too, so an acquisition either
// committed first (live: the partition stays) or waits and makes a new
// row whose token starts above the old ones (docs/leases.md). The keys a
// plain read finds held are left out first: a pass frozen inside the
// transaction would otherwise keep their holders' renewals waiting.
func (d *Store) RemovePartitions(ctx context.Context, claim driver.Lease, r driver.RemovePartitionsRequest) ([]string, error) {
	tenant, topic, groups, keys, idleBefore, now := r.Tenant, r.Topic, r.ConsumerGroups, r.PartitionKeys, r.IdleBefore, r.Now
	op := fmt.Sprintf("retention: remove drained partitions of tenant %q topic %q", tenant, topic)
	st := d.lifecycle()
	if len(keys) > 0 && len(groups) > 0 {
		held, err := d.liveLeaseKeys(ctx, d.Read, st.heldLeases, Args{"tenant": tenant, "topic": topic, "keys": textList(keys),
			"groups": textList(groups)}, now, op)
		if err != nil {
			return nil, err
		}
		keys = slices.DeleteFunc(slices.Clone(keys), func(k string) bool { return slices.Contains(held, k) })
	}
	if len(keys) == 0 {
		return nil, nil
	}
	return inTx(ctx, d.Begin, func(tx *sql.Tx) ([]string, error) {
		if err := d.fence(ctx, tx, claim, op); err != nil {
			return nil, err
		}
		key := Args{"tenant": tenant, "topic": topic, "keys": textList(keys)}
		keep := map[string]bool{}
		rows, err := d.query(ctx, tx, st.lockHeads, key)
		if err != nil {
			return nil, d.Wrap(op, err)
		}
		for rows.Next() {
			var k string
			var moved any
			var left sql.NullInt64
			if err := rows.Scan(&k, &moved, &left); err != nil {
				rows.Close()
				return nil, fmt.Errorf("%s: %w", op, err)
			}
			at, err := d.DecodeTime(moved)
			if err != nil {
				rows.Close()
				return nil, fmt.Errorf("%s: %w", op, err)
			}
			// A key without a head row has no message either: a
			// publisher makes the head row in the transaction that
			// inserts, and any message it adds now goes above every
			// cursor this removes.
			if !at.Before(idleBefore) || left.Valid {
				keep[k] = true
			}
		}
		if err := rows.Err(); err != nil {
			return nil, d.Wrap(op, err)
		}
		if len(groups) > 0 {
			live, err := d.liveLeaseKeys(ctx, tx, st.liveLeases, key.with(Args{"groups": textList(groups)}), now, op)
			if err != nil {
				return nil, err
			}
			for _, k := range live {
				keep[k] = true
			}
		}
		var gone List
		var removed []string
		for _, k := range keys {
			if !keep[k] {
				gone, removed = append(gone, k), append(removed, k)
			}
		}
		if len(gone) == 0 {
			return nil, nil
		}
		del := Args{"tenant": tenant, "topic": topic, "keys": gone, "groups": textList(groups), "idle_before": d.EncodeTime(idleBefore)}
		stmts := []string{st.dropHeads, st.dropCurs}
		if len(groups) > 0 {
			stmts = append(stmts, st.dropLeases, st.dropStates, st.dropGroupS)
			if slices.Contains(removed, "") {
				// No message is left in the ungrouped partition, and a new
				// one waits on its head row: every claim is of a message
				// that is gone.
				stmts = append(stmts, st.dropClaims)
			}
		}
		for _, s := range stmts {
			if _, err := d.exec(ctx, tx, s, del); err != nil {
				return nil, d.Wrap(op, err)
			}
		}
		if slices.Contains(removed, "") {
			for _, g := range groups { // their cursor rows went (dropCurs)
				d.markRows.Delete([3]string{tenant, topic, g})
			}
		}
		return removed, nil
	})
}

// liveLeaseKeys runs stmt, a locking read of lease rows (partition_key,
// owner, expires_at), and returns the keys of those unexpired by now.
func (d *Store) liveLeaseKeys(ctx context.Context, tx driver.DBTX, stmt string, args Args, now time.Time, op string) ([]string, error) {
	rows, err := d.query(ctx, tx, stmt, args)
	if err != nil {
		return nil, d.Wrap(op, err)
	}
	defer rows.Close()
	var live []string
	for rows.Next() {
		var k, owner string
		var exp any
		if err := rows.Scan(&k, &owner, &exp); err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		at, err := d.DecodeTime(exp)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		if owner != "" && at.After(now) {
			live = append(live, k)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, d.Wrap(op, err)
	}
	return live, nil
}

// UnreadPartitions lists up to limit partitions of a tenant's topic that
// group has no cursor for, in key order, each with the offset the group
// starts after there (its registry row's start, or 0).
func (d *Store) UnreadPartitions(ctx context.Context, g driver.GroupRef, limit int) ([]driver.OffsetRow, error) {
	tenant, topic, group := g.Tenant, g.Topic, g.ConsumerGroup
	op := fmt.Sprintf("list partitions of tenant %q topic %q without a cursor of group %q", tenant, topic, group)
	rows, err := d.query(ctx, d.Read, d.lifecycle().unread, Args{"tenant": tenant, "topic": topic, "group": group, "limit": limit})
	if err != nil {
		return nil, d.Wrap(op, err)
	}
	defer rows.Close()
	var out []driver.OffsetRow
	for rows.Next() {
		r := driver.OffsetRow{Tenant: tenant, Topic: topic, ConsumerGroup: group, NoCursor: true}
		if err := rows.Scan(&r.PartitionKey, &r.HeadOffset, &r.CommittedOffset); err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, d.Wrap(op, err)
	}
	for i := range out {
		if err := d.countLag(ctx, &out[i]); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// DeleteGroup removes a consumer group from a tenant's topic: its
// registry row, cursors, lease rows, retry bookkeeping, message-group
// state, ungrouped claims and member rows, in one transaction that first
// locks the group's lease rows. Unless force is set it refuses, with
// *driver.GroupLiveError, while a lease is unexpired by now or a member's
// heartbeat is at or after liveSince; with force it deletes them too,
// which voids every token the members hold (their writes fail with
// ErrLeaseLost).
func (d *Store) DeleteGroup(ctx context.Context, in driver.DeleteGroupParams) error {
	g, liveSince, now, force := in.Group, in.LiveSince, in.Now, in.Force
	tenant, topic, group := g.Tenant, g.Topic, g.ConsumerGroup
	op := fmt.Sprintf("delete consumer group %q of tenant %q topic %q", group, tenant, topic)
	_, err := inTx(ctx, d.Begin, func(tx *sql.Tx) (struct{}, error) {
		st := d.lifecycle()
		key := Args{"tenant": tenant, "topic": topic, "group": group}
		live := &driver.GroupLiveError{Tenant: tenant, Topic: topic, Group: group}
		held, err := d.liveLeaseKeys(ctx, tx, st.fenceGroup, key, now, op)
		if err != nil {
			return struct{}{}, err
		}
		live.Leases = len(held)
		members, err := d.Subscribers(ctx, driver.GroupScope{Tenants: []string{tenant}, Topic: topic, ConsumerGroup: group})
		if err != nil {
			return struct{}{}, err
		}
		for _, m := range members {
			if !m.HeartbeatAt.Before(liveSince) {
				live.Members = append(live.Members, m.Name)
			}
		}
		if !force && (live.Leases > 0 || len(live.Members) > 0) {
			return struct{}{}, live
		}
		for _, s := range []string{st.groupLeas, st.groupCurs, st.groupStat, st.groupGS, st.groupClm, st.groupDef, st.groupBeats, st.deleteReg} {
			if _, err := d.exec(ctx, tx, s, key); err != nil {
				return struct{}{}, d.Wrap(op, err)
			}
		}
		for _, m := range []*sync.Map{&d.groupStarts, &d.markRows, &d.busyClaims} {
			m.Delete([3]string{tenant, topic, group})
		}
		return struct{}{}, nil
	})
	return err
}

// SetGroupPaused sets (or clears) the paused mark of group on topic in
// each of tenants, making the group's registry row where it has none (it
// then starts at the earliest message, as a first member would).
func (d *Store) SetGroupPaused(ctx context.Context, g driver.GroupScope, paused bool, now time.Time) error {
	tenants, topic, group := g.Tenants, g.Topic, g.ConsumerGroup
	op := fmt.Sprintf("set paused=%t of consumer group %q of topic %q", paused, group, topic)
	var at any
	if paused {
		at = d.EncodeTime(now)
	}
	rows := make(Rows, len(tenants))
	for i, t := range tenants {
		rows[i] = []any{t, topic, group, 0, d.EncodeTime(now), at}
	}
	_, err := d.exec(ctx, d.Write, d.lifecycle().pause, Args{"rows": rows})
	return d.wrapNil(op, err)
}

// PausedTenants lists those of tenants where group is paused on topic.
func (d *Store) PausedTenants(ctx context.Context, g driver.GroupScope) ([]string, error) {
	tenants, topic, group := g.Tenants, g.Topic, g.ConsumerGroup
	op := fmt.Sprintf("read whether consumer group %q of topic %q is paused", group, topic)
	rows, err := d.query(ctx, d.Read, d.lifecycle().paused, Args{"tenants": textList(tenants), "topic": topic, "group": group})
	if err != nil {
		return nil, d.Wrap(op, err)
	}
	return scanStrings(rows, op)
}
