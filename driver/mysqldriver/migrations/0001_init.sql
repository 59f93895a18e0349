-- shardq schema v1 for MariaDB 10.6+ / MySQL 8.0+ (and Vitess, sharded by tenant).
-- Every primary key leads with tenant. ASCII identifiers are ascii_bin
-- (byte-for-byte); partition keys and message ids are utf8mb4_bin (by code
-- point). The widest key, uq_queue_messages_id, is 255+255+4*255+4*255 = 2550
-- bytes, inside InnoDB's 3072-byte index limit.

-- The log. `offset` comes from the table's AUTO_INCREMENT (idx_offset makes
-- it legal as a non-leading primary key column); a per-partition lock on
-- queue_partitions makes offsets of one partition visible in commit order.
CREATE TABLE IF NOT EXISTS queue_messages (
  tenant        VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  topic         VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  partition_key VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  `offset`      BIGINT NOT NULL AUTO_INCREMENT,
  id            VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  headers       MEDIUMTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  payload       LONGBLOB NOT NULL,
  created_at    DATETIME(6) NOT NULL,
  PRIMARY KEY (tenant, topic, partition_key, `offset`),
  UNIQUE KEY uq_queue_messages_id (tenant, topic, partition_key, id),
  KEY idx_offset (`offset`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- One head row per partition: publishers lock it before they insert (which
-- serialises publishers of one partition), it records the head offset, and
-- it makes discovery and lag cheap without reading queue_messages.
CREATE TABLE IF NOT EXISTS queue_partitions (
  tenant        VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  topic         VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  partition_key VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  head_offset   BIGINT NOT NULL DEFAULT 0,
  created_at    DATETIME(6) NOT NULL,
  updated_at    DATETIME(6) NOT NULL,
  PRIMARY KEY (tenant, topic, partition_key)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- Attempts, next attempt time and last error of a message being retried.
CREATE TABLE IF NOT EXISTS queue_delivery_state (
  tenant          VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  consumer_group  VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  topic           VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  partition_key   VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  message_offset  BIGINT NOT NULL,
  attempts        INT NOT NULL DEFAULT 0,
  next_attempt_at DATETIME(6) NULL,
  last_error      TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
  updated_at      DATETIME(6) NOT NULL,
  PRIMARY KEY (tenant, consumer_group, topic, partition_key, message_offset)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- A consumer group's committed cursor: the offset of the last settled message.
CREATE TABLE IF NOT EXISTS queue_offsets (
  tenant           VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  topic            VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  partition_key    VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  consumer_group   VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  committed_offset BIGINT NOT NULL DEFAULT 0,
  updated_at       DATETIME(6) NOT NULL,
  PRIMARY KEY (tenant, topic, partition_key, consumer_group)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- Exclusive, fenced right of one subscriber to deliver one partition.
CREATE TABLE IF NOT EXISTS queue_partition_leases (
  tenant         VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  consumer_group VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  topic          VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  partition_key  VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  owner          VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  token          BIGINT NOT NULL,
  expires_at     DATETIME(6) NOT NULL,
  acquired_at    DATETIME(6) NOT NULL,
  PRIMARY KEY (tenant, consumer_group, topic, partition_key)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- Liveness of subscribers.
CREATE TABLE IF NOT EXISTS queue_subscriber_heartbeats (
  tenant          VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  consumer_group  VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  topic           VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  subscriber_name VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  started_at      DATETIME(6) NOT NULL,
  heartbeat_at    DATETIME(6) NOT NULL,
  PRIMARY KEY (tenant, consumer_group, topic, subscriber_name)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
