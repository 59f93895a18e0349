// SPDX-License-Identifier: Apache-2.0

package tenants

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/publish"
	"github.com/shardq/shardq/internal/telemetry"
	"github.com/shardq/shardq/internal/testdb"
)

// newStates is the States a client over drv makes, with ttl and usageEvery
// for its Config.TenantSettingsTTL and TenantUsageInterval.
func newStates(t *testing.T, drv driver.Driver, clock func() time.Time, ttl, usageEvery time.Duration) *States {
	t.Helper()
	ts := New(drv, Options{TTL: ttl, UsageEvery: usageEvery, Clock: clock, Tel: telemetry.New(nil, nil), Log: slog.Default()})
	t.Cleanup(ts.Close)
	return ts
}

// setLimits is Admin.SetTenantLimits: the row, then forgetting what this
// client knew of it.
func setLimits(t *testing.T, drv driver.Driver, ts *States, tenant string, l driver.TenantLimits, now time.Time) {
	t.Helper()
	defer ts.Forget(tenant)
	if err := drv.SetTenantLimits(context.Background(), tenant, l, now); err != nil {
		t.Fatal(err)
	}
}

// store commits rows in a transaction of their own.
func store(t *testing.T, drv driver.Driver, rows []*driver.InsertMessage) {
	t.Helper()
	ctx := context.Background()
	tx, err := drv.BeginWrite(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := drv.InsertMessages(ctx, tx, rows); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

// publishRows is a publish of rows: admitted, stored, then ended.
func publishRows(t *testing.T, drv driver.Driver, ts *States, rows []*driver.InsertMessage) error {
	t.Helper()
	end, err := ts.Admit(context.Background(), rows[0].Tenant, rows, false)
	if err != nil {
		return err
	}
	defer end(publish.Ended)
	store(t, drv, rows)
	return nil
}

// What a tenant stores is measured in the call the first time, then again
// in the background once TenantUsageInterval old; between measures the
// client adds what it admits itself. A deletion elsewhere frees room only
// at the next measure. The quota metrics report the limit and the usage.
func TestStorageQuotaMeasuredInTheBackground(t *testing.T) {
	clock := testdb.NewClock(time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC))
	drv := testdb.Migrated(t, testdb.SQLite(t))
	ts := newStates(t, drv, clock.Now, time.Hour, time.Minute)
	ctx := context.Background()
	pub := func(id string) error {
		return publishRows(t, drv, ts, []*driver.InsertMessage{{Tenant: "t", Topic: "x", PartitionKey: "k", ID: id,
			Headers: map[string]string{"queue_name": "t"}, CreatedAt: clock.Now()}})
	}
	refused := func(id string, usage int64) {
		t.Helper()
		var qe *QuotaExceededError
		if err := pub(id); !errors.As(err, &qe) || qe.Quota != QuotaMaxMessages || qe.Usage != usage {
			t.Fatalf("publish %s: %v; want max_messages refused at %d", id, err, usage)
		}
	}
	for _, id := range []string{"a", "b"} {
		if err := pub(id); err != nil {
			t.Fatal(err)
		}
	}
	setLimits(t, drv, ts, "t", driver.TenantLimits{MaxMessages: 3}, clock.Now())
	if err := pub("c"); err != nil { // measured 2
		t.Fatal(err)
	}
	refused("d", 3) // 2 measured, 1 added
	for _, id := range []string{"a", "b"} {
		if ok, err := drv.DeleteMessage(ctx, driver.MessageRef{Tenant: "t", Topic: "x", PartitionKey: "k", ID: id}); !ok || err != nil {
			t.Fatalf("delete %s: %v %v", id, ok, err)
		}
	}
	refused("d", 3) // the measure stands
	clock.Add(time.Minute)
	// The stale measure is renewed in the background: this publish is
	// judged by it, or by the new one if that lands first.
	var qe *QuotaExceededError
	if err := pub("d"); err != nil {
		if !errors.As(err, &qe) || qe.Usage != 3 {
			t.Fatalf("publish d on the stale measure: %v; want max_messages refused at 3, or stored", err)
		}
		ts.bg.Wait()
		if err := pub("d"); err != nil {
			t.Fatalf("publish after the new measure of 1: %v", err)
		}
	}
	uses := ts.QuotaUses()
	if len(uses) != 1 || uses[0] != (telemetry.QuotaUse{Tenant: "t", Quota: QuotaMaxMessages, Limit: 3, Usage: 2, Measured: true}) {
		t.Fatalf("quota metrics %+v", uses)
	}
}

// A write admitted before a measure started and stored after it is
// counted until a measure that holds it lands: concurrent batches of one
// client never take a tenant past its quota, however large, and a write
// in the caller's transaction (ends unseen) is held for two measures.
func TestStorageQuotaHoldsWritesInFlightAcrossMeasures(t *testing.T) {
	clock := testdb.NewClock(time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC))
	drv := testdb.Migrated(t, testdb.SQLite(t))
	ts := newStates(t, drv, clock.Now, time.Hour, time.Minute)
	ctx := context.Background()
	setLimits(t, drv, ts, "t", driver.TenantLimits{MaxMessages: 200}, clock.Now())
	id := 0
	batch := func(n int) []*driver.InsertMessage {
		rows := make([]*driver.InsertMessage, n)
		for i := range rows {
			id++
			rows[i] = &driver.InsertMessage{Tenant: "t", Topic: "x", PartitionKey: "k", ID: fmt.Sprint(id),
				Headers: map[string]string{"queue_name": "t"}, CreatedAt: clock.Now()}
		}
		return rows
	}
	// measureNow lets the measure go stale and waits for the one the next
	// check starts in the background.
	measureNow := func() {
		t.Helper()
		clock.Add(time.Minute)
		end, err := ts.Admit(ctx, "t", nil, false)
		if err != nil {
			t.Fatal(err)
		}
		end(publish.Ended)
		ts.bg.Wait()
	}
	refused := func(n int, usage int64) {
		t.Helper()
		var qe *QuotaExceededError
		if _, err := ts.Admit(ctx, "t", batch(n), false); !errors.As(err, &qe) || qe.Usage != usage {
			t.Fatalf("admit %d: %v; want max_messages refused at %d", n, err, usage)
		}
	}
	first := batch(150)
	end, err := ts.Admit(ctx, "t", first, false) // measured 0
	if err != nil {
		t.Fatal(err)
	}
	measureNow() // starts while the batch is in flight: 0
	store(t, drv, first)
	end(publish.Ended)
	refused(100, 150) // the measure misses it; the client does not
	measureNow()      // holds the 150
	refused(100, 150)
	second := batch(30)
	end, err = ts.Admit(ctx, "t", second, false)
	if err != nil {
		t.Fatal(err)
	}
	end(publish.EndsUnseen) // in a caller's transaction, not yet committed
	measureNow()
	refused(100, 180)
	measureNow()
	store(t, drv, second) // committed later than the two measures: no longer held
	refused(100, 150)
	measureNow()
	refused(100, 180)
	end, err = ts.Admit(ctx, "t", batch(20), false)
	if err != nil {
		t.Fatalf("admit up to the limit: %v", err)
	}
	end(publish.Ended)
	refused(1, 200)
}

