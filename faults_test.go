// SPDX-License-Identifier: Apache-2.0

package shardq_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver/mysqldriver"
	"github.com/shardq/shardq/internal/testdb"
)

// proxiedDatabase is a new MariaDB database's DSN, the same DSN through a
// CutProxy, and the proxy (closed when t ends).
func proxiedDatabase(t *testing.T) (direct, proxied string, proxy *testdb.CutProxy) {
	t.Helper()
	direct = testdb.MySQLDatabase(t)
	cfg, err := mysql.ParseDSN(direct)
	if err != nil {
		t.Fatal(err)
	}
	proxy = testdb.NewCutProxy(t, cfg.Addr)
	cfg.Addr = proxy.Addr()
	return direct, cfg.FormatDSN(), proxy
}

// faultSubscriberConfig is the member the fault tests run: short
// intervals, a lease long enough to outlive one outage.
func faultSubscriberConfig(h shardq.Handler) shardq.SubscriberConfig {
	return shardq.SubscriberConfig{ConsumerGroup: "g", Topic: "x", Tenants: []string{"t"}, Handler: h,
		LeaseTTL: 5 * time.Second, HeartbeatInterval: 100 * time.Millisecond, StaleAfter: 3 * time.Second,
		DiscoveryInterval: 50 * time.Millisecond, PollInterval: 10 * time.Millisecond, CommitInterval: 20 * time.Millisecond}
}

// TestSubscriberSurvivesConnectionCuts runs a subscriber through a proxy
// that severs every connection to MariaDB ten times while messages flow:
// the subscriber recovers each time and nothing is lost or reordered.
func TestSubscriberSurvivesConnectionCuts(t *testing.T) {
	ctx := context.Background()
	direct, proxied, proxy := proxiedDatabase(t)

	pubDrv, err := mysqldriver.Open(direct)
	if err != nil {
		t.Fatal(err)
	}
	defer pubDrv.Close()
	pub, err := shardq.NewClient(pubDrv, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	if err := pub.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	subDrv, err := mysqldriver.Open(proxied)
	if err != nil {
		t.Fatal(err)
	}
	defer subDrv.Close()
	subClient, err := shardq.NewClient(subDrv, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer subClient.Close()

	var mu sync.Mutex
	last := map[string]int64{}
	seen := map[string]bool{}
	var disorder []string
	sub, err := subClient.Subscribe(ctx, faultSubscriberConfig(func(_ context.Context, d *shardq.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		// At least once: a message may come again after a cut, but a
		// partition never goes backwards past what was acked before.
		if d.Offset < last[d.PartitionKey] {
			disorder = append(disorder, fmt.Sprintf("%s: %d after %d", d.PartitionKey, d.Offset, last[d.PartitionKey]))
		}
		last[d.PartitionKey] = d.Offset
		seen[d.ID] = true
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	const total = 2000
	cuts := 0
	for i := 0; i < total; i += 200 {
		var batch []shardq.Message
		for j := i; j < i+200; j++ {
			batch = append(batch, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: fmt.Sprintf("p%02d", j%16), ID: fmt.Sprintf("m%04d", j)})
		}
		if _, err := pub.Publish(ctx, batch...); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
		cuts += proxy.Cut()
	}
	deadline := time.Now().Add(time.Minute)
	for {
		mu.Lock()
		n := len(seen)
		mu.Unlock()
		if n == total {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d messages delivered a minute after the last cut", n, total)
		}
		time.Sleep(20 * time.Millisecond)
	}
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := sub.Stop(stopCtx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(disorder) > 0 {
		t.Fatalf("out of order after cuts: %v", disorder)
	}
	if cuts < 10 {
		t.Fatalf("only %d connections were cut; the test did not exercise the failure", cuts)
	}
	t.Logf("%d connections cut over 10 rounds; all %d messages delivered in order", cuts, total)
}
