// SPDX-License-Identifier: Apache-2.0

package mysqltest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/driver/mysqldriver"
	"github.com/shardq/shardq/internal/conformance"
	"github.com/shardq/shardq/internal/testdb"
)

// TestConformanceMySQL runs the client's conformance suite on MariaDB
// (MySQL), a database of each test's own.
func TestConformanceMySQL(t *testing.T) {
	conformance.RunParallel(t, func(t *testing.T) driver.Driver { return testdb.MySQL(t) }, nil)
}

// With a bound below every row event the feed names nothing, yet a
// receiver whose polls are an hour apart gets each message another client
// publishes: the commits, rescans, wake it.
func TestFeedRescanWakesConsumers(t *testing.T) {
	ctx := context.Background()
	dsn := testdb.MySQLDatabase(t)
	d := openFeedDriver(t, dsn, mysqldriver.FeedMaxEventBytes(1))
	c, err := shardq.NewClient(d, &shardq.Config{Tenants: []string{"t"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pub, err := shardq.NewClient(openFeedDriver(t, dsn), &shardq.Config{ChangeFeed: shardq.FeedOff})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	if _, err := pub.Publish(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", Payload: []byte("0")}); err != nil {
		t.Fatal(err)
	}
	r, err := c.AcceptGroup(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, "k", &shardq.ReceiverOptions{PollInterval: time.Hour, FeedPollInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop(ctx)
	for deadline := time.Now().Add(30 * time.Second); !c.FeedUp(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("feed not up within 30 s")
		}
	}
	for i := range 5 {
		if i > 0 {
			if _, err := pub.Publish(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", Payload: []byte(fmt.Sprint(i))}); err != nil {
				t.Fatal(err)
			}
		}
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		m, err := r.Receive(rctx)
		cancel()
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		if string(m.Payload) != fmt.Sprint(i) {
			t.Fatalf("got %q, want %d", m.Payload, i)
		}
		if err := r.Ack(ctx, m); err != nil {
			t.Fatal(err)
		}
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
