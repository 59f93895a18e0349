// SPDX-License-Identifier: Apache-2.0

package shardq_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
)

// seen is one delivery as a handler saw it.
type seen struct {
	id, key string
	large   bool
	size    int64
	sum     string
	chunky  bool // carried a shardq-large- header: a raw chunk or marker
}

// recorder is a subscriber's handler that reads every body whole.
type recorder struct {
	mu   sync.Mutex
	got  []seen
	fail func(d *shardq.Delivery) error
	note chan struct{}
}

func newRecorder() *recorder { return &recorder{note: make(chan struct{}, 100)} }

func (r *recorder) handle(t *testing.T) shardq.Handler {
	return func(ctx context.Context, d *shardq.Delivery) error {
		sum, n := sumOf(t, d.Body())
		_, chunky := d.Headers[shardq.HeaderLargeID]
		r.mu.Lock()
		r.got = append(r.got, seen{id: d.ID, key: d.PartitionKey, large: d.IsLarge(), size: n, sum: sum, chunky: chunky})
		r.mu.Unlock()
		select {
		case r.note <- struct{}{}:
		default:
		}
		if n != d.Size {
			t.Errorf("%s: read %d bytes, Size says %d", d.ID, n, d.Size)
		}
		if r.fail != nil {
			return r.fail(d)
		}
		return nil
	}
}

// waitFor waits until the handler has seen id.
func (r *recorder) waitFor(t *testing.T, id string) seen {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		r.mu.Lock()
		for _, s := range r.got {
			if s.id == id {
				r.mu.Unlock()
				return s
			}
		}
		r.mu.Unlock()
		select {
		case <-r.note:
		case <-deadline:
			t.Fatalf("%s never delivered; got %+v", id, r.snapshot())
		}
	}
}

func (r *recorder) snapshot() []seen {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]seen(nil), r.got...)
}

// stalledWrite starts a PublishLarge of n chunks of 64 KiB that stops
// after its first transactions until release is closed; it returns once
// those are stored.
func stalledWrite(t *testing.T, c *shardq.Client, msg shardq.Message, seed uint64) (release func(), done <-chan error) {
	t.Helper()
	stall, rel := make(chan struct{}), make(chan struct{})
	body := io.MultiReader(payload(64<<10*4, seed), readerFunc(func([]byte) (int, error) {
		close(stall)
		<-rel
		return 0, io.EOF
	}))
	ch := make(chan error, 1)
	go func() {
		_, err := c.PublishLarge(context.Background(), msg, body, &shardq.LargeOptions{ChunkSize: 64 << 10, ChunksPerTx: 2})
		ch <- err
	}()
	<-stall
	return sync.OnceFunc(func() { close(rel) }), ch
}

// A subscriber's handler gets a large message once, whole, as a stream,
// in order with its partition's other messages, and only after its end
// marker is stored: never a raw chunk, not even while the writer runs.
func TestSubscriberGetsLargeMessagesWhole(t *testing.T) {
	eachDatabase(t, func(t *testing.T, _ string, _ driver.Driver, c *shardq.Client) {
		ctx := context.Background()
		if _, err := c.Publish(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "before", Payload: []byte("b")}); err != nil {
			t.Fatal(err)
		}
		release, done := stalledWrite(t, c, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "big"}, 7)
		defer release()
		rec := newRecorder()
		sub, err := c.Subscribe(ctx, shardq.SubscriberConfig{ConsumerGroup: "g", Topic: "x", Tenants: []string{"t"}, Handler: rec.handle(t)})
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Stop(ctx)
		rec.waitFor(t, "before")
		// Another partition moves on meanwhile: the subscriber runs.
		if _, err := c.Publish(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "other", ID: "beside", Payload: []byte("o")}); err != nil {
			t.Fatal(err)
		}
		rec.waitFor(t, "beside")
		release()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if _, err := c.Publish(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "after", Payload: []byte("a")}); err != nil {
			t.Fatal(err)
		}
		rec.waitFor(t, "after")
		want, _ := sumOf(t, payload(64<<10*4, 7))
		var order []string
		for _, s := range rec.snapshot() {
			if s.chunky {
				t.Errorf("a handler saw a raw chunk or end marker: %+v", s)
			}
			if s.key != "k" {
				continue
			}
			order = append(order, s.id)
			if s.id == "big" && (!s.large || s.size != 64<<10*4 || s.sum != want) {
				t.Errorf("the large message as delivered: %+v; want %d bytes with SHA-256 %s", s, 64<<10*4, want)
			}
		}
		if len(order) != 3 || order[0] != "before" || order[1] != "big" || order[2] != "after" {
			t.Fatalf("partition k delivered %v; want [before big after], each once", order)
		}
	})
}

