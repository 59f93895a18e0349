-- Keys that sign the receipts of `shardq serve` (HMAC-SHA256,
-- docs/server.md): every server of a database signs with the newest and
-- accepts a key replaced less than shardq.MaxVisibility ago. Keys are few
-- and read whole; on Vitess the table is sharded by key_id.
CREATE TABLE IF NOT EXISTS shardq_receipt_keys (
  key_id     BIGINT NOT NULL,
  secret     VARBINARY(64) NOT NULL,
  created_at DATETIME(6) NOT NULL,
  PRIMARY KEY (key_id)
) ENGINE=InnoDB;
