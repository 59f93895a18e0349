-- shardq schema v1 for SQLite: the same tables and keys as MySQL, in
-- SQLite's types. TEXT compares with the BINARY collation, byte for byte,
-- which for UTF-8 is code-point order: the same as ascii_bin/utf8mb4_bin.
-- Times are INTEGER microseconds since the Unix epoch, UTC.

CREATE TABLE IF NOT EXISTS queue_messages (
  tenant        TEXT NOT NULL,
  topic         TEXT NOT NULL,
  partition_key TEXT NOT NULL,
  "offset"      INTEGER NOT NULL,
  id            TEXT NOT NULL,
  headers       TEXT NOT NULL,
  payload       BLOB NOT NULL,
  created_at    INTEGER NOT NULL,
  PRIMARY KEY (tenant, topic, partition_key, "offset")
) WITHOUT ROWID;
CREATE UNIQUE INDEX IF NOT EXISTS uq_queue_messages_id ON queue_messages (tenant, topic, partition_key, id);
CREATE INDEX IF NOT EXISTS idx_offset ON queue_messages ("offset");

-- SQLite has no AUTO_INCREMENT on a column that is not the rowid; this one
-- row is the file's offset counter (one file is one shard). Writers hold
-- SQLite's write lock, so offsets are drawn in commit order.
CREATE TABLE IF NOT EXISTS queue_offset_sequence (
  id          INTEGER PRIMARY KEY CHECK (id = 1),
  last_offset INTEGER NOT NULL
);
INSERT OR IGNORE INTO queue_offset_sequence (id, last_offset) VALUES (1, 0);

CREATE TABLE IF NOT EXISTS queue_partitions (
  tenant        TEXT NOT NULL,
  topic         TEXT NOT NULL,
  partition_key TEXT NOT NULL,
  head_offset   INTEGER NOT NULL DEFAULT 0,
  created_at    INTEGER NOT NULL,
  updated_at    INTEGER NOT NULL,
  PRIMARY KEY (tenant, topic, partition_key)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS queue_delivery_state (
  tenant          TEXT NOT NULL,
  consumer_group  TEXT NOT NULL,
  topic           TEXT NOT NULL,
  partition_key   TEXT NOT NULL,
  message_offset  INTEGER NOT NULL,
  attempts        INTEGER NOT NULL DEFAULT 0,
  next_attempt_at INTEGER,
  last_error      TEXT,
  updated_at      INTEGER NOT NULL,
  PRIMARY KEY (tenant, consumer_group, topic, partition_key, message_offset)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS queue_offsets (
  tenant           TEXT NOT NULL,
  topic            TEXT NOT NULL,
  partition_key    TEXT NOT NULL,
  consumer_group   TEXT NOT NULL,
  committed_offset INTEGER NOT NULL DEFAULT 0,
  updated_at       INTEGER NOT NULL,
  PRIMARY KEY (tenant, topic, partition_key, consumer_group)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS queue_partition_leases (
  tenant         TEXT NOT NULL,
  consumer_group TEXT NOT NULL,
  topic          TEXT NOT NULL,
  partition_key  TEXT NOT NULL,
  owner          TEXT NOT NULL,
  token          INTEGER NOT NULL,
  expires_at     INTEGER NOT NULL,
  acquired_at    INTEGER NOT NULL,
  PRIMARY KEY (tenant, consumer_group, topic, partition_key)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS queue_subscriber_heartbeats (
  tenant          TEXT NOT NULL,
  consumer_group  TEXT NOT NULL,
  topic           TEXT NOT NULL,
  subscriber_name TEXT NOT NULL,
  started_at      INTEGER NOT NULL,
  heartbeat_at    INTEGER NOT NULL,
  PRIMARY KEY (tenant, consumer_group, topic, subscriber_name)
) WITHOUT ROWID;
