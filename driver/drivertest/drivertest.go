// SPDX-License-Identifier: Apache-2.0

// Package drivertest is the conformance suite of the driver alone, which
// every shardq driver passes unchanged: it calls driver.Driver's methods
// and never a client. A driver's tests call RunParallel with a function
// that opens the driver on a fresh, empty (not migrated) database of the
// test's own.
//
//	func TestConformance(t *testing.T) {
//		drivertest.RunParallel(t, func(t *testing.T) driver.Driver { return openFresh(t) }, nil)
//	}
//
// The client's suite over the same drivers is internal/conformance.
package drivertest

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/retry"
)

// Open returns a driver on a fresh, empty database owned by t.
type Open func(t *testing.T) driver.Driver

// needsFresh names the tests of migration itself: they take open's
// database, never an already migrated one.
var needsFresh = map[string]bool{"MigrateIsIdempotent": true}

// RunParallel runs the conformance tests side by side (t.Parallel): open
// must return a database of the test's own (the same one again when a
// test calls it twice, as Vitess's keyspace pool does, or another: either
// is fresh). migrated, when not nil, is open with the database already
// migrated to the latest schema version and emptied of rows: every test
// but those of migration takes it, for servers where a test's DDL costs
// seconds (Vitess).
func RunParallel(t *testing.T, open, migrated Open) {
	tests := []struct {
		name string
		fn   func(*testing.T, Open)
	}{
		{"MigrateIsIdempotent", testMigrateIsIdempotent},
		{"DatabaseClock", testDatabaseClock},
		{"FetchAfterCursorAndLimit", testFetchAfterCursorAndLimit},
		{"PartitionsWithWorkScoped", testPartitionsWithWorkScoped},
	}
	for _, tc := range slices.Concat(tests, leaseTests, discoveryTests, groupTests, transactionTests, lifecycleTests, tokenTests, budgetTests) {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if migrated != nil && !needsFresh[tc.name] {
				tc.fn(t, migrated)
				return
			}
			tc.fn(t, open)
		})
	}
}

// setup opens and migrates a driver.
func setup(t *testing.T, open Open) driver.Driver {
	t.Helper()
	d := open(t)
	if _, err := d.Migrate(context.Background()); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return d
}

func fetchAll(t *testing.T, d driver.Driver, tenant, topic, key string) []driver.Message {
	t.Helper()
	msgs, err := d.FetchAfter(context.Background(), driver.TopicPartition{Tenant: tenant, Topic: topic, PartitionKey: key}, 0, 1_000_000)
	if err != nil {
		t.Fatalf("fetch: %v", err)
	}
	return msgs
}

// Rows returns msgs as a client's publish hands them to InsertMessages:
// an id (a UUIDv7), the queue_name header and the creation time (now)
// filled where msgs leave them empty, times in UTC to the microsecond.
func Rows(msgs ...driver.InsertMessage) []*driver.InsertMessage {
	now := time.Now().UTC().Truncate(time.Microsecond)
	rows := make([]*driver.InsertMessage, len(msgs))
	for i, m := range msgs {
		if m.ID == "" {
			m.ID = uuid.Must(uuid.NewV7()).String()
		}
		headers := make(map[string]string, len(m.Headers)+1)
		maps.Copy(headers, m.Headers)
		headers["queue_name"] = m.Tenant
		m.Headers = headers
		if m.CreatedAt.IsZero() {
			m.CreatedAt = now
		}
		m.CreatedAt = m.CreatedAt.UTC().Truncate(time.Microsecond)
		if !m.NotBefore.IsZero() {
			m.NotBefore = m.NotBefore.UTC().Truncate(time.Microsecond)
		}
		rows[i] = &m
	}
	return rows
}

// Insert stores msgs (filled as Rows fills them) in one write
// transaction of d, as a client's publish does, and runs it again while
// it fails with an error d calls retryable. It returns the messages as
// stored: offsets and duplicates filled.
func Insert(ctx context.Context, d driver.Driver, msgs ...driver.InsertMessage) ([]driver.InsertMessage, error) {
	rows := Rows(msgs...)
	err := retry.Do(ctx, 5, d.Retryable, nil, func() error {
		tx, err := d.BeginWrite(ctx)
		if err != nil {
			return err
		}
		if err := d.InsertMessages(driver.Rerunnable(ctx), tx, rows); err != nil {
			tx.Rollback()
			return err
		}
		return tx.Commit()
	})
	if err != nil {
		return nil, err
	}
	out := make([]driver.InsertMessage, len(rows))
	for i, r := range rows {
		out[i] = *r
	}
	return out, nil
}

// mustInsert is Insert, failing t on an error.
func mustInsert(t testing.TB, d driver.Driver, msgs ...driver.InsertMessage) []driver.InsertMessage {
	t.Helper()
	res, err := Insert(context.Background(), d, msgs...)
	if err != nil {
		t.Fatalf("insert: %v", err)
	}
	return res
}