// A batch handler gets a large message alone, as a batch of one, between
// the batches of ordinary messages around it.
func TestBatchSubscriberGetsLargeMessagesAlone(t *testing.T) {
	eachDatabase(t, func(t *testing.T, _ string, _ driver.Driver, c *shardq.Client) {
		ctx := context.Background()
		publish := func(id string) {
			if _, err := c.Publish(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: id, Payload: []byte(id)}); err != nil {
				t.Fatal(err)
			}
		}
		publish("a1")
		publish("a2")
		if _, err := c.PublishLarge(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "big"}, payload(300<<10, 8),
			&shardq.LargeOptions{ChunkSize: 64 << 10}); err != nil {
			t.Fatal(err)
		}
		publish("b1")
		var mu sync.Mutex
		var batches [][]string
		got := make(chan struct{}, 10)
		sub, err := c.Subscribe(ctx, shardq.SubscriberConfig{ConsumerGroup: "g", Topic: "x", Tenants: []string{"t"},
			BatchHandler: func(ctx context.Context, ds []*shardq.Delivery) error {
				var ids []string
				for _, d := range ds {
					if _, n := sumOf(t, d.Body()); n != d.Size {
						t.Errorf("%s: read %d of %d", d.ID, n, d.Size)
					}
					ids = append(ids, d.ID)
				}
				mu.Lock()
				batches = append(batches, ids)
				mu.Unlock()
				got <- struct{}{}
				return nil
			}})
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Stop(ctx)
		for range 3 {
			select {
			case <-got:
			case <-time.After(30 * time.Second):
				t.Fatalf("batches so far: %v", batches)
			}
		}
		mu.Lock()
		defer mu.Unlock()
		if len(batches) != 3 || len(batches[0]) != 2 || len(batches[1]) != 1 || batches[1][0] != "big" || len(batches[2]) != 1 || batches[2][0] != "b1" {
			t.Fatalf("batches %v; want [[a1 a2] [big] [b1]]", batches)
		}
	})
}

