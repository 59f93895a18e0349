-- shardq schema v1 for SQLite: the same tables and keys as MySQL, in
-- SQLite's types. TEXT compares with the BINARY collation, byte for byte,
-- which for UTF-8 is code-point order: the same as ascii_bin/utf8mb4_bin.
-- Times are INTEGER microseconds since the Unix epoch, UTC.

-- The log. "offset" is the rowid with AUTOINCREMENT, SQLite's form of
-- AUTO_INCREMENT: never reused, and drawn under the file's single write
-- lock, so offsets increase in commit order. Rows are stored in offset
-- order, so a batch appends instead of dirtying one page per partition
-- (SQLite writes whole pages to the WAL at commit). DESIGN's keys are unique
-- indexes here: (tenant, topic, partition_key, offset) serves reads of a
-- partition after a cursor, (tenant, topic, partition_key, id) idempotency,
-- and the rowid itself is idx_offset.
CREATE TABLE IF NOT EXISTS queue_messages (
  "offset"      INTEGER PRIMARY KEY AUTOINCREMENT,
  tenant        TEXT NOT NULL,
  topic         TEXT NOT NULL,
  partition_key TEXT NOT NULL,
  id            TEXT NOT NULL,
  headers       TEXT NOT NULL,
  payload       BLOB NOT NULL,
  created_at    INTEGER NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS pk_queue_messages ON queue_messages (tenant, topic, partition_key, "offset");
CREATE UNIQUE INDEX IF NOT EXISTS uq_queue_messages_id ON queue_messages (tenant, topic, partition_key, id);

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
