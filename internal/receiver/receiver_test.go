// SPDX-License-Identifier: Apache-2.0

package receiver

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/large"
	"github.com/shardq/shardq/internal/settle"
	"github.com/shardq/shardq/internal/telemetry"
	"github.com/shardq/shardq/internal/testdb"
	"github.com/shardq/shardq/internal/wakeup"
)

var ref = driver.PartitionRef{Tenant: "t", ConsumerGroup: "g", Topic: "x", PartitionKey: "k"}

// accept publishes ids to ref's partition of a migrated SQLite file and
// accepts the group there on clk.
func accept(t *testing.T, clk *testdb.Clock, ids ...string) *Receiver {
	t.Helper()
	d := testdb.Migrated(t, testdb.SQLite(t))
	ctx := context.Background()
	var rows []*driver.InsertMessage
	for _, id := range ids {
		rows = append(rows, &driver.InsertMessage{Tenant: ref.Tenant, Topic: ref.Topic, PartitionKey: ref.PartitionKey, ID: id, CreatedAt: clk.Now()})
	}
	tx, err := d.BeginWrite(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.InsertMessages(ctx, tx, rows); err != nil {
		tx.Rollback()
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := d.RegisterGroup(ctx, driver.GroupScope{Tenants: []string{ref.Tenant}, Topic: ref.Topic, ConsumerGroup: ref.ConsumerGroup}, false, clk.Now()); err != nil {
		t.Fatal(err)
	}
	local := &wakeup.Registry{}
	t.Cleanup(local.Close)
	r, err := AcceptGroup(ctx, d, Config{Name: "r", LeaseTTL: 30 * time.Second, IdleTimeout: time.Hour, PollInterval: 10 * time.Millisecond,
		FeedPollInterval: time.Second, LargeWriteTimeout: time.Minute, LargeStalls: &large.Stalls{},
		Settler: settle.Settler{Driver: d, Policy: settle.Policy{MaxAttempts: 5, BackoffMin: 10 * time.Second, BackoffMax: 10 * time.Second}, DLQSuffix: ".dlq", Clock: clk.Now},
		Log:     slog.New(slog.DiscardHandler), Tel: telemetry.New(nil, nil), Local: local,
		Owned: func(driver.PartitionRef, *driver.LeaseHeldError) error { return ErrGroupOwned }}, ref)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(context.Background()) })
	return r
}

func receive(t *testing.T, r *Receiver, wantID string, wantAttempt int) driver.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, attempt, err := r.Receive(ctx)
	if err != nil || m.ID != wantID || attempt != wantAttempt {
		t.Fatalf("Receive = %s attempt %d, %v; want %s attempt %d", m.ID, attempt, err, wantID, wantAttempt)
	}
	return m
}

// A receiver hands out one message at a time, in order: the next only
// once the one in hand is settled.
func TestReceiveHoldsOneMessageAtATime(t *testing.T) {
	clk := testdb.NewClock(time.Now())
	r := accept(t, clk, "m1", "m2")
	m1 := receive(t, r, "m1", 1)
	if _, _, err := r.Receive(context.Background()); !errors.Is(err, ErrUnsettled) {
		t.Fatalf("Receive with m1 in hand: %v, want ErrUnsettled", err)
	}
	if err := r.Ack(context.Background(), m1.Offset); err != nil {
		t.Fatal(err)
	}
	receive(t, r, "m2", 1)
}

// A nacked message comes back as its next attempt once its backoff has
// passed by the receiver's clock, and not before; nothing after it is
// handed out meanwhile.
func TestNackRedeliversAfterItsBackoff(t *testing.T) {
	clk := testdb.NewClock(time.Now())
	r := accept(t, clk, "m1", "m2")
	m1 := receive(t, r, "m1", 1)
	if err := r.Nack(context.Background(), m1.Offset, errors.New("handler failed")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	m, _, err := r.Receive(ctx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Receive before m1's backoff passed: %s, %v; want nothing until ctx ends", m.ID, err)
	}
	clk.Add(10 * time.Second) // the backoff, within the lease
	receive(t, r, "m1", 2)
}

// Once the lease may have expired by the receiver's clock, it hands out
// nothing and closes: another consumer may hold the group by then.
func TestReceivePastTheLeaseCloses(t *testing.T) {
	clk := testdb.NewClock(time.Now())
	r := accept(t, clk, "m1")
	clk.Add(31 * time.Second)
	m, _, err := r.Receive(context.Background())
	if !errors.Is(err, ErrReceiverClosed) || !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("Receive past the lease: %s, %v; want ErrReceiverClosed wrapping ErrLeaseLost", m.ID, err)
	}
	select {
	case <-r.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Done stayed open")
	}
}