// Dead-lettering a large message moves it whole: the dead-letter topic
// holds its chunks and end marker, lists it as one entry with its size,
// hands it to a reader whole, and requeue puts it back whole.
func TestLargeDeadLetterWhole(t *testing.T) {
	eachDatabase(t, func(t *testing.T, _ string, _ driver.Driver, c *shardq.Client) {
		ctx := context.Background()
		const size = 300 << 10
		want, _ := sumOf(t, payload(size, 9))
		if _, err := c.PublishLarge(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "big", Headers: map[string]string{"kind": "report"}},
			payload(size, 9), &shardq.LargeOptions{ChunkSize: 64 << 10, ChunksPerTx: 2}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Publish(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "next", Payload: []byte("n")}); err != nil {
			t.Fatal(err)
		}
		rec := newRecorder()
		rec.fail = func(d *shardq.Delivery) error {
			if d.ID == "big" {
				return shardq.DeadLetter(errors.New("cannot render"))
			}
			return nil
		}
		sub, err := c.Subscribe(ctx, shardq.SubscriberConfig{ConsumerGroup: "g", Topic: "x", Tenants: []string{"t"}, Handler: rec.handle(t)})
		if err != nil {
			t.Fatal(err)
		}
		rec.waitFor(t, "next")
		if err := sub.Stop(ctx); err != nil {
			t.Fatal(err)
		}

		dls, err := c.Admin().DeadLetters(ctx, shardq.DeadLetterRequest{Scope: shardq.Scope{Tenants: []string{"t"}}, Topic: "x"})
		if err != nil || len(dls) != 1 || dls[0].ID != "big" || dls[0].Headers[shardq.HeaderLargeBytes] != "307200" || dls[0].Headers["kind"] != "report" {
			t.Fatalf("dead letters %+v, %v; want the large message as one entry with its size", dls, err)
		}
		// The dead-letter topic's reader gets it whole.
		r, err := c.AcceptGroup(ctx, shardq.GroupRef{Tenant: "t", Topic: "x.dlq", ConsumerGroup: "ops"}, "k", nil)
		if err != nil {
			t.Fatal(err)
		}
		d, err := r.Receive(ctx)
		if err != nil || d.ID != "big" || !d.IsLarge() || d.Headers[shardq.HeaderDLQLastError] != "cannot render" {
			t.Fatalf("the dead letter as read: %+v, %v", d, err)
		}
		if sum, n := sumOf(t, d.Body()); sum != want || n != size {
			t.Fatalf("the dead letter's body: %d bytes, %s; want %d, %s", n, sum, size, want)
		}
		if err := r.Stop(ctx); err != nil { // unsettled: it stays
			t.Fatal(err)
		}

		if _, err := c.Admin().Requeue(ctx, shardq.MessageRef{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "big"}, ""); err != nil {
			t.Fatal(err)
		}
		if dls, err := c.Admin().DeadLetters(ctx, shardq.DeadLetterRequest{Scope: shardq.Scope{Tenants: []string{"t"}}, Topic: "x"}); err != nil || len(dls) != 0 {
			t.Fatalf("dead letters after the requeue: %+v, %v", dls, err)
		}
		rec.fail = nil
		sub, err = c.Subscribe(ctx, shardq.SubscriberConfig{ConsumerGroup: "g", Topic: "x", Tenants: []string{"t"}, Handler: rec.handle(t)})
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Stop(ctx)
		deadline := time.After(30 * time.Second)
		for {
			var bigs []seen
			for _, s := range rec.snapshot() {
				if s.id == "big" {
					bigs = append(bigs, s)
				}
			}
			if len(bigs) == 2 {
				if s := bigs[1]; !s.large || s.size != size || s.sum != want {
					t.Fatalf("the requeued message: %+v", s)
				}
				break
			}
			select {
			case <-rec.note:
			case <-deadline:
				t.Fatalf("the requeued message never came back whole: %+v", rec.snapshot())
			}
		}
	})
}

// TestLargeWriteAbandonedAcrossReaders: a stalled write is given up after
// LargeWriteTimeout of the process's readers waiting on it, even when no
// one reader waits that long (each receiver here gives its group back
// after 100 ms, as a fault or an idle release ends a worker), and while
// other messages move its partition's head (its own chunks are its
// progress).
func TestLargeWriteAbandonedAcrossReaders(t *testing.T) {
	eachDatabase(t, func(t *testing.T, _ string, drv driver.Driver, base *shardq.Client) {
		ctx := context.Background()
		c, err := shardq.NewClient(drv, &shardq.Config{LargeWriteTimeout: 500 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		release, done := stalledWrite(t, base, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "r", ID: "stuck"}, 10)
		defer release()
		for start, i := time.Now(), 0; ; i++ {
			if _, err := base.Publish(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "r", ID: fmt.Sprintf("behind-%d", i), Payload: []byte("b")}); err != nil {
				t.Fatal(err)
			}
			r, err := c.AcceptGroup(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, "r", nil)
			if err != nil {
				t.Fatal(err)
			}
			short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			_, err = r.Receive(short)
			cancel()
			if err := r.Stop(ctx); err != nil {
				t.Fatal(err)
			}
			// Given up, the write is passed over, and the message behind it
			// delivered in the same Receive.
			if m, _, _ := drv.GetMessage(ctx, driver.MessageRef{Tenant: "t", Topic: "x", PartitionKey: "r", ID: "stuck"}); m != nil {
				if m.Headers[shardq.HeaderLargeAborted] != "true" {
					t.Fatalf("the end marker the readers stored: %v", m.Headers)
				}
				break
			}
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Receive with nothing complete: %v (iteration %d)", err, i)
			}
			if time.Since(start) > 15*time.Second {
				t.Fatal("15 s of receivers, each waiting 100 ms, never gave up a write stalled for 500 ms")
			}
		}
		release()
		if err := <-done; !errors.Is(err, shardq.ErrLargeAbandoned) {
			t.Fatalf("the writer going on after it was given up: %v, want ErrLargeAbandoned", err)
		}
	})
}

