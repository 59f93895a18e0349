-- Deferred messages: the same table as MySQL's 0012 (see there).
CREATE TABLE IF NOT EXISTS queue_deferred (
  tenant         TEXT NOT NULL,
  consumer_group TEXT NOT NULL,
  topic          TEXT NOT NULL,
  message_offset INTEGER NOT NULL,
  partition_key  TEXT NOT NULL,
  owner          TEXT NOT NULL,
  token          INTEGER NOT NULL,
  attempts       INTEGER NOT NULL,
  visible_at     INTEGER NOT NULL,
  deferred_at    INTEGER NOT NULL,
  updated_at     INTEGER NOT NULL,
  PRIMARY KEY (tenant, consumer_group, topic, message_offset)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS idx_deferred_partition ON queue_deferred (tenant, topic, partition_key, consumer_group, message_offset);
