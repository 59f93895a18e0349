// SPDX-License-Identifier: Apache-2.0

package mysqldriver_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/driver/drivertest"
	"github.com/shardq/shardq/driver/mysqldriver"
	"github.com/shardq/shardq/internal/testdb"
)

// TestReadyGroupsProbesEachGroupOnce: listing the free groups reads one
// index entry per group for its next message, not every stored message of
// the group. MariaDB range-scans no key on a correlated subquery's outer
// reference, so a MIN over the messages after the cursor, written as one
// statement, read each group's retained messages (already consumed ones
// included) on every receive of the next group.
func TestReadyGroupsProbesEachGroupOnce(t *testing.T) {
	ctx := context.Background()
	d, err := mysqldriver.Open(testdb.MySQLDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, err := d.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	const groups, stored = 4, 500
	for k := range groups {
		batch := make([]driver.InsertMessage, stored)
		for i := range batch {
			batch[i] = driver.InsertMessage{Tenant: "t", Topic: "x", PartitionKey: fmt.Sprint("k", k), ID: fmt.Sprint(k, "-", i)}
		}
		res, err := drivertest.Insert(ctx, d, batch...)
		if err != nil {
			t.Fatal(err)
		}
		// The group consumed all but the last ten of the key.
		p := driver.PartitionRef{Tenant: "t", ConsumerGroup: "g", Topic: "x", PartitionKey: fmt.Sprint("k", k)}
		l, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: p, Owner: "m", Now: time.Now(), TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if err := d.CommitOffset(ctx, l, res[stored-11].Offset, time.Now()); err != nil {
			t.Fatal(err)
		}
		if err := d.ReleaseLease(ctx, l, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	d.DB().SetMaxOpenConns(1) // one session to count on
	reads := func() int {
		t.Helper()
		var v int
		if err := d.DB().QueryRowContext(ctx, "SHOW SESSION STATUS LIKE 'Handler_read_next'").Scan(new(string), &v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	before := reads()
	ready, err := d.ReadyGroups(ctx, driver.GroupScope{Tenants: []string{"t"}, Topic: "x", ConsumerGroup: "g"}, time.Now(), 10)
	if err != nil {
		t.Fatal(err)
	}
	read := reads() - before
	if len(ready) != groups {
		t.Fatalf("%d ready groups, want %d: %+v", len(ready), groups, ready)
	}
	if read > 10*groups {
		t.Fatalf("listing %d ready groups read %d index entries after their first (Handler_read_next); a probe each reads a few, a scan of each group's %d stored messages thousands",
			groups, read, stored)
	}
	t.Logf("%d ready groups: %d index entries read after their first", groups, read)
}
