-- Consumer groups that outlive their partitions (see the MySQL migration).
CREATE TABLE IF NOT EXISTS queue_consumer_groups (
  tenant         TEXT NOT NULL,
  topic          TEXT NOT NULL,
  consumer_group TEXT NOT NULL,
  start_offset   INTEGER NOT NULL DEFAULT 0,
  created_at     INTEGER NOT NULL,
  PRIMARY KEY (tenant, topic, consumer_group)
) WITHOUT ROWID;
