// SPDX-License-Identifier: Apache-2.0

package mysqldriver_test

import (
	"context"
	"database/sql"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/driver/drivertest"
	"github.com/shardq/shardq/driver/mysqldriver"
	"github.com/shardq/shardq/internal/sqlrecord"
	"github.com/shardq/shardq/internal/testdb"
)

var (
	touchesQueueTable = regexp.MustCompile(`\bqueue_[a-z_]+\b`)
	// A WHERE clause that names the tenant by equality or an explicit list.
	tenantWhere = regexp.MustCompile(`(?i)\bWHERE\b.*\b(p\.)?tenant\s*(=\s*\?|IN\s*\()`)
	// An INSERT routes by the tenant value of each row.
	tenantInsert = regexp.MustCompile(`(?i)^\s*INSERT INTO queue_[a-z_]+ \(tenant,`)
)

// recordingPool is a pool on dsn (parameters bound on the server, as Open
// sets it) that reports every statement it runs to record; it is closed
// when t ends.
func recordingPool(t *testing.T, dsn string, record func(string)) *sql.DB {
	t.Helper()
	db := sql.OpenDB(sqlrecord.Connector(testdb.MySQLConnector(t, dsn, false), record))
	t.Cleanup(func() { db.Close() })
	return db
}

// TestHotPathNamesTenant is invariant 7 of docs/design.md: every statement the driver
// sends to a queue table names its tenant by equality or an explicit IN list
// (or, for an INSERT, carries it as a column), so Vitess routes it to one
// shard or to the shards of that list. It records the SQL really sent while
// a workload runs.
func TestHotPathNamesTenant(t *testing.T) {
	ctx := context.Background()
	var mu sync.Mutex
	var recording bool
	var statements []string
	db := recordingPool(t, testdb.MySQLDatabase(t), func(q string) {
		mu.Lock()
		defer mu.Unlock()
		if recording {
			statements = append(statements, q)
		}
	})
	d, err := mysqldriver.New(db)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Migrate(ctx); err != nil { // DDL is not the hot path
		t.Fatal(err)
	}
	mu.Lock()
	recording = true
	mu.Unlock()

	if _, err := d.TenantSettings(ctx, []string{"a"}); err != nil { // a client reads a tenant's settings before it publishes
		t.Fatal(err)
	}
	var batch []driver.InsertMessage
	for i := range 20 {
		batch = append(batch, driver.InsertMessage{Tenant: "a", Topic: []string{"x", "y"}[i%2], PartitionKey: string(rune('k' + i%3))})
	}
	if _, err := drivertest.Insert(ctx, d, batch...); err != nil {
		t.Fatal(err)
	}
	if _, err := drivertest.Insert(ctx, d, batch[0]); err != nil { // a duplicate
		t.Fatal(err)
	}
	tx, err := d.BeginWrite(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.InsertMessages(ctx, driver.PreparedTx(tx.(*sql.Tx)), drivertest.Rows(driver.InsertMessage{Tenant: "a", Topic: "x"}, driver.InsertMessage{Tenant: "b", Topic: "x"})); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if _, err := d.FetchAfter(ctx, driver.TopicPartition{Tenant: "a", Topic: "x", PartitionKey: "k"}, 0, 10); err != nil {
		t.Fatal(err)
	}
	if _, err := d.PartitionsWithWork(ctx, driver.GroupScope{Tenants: []string{"a", "b"}, Topic: "x", ConsumerGroup: "g"}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.PartitionHeads(ctx, []string{"a"}, "x"); err != nil {
		t.Fatal(err)
	}
	if _, err := d.HeadsOf(ctx, "x", []string{"a"}, []string{"k", "l"}); err != nil {
		t.Fatal(err)
	}
	if err := d.ResetOffset(ctx, driver.PartitionRef{Tenant: "a", Topic: "x", PartitionKey: "k", ConsumerGroup: "g"}, 1); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	l, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: driver.PartitionRef{Tenant: "a", ConsumerGroup: "g", Topic: "x", PartitionKey: "k"}, Owner: "s", Now: now, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if l, err = d.RenewLease(ctx, l, now, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, _, err := d.RenewLeases(ctx, []driver.Lease{l}, now, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := d.CommitOffset(ctx, l, 2, now); err != nil {
		t.Fatal(err)
	}
	if err := d.RecordAttempt(ctx, driver.RecordAttemptParams{Lease: l, Offset: 3, State: driver.DeliveryState{Attempts: 1, NextAttemptAt: now}, Now: now}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.DeliveryStates(ctx, l.PartitionRef, 2, 3); err != nil {
		t.Fatal(err)
	}
	if err := d.DeadLetter(ctx, driver.DeadLetterParams{Lease: l, Copy: &driver.InsertMessage{Tenant: "a", Topic: "x.dlq", PartitionKey: "k", ID: "d", CreatedAt: now}, Offset: 3, Now: now}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.ListLeases(ctx, driver.GroupScope{Tenants: []string{"a"}, Topic: "x", ConsumerGroup: "g"}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.GroupState(ctx, l); err != nil {
		t.Fatal(err)
	}
	if err := d.SetGroupState(ctx, l, []byte("s"), now); err != nil {
		t.Fatal(err)
	}
	if err := d.ReleaseLease(ctx, l, now); err != nil {
		t.Fatal(err)
	}
	if _, err := d.ReadyGroups(ctx, driver.GroupScope{Tenants: []string{"a", "b"}, Topic: "x", ConsumerGroup: "g"}, now, 10); err != nil {
		t.Fatal(err)
	}
	var ungrouped []driver.InsertMessage
	for range 3 {
		ungrouped = append(ungrouped, driver.InsertMessage{Tenant: "a", Topic: "u"})
	}
	if _, err := drivertest.Insert(ctx, d, ungrouped...); err != nil {
		t.Fatal(err)
	}
	claims, _, err := d.ClaimMessages(ctx, driver.ClaimMessagesParams{Group: driver.GroupRef{Tenant: "a", Topic: "u", ConsumerGroup: "g"}, Owner: "s", Now: now, Visibility: time.Minute, Limit: driver.ClaimLimit{Messages: 10}})
	if err != nil || len(claims) != 3 {
		t.Fatalf("claimed %d ungrouped messages, %v", len(claims), err)
	}
	if err := d.AckClaims(ctx, claims[:1], now); err != nil {
		t.Fatal(err)
	}
	if err := d.RetryClaim(ctx, driver.RetryClaimParams{Claim: claims[1], RetryAt: now, LastError: "later", Now: now}); err != nil {
		t.Fatal(err)
	}
	if err := d.DeadLetterClaim(ctx, claims[2], &driver.InsertMessage{Tenant: "a", Topic: "u.dlq", ID: "d", CreatedAt: now}, now); err != nil {
		t.Fatal(err)
	}
	if _, err := d.AdvanceUngrouped(ctx, driver.GroupRef{Tenant: "a", Topic: "u", ConsumerGroup: "g"}, now); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"h1", "h2", "h3", "h4"} {
		h := &driver.HalfMessage{InsertMessage: driver.InsertMessage{Tenant: "a", Topic: "x", PartitionKey: "k", ID: id, CreatedAt: now},
			ProducerGroup: "pg", NextCheckAt: now}
		if err := d.InsertHalf(ctx, h); err != nil {
			t.Fatal(err)
		}
	}
	claimed, err := d.ClaimDueHalves(ctx, driver.HalfClaimRequest{Tenants: []string{"a", "b"}, ProducerGroup: "pg", Owner: "p", Now: now, ClaimTTL: time.Minute, Limit: 10})
	if err != nil || len(claimed) != 4 {
		t.Fatalf("claimed %d, %v", len(claimed), err)
	}
	if err := d.CommitHalves(ctx, []*driver.HalfCommit{{Ref: claimed[0].Ref(), ClaimToken: claimed[0].ClaimToken}}); err != nil {
		t.Fatal(err)
	}
	if err := d.RollbackHalf(ctx, claimed[1].Ref(), claimed[1].ClaimToken); err != nil {
		t.Fatal(err)
	}
	if err := d.RescheduleHalf(ctx, claimed[2], now); err != nil {
		t.Fatal(err)
	}
	if err := d.DeadLetterHalf(ctx, claimed[3], now); err != nil {
		t.Fatal(err)
	}
	if _, err := d.ListHalves(ctx, driver.Scope{Tenants: []string{"a"}}); err != nil { // --all-tenants is an operator's explicit fleet-wide read
		t.Fatal(err)
	}
	if _, err := d.SweepLeases(ctx, driver.SweepLeasesParams{Group: driver.GroupScope{Tenants: []string{"a", "b"}, Topic: "x", ConsumerGroup: "g"}, Owners: []string{"dead"}, StaleBefore: now, Now: now}); err != nil {
		t.Fatal(err)
	}
	if err := d.Heartbeat(ctx, driver.GroupScope{Tenants: []string{"a", "b"}, Topic: "x", ConsumerGroup: "g"}, "s", now); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Subscribers(ctx, driver.GroupScope{Tenants: []string{"a", "b"}, Topic: "x", ConsumerGroup: "g"}); err != nil {
		t.Fatal(err)
	}
	if err := d.RemoveHeartbeat(ctx, driver.GroupScope{Tenants: []string{"a", "b"}, Topic: "x", ConsumerGroup: "g"}, "s"); err != nil {
		t.Fatal(err)
	}

	mu.Lock()
	defer mu.Unlock()
	checked := 0
	for _, q := range statements {
		if !touchesQueueTable.MatchString(q) {
			continue
		}
		checked++
		flat := strings.Join(strings.Fields(q), " ")
		if !tenantWhere.MatchString(flat) && !tenantInsert.MatchString(flat) {
			t.Errorf("statement does not name its tenant:\n%s", flat)
		}
	}
	if checked < 20 {
		t.Fatalf("only %d queue statements recorded; the workload did not run", checked)
	}
}
