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
// MySQL DDL is not transactional; every statement is idempotent (IF NOT
// EXISTS, or an index or column already added or dropped is no error), so
// a migration cut short is completed by the next run.
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
	var version string
	if err := conn.QueryRowContext(ctx, "SELECT @@version").Scan(&version); err != nil {
		return nil, fmt.Errorf("migrate: read the server version: %w", err)
	}
	exec := migrationExec{conn: conn, vitess: strings.Contains(strings.ToLower(version), "vitess")}
	if err := migrate.Check(ctx, conn, current, migrate.Latest(d.migrations), driver.ErrSchemaNewer); err != nil {
		return nil, err
	}
	return migrate.Apply(ctx, exec, d.migrations, current, dialect.EncodeTime(time.Now()))
}

// SchemaCompatible refuses a database migrated past this driver by a
// contract migration.
func (d *Driver) SchemaCompatible(ctx context.Context) error {
	current, latest, err := d.SchemaVersion(ctx)
	if err != nil {
		return err
	}
	return migrate.Check(ctx, d.db, current, latest, driver.ErrSchemaNewer)
}

// migrationExec runs migration statements. A CREATE INDEX whose index
// exists, or an ADD COLUMN whose column does (MySQL has no IF NOT EXISTS
// for either), is done already: a migration cut short after it is
// completed by the next run. Through Vitess, a table that gained a column
// is rebuilt (ALTER TABLE … FORCE): vttablet reloads a table's columns
// only when its create_time moves, which an instant ADD COLUMN does not do
// (vttablet/tabletserver/schema/engine.go), and vtgate would refuse
// statements naming the new column.
type migrationExec struct {
	conn   *sql.Conn
	vitess bool
}

func (e migrationExec) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	res, err := e.conn.ExecContext(ctx, query, args...)
	var me *mysql.MySQLError
	addColumn := strings.HasPrefix(query, "ALTER TABLE ") && strings.Contains(query, " ADD COLUMN ")
	if errors.As(err, &me) && (me.Number == errDuplicateKeyName && strings.HasPrefix(query, "CREATE INDEX ") ||
		me.Number == errDuplicateColumn && addColumn || me.Number == errCantDropKey && strings.HasPrefix(query, "DROP INDEX ")) {
		res, err = sqldriver.RowsAffected(0), nil
	}
	if err == nil && addColumn && e.vitess {
		f := strings.Fields(query) // ALTER TABLE t ADD COLUMN c ...
		table, column := f[2], f[5]
		if _, err := e.conn.ExecContext(ctx, "ALTER TABLE "+table+" FORCE"); err != nil {
			return nil, fmt.Errorf("rebuild %s so that Vitess sees its new column: %w", table, err)
		}
		if err := e.waitForColumn(ctx, table, column); err != nil {
			return nil, err
		}
	}
	return res, err
}

// waitForColumn waits until vtgate plans a statement naming the new
// column: its schema tracking learns of the change asynchronously, and
// until then refuses such statements (error 1054).
func (e migrationExec) waitForColumn(ctx context.Context, table, column string) error {
	deadline := time.Now().Add(vitessSchemaWait)
	for {
		// Routed to one shard by the (never empty) tenant: the planner,
		// not a shard, is what has to know the column.
		rows, err := e.conn.QueryContext(ctx, "SELECT "+column+" FROM "+table+" WHERE tenant = ''")
		if err == nil {
			return rows.Close()
		}
		var me *mysql.MySQLError
		if !errors.As(err, &me) || me.Number != errBadField || time.Now().After(deadline) {
			return fmt.Errorf("wait for Vitess to see column %s of %s: %w", column, table, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// vitessSchemaWait bounds the wait for vtgate's schema tracking.
const vitessSchemaWait = 60 * time.Second

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
