// SPDX-License-Identifier: Apache-2.0

package mysqldriver

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/migrate"
)

// Migrate applies the pending migrations while holding a named server lock,
// so that processes starting together do not apply one migration twice.
// MySQL DDL is not transactional; every statement is idempotent
// (IF NOT EXISTS), so a migration cut short is completed by the next run.
func (d *Driver) Migrate(ctx context.Context) ([]int, error) {
	conn, err := d.db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	defer conn.Close()
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(CONCAT('shardq_migrate.', DATABASE()), 60)").Scan(&got); err != nil {
		return nil, fmt.Errorf("migrate: take lock: %w", err)
	}
	if got.Int64 != 1 {
		return nil, errors.New("migrate: another process held the migration lock for 60 s")
	}
	defer conn.ExecContext(context.WithoutCancel(ctx), "SELECT RELEASE_LOCK(CONCAT('shardq_migrate.', DATABASE()))")

	if _, err := conn.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+migrate.Table+` (
  version    INT NOT NULL PRIMARY KEY,
  name       VARCHAR(255) NOT NULL,
  applied_at DATETIME(6) NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin`); err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	current, err := d.currentVersion(ctx, conn)
	if err != nil {
		return nil, err
	}
	return migrate.Apply(ctx, indexOnce{conn}, d.migrations, current, dialect.EncodeTime(time.Now()), driver.ErrSchemaNewer)
}

// indexOnce runs migration statements; a CREATE INDEX whose index exists,
// or an ADD COLUMN whose column does (MySQL has no IF NOT EXISTS for
// either), is done already: a migration cut short after it is completed
// by the next run.
type indexOnce struct{ conn *sql.Conn }

func (e indexOnce) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	res, err := e.conn.ExecContext(ctx, query, args...)
	var me *mysql.MySQLError
	if errors.As(err, &me) && (me.Number == errDuplicateKeyName && strings.HasPrefix(query, "CREATE INDEX ") ||
		me.Number == errDuplicateColumn && strings.HasPrefix(query, "ALTER TABLE ") && strings.Contains(query, " ADD COLUMN ")) {
		return sqldriver.RowsAffected(0), nil
	}
	return res, err
}

// SchemaVersion reports the applied and the embedded versions; a database
// without the migrations table is at version 0.
func (d *Driver) SchemaVersion(ctx context.Context) (int, int, error) {
	current, err := d.currentVersion(ctx, d.db)
	return current, migrate.Latest(d.migrations), err
}

func (d *Driver) currentVersion(ctx context.Context, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}) (int, error) {
	var v int
	err := q.QueryRowContext(ctx, "SELECT COALESCE(MAX(version), 0) FROM "+migrate.Table).Scan(&v)
	var me *mysql.MySQLError
	if errors.As(err, &me) && me.Number == errNoSuchTable {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("schema version: %w", err)
	}
	return v, nil
}