func testMigrateIsIdempotent(t *testing.T, open Open) {
	ctx := context.Background()
	d := open(t)
	cur, latest, err := d.SchemaVersion(ctx)
	if err != nil || cur != 0 || latest < 1 {
		t.Fatalf("fresh database: version %d of %d, %v; want 0 of >= 1", cur, latest, err)
	}
	applied, err := d.Migrate(ctx)
	if err != nil || len(applied) == 0 || applied[len(applied)-1] != latest {
		t.Fatalf("first migrate applied %v, %v; want up to %d", applied, err, latest)
	}
	again, err := d.Migrate(ctx)
	if err != nil || len(again) != 0 {
		t.Fatalf("second migrate applied %v, %v; want nothing", again, err)
	}
	if cur, _, _ = d.SchemaVersion(ctx); cur != latest {
		t.Fatalf("after migrate: version %d, want %d", cur, latest)
	}
	// Concurrent migrations (processes starting together) must not collide.
	d2 := open(t)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := d2.Migrate(ctx)
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("concurrent migrate: %v", err)
		}
	}
}

func testFetchAfterCursorAndLimit(t *testing.T, open Open) {
	d := setup(t, open)
	ctx := context.Background()
	var batch []driver.InsertMessage
	for i := range 10 {
		batch = append(batch, driver.InsertMessage{Tenant: "t", Topic: "x", PartitionKey: "k", Payload: []byte{byte(i)}})
	}
	res := mustInsert(t, d, batch...)
	page, err := d.FetchAfter(ctx, driver.TopicPartition{Tenant: "t", Topic: "x", PartitionKey: "k"}, res[3].Offset, 4)
	if err != nil {
		t.Fatal(err)
	}
	if len(page) != 4 || page[0].Offset != res[4].Offset || page[3].Offset != res[7].Offset {
		t.Fatalf("page after offset %d: %+v", res[3].Offset, page)
	}
	if rest, _ := d.FetchAfter(ctx, driver.TopicPartition{Tenant: "t", Topic: "x", PartitionKey: "k"}, res[9].Offset, 10); len(rest) != 0 {
		t.Fatalf("fetch past the head returned %d messages", len(rest))
	}
	if other, _ := d.FetchAfter(ctx, driver.TopicPartition{Tenant: "t", Topic: "x", PartitionKey: "other"}, 0, 10); len(other) != 0 {
		t.Fatalf("another partition returned %d messages", len(other))
	}
}

func testPartitionsWithWorkScoped(t *testing.T, open Open) {
	d := setup(t, open)
	ctx := context.Background()
	var heads = map[string]int64{}
	for _, m := range []driver.InsertMessage{
		{Tenant: "a", Topic: "orders", PartitionKey: "k1"},
		{Tenant: "a", Topic: "orders", PartitionKey: "k2"},
		{Tenant: "a", Topic: "orders", PartitionKey: "k2"},
		{Tenant: "a", Topic: "refunds", PartitionKey: "k1"},
		{Tenant: "b", Topic: "orders", PartitionKey: "k1"},
		{Tenant: "c", Topic: "orders", PartitionKey: "k9"},
	} {
		r := mustInsert(t, d, m)[0]
		heads[m.Tenant+"/"+m.Topic+"/"+m.PartitionKey] = r.Offset
	}
	list := func(tenants ...string) []string {
		ps, err := d.PartitionsWithWork(ctx, driver.GroupScope{Tenants: tenants, Topic: "orders", ConsumerGroup: "g1"})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, p := range ps {
			name := p.Tenant + "/" + p.Topic + "/" + p.PartitionKey
			if p.HeadOffset != heads[name] {
				t.Fatalf("%s head %d, want %d", name, p.HeadOffset, heads[name])
			}
			out = append(out, fmt.Sprintf("%s@%d", name, p.CommittedOffset))
		}
		return out
	}
	if got, want := list("a", "b"), []string{"a/orders/k1@0", "a/orders/k2@0", "b/orders/k1@0"}; !slices.Equal(got, want) {
		t.Fatalf("work for [a b] = %v, want %v (never tenant c, never topic refunds)", got, want)
	}
	if got := list(); len(got) != 0 {
		t.Fatalf("an empty tenant list returned %v; it must never widen to all tenants", got)
	}
	// A cursor at the head means no work; one behind it means work.
	if err := d.ResetOffset(ctx, driver.PartitionRef{Tenant: "a", Topic: "orders", PartitionKey: "k1", ConsumerGroup: "g1"}, heads["a/orders/k1"]); err != nil {
		t.Fatal(err)
	}
	if err := d.ResetOffset(ctx, driver.PartitionRef{Tenant: "a", Topic: "orders", PartitionKey: "k2", ConsumerGroup: "g1"}, heads["a/orders/k2"]-1); err != nil {
		t.Fatal(err)
	}
	want := []string{fmt.Sprintf("a/orders/k2@%d", heads["a/orders/k2"]-1), "b/orders/k1@0"}
	if got := list("a", "b"); !slices.Equal(got, want) {
		t.Fatalf("after commits, work = %v, want %v", got, want)
	}
	// Another group's cursor is its own.
	if ps, _ := d.PartitionsWithWork(ctx, driver.GroupScope{Tenants: []string{"a"}, Topic: "orders", ConsumerGroup: "g2"}); len(ps) != 2 {
		t.Fatalf("group g2 sees %d partitions with work, want 2", len(ps))
	}
}
