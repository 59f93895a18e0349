package sqlitedriver

import (
	"context"
	"fmt"
	"strings"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/sqlcommon"
)

const (
	maxInsertRows  = 500 // 8 variables a row, far below SQLite's 32766
	maxInsertBytes = 4 << 20
)

// InsertMessages appends msgs in tx. The transaction holds SQLite's write
// lock (BEGIN IMMEDIATE), so there is one writer at a time and offsets drawn
// from queue_offset_sequence increase in commit order.
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

func insertGroup(ctx context.Context, tx driver.DBTX, g *sqlcommon.Group) error {
	if err := markExisting(ctx, tx, g); err != nil {
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
	var last int64
	if err := tx.QueryRowContext(ctx, "UPDATE queue_offset_sequence SET last_offset = last_offset + ? WHERE id = 1 RETURNING last_offset",
		len(fresh)).Scan(&last); err != nil {
		return wrap("draw offsets", err)
	}
	next := last - int64(len(fresh)) + 1
	heads := map[string]int64{}
	for _, m := range fresh {
		m.Offset = next
		heads[m.PartitionKey] = next
		next++
	}
	for _, chunk := range sqlcommon.Chunks(fresh, maxInsertRows, maxInsertBytes) {
		var sb strings.Builder
		args := make([]any, 0, 8*len(chunk))
		sb.WriteString(`INSERT INTO queue_messages (tenant, topic, partition_key, "offset", id, headers, payload, created_at) VALUES `)
		for i, m := range chunk {
			if i > 0 {
				sb.WriteString(", ")
			}
			sb.WriteString("(?, ?, ?, ?, ?, ?, ?, ?)")
			h, err := sqlcommon.EncodeHeaders(m.Headers)
			if err != nil {
				return err
			}
			payload := m.Payload
			if payload == nil {
				payload = []byte{}
			}
			args = append(args, g.Tenant, g.Topic, m.PartitionKey, m.Offset, m.ID, string(h), payload, micros(m.CreatedAt))
		}
		if _, err := tx.ExecContext(ctx, sb.String(), args...); err != nil {
			return wrap("insert messages", err)
		}
	}
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

// markExisting sets Offset and Duplicate on the messages already stored.
func markExisting(ctx context.Context, tx driver.DBTX, g *sqlcommon.Group) error {
	if err := sqlcommon.Lookup(ctx, tx, `SELECT partition_key, id, "offset" FROM queue_messages`, "", g, g.Msgs, true); err != nil {
		return wrap("look up message ids", err)
	}
	return nil
}
