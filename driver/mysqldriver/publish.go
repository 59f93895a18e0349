package mysqldriver

import (
	"context"
	"fmt"
	"strings"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/sqlcommon"
)

// Statement size bounds: well under the default max_allowed_packet (16 MiB
// on MariaDB, 64 MiB on MySQL 8).
const (
	maxInsertRows  = 500
	maxInsertBytes = 4 << 20
)

// InsertMessages appends msgs in tx. Per tenant (one shard on Vitess):
//
//  1. lock the head row of every partition written, in key order, creating
//     missing ones (INSERT ... ON DUPLICATE KEY UPDATE takes the row lock);
//  2. look up which identities are already stored, with a locking read so
//     that it sees the latest committed rows whatever the caller's isolation
//     level (PublishTx runs in the caller's transaction);
//  3. insert the new messages, drawing offsets from AUTO_INCREMENT;
//  4. read their offsets back (exact under every innodb_autoinc_lock_mode
//     and auto_increment_increment);
//  5. advance the head rows.
//
// Because step 1 holds the head row until commit, no two transactions
// insert into one partition at once, so a later commit never holds a lower
// offset than an earlier one: the reader's cursor cannot pass a gap that
// may still fill.
func (d *Driver) InsertMessages(ctx context.Context, tx driver.DBTX, msgs []*driver.InsertMessage) error {
	if len(msgs) == 0 {
		return nil
	}
	b := sqlcommon.Plan(msgs)
	err := b.ByTenant(func(tenant string, groups []*sqlcommon.Group) error {
		if err := lockHeads(ctx, tx, tenant, groups); err != nil {
			return err
		}
		for _, g := range groups {
			if err := insertGroup(ctx, tx, g); err != nil {
				return fmt.Errorf("tenant %q topic %q: %w", g.Tenant, g.Topic, err)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	b.Finish()
	return nil
}

func lockHeads(ctx context.Context, tx driver.DBTX, tenant string, groups []*sqlcommon.Group) error {
	var sb strings.Builder
	var args []any
	sb.WriteString("INSERT INTO queue_partitions (tenant, topic, partition_key, head_offset, created_at, updated_at) VALUES ")
	n := 0
	for _, g := range groups {
		for _, k := range g.Keys {
			if n > 0 {
				sb.WriteString(", ")
			}
			sb.WriteString("(?, ?, ?, 0, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))")
			args = append(args, tenant, g.Topic, k)
			n++
		}
	}
	sb.WriteString(" ON DUPLICATE KEY UPDATE head_offset = head_offset")
	if _, err := tx.ExecContext(ctx, sb.String(), args...); err != nil {
		return wrap(fmt.Sprintf("tenant %q: lock partition heads", tenant), err)
	}
	return nil
}

func insertGroup(ctx context.Context, tx driver.DBTX, g *sqlcommon.Group) error {
	if err := lookupOffsets(ctx, tx, g, g.Msgs, true); err != nil {
		return err
	}
	fresh := make([]*driver.InsertMessage, 0, len(g.Msgs))
	for _, m := range g.Msgs {
		if !m.Duplicate {
			fresh = append(fresh, m)
		}
	}
	if len(fresh) == 0 {
		return nil
	}
	for _, chunk := range sqlcommon.Chunks(fresh, maxInsertRows, maxInsertBytes) {
		var sb strings.Builder
		args := make([]any, 0, 7*len(chunk))
		sb.WriteString("INSERT INTO queue_messages (tenant, topic, partition_key, id, headers, payload, created_at) VALUES ")
		for i, m := range chunk {
			if i > 0 {
				sb.WriteString(", ")
			}
			sb.WriteString("(?, ?, ?, ?, ?, ?, ?)")
			h, err := sqlcommon.EncodeHeaders(m.Headers)
			if err != nil {
				return err
			}
			payload := m.Payload
			if payload == nil {
				payload = []byte{} // NOT NULL column; an empty payload is legal
			}
			args = append(args, g.Tenant, g.Topic, m.PartitionKey, m.ID, string(h), payload, formatTime(m.CreatedAt))
		}
		if _, err := tx.ExecContext(ctx, sb.String(), args...); err != nil {
			return wrap("insert messages", err)
		}
	}
	if err := lookupOffsets(ctx, tx, g, fresh, false); err != nil {
		return err
	}
	return advanceHeads(ctx, tx, g, fresh)
}

// lookupOffsets sets Offset for the stored messages among msgs; with
// existing it marks them Duplicate too, using a locking read: it sees the
// latest committed rows whatever the caller's isolation level and snapshot.
func lookupOffsets(ctx context.Context, tx driver.DBTX, g *sqlcommon.Group, msgs []*driver.InsertMessage, existing bool) error {
	suffix := ""
	if existing {
		suffix = " LOCK IN SHARE MODE"
	}
	if err := sqlcommon.Lookup(ctx, tx, "SELECT partition_key, id, `offset` FROM queue_messages", suffix, g, msgs, existing); err != nil {
		return wrap("look up message ids", err)
	}
	if !existing {
		for _, m := range msgs {
			if m.Offset == 0 {
				return fmt.Errorf("partition %q id %q: inserted row not found", m.PartitionKey, m.ID)
			}
		}
	}
	return nil
}

func advanceHeads(ctx context.Context, tx driver.DBTX, g *sqlcommon.Group, fresh []*driver.InsertMessage) error {
	heads := map[string]int64{}
	for _, m := range fresh {
		heads[m.PartitionKey] = max(heads[m.PartitionKey], m.Offset)
	}
	var sb strings.Builder
	args := make([]any, 0, 3*len(heads)+2)
	sb.WriteString("UPDATE queue_partitions SET head_offset = GREATEST(head_offset, CASE partition_key")
	keys := make([]any, 0, len(heads))
	for _, k := range g.Keys { // sorted, matching the lock order
		if h, ok := heads[k]; ok {
			sb.WriteString(" WHEN ? THEN ?")
			args = append(args, k, h)
			keys = append(keys, k)
		}
	}
	sb.WriteString(" END), updated_at = UTC_TIMESTAMP(6) WHERE tenant = ? AND topic = ? AND partition_key IN (" + sqlcommon.Placeholders(len(keys)) + ")")
	args = append(args, g.Tenant, g.Topic)
	args = append(args, keys...)
	if _, err := tx.ExecContext(ctx, sb.String(), args...); err != nil {
		return wrap("advance partition heads", err)
	}
	return nil
}
