// SPDX-License-Identifier: Apache-2.0

package mysqltest

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver/mysqldriver"
	"github.com/shardq/shardq/internal/sqlrecord"
	"github.com/shardq/shardq/internal/testdb"
)

// A client's publish, once its partition's statements are prepared, runs
// two statements and prepares none: the tenant's settings are cached and
// no clock is read (driver/mysqldriver's TestStatementsPreparedOnce
// counts the driver's own insert).
func TestClientPublishStatementsPreparedOnce(t *testing.T) {
	ctx := context.Background()
	dsn := testdb.MySQLDatabase(t)
	var prepares, runs atomic.Int64
	db := sql.OpenDB(sqlrecord.New(testdb.MySQLConnector(t, dsn, false), sqlrecord.Hooks{
		Prepare:   func(string) { prepares.Add(1) },
		Statement: func(string) { runs.Add(1) },
	}))
	defer db.Close()
	db.SetMaxOpenConns(1)
	d, err := mysqldriver.New(db)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	c, err := shardq.NewClient(d, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	publish := func(i int) {
		t.Helper()
		if _, err := c.Publish(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: fmt.Sprint(i)}); err != nil {
			t.Fatal(err)
		}
	}
	publish(0) // prepares what the first publish of a partition runs
	publish(1) // the next ones lock the head in the insert: that is prepared here
	publish(2) // prepared by now: cached statements, then bound to the transaction
	p0, r0 := prepares.Load(), runs.Load()
	for i := 3; i < 53; i++ {
		publish(i)
	}
	if p, r := prepares.Load()-p0, runs.Load()-r0; p != 0 || r != 50*2 {
		t.Fatalf("50 publishes prepared %d statements and ran %d; want 0 and 100 (lock heads and insert, advance heads each)", p, r)
	}
}

// A client's PublishTx in the caller's own transaction, on a driver that
// has not connected yet, reads the server's settings and the clock on the
// driver's pool, never inside the caller's transaction (where, through
// vtgate, such a read was seen to hang while holding head-row locks).
func TestClientColdPublishTxReadsNoSettingInCallersTx(t *testing.T) {
	dsn := testdb.MySQLDatabase(t)
	ctx := context.Background()
	open := func() *mysqldriver.Driver {
		d, err := mysqldriver.Open(dsn)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	testdb.Migrated(t, open()).Close()

	var mu sync.Mutex
	var callers []string
	own := sql.OpenDB(sqlrecord.Connector(testdb.MySQLConnector(t, dsn, false), func(q string) { mu.Lock(); callers = append(callers, q); mu.Unlock() }))
	defer own.Close()

	cold := open() // no connection yet: nothing read
	defer cold.Close()
	c, err := shardq.NewClient(cold, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tx, err := own.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.PublishTx(ctx, tx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k"}, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k"})
	if err != nil {
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