// Near its partitions quota, a write to a new partition counts the new
// partitions of the client's writes in flight: two concurrent writes to
// new keys cannot both take the last one. A write to an existing
// partition still goes through.
func TestPartitionsQuotaCountsNewKeysInFlight(t *testing.T) {
	drv := testdb.Migrated(t, testdb.SQLite(t))
	ts := newStates(t, drv, time.Now, time.Hour, 30*time.Second) // the client's default TenantUsageInterval
	ctx := context.Background()
	row := func(key string) []*driver.InsertMessage {
		return []*driver.InsertMessage{{Tenant: "t", Topic: "x", PartitionKey: key, ID: key + "-1", Headers: map[string]string{}, CreatedAt: time.Now().UTC()}}
	}
	if err := publishRows(t, drv, ts, []*driver.InsertMessage{{Tenant: "t", Topic: "x", PartitionKey: "a", ID: "a-0",
		Headers: map[string]string{"queue_name": "t"}, CreatedAt: time.Now().UTC()}}); err != nil {
		t.Fatal(err)
	}
	setLimits(t, drv, ts, "t", driver.TenantLimits{MaxPartitions: 2}, time.Now())
	endB, err := ts.Admit(ctx, "t", row("b"), false) // in flight
	if err != nil {
		t.Fatal(err)
	}
	var qe *QuotaExceededError
	if _, err := ts.Admit(ctx, "t", row("c"), false); !errors.As(err, &qe) || qe.Quota != QuotaMaxPartitions || qe.Usage != 2 {
		t.Fatalf("a new key while another is in flight: %v; want max_partitions refused at 2", err)
	}
	end, err := ts.Admit(ctx, "t", row("a"), false)
	if err != nil {
		t.Fatalf("an existing key: %v", err)
	}
	end(publish.Ended)
	endB(publish.Ended) // failed: nothing stored
	end, err = ts.Admit(ctx, "t", row("c"), false)
	if err != nil {
		t.Fatalf("a new key once the other write ended unstored: %v", err)
	}
	end(publish.Ended)
}
