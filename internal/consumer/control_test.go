// SPDX-License-Identifier: Apache-2.0

package consumer

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/lifecycle"
	"github.com/shardq/shardq/internal/testdb"
)

// deadlineDriver fails every lease acquisition as a call past its
// deadline does.
type deadlineDriver struct{ driver.Driver }

func (deadlineDriver) AcquireLease(context.Context, driver.AcquireLeaseParams) (driver.Lease, error) {
	return driver.Lease{}, fmt.Errorf("acquire lease: %w", context.DeadlineExceeded)
}

// countingHandler counts the records whose message contains substr.
type countingHandler struct {
	slog.Handler
	substr string
	n      *atomic.Int64
}

func (countingHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h countingHandler) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, h.substr) {
		h.n.Add(1)
	}
	return nil
}

// TestAcquisitionsPastTheDeadlineLogOnce: once a tick's deadline passes,
// acquiring the rest of its plan stops with one warning, not one per
// partition (hundreds of thousands of lines when a member starts on a
// topic with that many partitions with work).
func TestAcquisitionsPastTheDeadlineLogOnce(t *testing.T) {
	d := testdb.Migrated(t, testdb.SQLite(t))
	for i := 0; i < 50; i += publishKeys(t, d, "k", i, 50) {
	}
	if err := d.Heartbeat(context.Background(), driver.GroupScope{Tenants: []string{"bench"}, Topic: "tick", ConsumerGroup: "g"}, "m0", time.Now()); err != nil {
		t.Fatal(err)
	}
	var warnings atomic.Int64
	s := &Member{drv: deadlineDriver{d}, workers: map[driver.PartitionRef]*worker{}, life: lifecycle.New(context.Background()),
		log:    slog.New(countingHandler{slog.DiscardHandler, "acquir", &warnings}),
		beatAt: map[string]time.Time{"bench": time.Now()},
		cfg: Config{ConsumerGroup: "g", Topic: "tick", Tenants: []string{"bench"}, ID: "m0", LeaseTTL: time.Minute, StaleAfter: time.Minute,
			MaxPartitions: 100, DiscoveryWindow: time.Minute, FullDiscoveryInterval: time.Hour, Clock: time.Now}}
	defer s.life.Stop(context.Background())
	s.tick()
	if n := warnings.Load(); n != 1 {
		t.Fatalf("%d warnings about acquiring 50 partitions past the deadline, want 1", n)
	}
}
