// SPDX-License-Identifier: Apache-2.0

package sqlcommon

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/shardq/shardq/driver"
)

// PartitionsWithWork lists the partitions of topic in tenants whose head row
// is past group's cursor. It reads head rows and cursors only, never
// queue_messages; both tables lead with tenant, so on Vitess the join runs
// inside each tenant's shard.
func (d *Store) PartitionsWithWork(ctx context.Context, g driver.GroupScope) ([]driver.Partition, error) {
	tenants, topic, group := g.Tenants, g.Topic, g.ConsumerGroup
	return d.partitions(ctx, d.sql().admin.withWork, topic, tenants, Args{"group": group})
}

// PartitionsMovedSince is PartitionsWithWork of the partitions whose head
// moved at or after since (updated_at, by the publishers' clocks).
func (d *Store) PartitionsMovedSince(ctx context.Context, g driver.GroupScope, since time.Time) ([]driver.Partition, error) {
	tenants, topic, group := g.Tenants, g.Topic, g.ConsumerGroup
	return d.partitions(ctx, d.sql().admin.withWorkMoved, topic, tenants, Args{"group": group, "since": d.EncodeTime(since)})
}

// PartitionsWithWorkOf is PartitionsWithWork of the partitions named by
// each of tenants with each of keys, 500 keys a statement.
func (d *Store) PartitionsWithWorkOf(ctx context.Context, g driver.GroupScope, keys []string) ([]driver.Partition, error) {
	tenants, topic, group := g.Tenants, g.Topic, g.ConsumerGroup
	var out []driver.Partition
	for len(keys) > 0 {
		chunk := keys[:min(len(keys), 500)]
		keys = keys[len(chunk):]
		ps, err := d.partitions(ctx, d.sql().admin.withWorkOf, topic, tenants, Args{"group": group, "keys": textList(chunk)})
		if err != nil {
			return nil, err
		}
		out = append(out, ps...)
	}
	return out, nil
}

// TenantsWithPartitions lists those of tenants with a head row in topic.
func (d *Store) TenantsWithPartitions(ctx context.Context, tenants []string, topic string) ([]string, error) {
	op := fmt.Sprintf("list the tenants with partitions of topic %q", topic)
	rows, err := d.query(ctx, d.Read, d.sql().admin.sweepTenants, Args{"tenants": textList(tenants), "topic": topic})
	if err != nil {
		return nil, d.Wrap(op, err)
	}
	return scanStrings(rows, op)
}

// HeadsPage reads up to limit head rows of one tenant's topic in key
// order (after the key after[0] when after is not empty), with the
// group's position in each: a page of discovery's sweep.
func (d *Store) HeadsPage(ctx context.Context, g driver.GroupRef, after []string, limit int) ([]driver.Partition, error) {
	tenant, topic, group := g.Tenant, g.Topic, g.ConsumerGroup
	stmt, args := d.sql().admin.sweep, Args{"tenant": tenant, "group": group, "limit": limit}
	if len(after) > 0 {
		stmt, args["after"] = d.sql().admin.sweepAfter, after[0]
	}
	return d.partitions(ctx, stmt, topic, []string{tenant}, args)
}

// PartitionHeads lists every partition of topic in tenants with its head.
func (d *Store) PartitionHeads(ctx context.Context, tenants []string, topic string) ([]driver.Partition, error) {
	return d.partitions(ctx, d.sql().admin.heads, topic, tenants, Args{})
}

// HeadsOf reads the heads of the partitions keys (each tenant with each
// key) of topic, in one statement for up to 500 keys.
func (d *Store) HeadsOf(ctx context.Context, topic string, tenants, keys []string) (map[driver.HeadKey]int64, error) {
	op := fmt.Sprintf("read partition heads of tenants %v topic %q", tenants, topic)
	out := make(map[driver.HeadKey]int64, len(keys))
	for len(keys) > 0 {
		chunk := keys[:min(len(keys), 500)]
		keys = keys[len(chunk):]
		rows, err := d.query(ctx, d.Read, d.sql().admin.headsOf, Args{"tenants": textList(tenants), "topic": topic, "keys": textList(chunk)})
		if err != nil {
			return nil, d.Wrap(op, err)
		}
		for rows.Next() {
			var k driver.HeadKey
			var h int64
			if err := rows.Scan(&k.Tenant, &k.PartitionKey, &h); err != nil {
				rows.Close()
				return nil, fmt.Errorf("%s: %w", op, err)
			}
			out[k] = h
		}
		err = rows.Err()
		rows.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
	}
	return out, nil
}

func (d *Store) partitions(ctx context.Context, stmt, topic string, tenants []string, more Args) ([]driver.Partition, error) {
	if len(tenants) == 0 {
		return nil, nil
	}
	op := fmt.Sprintf("list partitions of topic %q", topic)
	rows, err := d.query(ctx, d.Read, stmt, more.with(Args{"tenants": textList(tenants), "topic": topic}))
	if err != nil {
		return nil, d.Wrap(op, err)
	}
	defer rows.Close()
	var out []driver.Partition
	for rows.Next() {
		p := driver.Partition{Topic: topic}
		if err := rows.Scan(&p.Tenant, &p.PartitionKey, &p.HeadOffset, &p.CommittedOffset); err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	return out, nil
}

// ResetOffset upserts a group's cursor without a lease (an operator's act).
// For the ungrouped partition it also drops the group's claims above the
// new cursor and sets the claim mark to it, so that those messages are
// claimed (delivered) again; the cursor row's lock keeps claimers out
// meanwhile.
func (d *Store) ResetOffset(ctx context.Context, p driver.PartitionRef, offset int64) error {
	tenant, topic, partitionKey, group := p.Tenant, p.Topic, p.PartitionKey, p.ConsumerGroup
	op := fmt.Sprintf("reset offset tenant %q topic %q partition %q group %q", tenant, topic, partitionKey, group)
	_, err := inTx(ctx, d.Begin, func(tx *sql.Tx) (struct{}, error) {
		// Fence first: the partition's lease (if any) is freed with the
		// next token, so its holder's next write fails with ErrLeaseLost
		// instead of committing its own cursor over the reset (commits keep
		// the maximum), and whoever acquires it next reads the new cursor.
		// The row lock also waits out a fenced write in flight.
		ref := driver.PartitionRef{Tenant: tenant, ConsumerGroup: group, Topic: topic, PartitionKey: partitionKey}
		if _, err := d.exec(ctx, tx, d.leases().revoke, refNamed(ref).with(Args{"now": d.EncodeTime(time.Now())})); err != nil {
			return struct{}{}, d.Wrap(op, err)
		}
		cursor := refNamed(ref).with(Args{"offset": offset, "now": d.EncodeTime(time.Now())})
		if _, err := d.exec(ctx, tx, d.sql().admin.resetOffset, cursor); err != nil {
			return struct{}{}, d.Wrap(op, err)
		}
		// A rewound cursor gives the partition work without moving its
		// head: stamp the head row so that discovery, which reads what
		// moved, sees it at its next tick.
		if _, err := d.exec(ctx, tx, d.sql().admin.touchHead, cursor); err != nil {
			return struct{}{}, d.Wrap(op, err)
		}
		if partitionKey != "" {
			return struct{}{}, nil
		}
		_, err := d.exec(ctx, tx, d.sql().group.dropAbove, cursor)
		return struct{}{}, d.wrapNil(op, err)
	})
	return err
}
