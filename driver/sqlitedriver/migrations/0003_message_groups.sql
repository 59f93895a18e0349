-- Message groups: the same tables as MySQL's 0003 (see there).
CREATE TABLE IF NOT EXISTS queue_group_state (
  tenant         TEXT NOT NULL,
  consumer_group TEXT NOT NULL,
  topic          TEXT NOT NULL,
  partition_key  TEXT NOT NULL,
  state          BLOB NOT NULL,
  updated_at     INTEGER NOT NULL,
  PRIMARY KEY (tenant, consumer_group, topic, partition_key)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS queue_message_claims (
  tenant         TEXT NOT NULL,
  consumer_group TEXT NOT NULL,
  topic          TEXT NOT NULL,
  message_offset INTEGER NOT NULL,
  owner          TEXT NOT NULL,
  token          INTEGER NOT NULL,
  attempts       INTEGER NOT NULL,
  visible_at     INTEGER NOT NULL,
  done           INTEGER NOT NULL DEFAULT 0,
  last_error     TEXT NULL,
  updated_at     INTEGER NOT NULL,
  PRIMARY KEY (tenant, consumer_group, topic, message_offset)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS idx_claims_open ON queue_message_claims (tenant, consumer_group, topic, done, message_offset);
