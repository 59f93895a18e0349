-- Discovery reads what changed, not every partition ever used
-- (docs/consumers.md, "Discovery"): head rows by when their head last
-- moved, and the lease rows an owner holds. A CREATE INDEX that finds its
-- index already there (a migration cut short) counts as done (Migrate).
CREATE INDEX idx_partitions_moved ON queue_partitions (tenant, topic, updated_at);
CREATE INDEX idx_leases_owner ON queue_partition_leases (tenant, consumer_group, topic, owner);
