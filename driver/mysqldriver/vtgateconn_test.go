// SPDX-License-Identifier: Apache-2.0

package mysqldriver_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/shardq/shardq/driver/mysqldriver"
	"github.com/shardq/shardq/internal/testdb"
)

// TestVTGateConnTransactions checks, on MariaDB, that a transaction whose
// BEGIN waits for its first execution is still one transaction: its
// statements commit or roll back together, one that ran nothing ends
// cleanly, and when the BEGIN fails no statement of it runs on its own.
func TestVTGateConnTransactions(t *testing.T) {
	db := sql.OpenDB(mysqldriver.VTGateConnector(testdb.MySQLConnector(t, testdb.MySQLDatabase(t), false)))
	defer db.Close()
	db.SetMaxOpenConns(1) // every step below on the one connection
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, "CREATE TABLE t (v INT PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	count := func() int {
		t.Helper()
		var n int
		if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM t").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	insert := func(tx *sql.Tx, v int) error {
		_, err := tx.ExecContext(ctx, "INSERT INTO t (v) VALUES (?)", v)
		return err
	}

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := insert(tx, 1); err != nil {
		t.Fatal(err)
	}
	if err := insert(tx, 2); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 0 {
		t.Fatalf("after a rollback: %d rows, want 0", n)
	}

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
}