// A large write that makes no progress for LargeWriteTimeout is given up
// by a reader waiting for it (a group receiver, and a subscriber): it
// stores an aborted end marker and passes over the chunks; the writer,
// when it goes on, fails with ErrLargeAbandoned, and so does a resume
// under the same id.
func TestLargeWriteAbandoned(t *testing.T) {
	eachDatabase(t, func(t *testing.T, url string, drv driver.Driver, base *shardq.Client) {
		ctx := context.Background()
		c, err := shardq.NewClient(drv, &shardq.Config{LargeWriteTimeout: 500 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()

		// A group receiver waits, with short contexts that add up.
		release, done := stalledWrite(t, base, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "r", ID: "stuck"}, 10)
		defer release()
		r, err := c.AcceptGroup(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, "r", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Stop(ctx)
		for start := time.Now(); ; {
			short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			d, err := r.Receive(short)
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Receive with nothing complete: %+v, %v", d, err)
			}
			if m, _, _ := drv.GetMessage(ctx, driver.MessageRef{Tenant: "t", Topic: "x", PartitionKey: "r", ID: "stuck"}); m != nil {
				if m.Headers[shardq.HeaderLargeAborted] != "true" {
					t.Fatalf("the end marker the reader stored: %v", m.Headers)
				}
				break
			}
			if time.Since(start) > 30*time.Second {
				t.Fatal("the receiver never gave the write up")
			}
		}
		release()
		if err := <-done; !errors.Is(err, shardq.ErrLargeAbandoned) {
			t.Fatalf("the writer going on after it was given up: %v, want ErrLargeAbandoned", err)
		}
		if _, err := base.PublishLarge(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "r", ID: "stuck"}, payload(100, 10), nil); !errors.Is(err, shardq.ErrLargeAbandoned) {
			t.Fatalf("a resume under the abandoned id: %v, want ErrLargeAbandoned", err)
		}
		if _, err := base.Publish(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "r", ID: "next", Payload: []byte("n")}); err != nil {
			t.Fatal(err)
		}
		if d, err := r.Receive(ctx); err != nil || d.ID != "next" {
			t.Fatalf("after the abandoned write: %+v, %v; want the next message", d, err)
		}
		if strings.HasPrefix(url, "sqlite:") {
			passOverFailsThenResumes(t, drv, c)
		}

		// A subscriber's worker waits, then passes over.
		release2, done2 := stalledWrite(t, base, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "s", ID: "stuck2"}, 11)
		defer release2()
		if _, err := base.Publish(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "s", ID: "queued", Payload: []byte("q")}); err != nil {
			t.Fatal(err)
		}
		rec := newRecorder()
		sub, err := c.Subscribe(ctx, shardq.SubscriberConfig{ConsumerGroup: "g2", Topic: "x", Tenants: []string{"t"}, Handler: rec.handle(t)})
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Stop(ctx)
		rec.waitFor(t, "queued")
		release2()
		if err := <-done2; !errors.Is(err, shardq.ErrLargeAbandoned) {
			t.Fatalf("the second writer: %v, want ErrLargeAbandoned", err)
		}
		for _, s := range rec.snapshot() {
			if s.key == "s" && s.id != "queued" || s.chunky {
				t.Errorf("delivered from an abandoned write: %+v", s)
			}
		}
	})
}

