// SPDX-License-Identifier: Apache-2.0

package conformance

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/driver/drivertest"
)

// effects is an application's table beside the queue's: what a handler
// did, one row per time it did it.
func effects(t *testing.T, d driver.Driver) (insert func(ctx context.Context, tx *sql.Tx, id string) error, list func() []string) {
	t.Helper()
	ctx := context.Background()
	if _, err := d.DB().ExecContext(ctx, "CREATE TABLE app_effects (tenant VARCHAR(255) NOT NULL, id VARCHAR(64) NOT NULL)"); err != nil {
		t.Fatalf("create the application's table: %v", err)
	}
	// Through vtgate the application's table is sharded by tenant as the
	// queue's are, so that its rows share the tenant's shard.
	var version string
	if d.DB().QueryRowContext(ctx, "SELECT @@version").Scan(&version) == nil && strings.Contains(version, "Vitess") {
		_, err := d.DB().ExecContext(ctx, "ALTER VSCHEMA ON app_effects ADD VINDEX tenant_xxhash(tenant)")
		if err != nil && !strings.Contains(err.Error(), "already") {
			t.Fatalf("vschema of the application's table: %v", err)
		}
	}
	insert = func(ctx context.Context, tx *sql.Tx, id string) error {
		_, err := tx.ExecContext(ctx, "INSERT INTO app_effects (tenant, id) VALUES ('t', ?)", id)
		return err
	}
	list = func() []string {
		t.Helper()
		tx, err := beginWrite(ctx, d)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		rows, err := tx.QueryContext(ctx, "SELECT id FROM app_effects WHERE tenant = 't' ORDER BY id")
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var out []string
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				t.Fatal(err)
			}
			out = append(out, id)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	return insert, list
}

