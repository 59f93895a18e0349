// SPDX-License-Identifier: Apache-2.0

package publish

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/telemetry"
	"github.com/shardq/shardq/internal/testdb"
	"github.com/shardq/shardq/internal/wakeup"
)

// heldInserts is the real database with the batches that hold the
// message id hold waiting for release.
type heldInserts struct {
	driver.Driver
	hold    string
	release chan struct{}
}

func (d heldInserts) InsertMessages(ctx context.Context, tx driver.DBTX, msgs []*driver.InsertMessage) error {
	for _, m := range msgs {
		if m.ID == d.hold {
			select {
			case <-d.release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	return d.Driver.InsertMessages(ctx, tx, msgs)
}

func newTestProducer(t *testing.T, drv driver.Driver, cfg ProducerConfig) *Producer {
	t.Helper()
	p, err := New(drv, telemetry.New(nil, nil), &wakeup.Registry{}, Config{MaxPayloadBytes: 1 << 20, MaxDelay: time.Hour,
		MaxBatch: 100, MaxInflight: 1, Timeout: time.Minute, Tenants: []string{"t"}, Clock: time.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return NewProducer(p, cfg)
}

// handedIn waits until n messages are handed in and unresolved: the
// producer's own count, polled (bounded), since a Publish waiting for
// room does not return.
func handedIn(t *testing.T, pr *Producer, n int) {
	t.Helper()
	for range 10_000 {
		pr.mu.Lock()
		got := len(pr.pending)
		pr.mu.Unlock()
		if got == n {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("%d messages never handed in", n)
}

// A message handed in behind a failure of its key and still waiting for
// room in the buffer when the key is resumed fails: written after the
// resume, it would be stored after what the caller publishes again.
func TestResumeReachesAMessageWaitingForRoom(t *testing.T) {
	d := testdb.Migrated(t, testdb.SQLite(t))
	release := make(chan struct{})
	pr := newTestProducer(t, heldInserts{d, "x", release}, ProducerConfig{MaxBatch: 1, MaxBatchBytes: 1 << 20, Lanes: 1,
		MaxBuffered: 1, MaxBufferedBytes: 1 << 20})
	ctx := context.Background()
	msg := func(key, id string) Message { return Message{Tenant: "t", Topic: "x", PartitionKey: key, ID: id} }
	x := pr.Publish(ctx, msg("j", "x")) // its write is held: the buffer of one stays full
	handedIn(t, pr, 1)
	aCtx, cancel := context.WithCancel(ctx)
	futures := make(chan *Future, 2)
	go func() { futures <- pr.Publish(aCtx, msg("k", "a")) }() // waits for room
	handedIn(t, pr, 2)
	go func() { futures <- pr.Publish(ctx, msg("k", "b")) }() // waits for room behind a
	handedIn(t, pr, 3)
	cancel() // a fails at hand-in: k pauses
	a := <-futures
	if _, err := a.Wait(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("a: %v, want its wait for room cancelled", err)
	}
	pr.Resume("t", "x", "k")
	close(release)
	if _, err := x.Wait(ctx); err != nil {
		t.Fatalf("x: %v", err)
	}
	b := <-futures
	if _, err := b.Wait(ctx); !errors.Is(err, ErrKeyPaused) || !errors.Is(err, errResumed) {
		t.Fatalf("b, handed in before a failed and resumed while it waited for room: %v, want ErrKeyPaused", err)
	}
	if _, err := pr.Publish(ctx, msg("k", "a-again")).Wait(ctx); err != nil {
		t.Fatalf("a-again after Resume: %v", err)
	}
	if err := pr.Close(ctx); err != nil {
		t.Fatal(err)
	}
	msgs, err := d.FetchAfter(ctx, driver.TopicPartition{Tenant: "t", Topic: "x", PartitionKey: "k"}, 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range msgs {
		got = append(got, m.ID)
	}
	if !slices.Equal(got, []string{"a-again"}) {
		t.Fatalf("key k stored %v, want [a-again]", got)
	}
}

// Close whose ctx ends before the flush aborts: the write in flight is
// cancelled, what is queued behind it fails without a write, and Close
// returns once the lanes have ended.
func TestCloseAbortsWhenItsContextEnds(t *testing.T) {
	d := testdb.Migrated(t, testdb.SQLite(t))
	pr := newTestProducer(t, heldInserts{d, "x", make(chan struct{})}, ProducerConfig{MaxBatch: 1, MaxBatchBytes: 1 << 20, Lanes: 1,
		MaxBuffered: 10, MaxBufferedBytes: 1 << 20})
	ctx := context.Background()
	x := pr.Publish(ctx, Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "x"}) // held until cancelled
	y := pr.Publish(ctx, Message{Tenant: "t", Topic: "x", PartitionKey: "j", ID: "y"}) // queued behind x
	handedIn(t, pr, 2)
	short, cancel := context.WithCancel(ctx)
	cancel()
	if err := pr.Close(short); !errors.Is(err, context.Canceled) {
		t.Fatalf("Close: %v, want its ctx's error", err)
	}
	for name, f := range map[string]*Future{"x": x, "y": y} {
		select {
		case <-f.Done():
		default:
			t.Fatalf("%s unresolved when Close returned", name)
		}
		if _, err := f.Wait(ctx); !errors.Is(err, errAborted) {
			t.Fatalf("%s: %v, want the abort", name, err)
		}
	}
	msgs, err := d.FetchAfter(ctx, driver.TopicPartition{Tenant: "t", Topic: "x", PartitionKey: "j"}, 0, 10)
	if err != nil || len(msgs) != 0 {
		t.Fatalf("y stored after the abort: %v, %v", msgs, err)
	}
}
