-- Deferred messages (docs/consumers.md, "Deferral"): messages a consumer
-- group set aside (Delivery.Defer), which its cursor or claim has passed,
-- to be fetched later by offset (Client.ReceiveDeferred). A row lives
-- until the message is settled through it, or until retention deleted the
-- message (retention keeps a deferred message up to its MaxRetention).
-- owner, token and visible_at are the claim of a ReceiveDeferred: the
-- token changes with every claim and fences its writes, and the row is
-- claimable again from visible_at. idx_deferred_partition serves
-- retention's lowest deferred offset of a partition and the lag report's
-- count per partition and group.
CREATE TABLE IF NOT EXISTS queue_deferred (
  tenant         VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  consumer_group VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  topic          VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  message_offset BIGINT NOT NULL,
  partition_key  VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  owner          VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  token          BIGINT NOT NULL,
  attempts       INT NOT NULL,
  visible_at     DATETIME(6) NOT NULL,
  deferred_at    DATETIME(6) NOT NULL,
  updated_at     DATETIME(6) NOT NULL,
  PRIMARY KEY (tenant, consumer_group, topic, message_offset),
  KEY idx_deferred_partition (tenant, topic, partition_key, consumer_group, message_offset)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
