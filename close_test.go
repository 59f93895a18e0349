// SPDX-License-Identifier: Apache-2.0

package shardq_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
)

// Client.Close stops everything the client started and still runs (a
// subscriber, a group receiver, a transaction producer, a cleaner), waits
// for their goroutines, releases their leases and heartbeats, and refuses
// new ones with ErrClosed.
func TestCloseStopsWhatTheClientStarted(t *testing.T) {
	eachDatabase(t, func(t *testing.T, url string, drv driver.Driver, c *shardq.Client) {
		ctx := context.Background()
		before := goleak.IgnoreCurrent()
		if _, err := c.Publish(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "a"}, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "b"}); err != nil {
			t.Fatal(err)
		}
		delivered := make(chan struct{}, 10)
		cfg := shardq.SubscriberConfig{ConsumerGroup: "g", Topic: "x", Tenants: []string{"t"}, Take: shardq.TakeGrouped,
			DiscoveryInterval: 20 * time.Millisecond, PollInterval: 10 * time.Millisecond,
			Handler: func(context.Context, *shardq.Delivery) error { delivered <- struct{}{}; return nil }}
		if _, err := c.Subscribe(ctx, cfg); err != nil {
			t.Fatal(err)
		}
		<-delivered
		if _, err := c.AcceptGroup(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g2"}, "b", nil); err != nil {
			t.Fatal(err)
		}
		if _, err := c.StartTransactionProducer(ctx, shardq.TransactionProducerConfig{ProducerGroup: "pg", Tenants: []string{"t"},
			Checker: func(context.Context, *shardq.HalfMessage) (shardq.TxState, error) { return shardq.TxUnknown, nil }}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.StartCleaner(ctx, []string{"t"}, time.Hour, shardq.RetentionConfig{}); err != nil {
			t.Fatal(err)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		// The driver stays open: its pools (their openers and cleaners, the
		// write-transaction pool's begun by the client's first write) and
		// go-sql-driver's per-connection watchers are not the client's.
		goleak.VerifyNone(t, before, goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"),
			goleak.IgnoreTopFunction("database/sql.(*DB).connectionCleaner"),
			goleak.IgnoreTopFunction("github.com/go-sql-driver/mysql.(*mysqlConn).startWatcher.func1"))
		for _, g := range []string{"g", "g2"} {
			ls, err := drv.ListLeases(ctx, driver.GroupScope{Tenants: []string{"t"}, Topic: "x", ConsumerGroup: g})
			if err != nil {
				t.Fatal(err)
			}
			for _, l := range ls {
				if l.Owner != "" {
					t.Fatalf("lease %s still held by %q after Close", l.PartitionRef, l.Owner)
				}
			}
		}
		if subs, err := drv.Subscribers(ctx, driver.GroupScope{Tenants: []string{"t"}, Topic: "x", ConsumerGroup: "g"}); err != nil || len(subs) != 0 {
			t.Fatalf("heartbeats after Close: %+v, %v", subs, err)
		}
		if _, err := c.Subscribe(ctx, cfg); !errors.Is(err, shardq.ErrClosed) {
			t.Fatalf("Subscribe after Close = %v, want ErrClosed", err)
		}
		if _, err := c.AcceptGroup(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g2"}, "a", nil); !errors.Is(err, shardq.ErrClosed) {
			t.Fatalf("AcceptGroup after Close = %v, want ErrClosed", err)
		}
	})
}
