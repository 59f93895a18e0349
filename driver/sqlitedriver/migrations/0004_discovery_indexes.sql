-- Discovery reads what changed, not every partition ever used
-- (docs/consumers.md, "Discovery"): head rows by when their head last
-- moved, and the lease rows an owner holds.
CREATE INDEX IF NOT EXISTS idx_partitions_moved ON queue_partitions (tenant, topic, updated_at);
CREATE INDEX IF NOT EXISTS idx_leases_owner ON queue_partition_leases (tenant, consumer_group, topic, owner);
