-- A tenant's own settings (see the MySQL migration).
CREATE TABLE IF NOT EXISTS queue_tenants (
  tenant       TEXT NOT NULL,
  suspended_at INTEGER,
  updated_at   INTEGER NOT NULL,
  PRIMARY KEY (tenant)
) WITHOUT ROWID;
