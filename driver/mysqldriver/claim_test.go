// SPDX-License-Identifier: Apache-2.0

package mysqldriver_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/driver/drivertest"
	"github.com/shardq/shardq/driver/mysqldriver"
	"github.com/shardq/shardq/internal/sqlrecord"
	"github.com/shardq/shardq/internal/testdb"
)

// TestClaimHidesNothingCommittedMeanwhile: under REPEATABLE READ (InnoDB's
// default), a claim transaction's plain reads see the snapshot of its
// first one, taken after the claim mark's lock. A message committed after
// that, just before the transaction reads the messages above the mark, is
// not this claim's: the mark stays below it, and the next claim takes it.
// Had the claim locked it, or moved the mark past what it read, it would
// stay hidden (for a visibility timeout, or for ever).
func TestClaimHidesNothingCommittedMeanwhile(t *testing.T) {
	ctx := context.Background()
	dsn := testdb.MySQLDatabase(t)
	publisher, err := mysqldriver.Open(dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer publisher.Close()
	if _, err := publisher.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	publish := func(id string) {
		tx, err := publisher.BeginWrite(ctx)
		if err != nil {
			t.Error(err)
			return
		}
		if err := publisher.InsertMessages(ctx, tx, []*driver.InsertMessage{{Tenant: "t", Topic: "x", ID: id, Payload: []byte(id),
			CreatedAt: time.Now()}}); err != nil {
			tx.Rollback()
			t.Error(err)
			return
		}
		if err := tx.Commit(); err != nil {
			t.Error(err)
		}
	}

	var mu sync.Mutex
	armed := false
	db := recordingPool(t, dsn, func(q string) {
		mu.Lock()
		fire := armed && strings.Contains(q, "FROM queue_messages") && strings.Contains(q, "ORDER BY `offset` LIMIT")
		if fire {
			armed = false
		}
		mu.Unlock()
		if fire {
			publish("late") // commits on another connection, inside the claim's window
		}
	})
	claimer, err := mysqldriver.New(db)
	if err != nil {
		t.Fatal(err)
	}
	publish("early")
	mu.Lock()
	armed = true
	mu.Unlock()
	now := time.Now()
	claims, _, err := claimer.ClaimMessages(ctx, driver.ClaimMessagesParams{Group: driver.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, Owner: "m#1", Now: now, Visibility: time.Minute, Limit: driver.ClaimLimit{Messages: 10}})
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	fired := !armed
	mu.Unlock()
	if !fired {
		t.Fatal("the claim sent no read of the messages above its mark: the test did not reach its window")
	}
	next, _, err := claimer.ClaimMessages(ctx, driver.ClaimMessagesParams{Group: driver.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, Owner: "m#2", Now: now, Visibility: time.Minute, Limit: driver.ClaimLimit{Messages: 10}})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, c := range append(claims, next...) {
		ids = append(ids, c.Message.ID)
	}
	if len(ids) != 2 || ids[0] != "early" || ids[1] != "late" {
		t.Fatalf("two claims took %v, want [early late]: a message committed during a claim was hidden", ids)
	}
}

// TestIdleAdvanceOpensNoTransaction: advancing the ungrouped cursor when it
// cannot move (nothing new, or its next message still claimed) reads and
// writes nothing in a transaction; members call it every
// DiscoveryInterval.
func TestIdleAdvanceOpensNoTransaction(t *testing.T) {
	ctx := context.Background()
	dsn := testdb.MySQLDatabase(t)
	var begins atomic.Int64
	db := sql.OpenDB(sqlrecord.New(testdb.MySQLConnector(t, dsn, false), sqlrecord.Hooks{Begin: func() { begins.Add(1) }}))
	defer db.Close()
	d, err := mysqldriver.New(db)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	publish := func(ids ...string) {
		t.Helper()
		tx, err := d.BeginWrite(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var ms []*driver.InsertMessage
		for _, id := range ids {
			ms = append(ms, &driver.InsertMessage{Tenant: "t", Topic: "x", ID: id, CreatedAt: now})
		}
		if err := d.InsertMessages(ctx, tx, ms); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	advance := func(wantCursor, wantBegins int64) {
		t.Helper()
		before := begins.Load()
		cur, err := d.AdvanceUngrouped(ctx, driver.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, now)
		if err != nil {
			t.Fatal(err)
		}
		if cur != wantCursor || begins.Load()-before != wantBegins {
			t.Fatalf("advance: cursor %d with %d transactions, want %d with %d", cur, begins.Load()-before, wantCursor, wantBegins)
		}
	}
	publish("a", "b")
	claims, _, err := d.ClaimMessages(ctx, driver.ClaimMessagesParams{Group: driver.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, Owner: "m#1", Now: now, Visibility: time.Minute, Limit: driver.ClaimLimit{Messages: 10}})
	if err != nil || len(claims) != 2 {
		t.Fatalf("claim: %v, %v", claims, err)
	}
	advance(0, 0) // both in handlers
	if err := d.AckClaims(ctx, claims, now); err != nil {
		t.Fatal(err)
	}
	advance(2, 1) // it moves: one transaction
	advance(2, 0) // nothing new
	advance(2, 0)
	publish("c")
	c, _, err := d.ClaimMessages(ctx, driver.ClaimMessagesParams{Group: driver.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, Owner: "m#1", Now: now, Visibility: time.Minute, Limit: driver.ClaimLimit{Messages: 10}})
	if err != nil || len(c) != 1 {
		t.Fatalf("claim: %v, %v", c, err)
	}
	advance(2, 0) // c in a handler
	if err := d.AckClaims(ctx, c, now); err != nil {
		t.Fatal(err)
	}
	advance(3, 1)
}

// TestStatementsPreparedOnce: with parameters bound on the server, each
// statement text is prepared once per connection and then reused, so a
// publish costs one round trip a statement, as interpolation did. A pool
// of one connection makes the count exact.
func TestStatementsPreparedOnce(t *testing.T) {
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
	publish := func(i int) {
		t.Helper()
		if _, err := drivertest.Insert(ctx, d, driver.InsertMessage{Tenant: "t", Topic: "x", PartitionKey: "k", ID: fmt.Sprint(i)}); err != nil {
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