// passOverFailsThenResumes: a receiver of another group passes over the
// abandoned write at key r; when the ack of that pass-over fails (an
// SQLite trigger refuses the group's cursor write), the receive returns
// the error and the next receive starts there again, rather than refusing
// as if a message were in hand.
func passOverFailsThenResumes(t *testing.T, drv driver.Driver, c *shardq.Client) {
	ctx := context.Background()
	for _, op := range []string{"INSERT", "UPDATE"} {
		if _, err := drv.DB().ExecContext(ctx, "CREATE TRIGGER refuse_cursor_"+op+" BEFORE "+op+" ON queue_offsets"+
			" WHEN NEW.consumer_group = 'g-pass' BEGIN SELECT RAISE(ABORT, 'the cursor write is refused'); END"); err != nil {
			t.Fatal(err)
		}
	}
	r, err := c.AcceptGroup(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g-pass"}, "r", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop(ctx)
	if d, err := r.Receive(ctx); err == nil || !strings.Contains(err.Error(), "the cursor write is refused") {
		t.Fatalf("receive whose pass-over cannot ack: %+v, %v; want the refusal", d, err)
	}
	for _, op := range []string{"INSERT", "UPDATE"} {
		if _, err := drv.DB().ExecContext(ctx, "DROP TRIGGER refuse_cursor_"+op); err != nil {
			t.Fatal(err)
		}
	}
	if d, err := r.Receive(ctx); err != nil || d.ID != "next" {
		t.Fatalf("receive after the failed pass-over: %+v, %v; want the next message", d, err)
	}
}

// A receive with receipts hands out a large message alone, as one entry
// with its size and digest, after the ordinary messages before it (which
// come in their own receive); Body reads it by the receipt; an ack
// passes every chunk, and a nack counts one failed attempt.
func TestReceiptsHandOutLargeMessagesWhole(t *testing.T) {
	eachDatabase(t, func(t *testing.T, _ string, _ driver.Driver, c *shardq.Client) {
		ctx := context.Background()
		const size = 250 << 10
		want, _ := sumOf(t, payload(size, 12))
		publish := func(id string) {
			if _, err := c.Publish(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: id, Payload: []byte(id)}); err != nil {
				t.Fatal(err)
			}
		}
		publish("before")
		if _, err := c.PublishLarge(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "big"}, payload(size, 12),
			&shardq.LargeOptions{ChunkSize: 64 << 10}); err != nil {
			t.Fatal(err)
		}
		publish("after")
		rc, err := c.Receipts(nil)
		if err != nil {
			t.Fatal(err)
		}
		g := shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}
		receive := func() []shardq.ReceivedMessage {
			t.Helper()
			got, err := rc.Receive(ctx, shardq.ReceiveRequest{Tenant: "t", Topic: "x", ConsumerGroup: "g", PartitionKey: "k", Max: 10})
			if err != nil {
				t.Fatal(err)
			}
			return got.Messages
		}
		if ms := receive(); len(ms) != 1 || ms[0].ID != "before" {
			t.Fatalf("first receive: %+v; want the ordinary message before the large one, alone", ms)
		} else if err := rc.Ack(ctx, g, ms[0].Receipt); err != nil {
			t.Fatal(err)
		}
		ms := receive()
		if len(ms) != 1 || ms[0].ID != "big" || !ms[0].IsLarge() || ms[0].Size != size || ms[0].SHA256 != want || ms[0].Payload != nil {
			t.Fatalf("second receive: %+v; want the large message alone, whole", ms)
		}
		if sum, n := sumOf(t, ms[0].Body()); sum != want || n != size {
			t.Fatalf("its body: %d bytes, %s", n, sum)
		}
		if err := rc.Nack(ctx, g, ms[0].Receipt, shardq.NackOptions{Reason: "later"}); err != nil {
			t.Fatal(err)
		}
		ms = receive()
		if len(ms) != 1 || ms[0].ID != "big" || ms[0].Attempt != 2 {
			t.Fatalf("after a nack: %+v; want the large message again, attempt 2", ms)
		}
		b, err := rc.Body(ctx, g, ms[0].Receipt)
		if err != nil {
			t.Fatal(err)
		}
		if sum, n := sumOf(t, b); sum != want || n != size || b.SHA256 != want {
			t.Fatalf("Body by the receipt: %d bytes, %s (%+v)", n, sum, b)
		}
		if err := rc.Ack(ctx, g, ms[0].Receipt); err != nil {
			t.Fatal(err)
		}
		if ms := receive(); len(ms) != 1 || ms[0].ID != "after" {
			t.Fatalf("after the ack: %+v; want the next message, every chunk passed", ms)
		}
	})
}

