-- Half messages of transactional sends: written before the producer's local
-- transaction, invisible to consumers, resolved by commit (moved into
-- queue_messages with a fresh offset), rollback (deleted) or check-back.
-- Keyed like queue_messages, tenant first.
CREATE TABLE IF NOT EXISTS queue_half_messages (
  tenant           VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  topic            VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  partition_key    VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  id               VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  producer_group   VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  headers          MEDIUMTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  payload          LONGBLOB NOT NULL,
  created_at       DATETIME(6) NOT NULL,
  check_count      INT NOT NULL DEFAULT 0,
  next_check_at    DATETIME(6) NOT NULL,
  claim_owner      VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT '',
  claim_token      BIGINT NOT NULL DEFAULT 0,
  claim_expires_at DATETIME(6) NOT NULL,
  PRIMARY KEY (tenant, topic, partition_key, id),
  KEY idx_half_due (tenant, producer_group, next_check_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- Half messages whose checks ran out under the dead-letter policy.
CREATE TABLE IF NOT EXISTS queue_half_messages_dead (
  tenant         VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  topic          VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  partition_key  VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  id             VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  producer_group VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  headers        MEDIUMTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  payload        LONGBLOB NOT NULL,
  created_at     DATETIME(6) NOT NULL,
  check_count    INT NOT NULL,
  dead_at        DATETIME(6) NOT NULL,
  PRIMARY KEY (tenant, topic, partition_key, id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
