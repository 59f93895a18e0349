// SPDX-License-Identifier: Apache-2.0

package consumer

import (
	"context"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/testdb"
)

// TestSweepFindsOldWorkPageByPage: partitions with work whose heads moved
// long before the window are found by the sweep, a bounded page of head
// rows a tick, across tenants, and a new sweep starts only after
// FullDiscoveryInterval.
func TestSweepFindsOldWorkPageByPage(t *testing.T) {
	defer func(f, r, p int) { firstSweepRows, sweepRows, sweepPages = f, r, p }(firstSweepRows, sweepRows, sweepPages)
	firstSweepRows, sweepRows, sweepPages = 3, 2, 2
	d := testdb.Migrated(t, testdb.SQLite(t))
	for i := 0; i < 5; i += publishKeys(t, d, "k", i, 5) { // tenant "bench": k0000000 ... k0000004
	}
	// Every head moved an hour ago: only the sweep finds them.
	if _, err := d.DB().Exec("UPDATE queue_partitions SET updated_at = ?", time.Now().Add(-time.Hour).UnixMicro()); err != nil {
		t.Fatal(err)
	}
	rec := &pageRecorder{Driver: d}
	m := &Member{drv: rec, log: slog.New(slog.DiscardHandler), cfg: Config{ConsumerGroup: "g", Topic: "tick", Tenants: []string{"bench", "other"},
		DiscoveryWindow: time.Minute, FullDiscoveryInterval: time.Hour}}
	var found []int
	for range 4 {
		work, err := m.discover(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		found = append(found, len(work))
	}
	// Tick 1 has nothing else to do: a first-sweep page of 3 rows. Then
	// the member has work, and reads pages of 2: "bench" ends at tick 3,
	// and "other" has no partition of the topic, so it is never paged and
	// the sweep is done; later ticks re-read by key what had work.
	if want := []int{3, 5, 5, 5}; !slices.Equal(found, want) {
		t.Fatalf("partitions with work per tick %v, want %v", found, want)
	}
	if want := []int{3, 2, 2}; !slices.Equal(rec.limits, want) || slices.Contains(rec.tenants, "other") {
		t.Fatalf("page limits %v of tenants %v, want %v, none of tenant other", rec.limits, rec.tenants, want)
	}
	if m.disc.sweep.on || m.disc.sweep.done != 1 {
		t.Fatalf("sweep %+v, want one done and none running before FullDiscoveryInterval", m.disc.sweep)
	}
	m.disc.sweep.startedAt = m.disc.sweep.startedAt.Add(-time.Hour)
	if _, err := m.discover(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !m.disc.sweep.on || m.disc.sweep.after == nil {
		t.Fatalf("sweep %+v, want the next one started after FullDiscoveryInterval, at its later pace", m.disc.sweep)
	}
}

// pageRecorder records the limit of every sweep page read.
type pageRecorder struct {
	driver.Driver
	limits  []int
	tenants []string
}

func (r *pageRecorder) HeadsPage(ctx context.Context, g driver.GroupRef, after []string, limit int) ([]driver.Partition, error) {
	r.limits, r.tenants = append(r.limits, limit), append(r.tenants, g.Tenant)
	return r.Driver.HeadsPage(ctx, g, after, limit)
}
