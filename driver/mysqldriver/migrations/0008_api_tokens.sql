-- Bearer tokens of `shardq serve` (docs/server.md). A row per tenant the
-- token may use: a request names its tenant, so checking its token reads
-- one row of one shard. Only the SHA-256 of the token's secret is stored.
CREATE TABLE IF NOT EXISTS queue_api_tokens (
  tenant      VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  token_id    VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  secret_hash VARBINARY(32) NOT NULL,
  role        VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  created_at  DATETIME(6) NOT NULL,
  expires_at  DATETIME(6) NULL,
  revoked_at  DATETIME(6) NULL,
  PRIMARY KEY (tenant, token_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
