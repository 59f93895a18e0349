-- A tenant's limits (docs/tenants.md, "Quotas and retention"); 0: none,
-- or the retention's default. publish_rate in messages and
-- publish_byte_rate in payload bytes per second; max_messages, max_bytes
-- and max_partitions (head rows) of what it stores; min/max_retention_ms
-- for its topics.
ALTER TABLE queue_tenants
  ADD COLUMN publish_rate      BIGINT NOT NULL DEFAULT 0,
  ADD COLUMN publish_byte_rate BIGINT NOT NULL DEFAULT 0,
  ADD COLUMN max_messages      BIGINT NOT NULL DEFAULT 0,
  ADD COLUMN max_bytes         BIGINT NOT NULL DEFAULT 0,
  ADD COLUMN max_partitions    BIGINT NOT NULL DEFAULT 0,
  ADD COLUMN min_retention_ms  BIGINT NOT NULL DEFAULT 0,
  ADD COLUMN max_retention_ms  BIGINT NOT NULL DEFAULT 0;
