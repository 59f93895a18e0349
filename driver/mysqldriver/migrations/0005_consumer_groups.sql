-- Consumer groups that outlive their partitions (docs/design.md,
-- "Partition lifecycle"). A row says a group reads the topic of a tenant:
-- retention counts it among the groups that must pass a message even
-- when it has no cursor left, because removing drained partitions removes
-- cursors. start_offset is where the group starts in partitions it has no
-- cursor for: 0 (earliest) or the topic's highest head when the group was
-- made with the latest start position.
CREATE TABLE IF NOT EXISTS queue_consumer_groups (
  tenant         VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  topic          VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  consumer_group VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  start_offset   BIGINT NOT NULL DEFAULT 0,
  created_at     DATETIME(6) NOT NULL,
  PRIMARY KEY (tenant, topic, consumer_group)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
