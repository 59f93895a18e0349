// SPDX-License-Identifier: Apache-2.0

package mysqldriver_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/driver/drivertest"
	"github.com/shardq/shardq/driver/mysqldriver"
	"github.com/shardq/shardq/internal/testdb"
)

// feedEvents is a FeedSink that hands every event to the test.
type feedEvents = testdb.FeedEvents

// feedDriver is a driver on a migrated database; the test runs its feed
// itself.
func feedDriver(t *testing.T) *mysqldriver.Driver {
	t.Helper()
	return testdb.Migrated(t, testdb.MySQL(t))
}

// startFeed runs d's feed from (file, pos) until the test ends.
func startFeed(t *testing.T, d *mysqldriver.Driver, file string, pos uint32) feedEvents {
	t.Helper()
	events := make(feedEvents, 100)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mysqldriver.FeedFrom(ctx, d, events, file, pos) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("feed: %v", err)
		}
	})
	return events
}

// The feed names exactly the partitions a committed publish moved, with
// their new heads, once per transaction; a rolled-back one names nothing.
func TestFeedNamesCommittedHeads(t *testing.T) {
	ctx := context.Background()
	d := feedDriver(t)
	file, pos, err := mysqldriver.BinlogPosition(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	events := startFeed(t, d, file, pos)
	events.Next(t, "up")

	tx, err := d.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.InsertMessages(ctx, driver.PreparedTx(tx), drivertest.Rows(driver.InsertMessage{Tenant: "t", Topic: "x", PartitionKey: "rolled-back", Payload: []byte("x")})); err != nil {
		t.Fatal(err)
	}
	tx.Rollback()
	res, err := drivertest.Insert(ctx, d,
		driver.InsertMessage{Tenant: "t", Topic: "x", PartitionKey: "a", Payload: []byte("1")},
		driver.InsertMessage{Tenant: "t", Topic: "x", PartitionKey: "a", Payload: []byte("2")},
		driver.InsertMessage{Tenant: "t", Topic: "y", PartitionKey: "ключ", Payload: []byte("3")})
	if err != nil {
		t.Fatal(err)
	}
	got := []string{events.Next(t, "moved"), events.Next(t, "moved")}
	want := []string{fmt.Sprintf("moved t/x/a@%d", res[1].Offset), fmt.Sprintf("moved t/y/ключ@%d", res[2].Offset)}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("feed said %q; want %q (and nothing of the rolled-back partition)", got, want)
	}
}

