-- Keys that sign the receipts of `shardq serve` (see the MySQL migration).
CREATE TABLE IF NOT EXISTS shardq_receipt_keys (
  key_id     INTEGER NOT NULL PRIMARY KEY,
  secret     BLOB NOT NULL,
  created_at INTEGER NOT NULL
);
