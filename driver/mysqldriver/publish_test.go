// SPDX-License-Identifier: Apache-2.0

package mysqldriver_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/driver/mysqldriver"
	"github.com/shardq/shardq/internal/testdb"
)

// TestLonePublishWaitsForTheHeadLock: a transaction that writes one
// message takes its partition's head-row lock in the statement that draws
// its offset. A second lone publish of the partition must wait for the
// first's commit before it draws its own, so that offsets become visible
// in increasing order (invariant 2); without the lock it would draw a
// higher offset and could commit first, and a reader's cursor would pass
// the first message before it is visible. The server runs READ COMMITTED,
// as many are set to, where an INSERT ... SELECT locks nothing it does not
// ask to lock. The wait is observed on the server, not timed.
func TestLonePublishWaitsForTheHeadLock(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dsn := testdb.MySQLDatabase(t)
	d, err := mysqldriver.Open(dsn + "?tx_isolation=%27READ-COMMITTED%27")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, err := d.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	msg := func(id string) *driver.InsertMessage {
		return &driver.InsertMessage{Tenant: "t", Topic: "x", PartitionKey: "k", ID: id, Payload: []byte(id), CreatedAt: time.Now()}
	}
	var isolation string
	if err := d.DB().QueryRowContext(ctx, "SELECT @@tx_isolation").Scan(&isolation); err != nil || isolation != "READ-COMMITTED" {
		t.Fatalf("the session's isolation: %q, %v", isolation, err)
	}
	publish := func(m *driver.InsertMessage) (driver.Tx, error) {
		tx, err := d.BeginWrite(ctx)
		if err != nil {
			return nil, err
		}
		// Publish's transactions: run again on a deadlock.
		if err := d.InsertMessages(driver.Rerunnable(ctx), tx, []*driver.InsertMessage{m}); err != nil {
			tx.Rollback()
			return nil, err
		}
		return tx, nil
	}
	// The head row exists and this driver locked it, so that both
	// publishes below take the one-statement path.
	tx, err := publish(msg("first"))
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}

	first := msg("a")
	txA, err := publish(first)
	if err != nil {
		t.Fatal(err)
	}
	second := msg("b")
	done := make(chan error, 1)
	go func() {
		tx, err := publish(second)
		if err == nil {
			err = tx.Commit()
		}
		done <- err
	}()
	// The server is watched on a pool of its own: the driver's may have
	// no connection to spare while both transactions hold one.
	watch := sql.OpenDB(testdb.MySQLConnector(t, dsn, false))
	defer watch.Close()
	waitForLockWait(ctx, t, watch, done)
	select {
	case err := <-done:
		t.Fatalf("the second publish finished (%v) while the first held its partition's head row", err)
	default:
	}
	if err := txA.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if second.Offset <= first.Offset {
		t.Fatalf("offsets %d then %d: the later commit holds the lower offset", first.Offset, second.Offset)
	}
}

// waitForLockWait returns once an INSERT into queue_messages has run on
// the server for 200 ms: it waits for a row lock, since one runs in
// milliseconds otherwise (and a lone publish that finished is reported
// through done). The wait happens while the statement reads the head row,
// before InnoDB lists its transaction, so the process list is watched.
func waitForLockWait(ctx context.Context, t *testing.T, db *sql.DB, done chan error) {
	t.Helper()
	for {
		var n int
		if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.PROCESSLIST "+
			"WHERE INFO LIKE 'INSERT INTO queue_messages %' AND TIME_MS >= 200 AND DB = DATABASE()").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		select {
		case err := <-done:
			t.Fatalf("the second publish finished (%v) while the first held its partition's head row", err)
		case <-ctx.Done():
			t.Fatal("no publish waited for the head row's lock")
		case <-time.After(5 * time.Millisecond):
		}
	}
}
