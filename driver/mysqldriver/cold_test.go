// SPDX-License-Identifier: Apache-2.0

package mysqldriver_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/driver/drivertest"
	"github.com/shardq/shardq/driver/mysqldriver"
	"github.com/shardq/shardq/internal/testdb"
)

// An insert in the caller's own transaction (PublishTx's) on a driver that
// has not connected yet reads the server's settings on the driver's pool,
// never inside the caller's transaction (where, through vtgate, such a
// read was seen to hang while holding head-row locks).
func TestColdPublishTxReadsNoSettingInCallersTx(t *testing.T) {
	dsn := testdb.MySQLDatabase(t)
	ctx := context.Background()
	migrated := testdb.Migrated(t, mustOpen(t, dsn))
	migrated.Close()

	var mu sync.Mutex
	var callers []string
	own := recordingPool(t, dsn, func(q string) { mu.Lock(); callers = append(callers, q); mu.Unlock() })

	cold := mustOpen(t, dsn) // no connection yet: nothing read
	defer cold.Close()
	tx, err := own.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	res := drivertest.Rows(driver.InsertMessage{Tenant: "t", Topic: "x", PartitionKey: "k"}, driver.InsertMessage{Tenant: "t", Topic: "x", PartitionKey: "k"})
	if err := cold.InsertMessages(ctx, driver.PreparedTx(tx), res); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if len(res) != 2 || res[1].Offset <= res[0].Offset {
		t.Fatalf("offsets %+v", res)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, q := range callers {
		if strings.Contains(q, "@@") {
			t.Fatalf("the caller's transaction ran %q", q)
		}
	}
	if len(callers) == 0 {
		t.Fatal("nothing recorded on the caller's pool")
	}
}

func mustOpen(t *testing.T, dsn string) *mysqldriver.Driver {
	t.Helper()
	d, err := mysqldriver.Open(dsn)
	if err != nil {
		t.Fatal(err)
	}
	return d
}
