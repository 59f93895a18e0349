-- Bearer tokens of `shardq serve` (see the MySQL migration).
CREATE TABLE IF NOT EXISTS queue_api_tokens (
  tenant      TEXT NOT NULL,
  token_id    TEXT NOT NULL,
  secret_hash BLOB NOT NULL,
  role        TEXT NOT NULL,
  created_at  INTEGER NOT NULL,
  expires_at  INTEGER,
  revoked_at  INTEGER,
  PRIMARY KEY (tenant, token_id)
) WITHOUT ROWID;
