-- Message groups (docs/groups.md). Session state: an opaque value per
-- (tenant, consumer group, topic, partition key), written only under the
-- partition's lease.
CREATE TABLE IF NOT EXISTS queue_group_state (
  tenant         VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  consumer_group VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  topic          VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  partition_key  VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  state          LONGBLOB NOT NULL,
  updated_at     DATETIME(6) NOT NULL,
  PRIMARY KEY (tenant, consumer_group, topic, partition_key)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- Per-message claims of ungrouped messages (empty partition key), taken by
-- competing consumers instead of a partition lease. A claim is visible
-- again (claimable) from visible_at: its visibility timeout, or its retry
-- time after a nack. token changes with every claim and fences the
-- claim's writes; done marks a message acked or dead-lettered. Rows at or
-- below the group's cursor of partition '' are deleted as it advances.
-- idx_claims_open finds the claims not done (in flight or waiting for a
-- retry) without reading the done ones.
CREATE TABLE IF NOT EXISTS queue_message_claims (
  tenant         VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  consumer_group VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  topic          VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  message_offset BIGINT NOT NULL,
  owner          VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  token          BIGINT NOT NULL,
  attempts       INT NOT NULL,
  visible_at     DATETIME(6) NOT NULL,
  done           TINYINT NOT NULL DEFAULT 0,
  last_error     TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
  updated_at     DATETIME(6) NOT NULL,
  PRIMARY KEY (tenant, consumer_group, topic, message_offset),
  KEY idx_claims_open (tenant, consumer_group, topic, done, message_offset)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