// A position the server no longer has (its logs were purged while the
// feed was away) is said once, and the feed goes on from the server's
// current position with a rescan (Up), not silently from nowhere.
func TestFeedStalePositionRescans(t *testing.T) {
	ctx := context.Background()
	d := feedDriver(t)
	stale, pos, err := mysqldriver.BinlogPosition(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := sql.Open("mysql", testdb.MySQLServerDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	purge(t, admin, stale)

	events := startFeed(t, d, stale, pos)
	if note := events.Next(t, "note"); !strings.Contains(note, "no longer on the server") {
		t.Fatalf("note %q; want the position given up", note)
	}
	events.Next(t, "up")
	res, err := drivertest.Insert(ctx, d, driver.InsertMessage{Tenant: "t", Topic: "x", PartitionKey: "after", Payload: []byte("1")})
	if err != nil {
		t.Fatal(err)
	}
	if got := events.Next(t, "moved"); got != fmt.Sprintf("moved t/x/after@%d", res[0].Offset) {
		t.Fatalf("after the rescan the feed said %q", got)
	}
}

// purge rotates the binary log and purges every file up to the new one,
// until file is gone (a replica still reading an old file holds it).
func purge(t *testing.T, admin *sql.DB, file string) {
	t.Helper()
	ctx := context.Background()
	if _, err := admin.ExecContext(ctx, "FLUSH BINARY LOGS"); err != nil {
		t.Fatal(err)
	}
	var current string
	var pos uint32
	var rest1, rest2 sql.NullString
	if err := admin.QueryRowContext(ctx, "SHOW MASTER STATUS").Scan(&current, &pos, &rest1, &rest2); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := admin.ExecContext(ctx, "PURGE BINARY LOGS TO '"+current+"'"); err != nil {
			t.Fatal(err)
		}
		rows, err := admin.QueryContext(ctx, "SHOW BINARY LOGS")
		if err != nil {
			t.Fatal(err)
		}
		gone := true
		for rows.Next() {
			var name string
			var size int64
			cols, _ := rows.Columns()
			dst := []any{&name, &size}
			for range len(cols) - 2 {
				dst = append(dst, new(sql.RawBytes))
			}
			if err := rows.Scan(dst...); err != nil {
				t.Fatal(err)
			}
			gone = gone && name != file
		}
		rows.Close()
		if gone {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("binary log %s still listed after purging to %s", file, current)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Through vtgate there is no binary log to read: the feed says so (one
// log line, by the client) and consumers poll.
func TestVitessFeedUnavailable(t *testing.T) {
	d := testdb.Vitess(t)
	err := d.FeedHeads(context.Background(), make(feedEvents, 10))
	if !errors.Is(err, driver.ErrFeedUnavailable) || !strings.Contains(err.Error(), "Vitess") {
		t.Fatalf("feed on vtgate: %v; want ErrFeedUnavailable naming Vitess", err)
	}
}

// openFeedDriver opens a migrated driver on dsn with opts, closed when t
// ends.
func openFeedDriver(t *testing.T, dsn string, opts ...mysqldriver.Option) *mysqldriver.Driver {
	t.Helper()
	d, err := mysqldriver.Open(dsn, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return testdb.Migrated(t, d)
}

// An event above the feed's size bound (another application's 8 MiB row,
// which the server streams to every replica) is passed over as it
// arrives, never allocated, and the commit of its transaction is a
// Rescan, since it might have held a head change; the feed goes on, and
// reports later commits by name.
func TestFeedSkipsLargeEvents(t *testing.T) {
	ctx := context.Background()
	dsn := testdb.MySQLDatabase(t)
	d := openFeedDriver(t, dsn, mysqldriver.FeedMaxEventBytes(64<<10))
	if _, err := d.DB().ExecContext(ctx, "CREATE TABLE other_app (id INT PRIMARY KEY, b LONGBLOB)"); err != nil {
		t.Fatal(err)
	}
	file, pos, err := mysqldriver.BinlogPosition(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	events := startFeed(t, d, file, pos)
	events.Next(t, "up")

	const big = 8 << 20 // made by the server: this process never holds it
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if _, err := d.DB().ExecContext(ctx, "INSERT INTO other_app VALUES (1, REPEAT('x', ?))", big); err != nil {
		t.Fatal(err)
	}
	if ev := events.Next(t, ""); ev != "rescan" && !strings.HasPrefix(ev, "note ") {
		t.Fatalf("after an event over the bound the feed said %q; want a rescan", ev)
	}
	events.Next(t, "rescan")
	runtime.ReadMemStats(&after)
	if n := after.TotalAlloc - before.TotalAlloc; n > big/2 {
		t.Fatalf("the process allocated %d bytes while the feed passed over a %d-byte event", n, big)
	}

	// A transaction with a large event and a head change: both said.
	tx, err := d.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO other_app VALUES (2, REPEAT('y', ?))", big); err != nil {
		t.Fatal(err)
	}
	res := drivertest.Rows(driver.InsertMessage{Tenant: "t", Topic: "x", PartitionKey: "with-big", Payload: []byte("1")})
	if err := d.InsertMessages(ctx, driver.PreparedTx(tx), res); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if got, want := events.Next(t, "moved"), fmt.Sprintf("moved t/x/with-big@%d", res[0].Offset); got != want {
		t.Fatalf("feed said %q; want %q", got, want)
	}
	events.Next(t, "rescan")
	next, err := drivertest.Insert(ctx, d, driver.InsertMessage{Tenant: "t", Topic: "x", PartitionKey: "after", Payload: []byte("2")})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := events.Next(t, "moved"), fmt.Sprintf("moved t/x/after@%d", next[0].Offset); got != want {
		t.Fatalf("after the skipped events the feed said %q; want %q", got, want)
	}
}

// With FeedDSN the feed connects as a user with only the replication
// privileges, and the queue's user needs none: without the option, the
// same queue user's feed is unavailable.
func TestFeedDSN(t *testing.T) {
	ctx := context.Background()
	dsn := testdb.MySQLDatabase(t)
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	suffix := strings.TrimPrefix(cfg.DBName, "shardq_test_")
	queueUser, feedUser := "'queue_"+suffix+"'@'%'", "'feed_"+suffix+"'@'%'"
	t.Cleanup(func() { admin.ExecContext(context.Background(), "DROP USER IF EXISTS "+queueUser+", "+feedUser) })
	for _, stmt := range []string{
		"CREATE USER " + queueUser + " IDENTIFIED BY 'pw'",
		"GRANT ALL PRIVILEGES ON `" + cfg.DBName + "`.* TO " + queueUser,
		"CREATE USER " + feedUser + " IDENTIFIED BY 'pw'",
		"GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO " + feedUser, // what docs/feed.md asks for
	} {
		if _, err := admin.ExecContext(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	as := func(user, db string) string {
		c := *cfg
		c.User, c.Passwd, c.DBName = strings.Trim(strings.Split(user, "@")[0], "'"), "pw", db
		return c.FormatDSN()
	}

	alone := openFeedDriver(t, as(queueUser, cfg.DBName))
	if err := alone.FeedHeads(ctx, make(feedEvents, 10)); !errors.Is(err, driver.ErrFeedUnavailable) {
		t.Fatalf("the queue user's own feed: %v; want ErrFeedUnavailable (it has no replication privilege)", err)
	}

	d := openFeedDriver(t, as(queueUser, cfg.DBName), mysqldriver.FeedDSN(as(feedUser, "")))
	events := make(feedEvents, 100)
	fctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- d.FeedHeads(fctx, events) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("feed: %v", err)
		}
	}()
	events.Next(t, "up")
	res, err := drivertest.Insert(ctx, d, driver.InsertMessage{Tenant: "t", Topic: "x", PartitionKey: "k", Payload: []byte("1")})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := events.Next(t, "moved"), fmt.Sprintf("moved t/x/k@%d", res[0].Offset); got != want {
		t.Fatalf("feed said %q; want %q", got, want)
	}
}

// Open checks the feed's options before anything connects.
func TestFeedOptionsChecked(t *testing.T) {
	const dsn = "u:p@tcp(127.0.0.1:1)/db"
	for _, tc := range []struct {
		opt  mysqldriver.Option
		want string
	}{
		{mysqldriver.FeedMaxEventBytes(-1), "feed max event bytes -1"},
		{mysqldriver.FeedMaxEventBytes(1 << 32), "feed max event bytes 4294967296"},
		{mysqldriver.FeedDSN("feed:pw@db:3306"), "mysql feed dsn"},
	} {
		d, err := mysqldriver.Open(dsn, tc.opt)
		if err == nil {
			d.Close()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Open: %v; want an error naming %q", err, tc.want)
		}
	}
	d, err := mysqldriver.Open(dsn, mysqldriver.FeedDSN("feed:pw@tcp(db:3306)/"), mysqldriver.FeedMaxEventBytes(1<<20))
	if err != nil {
		t.Fatal(err)
	}
	d.Close()
}
