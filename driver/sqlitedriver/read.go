package sqlitedriver

import (
	"context"
	"fmt"

	"github.com/shardq/shardq/driver"
)

// FetchAfter reads one partition from its (tenant, topic, partition_key,
// offset) index, in offset order.
func (d *Driver) FetchAfter(ctx context.Context, tenant, topic, partitionKey string, after int64, limit int) ([]driver.Message, error) {
	return dialect.FetchAfter(ctx, d.read, tenant, topic, partitionKey, after, limit)
}

// PartitionsWithWork lists the partitions with work for group.
func (d *Driver) PartitionsWithWork(ctx context.Context, tenants []string, topic, group string) ([]driver.Partition, error) {
	return dialect.PartitionsWithWork(ctx, d.read, tenants, topic, group)
}

// PartitionHeads lists every partition of topic in the listed tenants.
func (d *Driver) PartitionHeads(ctx context.Context, tenants []string, topic string) ([]driver.Partition, error) {
	return dialect.PartitionHeads(ctx, d.read, tenants, topic)
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