// Retention never cuts inside a large message: chunks older than the
// maximum age stay while their end marker is younger, and go with it
// once it is old enough.
func TestRetentionKeepsLargeMessagesWhole(t *testing.T) {
	eachDatabase(t, func(t *testing.T, _ string, drv driver.Driver, _ *shardq.Client) {
		ctx := context.Background()
		var mu sync.Mutex
		now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
		clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
		advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
		c, err := shardq.NewClient(drv, &shardq.Config{Clock: clock})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		release, done := stalledWrite(t, c, shardq.Message{Tenant: "t", Topic: "x.dlq", PartitionKey: "k", ID: "big"}, 13)
		advance(2 * time.Hour) // the end marker is two hours younger than the chunks
		release()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		stored := func() int {
			ms, err := c.Admin().Messages(ctx, shardq.BrowseRequest{Tenant: "t", Topic: "x.dlq", PartitionKey: "k", OnePartition: true})
			if err != nil {
				t.Fatal(err)
			}
			return len(ms)
		}
		pass := func() {
			t.Helper()
			if _, err := c.Admin().RunRetention(ctx, shardq.Scope{Tenants: []string{"t"}},
				shardq.RetentionConfig{DeadLetters: shardq.RetentionPolicy{MinRetention: 30 * time.Minute, MaxRetention: time.Hour}}); err != nil {
				t.Fatal(err)
			}
		}
		pass()
		if n := stored(); n != 5 {
			t.Fatalf("after a pass between the chunks' age and the end marker's: %d messages, want the 4 chunks and the end marker", n)
		}
		advance(2 * time.Hour)
		pass()
		if n := stored(); n != 0 {
			t.Fatalf("after a pass past the end marker's age: %d messages, want none", n)
		}
	})
}

// A large message whose stored bytes differ from its end marker's digest
// is a failed delivery like any other: its handler's read fails with
// ErrLargeCorrupt, the attempt is counted and retried, and after the last
// one the message is dead-lettered (whole); the partition goes on.
func TestCorruptLargeMessageIsAFailedDelivery(t *testing.T) {
	eachDatabase(t, func(t *testing.T, _ string, drv driver.Driver, c *shardq.Client) {
		ctx := context.Background()
		if _, err := c.PublishLarge(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "big"}, payload(200<<10, 14),
			&shardq.LargeOptions{ChunkSize: 64 << 10}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Publish(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "next", Payload: []byte("n")}); err != nil {
			t.Fatal(err)
		}
		// Same size, other bytes.
		if _, err := drv.DB().ExecContext(ctx, "UPDATE queue_messages SET payload = ? WHERE tenant = 't' AND topic = 'x' AND id = 'big#1'",
			make([]byte, 64<<10)); err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		var errs []error
		rec := newRecorder()
		sub, err := c.Subscribe(ctx, shardq.SubscriberConfig{ConsumerGroup: "g", Topic: "x", Tenants: []string{"t"}, MaxAttempts: 2,
			BackoffMin: time.Millisecond, BackoffMax: time.Millisecond,
			Handler: func(ctx context.Context, d *shardq.Delivery) error {
				_, err := io.Copy(io.Discard, d.Body())
				if err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return err
				}
				return rec.handle(t)(ctx, d)
			}})
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Stop(ctx)
		rec.waitFor(t, "next")
		mu.Lock()
		if len(errs) != 2 || !errors.Is(errs[0], shardq.ErrLargeCorrupt) {
			t.Fatalf("handler errors %v; want ErrLargeCorrupt on each of the 2 attempts", errs)
		}
		mu.Unlock()
		dls, err := c.Admin().DeadLetters(ctx, shardq.DeadLetterRequest{Scope: shardq.Scope{Tenants: []string{"t"}}, Topic: "x"})
		if err != nil || len(dls) != 1 || dls[0].ID != "big" || dls[0].Headers[shardq.HeaderDLQAttempts] != "2" {
			t.Fatalf("dead letters %+v, %v; want big after 2 attempts", dls, err)
		}
	})
}

