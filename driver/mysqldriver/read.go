package mysqldriver

import (
	"context"
	"fmt"

	"github.com/shardq/shardq/driver"
)

// FetchAfter reads one partition from the primary key, in offset order.
func (d *Driver) FetchAfter(ctx context.Context, tenant, topic, partitionKey string, after int64, limit int) ([]driver.Message, error) {
	return dialect.FetchAfter(ctx, d.db, tenant, topic, partitionKey, after, limit)
}

// PartitionsWithWork lists the partitions with work for group.
func (d *Driver) PartitionsWithWork(ctx context.Context, tenants []string, topic, group string) ([]driver.Partition, error) {
	return dialect.PartitionsWithWork(ctx, d.db, tenants, topic, group)
}

// PartitionHeads lists every partition of topic in the listed tenants.
func (d *Driver) PartitionHeads(ctx context.Context, tenants []string, topic string) ([]driver.Partition, error) {
	return dialect.PartitionHeads(ctx, d.db, tenants, topic)
}

// ResetOffset upserts a group's cursor.
func (d *Driver) ResetOffset(ctx context.Context, tenant, topic, partitionKey, group string, offset int64) error {
	_, err := d.db.ExecContext(ctx, "INSERT INTO queue_offsets (tenant, topic, partition_key, consumer_group, committed_offset, updated_at) "+
		"VALUES (?, ?, ?, ?, ?, UTC_TIMESTAMP(6)) ON DUPLICATE KEY UPDATE committed_offset = VALUES(committed_offset), updated_at = VALUES(updated_at)",
		tenant, topic, partitionKey, group, offset)
	if err != nil {
		return wrap(fmt.Sprintf("reset offset tenant %q topic %q partition %q group %q", tenant, topic, partitionKey, group), err)
	}
	return nil
}
