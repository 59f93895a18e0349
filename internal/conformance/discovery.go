// SPDX-License-Identifier: Apache-2.0

package conformance

import (
	"context"
	"database/sql"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardq/shardq"
)

var discoveryTests = []conformanceTest{
	{"LateCommitSeenWithinWindow", testLateCommitSeenWithinWindow},
	{"LateCommitSeenByFullDiscovery", testLateCommitSeenByFullDiscovery},
}

// lateCommit starts a subscriber with cfg's discovery settings, lets it
// tick, then publishes to a new partition in a transaction held open for
// several ticks before it commits, and waits for the message: a tick that
// reads only the heads that moved since the last tick would pass over it
// (its head was stamped before that tick and committed after).
func lateCommit(t *testing.T, open Open, window, full time.Duration) {
	d, c := setup(t, open, nil)
	var got atomic.Int64
	cfg := fastConfig("g", "x", []string{"t"}, func(_ context.Context, m *shardq.Delivery) error {
		if m.PartitionKey == "late" {
			got.Add(1)
		}
		return nil
	})
	cfg.DiscoveryWindow, cfg.FullDiscoveryInterval = window, full
	sub, err := c.Subscribe(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Stop(context.Background())
	mustPublish(t, c, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "early"})
	time.Sleep(5 * cfg.DiscoveryInterval) // the first, full tick is behind us

	tx, err := d.DB().BeginTx(context.Background(), &sql.TxOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.PublishTx(context.Background(), tx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "late"}); err != nil {
		tx.Rollback()
		t.Fatal(err)
	}
	time.Sleep(6 * cfg.DiscoveryInterval) // ticks pass while the head is stamped but not committed
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the late-committed message delivered", 30*time.Second, func() bool { return got.Load() == 1 })
}

// testLateCommitSeenWithinWindow: a commit later than a tick but within
// DiscoveryWindow is found by the next incremental tick (the full read is
// an hour away).
func testLateCommitSeenWithinWindow(t *testing.T, open Open) {
	lateCommit(t, open, time.Minute, time.Hour)
}

// testLateCommitSeenByFullDiscovery: a commit later than DiscoveryWindow
// is found by the full read, the net under the window.
func testLateCommitSeenByFullDiscovery(t *testing.T, open Open) {
	lateCommit(t, open, time.Nanosecond, time.Second)
}
