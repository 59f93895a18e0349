// SPDX-License-Identifier: Apache-2.0

package sqlitedriver

import (
	"context"
	"fmt"
	"strings"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/sqlcommon"
)

const (
	maxInsertRows  = 500 // 7 variables a row, far below SQLite's 32766
	maxInsertBytes = 4 << 20
)

// InsertMessages appends msgs in tx. The transaction holds SQLite's write
// lock (BEGIN IMMEDIATE), so there is one writer at a time and the offsets
// (AUTOINCREMENT rowids) it draws increase in commit order.
func (d *Driver) InsertMessages(ctx context.Context, tx driver.DBTX, msgs []*driver.InsertMessage) error {
	if len(msgs) == 0 {
		return nil
	}
	b := sqlcommon.Plan(msgs)
	for _, g := range b.Groups {
		if err := insertGroup(ctx, tx, g); err != nil {
			return fmt.Errorf("tenant %q topic %q: %w", g.Tenant, g.Topic, err)
		}
	}
	b.Finish()
	return nil
}

// insertGroup inserts the messages with ON CONFLICT DO NOTHING; RETURNING
// names the rows that went in and their offsets (rowids). The others were
// stored before and get their stored offset.
func insertGroup(ctx context.Context, tx driver.DBTX, g *sqlcommon.Group) error {
	inserted := make(map[[2]string]int64, len(g.Msgs))
	for _, chunk := range sqlcommon.Chunks(g.Msgs, maxInsertRows, maxInsertBytes) {
		if err := insertChunk(ctx, tx, g, chunk, inserted); err != nil {
			return err
		}
	}
	heads := map[string]int64{}
	for _, m := range g.Msgs {
		if off, ok := inserted[[2]string{m.PartitionKey, m.ID}]; ok {
			m.Offset = off
			heads[m.PartitionKey] = max(heads[m.PartitionKey], off)
			continue
		}
		m.Duplicate = true
		if err := tx.QueryRowContext(ctx, `SELECT "offset" FROM queue_messages WHERE tenant = ? AND topic = ? AND partition_key = ? AND id = ?`,
			g.Tenant, g.Topic, m.PartitionKey, m.ID).Scan(&m.Offset); err != nil {
			return wrap(fmt.Sprintf("look up stored message partition %q id %q", m.PartitionKey, m.ID), err)
		}
	}
	if len(heads) == 0 {
		return nil
	}
	return advanceHeads(ctx, tx, g, heads)
}

func insertChunk(ctx context.Context, tx driver.DBTX, g *sqlcommon.Group, chunk []*driver.InsertMessage, inserted map[[2]string]int64) error {
	query, args, err := dialect.InsertMessages(g, chunk)
	if err != nil {
		return err
	}
	query += ` ON CONFLICT (tenant, topic, partition_key, id) DO NOTHING RETURNING partition_key, id, "offset"`
	rows, err := tx.QueryContext(ctx, query, args...)
	if err != nil {
		return wrap("insert messages", err)
	}
	defer rows.Close()
	for rows.Next() {
		var key, id string
		var off int64
		if err := rows.Scan(&key, &id, &off); err != nil {
			return fmt.Errorf("insert messages: %w", err)
		}
		inserted[[2]string{key, id}] = off
	}
	if err := rows.Err(); err != nil {
		return wrap("insert messages", err)
	}
	return nil
}

func advanceHeads(ctx context.Context, tx driver.DBTX, g *sqlcommon.Group, heads map[string]int64) error {
	var sb strings.Builder
	args := make([]any, 0, 6*len(heads))
	now := nowMicros()
	sb.WriteString("INSERT INTO queue_partitions (tenant, topic, partition_key, head_offset, created_at, updated_at) VALUES ")
	n := 0
	for _, k := range g.Keys {
		h, ok := heads[k]
		if !ok {
			continue
		}
		if n > 0 {
			sb.WriteString(", ")
		}
		sb.WriteString("(?, ?, ?, ?, ?, ?)")
		args = append(args, g.Tenant, g.Topic, k, h, now, now)
		n++
	}
	sb.WriteString(" ON CONFLICT (tenant, topic, partition_key) DO UPDATE SET " +
		"head_offset = max(head_offset, excluded.head_offset), updated_at = excluded.updated_at")
	if _, err := tx.ExecContext(ctx, sb.String(), args...); err != nil {
		return wrap("advance partition heads", err)
	}
	return nil
}
