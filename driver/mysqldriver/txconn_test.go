// SPDX-License-Identifier: Apache-2.0

package mysqldriver_test

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"errors"
	"fmt"
	"testing"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/driver/drivertest"
	"github.com/shardq/shardq/driver/mysqldriver"
	"github.com/shardq/shardq/internal/testdb"
)

// TestTxConnTransactions checks, on MariaDB, that a transaction that
// reaches the server at its first execution is still one transaction:
// its statements commit or roll back together, one that ran nothing ends
// cleanly, and when its BEGIN fails no statement of it runs on its own.
// Both kinds run it: the BEGIN sent before the first execution (through
// vtgate) and none sent at all, the session's autocommit off (the
// write-transaction pool), which must also leave no transaction open
// after its end and run nothing outside one.
func TestTxConnTransactions(t *testing.T) {
	for _, tc := range []struct {
		name     string
		wrap     func(sqldriver.Connector) sqldriver.Connector
		implicit bool
	}{
		{"vtgate", mysqldriver.VTGateConnector, false},
		{"implicit", mysqldriver.ImplicitConnector, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dsn := testdb.MySQLDatabase(t)
			db := sql.OpenDB(tc.wrap(testdb.MySQLConnector(t, dsn, false)))
			defer db.Close()
			db.SetMaxOpenConns(1) // every step below on the one connection
			plain := sql.OpenDB(testdb.MySQLConnector(t, dsn, false))
			defer plain.Close()
			testTxConn(t, db, plain, tc.implicit)
		})
	}
}

func testTxConn(t *testing.T, db, plain *sql.DB, implicit bool) {
	ctx := context.Background()
	if _, err := plain.ExecContext(ctx, "CREATE TABLE t (v INT PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	count := func() int {
		t.Helper()
		var n int
		if err := plain.QueryRowContext(ctx, "SELECT COUNT(*) FROM t").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	insert := func(tx *sql.Tx, v int) error {
		_, err := tx.ExecContext(ctx, "INSERT INTO t (v) VALUES (?)", v)
		return err
	}
	// ended checks that the wrapped connection holds no transaction: one
	// left open would keep the snapshot of its first read, and the next
	// transaction, on the same session, would not see a row committed
	// since.
	probe := 100
	ended := func(when string) {
		t.Helper()
		probe++
		if _, err := plain.ExecContext(ctx, "INSERT INTO t (v) VALUES (?)", probe); err != nil {
			t.Fatal(err)
		}
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		var n int
		err = tx.QueryRowContext(ctx, "SELECT COUNT(*) FROM t WHERE v = ?", probe).Scan(&n)
		if err := errors.Join(err, tx.Commit()); err != nil {
			t.Fatal(err)
		}
		if n != 1 {
			t.Fatalf("%s: a row committed since is not seen: the transaction is still open", when)
		}
		if _, err := plain.ExecContext(ctx, "DELETE FROM t WHERE v = ?", probe); err != nil {
			t.Fatal(err)
		}
	}
	snapshot := func(tx *sql.Tx) {
		t.Helper()
		var n int
		if err := tx.QueryRowContext(ctx, "SELECT COUNT(*) FROM t").Scan(&n); err != nil {
			t.Fatal(err)
		}
	}

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	snapshot(tx)
	if err := insert(tx, 1); err != nil {
		t.Fatal(err)
	}
	if err := insert(tx, 2); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 0 {
		t.Fatalf("before the transaction's end: %d rows seen, want 0", n)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 0 {
		t.Fatalf("after a rollback: %d rows, want 0", n)
	}
	ended("after a rollback")

	tx, err = db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var one int
	if err := tx.QueryRowContext(ctx, "SELECT COUNT(*) FROM t WHERE v > ?", 0).Scan(&one); err != nil {
		t.Fatal(err)
	}
	if err := insert(tx, 1); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 1 {
		t.Fatalf("after a commit: %d rows, want 1", n)
	}
	ended("after a commit")

	for _, end := range []func(*sql.Tx) error{(*sql.Tx).Commit, (*sql.Tx).Rollback} {
		tx, err = db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := end(tx); err != nil {
			t.Fatalf("ending a transaction that ran nothing: %v", err)
		}
	}

	// go-sql-driver refuses this isolation level when it begins, which is
	// now at the first execution.
	tx, err = db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelLinearizable})
	if err != nil {
		t.Fatal(err)
	}
	if err := insert(tx, 5); err == nil {
		t.Fatal("insert after a failed BEGIN: no error")
	}
	if err := insert(tx, 6); err == nil {
		t.Fatal("second insert after a failed BEGIN: no error")
	}
	if err := tx.Commit(); err == nil {
		t.Fatal("commit after a failed BEGIN: no error")
	}
	if n := count(); n != 1 {
		t.Fatalf("after a failed BEGIN: %d rows, want 1 (a statement ran outside the transaction)", n)
	}

	// Another isolation level is begun explicitly, and ends as any other.
	tx, err = db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		t.Fatal(err)
	}
	if err := insert(tx, 7); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 2 {
		t.Fatalf("after a read-committed transaction: %d rows, want 2", n)
	}
	ended("after a read-committed transaction")

	_, err = db.ExecContext(ctx, "INSERT INTO t (v) VALUES (?)", 8)
	switch {
	case implicit && err == nil:
		t.Fatal("a statement outside a transaction ran on a session with autocommit off")
	case !implicit && err != nil:
		t.Fatal(err)
	}
	ended("after a statement outside a transaction")
}

// TestWriteTransactionsBeginWithTheirFirstStatement: on MariaDB, Open's
// driver sends no START TRANSACTION for its own write transactions: a
// lone publish is its statements and a COMMIT.
func TestWriteTransactionsBeginWithTheirFirstStatement(t *testing.T) {
	ctx := context.Background()
	d, err := mysqldriver.Open(testdb.MySQLDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, err := d.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	pool, err := d.WriteDB(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if pool == d.DB() {
		t.Fatal("write transactions begin on DB(), not on a pool of their own")
	}
	pool.SetMaxOpenConns(1) // one session to count on
	const n = 20
	for i := range n {
		if _, err := drivertest.Insert(ctx, d, driver.InsertMessage{Tenant: "t", Topic: "x", PartitionKey: fmt.Sprint(i % 3), ID: fmt.Sprint(i)}); err != nil {
			t.Fatal(err)
		}
	}
	status := func(tx *sql.Tx, name string) int {
		t.Helper()
		var v int
		if err := tx.QueryRowContext(ctx, "SHOW SESSION STATUS LIKE '"+name+"'").Scan(new(string), &v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	wtx, err := d.BeginWrite(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tx := wtx.(*sql.Tx)
	begins, commits := status(tx, "Com_begin"), status(tx, "Com_commit")
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if begins != 0 || commits < n {
		t.Fatalf("after %d publishes the session counted %d BEGINs and %d COMMITs; want 0 and at least %d", n, begins, commits, n)
	}
	if _, err := pool.ExecContext(ctx, "DELETE FROM queue_messages"); !errors.Is(err, mysqldriver.ErrOutsideTx) {
		t.Fatalf("a statement outside a transaction on the write-transaction pool: %v", err)
	}
}
