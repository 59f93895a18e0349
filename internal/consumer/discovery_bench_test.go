// SPDX-License-Identifier: Apache-2.0

package consumer

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/testdb"
)

// BenchmarkTickWithHistory measures what one discovery tick reads (members,
// held leases, partitions with work: tickInputs, the member's own code) when
// a topic holds `history` drained partitions and 1,000 active ones, after
// the first sweep, against the full read of every head row it replaces. The history is published through the driver and
// drained by writing its cursors at the heads with one INSERT ... SELECT
// (the schema directly: a million ResetOffset transactions would take
// hours); its heads are older than DiscoveryWindow. Compare ns/op across
// history sizes: the incremental tick should not grow with history.
func BenchmarkTickWithHistory(b *testing.B) {
	for _, db := range []struct {
		name string
		open func(testing.TB) driver.Driver
	}{
		{"sqlite", func(t testing.TB) driver.Driver { return testdb.Migrated(t, testdb.SQLite(t)) }},
		{"mysql", func(t testing.TB) driver.Driver { return testdb.Migrated(t, testdb.MySQL(t)) }},
	} {
		b.Run(db.name, func(b *testing.B) {
			d := db.open(b)
			have := 0
			for _, history := range []int{0, 10_000, 100_000} {
				for have < history {
					have += publishKeys(b, d, "h", have, history)
				}
				drain(b, d)
				benchTicks(b, d, history)
			}
		})
	}
}

const (
	benchActive = 1000
	benchWindow = time.Second
)

// publishKeys publishes one message to keys prefix+from.. (up to 500,
// below upTo) and reports how many.
func publishKeys(b testing.TB, d driver.Driver, prefix string, from, upTo int) int {
	ctx := context.Background()
	var ms []*driver.InsertMessage
	for i := from; i < upTo && len(ms) < 500; i++ {
		ms = append(ms, &driver.InsertMessage{Tenant: "bench", Topic: "tick", PartitionKey: fmt.Sprintf("%s%07d", prefix, i),
			ID: "m", CreatedAt: time.Now()})
	}
	tx, err := d.BeginWrite(ctx)
	if err != nil {
		b.Fatal(err)
	}
	if err := d.InsertMessages(ctx, tx, ms); err != nil {
		tx.Rollback()
		b.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		b.Fatal(err)
	}
	return len(ms)
}

// drain puts group g's cursor of every partition at its head and leaves
// a free lease row on each, as members that read and released them do.
func drain(b *testing.B, d driver.Driver) {
	for _, q := range []string{
		"DELETE FROM queue_offsets WHERE tenant = 'bench'",
		"INSERT INTO queue_offsets (tenant, topic, partition_key, consumer_group, committed_offset, updated_at) " +
			"SELECT tenant, topic, partition_key, 'g', head_offset, updated_at FROM queue_partitions WHERE tenant = 'bench'",
		"DELETE FROM queue_partition_leases WHERE tenant = 'bench'",
		"INSERT INTO queue_partition_leases (tenant, consumer_group, topic, partition_key, owner, token, expires_at, acquired_at) " +
			"SELECT tenant, 'g', topic, partition_key, '', 1, updated_at, updated_at FROM queue_partitions WHERE tenant = 'bench'",
	} {
		if _, err := d.DB().Exec(q); err != nil {
			b.Fatal(err)
		}
	}
}

func benchTicks(b *testing.B, d driver.Driver, history int) {
	ctx := context.Background()
	time.Sleep(benchWindow + 10*time.Millisecond) // the history's heads age out of the window
	for i := 0; i < benchActive; {
		i += publishKeys(b, d, fmt.Sprintf("a%d-", history), i, benchActive)
	}
	now := time.Now()
	for i := range 4 {
		if err := d.Heartbeat(ctx, driver.GroupScope{Tenants: []string{"bench"}, Topic: "tick", ConsumerGroup: "g"}, fmt.Sprintf("m%d", i), now); err != nil {
			b.Fatal(err)
		}
	}
	m := &Member{drv: d, log: slog.New(slog.DiscardHandler), cfg: Config{ConsumerGroup: "g", Topic: "tick", Tenants: []string{"bench"},
		ID: "m0", DiscoveryWindow: benchWindow, FullDiscoveryInterval: time.Hour}}
	tick := func(b *testing.B) {
		_, _, work, err := m.tickInputs(ctx, m.cfg.Tenants)
		if err != nil {
			b.Fatal(err)
		}
		if len(work) != benchActive {
			b.Fatalf("tick saw %d partitions with work, want %d", len(work), benchActive)
		}
	}
	b.Run(fmt.Sprintf("history=%d/full", history), func(b *testing.B) {
		for b.Loop() {
			if _, err := d.PartitionsWithWork(ctx, driver.GroupScope{Tenants: m.cfg.Tenants, Topic: m.cfg.Topic, ConsumerGroup: m.cfg.ConsumerGroup}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run(fmt.Sprintf("history=%d/incremental", history), func(b *testing.B) {
		m.disc = discovery{}
		for tick(b); m.disc.sweep.on; tick(b) { // the first sweep, a page a tick
		}
		for b.Loop() {
			tick(b)
		}
	})
	drain(b, d) // the active partitions join the history
}
