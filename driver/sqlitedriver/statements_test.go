// SPDX-License-Identifier: Apache-2.0

package sqlitedriver_test

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/driver/drivertest"
	"github.com/shardq/shardq/driver/sqlitedriver"
)

// The driver prepares its statements once per pool and uses them in the
// transactions it begins. A caller's transaction on a pool of its own (the
// same file) never gets them: an insert there (PublishTx's) runs
// unprepared, and the driver's own transactions before and after keep
// theirs.
func TestPreparedStatementsStayWithTheirPool(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "shardq.db")
	d, err := sqlitedriver.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, err := d.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	own, err := sql.Open("sqlite", path+"?_txlock=immediate&_busy_timeout=10000")
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	for i := range 3 {
		if _, err := drivertest.Insert(ctx, d, driver.InsertMessage{Tenant: "t", Topic: "x", PartitionKey: "k", ID: fmt.Sprint("driver-", i)}); err != nil {
			t.Fatal(err)
		}
		tx, err := own.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		rows := drivertest.Rows(driver.InsertMessage{Tenant: "t", Topic: "x", PartitionKey: "k", ID: fmt.Sprint("caller-", i)})
		if err := d.InsertMessages(ctx, driver.PreparedTx(tx), rows); err != nil { // as PublishTx inserts
			tx.Rollback()
			t.Fatalf("an insert in the caller's own pool: %v", err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	msgs, err := d.FetchAfter(ctx, driver.TopicPartition{Tenant: "t", Topic: "x", PartitionKey: "k"}, 0, 10)
	if err != nil || len(msgs) != 6 {
		t.Fatalf("stored %d messages, want 6 (%v)", len(msgs), err)
	}
	for i, m := range msgs {
		want := fmt.Sprint([]string{"driver-", "caller-"}[i%2], i/2)
		if m.ID != want {
			t.Fatalf("message %d is %s, want %s", i, m.ID, want)
		}
	}
}
