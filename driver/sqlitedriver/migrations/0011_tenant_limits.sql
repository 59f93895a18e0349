-- A tenant's limits (see the MySQL migration).
ALTER TABLE queue_tenants ADD COLUMN publish_rate INTEGER NOT NULL DEFAULT 0;
ALTER TABLE queue_tenants ADD COLUMN publish_byte_rate INTEGER NOT NULL DEFAULT 0;
ALTER TABLE queue_tenants ADD COLUMN max_messages INTEGER NOT NULL DEFAULT 0;
ALTER TABLE queue_tenants ADD COLUMN max_bytes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE queue_tenants ADD COLUMN max_partitions INTEGER NOT NULL DEFAULT 0;
ALTER TABLE queue_tenants ADD COLUMN min_retention_ms INTEGER NOT NULL DEFAULT 0;
ALTER TABLE queue_tenants ADD COLUMN max_retention_ms INTEGER NOT NULL DEFAULT 0;
