// SPDX-License-Identifier: Apache-2.0

package publish

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/telemetry"
	"github.com/shardq/shardq/internal/testdb"
	"github.com/shardq/shardq/internal/wakeup"
)

// heldInserts is the real database with the batches that hold the
// message id hold waiting for release, and those that hold fail failing.
type heldInserts struct {
	driver.Driver
	hold    string
	release chan struct{}
	fail    string
}

var errInjected = errors.New("injected: the insert failed")

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
	for _, m := range msgs {
		if d.fail != "" && m.ID == d.fail {
			return errInjected
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
// room in the buffer fails (ErrKeyPaused), whether the pause or the key's
// Resume reaches it first: written after the resume, it would be stored
// after what the caller publishes again.
func TestWaitersOfAPausedKeyFail(t *testing.T) {
	d := testdb.Migrated(t, testdb.SQLite(t))
	release := make(chan struct{})
	pr := newTestProducer(t, heldInserts{Driver: d, hold: "x", release: release}, ProducerConfig{MaxBatch: 1, MaxBatchBytes: 1 << 20, Lanes: 1,
		MaxBuffered: 1, MaxBufferedBytes: 1 << 20})
	ctx := context.Background()
	msg := func(key, id string) Message { return Message{Tenant: "t", Topic: "x", PartitionKey: key, ID: id} }
	x := pr.Publish(ctx, msg("j", "x")) // its write is held: the buffer of one stays full
	handedIn(t, pr, 1)
	aCtx, cancel := context.WithCancel(ctx)
	as, bs := make(chan *Future, 1), make(chan *Future, 1)
	go func() { as <- pr.Publish(aCtx, msg("k", "a")) }() // waits for room
	handedIn(t, pr, 2)
	go func() { bs <- pr.Publish(ctx, msg("k", "b")) }() // waits for room behind a
	handedIn(t, pr, 3)
	cancel() // a fails at hand-in: k pauses
	a := <-as
	if _, err := a.Wait(ctx); !errors.Is(err, context.Canceled) || errors.Is(err, ErrKeyPaused) {
		t.Fatalf("a: %v, want its wait for room cancelled", err)
	}
	pr.Resume("t", "x", "k")
	close(release)
	if _, err := x.Wait(ctx); err != nil {
		t.Fatalf("x: %v", err)
	}
	b := <-bs
	if _, err := b.Wait(ctx); !errors.Is(err, ErrKeyPaused) {
		t.Fatalf("b, handed in behind a's failure, waiting for room: %v, want ErrKeyPaused", err)
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
	pr := newTestProducer(t, heldInserts{Driver: d, hold: "x", release: make(chan struct{})}, ProducerConfig{MaxBatch: 1, MaxBatchBytes: 1 << 20, Lanes: 1,
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

// Waiters take room in the order they came: a large message waiting for
// room is not passed over by smaller ones that came after it.
func TestWaitersTakeRoomInOrder(t *testing.T) {
	d := testdb.Migrated(t, testdb.SQLite(t))
	release := make(chan struct{})
	pr := newTestProducer(t, heldInserts{Driver: d, hold: "x", release: release}, ProducerConfig{MaxBatch: 1, MaxBatchBytes: 1 << 20, Lanes: 1,
		MaxBuffered: 100, MaxBufferedBytes: 1000})
	ctx := context.Background()
	msg := func(id string, n int) Message {
		return Message{Tenant: "t", Topic: "x", PartitionKey: id, ID: id, Payload: make([]byte, n)}
	}
	x := pr.Publish(ctx, msg("x", 600)) // held: 600 of 1,000 bytes
	handedIn(t, pr, 1)
	futures := make(chan *Future, 2)
	go func() { futures <- pr.Publish(ctx, msg("big", 900)) }() // waits for x
	handedIn(t, pr, 2)
	smallCtx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	// 100 bytes fit beside x, but big came first.
	if _, err := pr.Publish(smallCtx, msg("small", 100)).Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a small message behind a waiting large one: %v, want it to wait (until its ctx ended)", err)
	}
	close(release)
	if _, err := x.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := (<-futures).Wait(ctx); err != nil {
		t.Fatalf("big: %v", err)
	}
	if err := pr.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// A failed batch pauses all its keys before any of its messages is
// resolved: a Resume that follows the first failure the caller sees is
// not undone by the pause of a later message of the batch.
func TestResumeAfterAFailedBatchHolds(t *testing.T) {
	d := testdb.Migrated(t, testdb.SQLite(t))
	release := make(chan struct{})
	pr := newTestProducer(t, heldInserts{Driver: d, hold: "a0", release: release, fail: "a0"}, ProducerConfig{MaxBatch: 100,
		MaxBatchBytes: 1 << 20, Lanes: 1, MaxBuffered: 1000, MaxBufferedBytes: 1 << 20})
	ctx := context.Background()
	msg := func(id string) Message { return Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: id} }
	first := pr.Publish(ctx, msg("a0")) // held, then fails: the others queue behind it
	for i := 1; i < 100; i++ {
		pr.Publish(ctx, msg(fmt.Sprintf("a%d", i)))
	}
	handedIn(t, pr, 100)
	resumed := make(chan struct{})
	go func() {
		<-first.Done()
		pr.Resume("t", "x", "k")
		close(resumed)
	}()
	close(release)
	<-resumed
	if err := pr.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pr.Publish(ctx, msg("after")).Wait(ctx); err != nil {
		t.Fatalf("a message published after the Resume: %v", err)
	}
	if err := pr.Close(ctx); err != nil {
		t.Fatal(err)
	}
}