// An end marker stored under a large message's id before its chunk 0 (the
// copy a requeue moves last, after the chunks) does not complete it: a
// reader waits for the one after the chunks.
func TestEndMarkerBeforeTheChunksIsNotItsEnd(t *testing.T) {
	eachDatabase(t, func(t *testing.T, _ string, drv driver.Driver, c *shardq.Client) {
		ctx := context.Background()
		body := []byte("a payload of two chunks")
		sum := sha256.Sum256(body)
		end := func() *driver.InsertMessage {
			return &driver.InsertMessage{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "big", CreatedAt: time.Now().UTC().Truncate(time.Microsecond),
				Headers: map[string]string{shardq.HeaderLargeChunks: "2", shardq.HeaderLargeBytes: fmt.Sprint(len(body)), shardq.HeaderLargeSHA256: hex.EncodeToString(sum[:])}}
		}
		chunk := func(i int, p []byte) *driver.InsertMessage {
			return &driver.InsertMessage{Tenant: "t", Topic: "x", PartitionKey: "k", ID: fmt.Sprintf("big#%d", i), Payload: p,
				CreatedAt: time.Now().UTC().Truncate(time.Microsecond), Headers: map[string]string{shardq.HeaderLargeID: "big", shardq.HeaderLargeChunk: fmt.Sprint(i)}}
		}
		insert := func(ms ...*driver.InsertMessage) {
			t.Helper()
			tx, err := drv.BeginWrite(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := drv.InsertMessages(ctx, tx, ms); err != nil {
				tx.Rollback()
				t.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
		}
		insert(end(), chunk(0, body[:10]), chunk(1, body[10:])) // the stale end marker first
		r, err := c.AcceptGroup(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, "k", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Stop(ctx)
		// The stale marker itself comes first: an end marker without its
		// chunks, passed over. Then chunk 0 waits.
		short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		d, err := r.Receive(short)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Receive with the end marker before the chunks: %+v, %v; want it to wait", d, err)
		}
		if _, err := c.Admin().Delete(ctx, shardq.MessageRef{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "big"}); err != nil {
			t.Fatal(err)
		}
		insert(end()) // moved: now after the chunks
		if d, err = r.Receive(ctx); err != nil || !d.IsLarge() {
			t.Fatalf("after the end marker moved: %+v, %v", d, err)
		}
		if got, err := io.ReadAll(d.Body()); err != nil || string(got) != string(body) {
			t.Fatalf("body %q, %v", got, err)
		}
	})
}

// Writes in progress do not hide ready groups from a receive of the next
// free group, although their chunk 0 is older: more of them than one
// page of ready groups, and a message published after them still comes.
func TestReceiveNextGroupPastWritesInProgress(t *testing.T) {
	eachDatabase(t, func(t *testing.T, _ string, _ driver.Driver, c *shardq.Client) {
		ctx := context.Background()
		for i := range 25 {
			release, done := stalledWrite(t, c, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: fmt.Sprintf("w%02d", i), ID: "big"}, uint64(i))
			defer func() { release(); <-done }()
		}
		if _, err := c.Publish(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "ready", ID: "m", Payload: []byte("m")}); err != nil {
			t.Fatal(err)
		}
		rc, err := c.Receipts(nil)
		if err != nil {
			t.Fatal(err)
		}
		for attempt := 1; ; attempt++ {
			got, err := rc.Receive(ctx, shardq.ReceiveRequest{Tenant: "t", Topic: "x", ConsumerGroup: "g", NextGroup: true, Max: 10})
			if err != nil {
				t.Fatal(err)
			}
			if len(got.Messages) == 1 && got.Messages[0].ID == "m" {
				return
			}
			if len(got.Messages) != 0 || attempt == 3 {
				t.Fatalf("receive %d of the next group: %+v; want m, past the writes in progress", attempt, got.Messages)
			}
		}
	})
}
