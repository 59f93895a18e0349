-- Pausing a consumer group (see the MySQL migration): NULL means running.
ALTER TABLE queue_consumer_groups ADD COLUMN paused_at INTEGER;
