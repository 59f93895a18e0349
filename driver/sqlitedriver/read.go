package sqlitedriver

import (
	"context"
	"fmt"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/sqlcommon"
)

// FetchAfter reads one partition from the primary key, in offset order.
func (d *Driver) FetchAfter(ctx context.Context, tenant, topic, partitionKey string, after int64, limit int) ([]driver.Message, error) {
	rows, err := d.read.QueryContext(ctx, `SELECT "offset", id, headers, payload, created_at FROM queue_messages `+
		`WHERE tenant = ? AND topic = ? AND partition_key = ? AND "offset" > ? ORDER BY "offset" LIMIT ?`,
		tenant, topic, partitionKey, after, limit)
	if err != nil {
		return nil, wrap(fmt.Sprintf("fetch tenant %q topic %q partition %q", tenant, topic, partitionKey), err)
	}
	defer rows.Close()
	var out []driver.Message
	for rows.Next() {
		m := driver.Message{Tenant: tenant, Topic: topic, PartitionKey: partitionKey}
		var headers []byte
		var created int64
		if err := rows.Scan(&m.Offset, &m.ID, &headers, &m.Payload, &created); err != nil {
			return nil, fmt.Errorf("fetch tenant %q topic %q partition %q: %w", tenant, topic, partitionKey, err)
		}
		if m.Headers, err = sqlcommon.DecodeHeaders(headers); err != nil {
			return nil, fmt.Errorf("fetch tenant %q topic %q partition %q offset %d: %w", tenant, topic, partitionKey, m.Offset, err)
		}
		if m.Payload == nil {
			m.Payload = []byte{}
		}
		m.CreatedAt = fromMicros(created)
		out = append(out, m)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("fetch tenant %q topic %q partition %q: %w", tenant, topic, partitionKey, err)
	}
	return out, nil
}

// PartitionsWithWork lists the partitions with work for group.
func (d *Driver) PartitionsWithWork(ctx context.Context, tenants []string, topic, group string) ([]driver.Partition, error) {
	return sqlcommon.PartitionsWithWork(ctx, d.read, wrap, tenants, topic, group)
}

// PartitionHeads lists every partition of topic in the listed tenants.
func (d *Driver) PartitionHeads(ctx context.Context, tenants []string, topic string) ([]driver.Partition, error) {
	return sqlcommon.PartitionHeads(ctx, d.read, wrap, tenants, topic)
}

// ResetOffset upserts a group's cursor.
func (d *Driver) ResetOffset(ctx context.Context, tenant, topic, partitionKey, group string, offset int64) error {
	_, err := d.write.ExecContext(ctx, "INSERT INTO queue_offsets (tenant, topic, partition_key, consumer_group, committed_offset, updated_at) "+
		"VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (tenant, topic, partition_key, consumer_group) DO UPDATE SET "+
		"committed_offset = excluded.committed_offset, updated_at = excluded.updated_at",
		tenant, topic, partitionKey, group, offset, nowMicros())
	if err != nil {
		return wrap(fmt.Sprintf("reset offset tenant %q topic %q partition %q group %q", tenant, topic, partitionKey, group), err)
	}
	return nil
}
