// SPDX-License-Identifier: Apache-2.0

package mysqldriver_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/driver/mysqldriver"
	"github.com/shardq/shardq/internal/testdb"
)

// feedEvents is a FeedSink that hands every event to the test.
type feedEvents chan string

func (e feedEvents) Moved(hs []driver.HeadChange) {
	for _, h := range hs {
		e.send(fmt.Sprintf("moved %s/%s/%s@%d", h.Tenant, h.Topic, h.PartitionKey, h.Head))
	}
}
func (e feedEvents) Rescan()                      { e.send("rescan") }
func (e feedEvents) Up(bool)                      { e.send("up") }
func (e feedEvents) Down(err error)               { e.send("down") }
func (e feedEvents) Note(msg string, args ...any) { e.send("note " + msg) }

// send never blocks the feed (a sink must not): a test that reads
// nothing does not hold the feed past its cancellation.
func (e feedEvents) send(ev string) {
	select {
	case e <- ev:
	default:
	}
}

// next waits for the next event that starts with prefix, skipping others.
func (e feedEvents) next(t *testing.T, prefix string) string {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case ev := <-e:
			if strings.HasPrefix(ev, prefix) {
				return ev
			}
		case <-deadline:
			t.Fatalf("no %q event within 30 s", prefix)
		}
	}
}

// feedDriver is a migrated database and a client that publishes to it
// (its own feed off: the test runs the feed itself).
func feedDriver(t *testing.T) (*mysqldriver.Driver, *shardq.Client) {
	t.Helper()
	d := testdb.Migrated(t, testdb.MySQL(t))
	c, err := shardq.NewClient(d, &shardq.Config{ChangeFeed: shardq.FeedOff})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return d, c
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
	d, c := feedDriver(t)
	file, pos, err := mysqldriver.BinlogPosition(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	events := startFeed(t, d, file, pos)
	events.next(t, "up")

	tx, err := d.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.PublishTx(ctx, tx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "rolled-back", Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	tx.Rollback()
	res, err := c.Publish(ctx,
		shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "a", Payload: []byte("1")},
		shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "a", Payload: []byte("2")},
		shardq.Message{Tenant: "t", Topic: "y", PartitionKey: "ключ", Payload: []byte("3")})
	if err != nil {
		t.Fatal(err)
	}
	got := []string{events.next(t, "moved"), events.next(t, "moved")}
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
	d, c := feedDriver(t)
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
	if note := events.next(t, "note"); !strings.Contains(note, "no longer on the server") {
		t.Fatalf("note %q; want the position given up", note)
	}
	events.next(t, "up")
	res, err := c.Publish(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "after", Payload: []byte("1")})
	if err != nil {
		t.Fatal(err)
	}
	if got := events.next(t, "moved"); got != fmt.Sprintf("moved t/x/after@%d", res[0].Offset) {
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
