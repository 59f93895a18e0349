// SPDX-License-Identifier: Apache-2.0

package sqlitedriver_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/driver/sqlitedriver"
)

// TestIdleAdvanceOpensNoTransaction: advancing the ungrouped cursor when it
// cannot move (nothing new, or its next message still claimed) takes no
// write lock. Another process holds the file's write lock meanwhile; a
// write transaction would fail as busy.
func TestIdleAdvanceOpensNoTransaction(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "shardq.db")
	d, err := sqlitedriver.Open(path, &sqlitedriver.Options{BusyTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, err := d.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	other, err := sqlitedriver.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	now := time.Now()
	publish := func(id string) {
		t.Helper()
		tx, err := d.BeginWrite(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := d.InsertMessages(ctx, tx, []*driver.InsertMessage{{Tenant: "t", Topic: "x", ID: id, CreatedAt: now}}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	// advanceWhileLocked advances while other holds the write lock.
	advanceWhileLocked := func(want int64) {
		t.Helper()
		lock, err := other.BeginWrite(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer lock.Rollback()
		cur, err := d.AdvanceUngrouped(ctx, driver.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, now)
		if err != nil || cur != want {
			t.Fatalf("advance under another writer: cursor %d, %v; want %d without a write transaction", cur, err, want)
		}
	}
	publish("a")
	claims, _, err := d.ClaimMessages(ctx, driver.ClaimMessagesParams{Group: driver.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, Owner: "m#1", Now: now, Visibility: time.Minute, Limit: driver.ClaimLimit{Messages: 10}})
	if err != nil || len(claims) != 1 {
		t.Fatalf("claim: %v, %v", claims, err)
	}
	advanceWhileLocked(0) // a in a handler
	if err := d.AckClaims(ctx, claims, now); err != nil {
		t.Fatal(err)
	}
	if cur, err := d.AdvanceUngrouped(ctx, driver.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, now); err != nil || cur != 1 {
		t.Fatalf("advance: %d, %v", cur, err)
	}
	advanceWhileLocked(1) // nothing new
}