// A subscriber's handler that acks in its own transaction: the
// settlement commits with the application's writes, or neither does. A
// handler that rolls back (and fails) finds its message again; an
// ungrouped message's claim is settled the same way.
func testAckTxSubscriber(t *testing.T, open Open) {
	d, c := setup(t, open, nil)
	insert, list := effects(t, d)
	publishGroup(t, c, "k", "m1", "m2", "m3")
	mustPublish(t, c, shardq.Message{Tenant: "t", Topic: "x", ID: "u1"}, shardq.Message{Tenant: "t", Topic: "x", ID: "u2"})
	var mu sync.Mutex
	failedOnce := false
	handled := map[string]int{}
	var kept *shardq.Delivery
	sub, err := c.Subscribe(context.Background(), fastConfig("g", "x", []string{"t"}, func(ctx context.Context, m *shardq.Delivery) error {
		mu.Lock()
		handled[m.ID]++
		fail := m.ID == "m2" && !failedOnce
		failedOnce = failedOnce || fail
		kept = m
		mu.Unlock()
		// The application's transaction begun on the driver's write pool,
		// or on DB() (on MySQL a pool of its own beside the one the
		// driver's write transactions begin on, whose statements m1's
		// and m2's transactions prepared by now): m3 and u2.
		begin := func(ctx context.Context) (*sql.Tx, error) { return beginWrite(ctx, d) }
		if m.ID == "m3" || m.ID == "u2" {
			begin = func(ctx context.Context) (*sql.Tx, error) { return d.DB().BeginTx(ctx, nil) }
		}
		tx, err := begin(ctx)
		if err != nil {
			return err
		}
		if err := insert(ctx, tx, m.ID); err != nil {
			tx.Rollback()
			return err
		}
		if err := m.AckTx(ctx, tx); err != nil {
			tx.Rollback()
			return err
		}
		if fail { // the process "crashes" before its commit
			tx.Rollback()
			return errors.New("rolled back")
		}
		if err := tx.Commit(); err != nil {
			return err
		}
		if m.ID == "m3" {
			return errors.New("a step after the commit failed") // m3 stays settled: not retried
		}
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "every effect", 10*time.Second, func() bool { return len(list()) == 5 })
	if err := sub.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := list(); !slices.Equal(got, []string{"m1", "m2", "m3", "u1", "u2"}) {
		t.Fatalf("effects %v, want each message's once", got)
	}
	if handled["m2"] != 2 || handled["m3"] != 1 {
		t.Fatalf("m2 handled %d times, m3 %d; want 2 (the rolled-back attempt delivered again) and 1 (committed, then failed)", handled["m2"], handled["m3"])
	}
	tx, err := beginWrite(context.Background(), d)
	if err != nil {
		t.Fatal(err)
	}
	err = kept.AckTx(context.Background(), tx)
	tx.Rollback()
	if !errors.Is(err, shardq.ErrNoTxSettle) {
		t.Fatalf("AckTx of a delivery kept past its handler = %v, want ErrNoTxSettle", err)
	}
	if got := drivertest.Committed(t, d, "t", "x", "k", "g"); got != 3 {
		t.Fatalf("cursor of k at %d, want 3", got)
	}
	var r shardq.ReceivedMessage
	if err := r.AckTx(context.Background(), nil); !errors.Is(err, shardq.ErrNoTxSettle) {
		t.Fatalf("AckTx of a receipt's delivery = %v, want ErrNoTxSettle", err)
	}
}

// A GroupReceiver's AckTx: rolled back it moves nothing; committed it
// moves the cursor before Ack, which then finds it there; under a lost
// lease it fails and the application's transaction rolls back.
func testAckTxReceiver(t *testing.T, open Open) {
	d, c := setup(t, open, nil)
	ctx := context.Background()
	insert, list := effects(t, d)
	publishGroup(t, c, "k", "m1", "m2")
	cursor := func() int64 { t.Helper(); return drivertest.Committed(t, d, "t", "x", "k", "g") }
	clock := newFakeClock(time.Now())
	o := receiverOpts("r")
	o.Clock, o.LeaseTTL = clock.Now, 10*time.Second
	r, err := c.AcceptGroup(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, "k", o)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop(ctx)
	m1, err := r.Receive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	inTx := func(commit bool) error {
		tx, err := beginWrite(ctx, d)
		if err != nil {
			t.Fatal(err)
		}
		if err := insert(ctx, tx, m1.ID); err != nil {
			t.Fatal(err)
		}
		if err := m1.AckTx(ctx, tx); err != nil {
			tx.Rollback()
			return err
		}
		if !commit {
			return tx.Rollback()
		}
		return tx.Commit()
	}
	if err := inTx(false); err != nil {
		t.Fatal(err)
	}
	if got := cursor(); got != 0 || len(list()) != 0 {
		t.Fatalf("after a rollback: cursor %d, effects %v; want neither moved", got, list())
	}
	if err := inTx(true); err != nil {
		t.Fatal(err)
	}
	if got := cursor(); got != 1 || !slices.Equal(list(), []string{"m1"}) {
		t.Fatalf("after a commit: cursor %d, effects %v", got, list())
	}
	// A Nack after a committed AckTx changes nothing: m1 stays settled.
	if err := r.Nack(ctx, m1, errors.New("a step after the commit failed")); err != nil {
		t.Fatalf("Nack after AckTx: %v", err)
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second) // m1 again would wait for its retry on the frozen clock
	m2, err := r.Receive(rctx)
	cancel()
	if err != nil || m2.ID != "m2" {
		t.Fatalf("next = %v, %v; want m2 (m1 settled by its transaction)", m2, err)
	}
	// The lease lapses and another member takes the group.
	clock.Advance(11 * time.Second)
	if _, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: driver.PartitionRef{Tenant: "t", ConsumerGroup: "g", Topic: "x", PartitionKey: "k"}, Owner: "other#1", Now: clock.Now(), TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	tx, err := beginWrite(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	if err := insert(ctx, tx, m2.ID); err != nil {
		t.Fatal(err)
	}
	err = m2.AckTx(ctx, tx)
	tx.Rollback()
	if !errors.Is(err, shardq.ErrLeaseLost) {
		t.Fatalf("AckTx under a lost lease = %v, want ErrLeaseLost", err)
	}
	if got := list(); !slices.Equal(got, []string{"m1"}) || cursor() != 1 {
		t.Fatalf("after a lost lease: effects %v, cursor %d", got, cursor())
	}
}
