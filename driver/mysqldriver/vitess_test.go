// SPDX-License-Identifier: Apache-2.0

package mysqldriver_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/driver/drivertest"
	"github.com/shardq/shardq/driver/mysqldriver"
	"github.com/shardq/shardq/internal/sqlrecord"
	"github.com/shardq/shardq/internal/testdb"
)

// openRecordedBy is testdb.Vitess with record called on every statement
// the driver sends: connections as Open makes them through vtgate
// (transactions begun at their first execution) under a recorder.
func openRecordedBy(t *testing.T, record func(string)) *mysqldriver.Driver {
	testdb.Vitess(t) // a clean keyspace (or a skip/fail with the reason)
	return openRecordedOn(t, testdb.VitessDSN(), record)
}

// openRecordedOn is openRecordedBy on the keyspace of dsn, cleaned by the
// caller.
func openRecordedOn(t *testing.T, dsn string, record func(string)) *mysqldriver.Driver {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	inner, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(sqlrecord.Connector(mysqldriver.VTGateConnector(inner), record))
	t.Cleanup(func() { db.Close() })
	d, err := mysqldriver.New(db)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestVitess runs the driver's conformance suite (drivertest) through
// vtgate: one keyspace of two shards, sharded by tenant (vschema.json). It
// records every statement the driver sends meanwhile, and then proves the
// routing (the client's suite proves its own: internal/conformance).
func TestVitess(t *testing.T) {
	var log testdb.StatementLog
	t.Run("Conformance", func(t *testing.T) {
		drivertest.RunParallel(t, func(t *testing.T) driver.Driver {
			_, dsn := testdb.VitessIn(t) // a clean keyspace of t's own
			return openRecordedOn(t, dsn, log.Record)
		}, func(t *testing.T) driver.Driver {
			_, dsn := testdb.VitessMigrated(t) // migrated, no rows
			return openRecordedOn(t, dsn, log.Record)
		})
	})
	// The suite sends about 139 distinct statements that route by tenant (IN
	// lists vary with timing); a floor near that
	// catches a recording that lost most of them.
	t.Run("RoutingProof", func(t *testing.T) { testdb.RoutingProof(t, log.All(), 110) })
}

// onShard opens vtgate targeted at one shard of the keyspace.
func onShard(t *testing.T, shard string) *sql.DB { return testdb.VitessShard(t, shard) }

// vitessOnBothShards migrates a clean keyspace and places 8 tenants,
// failing unless each shard holds one.
func vitessOnBothShards(t *testing.T) (*mysqldriver.Driver, map[string][]string) {
	t.Helper()
	d := testdb.Vitess(t)
	if _, err := d.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	placed := testdb.VitessTenantsByShard(t, 8, func(tenant string) error {
		_, err := drivertest.Insert(context.Background(), d, driver.InsertMessage{Tenant: tenant, Topic: "x", PartitionKey: "k", ID: "probe"})
		return err
	})
	if len(placed["-80"]) == 0 || len(placed["80-"]) == 0 {
		t.Fatalf("placement %v: want a tenant on each shard", placed)
	}
	return d, placed
}

// A member's heartbeat rows are written, refreshed and removed in one
// statement however many tenants it serves, through vtgate too (each
// shard's part committed on its own, so they need not go tenant by
// tenant as locks in a transaction do): a member's idle cost does not
// grow with its tenants.
func TestVitessHeartbeatsOneStatementOverShards(t *testing.T) {
	var mu sync.Mutex
	var beats []string
	d := openRecordedBy(t, func(q string) {
		if strings.Contains(q, "queue_subscriber_heartbeats") {
			mu.Lock()
			beats = append(beats, q)
			mu.Unlock()
		}
	})
	if _, err := d.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, now := context.Background(), time.Now()
	var tenants []string
	for i := range 8 {
		tenants = append(tenants, fmt.Sprintf("t%02d", i))
	}
	g := driver.GroupScope{Tenants: tenants, ConsumerGroup: "g", Topic: "x"}
	count := func(what string, call func() error) {
		t.Helper()
		mu.Lock()
		beats = nil
		mu.Unlock()
		if err := call(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(beats) != 1 {
			t.Errorf("%s over %d tenants: %d statements, want 1: %q", what, len(tenants), len(beats), beats)
		}
	}
	count("heartbeat", func() error { return d.Heartbeat(ctx, g, "m", now) })
	for _, shard := range []string{"-80", "80-"} {
		var n int
		if err := testdb.VitessShard(t, shard).QueryRowContext(ctx, "SELECT COUNT(*) FROM queue_subscriber_heartbeats").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			t.Fatalf("shard %s holds no heartbeat row: the tenants must span both shards", shard)
		}
	}
	count("refresh", func() error {
		n, err := d.RefreshHeartbeat(ctx, g, "m", now.Add(time.Second))
		if err == nil && n != int64(len(tenants)) {
			err = fmt.Errorf("refreshed %d rows, want %d", n, len(tenants))
		}
		return err
	})
	count("remove", func() error { return d.RemoveHeartbeat(ctx, g, "m") })
	subs, err := d.Subscribers(ctx, g)
	if err != nil || len(subs) != 0 {
		t.Fatalf("after the remove: %v, %v; want none", subs, err)
	}
}

// A transaction that locks rows of two shards takes them tenant after
// tenant. A renewal of one member's leases on both shards, racing a
// commit that holds the first tenant's lease and then needs the second's,
// waits on the first and lets the commit finish. In one statement over
// both shards the renewal held the second shard's row while it waited on
// the first, the commit waited on it, and neither shard's database saw
// the cycle: both waited out the lock wait timeout (found by the chaos
// runner, docs/chaos.md).
func TestVitessCrossShardLocksTakenInOrder(t *testing.T) {
	d, placed := vitessOnBothShards(t)
	ctx := context.Background()
	first, second, firstShard := placed["-80"][0], placed["80-"][0], "-80"
	if second < first {
		first, second, firstShard = second, first, "80-"
	}
	now := time.Now()
	lease := func(tenant string) driver.Lease {
		l, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: driver.PartitionRef{Tenant: tenant, ConsumerGroup: "g", Topic: "x", PartitionKey: "k"}, Owner: "m", Now: now, TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	l1, l2 := lease(first), lease(second)

	tx, err := d.BeginWrite(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if err := d.InTx(tx).CommitOffset(ctx, l1, 1, now); err != nil {
		t.Fatal(err)
	}
	type renewal struct {
		renewed, lost []driver.Lease
		err           error
	}
	done := make(chan renewal, 1)
	go func() {
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		r, l, err := d.RenewLeases(rctx, []driver.Lease{l1, l2}, now, time.Minute)
		done <- renewal{r, l, err}
	}()
	// The renewal waits on the first tenant's row before the commit goes on.
	shard := onShard(t, firstShard)
	for deadline := time.Now().Add(20 * time.Second); ; {
		var waiting int
		// The shard's mysqld serves every keyspace of the test Vitess, which
		// other test processes use meanwhile: only this keyspace's count.
		if err := shard.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.processlist WHERE info LIKE 'update queue_partition_leases set expires_at%' AND db = ?",
			"vt_"+testdb.VitessKeyspace()+"_"+firstShard).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting > 0 {
			break
		}
		select {
		case r := <-done:
			t.Fatalf("the renewal did not wait for the commit's lock: renewed %v, lost %v, err %v", r.renewed, r.lost, r.err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the renewal never waited on the first tenant's lease")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := d.InTx(tx).CommitOffset(cctx, l2, 1, now); err != nil {
		t.Fatalf("the commit could not lock the second tenant's lease (the renewal holds it while it waits on the first): %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || len(r.renewed) != 2 || len(r.lost) != 0 {
		t.Fatalf("renewal after the commit: renewed %v, lost %v, err %v", r.renewed, r.lost, r.err)
	}
}

// TestVitessTransactionsStayOnTheirTenantsShard begins transactions whose
// first statement is a prepared SELECT … FOR UPDATE (the lease fence), each
// on a new connection, which has not prepared it, under vtgate's
// transaction_mode=SINGLE (which refuses a transaction over two shards),
// for tenants on both shards. vtgate runs a prepare's field query on any
// shard of a transaction that has touched none: with the BEGIN sent
// before that prepare, about half these transactions would span two
// shards.
func TestVitessTransactionsStayOnTheirTenantsShard(t *testing.T) {
	d, placed := vitessOnBothShards(t)
	ctx := context.Background()
	now := time.Now()
	var leases []driver.Lease
	for _, tenant := range []string{placed["-80"][0], placed["80-"][0]} {
		l, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: driver.PartitionRef{Tenant: tenant, ConsumerGroup: "g", Topic: "x", PartitionKey: "k"}, Owner: "m", Now: now, TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
	}
	d.DB().SetMaxIdleConns(0) // a connection closed goes: each Conn below is new
	for i := range 16 {
		l := leases[i%2]
		err := func() error {
			conn, err := d.DB().Conn(ctx)
			if err != nil {
				return err
			}
			defer conn.Close()
			if _, err := conn.ExecContext(ctx, "SET transaction_mode = 'single'"); err != nil {
				return err
			}
			tx, err := conn.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			defer tx.Rollback()
			if err := d.InTx(tx).CommitOffset(ctx, l, int64(i+1), now); err != nil {
				return err
			}
			return tx.Commit()
		}()
		if err != nil {
			t.Fatalf("transaction %d (tenant %s): %v", i, l.Tenant, err)
		}
	}
}
