-- A tenant's own settings (docs/tenants.md): a row only for a tenant that
-- has one set. suspended_at says since when the tenant's publishing and
-- consuming are refused (NULL: active). Clients and members read the row
-- through a cache, at most once per TenantSettingsTTL or rebalance tick.
CREATE TABLE IF NOT EXISTS queue_tenants (
  tenant       VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  suspended_at DATETIME(6) NULL,
  updated_at   DATETIME(6) NOT NULL,
  PRIMARY KEY (tenant)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
