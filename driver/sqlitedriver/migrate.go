// SPDX-License-Identifier: Apache-2.0

package sqlitedriver

import (
	"context"
	"fmt"
	"strings"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/migrate"
)

// Migrate applies the pending migrations in one IMMEDIATE transaction:
// SQLite's DDL is transactional, so a migration applies whole or not at all,
// and a second process waits for the first and then finds nothing to do.
func (d *Driver) Migrate(ctx context.Context) ([]int, error) {
	tx, err := d.write.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+migrate.Table+` (
  version    INTEGER PRIMARY KEY,
  name       TEXT NOT NULL,
  applied_at INTEGER NOT NULL
)`); err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	var current int
	if err := tx.QueryRowContext(ctx, "SELECT COALESCE(MAX(version), 0) FROM "+migrate.Table).Scan(&current); err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	if err := migrate.Check(ctx, tx, current, migrate.Latest(d.migrations), driver.ErrSchemaNewer); err != nil {
		return nil, err
	}
	applied, err := migrate.Apply(ctx, tx, d.migrations, current, nowMicros())
	if err != nil {
		return nil, err // rolled back: nothing was applied
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("migrate: commit: %w", err)
	}
	return applied, nil
}

// SchemaCompatible refuses a file migrated past this driver by a contract
// migration.
func (d *Driver) SchemaCompatible(ctx context.Context) error {
	current, latest, err := d.SchemaVersion(ctx)
	if err != nil {
		return err
	}
	return migrate.Check(ctx, d.read, current, latest, driver.ErrSchemaNewer)
}

// SchemaVersion reports the applied and the embedded versions; a file
// without the migrations table is at version 0.
func (d *Driver) SchemaVersion(ctx context.Context) (int, int, error) {
	var current int
	err := d.read.QueryRowContext(ctx, "SELECT COALESCE(MAX(version), 0) FROM "+migrate.Table).Scan(&current)
	if err != nil && strings.Contains(err.Error(), "no such table") {
		err = nil
	}
	if err != nil {
		return 0, 0, fmt.Errorf("schema version: %w", err)
	}
	return current, migrate.Latest(d.migrations), nil
}
