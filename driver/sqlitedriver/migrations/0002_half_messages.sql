-- Half messages of transactional sends (see the MySQL migration).
CREATE TABLE IF NOT EXISTS queue_half_messages (
  tenant           TEXT NOT NULL,
  topic            TEXT NOT NULL,
  partition_key    TEXT NOT NULL,
  id               TEXT NOT NULL,
  producer_group   TEXT NOT NULL,
  headers          TEXT NOT NULL,
  payload          BLOB NOT NULL,
  created_at       INTEGER NOT NULL,
  check_count      INTEGER NOT NULL DEFAULT 0,
  next_check_at    INTEGER NOT NULL,
  claim_owner      TEXT NOT NULL DEFAULT '',
  claim_token      INTEGER NOT NULL DEFAULT 0,
  claim_expires_at INTEGER NOT NULL,
  PRIMARY KEY (tenant, topic, partition_key, id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS idx_half_due ON queue_half_messages (tenant, producer_group, next_check_at);

CREATE TABLE IF NOT EXISTS queue_half_messages_dead (
  tenant         TEXT NOT NULL,
  topic          TEXT NOT NULL,
  partition_key  TEXT NOT NULL,
  id             TEXT NOT NULL,
  producer_group TEXT NOT NULL,
  headers        TEXT NOT NULL,
  payload        BLOB NOT NULL,
  created_at     INTEGER NOT NULL,
  check_count    INTEGER NOT NULL,
  dead_at        INTEGER NOT NULL,
  PRIMARY KEY (tenant, topic, partition_key, id)
) WITHOUT ROWID;
