// SPDX-License-Identifier: Apache-2.0

package shardq_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
)

// payload is a deterministic stream of n pseudo-random bytes: nothing
// holds it whole.
func payload(n int64, seed uint64) io.Reader {
	return io.LimitReader(rand.NewChaCha8([32]byte{byte(seed)}), n)
}

func sumOf(t *testing.T, r io.Reader) (string, int64) {
	t.Helper()
	h := sha256.New()
	n, err := io.Copy(h, r)
	if err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil)), n
}

// heapPeak samples the heap until stop is called and returns the peak.
func heapPeak() (stop func() uint64) {
	var peak atomic.Uint64
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			if ms.HeapAlloc > peak.Load() {
				peak.Store(ms.HeapAlloc)
			}
			select {
			case <-done:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	})
	return func() uint64 { close(done); wg.Wait(); return peak.Load() }
}

// A payload of hundreds of MiB goes in as chunks and comes out whole, in
// order, checked, with ordinary messages published beside it in the same
// topic; neither side holds it in memory.
func TestLargeMessageRoundTrip(t *testing.T) {
	const size = 200 << 20
	eachDatabase(t, func(t *testing.T, _ string, _ driver.Driver, c *shardq.Client) {
		ctx := context.Background()
		want, _ := sumOf(t, payload(size, 1))
		small := make(chan error, 1)
		go func() { // ordinary messages in the same topic meanwhile
			for i := range 50 {
				if _, err := c.Publish(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "small", Payload: []byte{byte(i)}}); err != nil {
					small <- err
					return
				}
			}
			small <- nil
		}()
		runtime.GC()
		peak := heapPeak()
		res, err := c.PublishLarge(ctx, shardq.Message{Tenant: "t", Topic: "x", ID: "video", Headers: map[string]string{"type": "mp4"}},
			payload(size, 1), nil)
		if err != nil {
			t.Fatal(err)
		}
		if p := peak(); p > size/4 {
			t.Errorf("publishing %d MiB took the heap to %d MiB", size>>20, p>>20)
		}
		if err := <-small; err != nil {
			t.Fatal(err)
		}
		if res.Bytes != size || res.SHA256 != want || res.Chunks != size/shardq.DefaultLargeChunkSize {
			t.Fatalf("result %+v; want %d bytes, %s", res, size, want)
		}
		r, err := c.AcceptGroup(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, res.PartitionKey, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Stop(ctx)
		runtime.GC()
		peak = heapPeak()
		ld, err := r.ReceiveLarge(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got, n := sumOf(t, ld.Body)
		if p := peak(); p > size/4 {
			t.Errorf("reading %d MiB took the heap to %d MiB", size>>20, p>>20)
		}
		if got != want || n != size || ld.ID != "video" || ld.Headers["type"] != "mp4" || ld.Chunks != res.Chunks {
			t.Fatalf("read %d bytes %s as %q %v; want %d bytes %s", n, got, ld.ID, ld.Headers, size, want)
		}
		if err := r.Ack(ctx, ld.Delivery); err != nil {
			t.Fatal(err)
		}
		// The small messages' group is untouched and ordinary.
		sr, err := c.AcceptGroup(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, "small", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer sr.Stop(ctx)
		for i := range 50 {
			ld, err := sr.ReceiveLarge(ctx)
			if err != nil || ld.Chunks != 0 || ld.Size != 1 || ld.Payload[0] != byte(i) {
				t.Fatalf("small message %d: %+v, %v", i, ld, err)
			}
			if err := sr.Ack(ctx, ld.Delivery); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// A reader that stops mid-message (closed without settling, as a crashed
// one whose lease lapses) leaves the whole message to the next, which
// reads it again from its first chunk.
func TestLargeMessageReaderStoppedMidway(t *testing.T) {
	const size = 8 << 20
	eachDatabase(t, func(t *testing.T, _ string, _ driver.Driver, c *shardq.Client) {
		ctx := context.Background()
		want, _ := sumOf(t, payload(size, 2))
		res, err := c.PublishLarge(ctx, shardq.Message{Tenant: "t", Topic: "x"}, payload(size, 2), &shardq.LargeOptions{ChunkSize: 64 << 10})
		if err != nil {
			t.Fatal(err)
		}
		first, err := c.AcceptGroup(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, res.PartitionKey, nil)
		if err != nil {
			t.Fatal(err)
		}
		ld, err := first.ReceiveLarge(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.CopyN(io.Discard, ld.Body, size/2); err != nil {
			t.Fatal(err)
		}
		if err := first.Stop(ctx); err != nil { // gone mid-message
			t.Fatal(err)
		}
		second, err := c.AcceptGroup(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, res.PartitionKey, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer second.Stop(ctx)
		ld, err = second.ReceiveLarge(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got, n := sumOf(t, ld.Body); got != want || n != size {
			t.Fatalf("the second reader got %d bytes %s; want the whole, %s", n, got, want)
		}
		if err := second.Ack(ctx, ld.Delivery); err != nil {
			t.Fatal(err)
		}
	})
}

// The context of ReceiveLarge bounds the wait for a message, not the
// reading of its body: a caller that receives with a timeout (the CLI's
// --idle-exit and --next-group) and reads the body after the receive's
// context ended gets it whole. Once the receiver is stopped, reading the
// rest fails at once instead of reading on.
func TestLargeBodyOutlivesTheReceiveContext(t *testing.T) {
	const size = 1 << 20
	eachDatabase(t, func(t *testing.T, _ string, _ driver.Driver, c *shardq.Client) {
		ctx := context.Background()
		want, _ := sumOf(t, payload(size, 3))
		res, err := c.PublishLarge(ctx, shardq.Message{Tenant: "t", Topic: "x"}, payload(size, 3), &shardq.LargeOptions{ChunkSize: 64 << 10})
		if err != nil {
			t.Fatal(err)
		}
		g := shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}
		r, err := c.AcceptGroup(ctx, g, res.PartitionKey, nil)
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		ld, err := r.ReceiveLarge(rctx)
		cancel() // the receive is over: the body is read after it
		if err != nil {
			t.Fatal(err)
		}
		if got, n := sumOf(t, ld.Body); got != want || n != size {
			t.Fatalf("read after the receive's context ended: %d bytes %s; want %d, %s", n, got, size, want)
		}
		if err := r.Nack(ctx, ld.Delivery, errors.New("again")); err != nil {
			t.Fatal(err)
		}
		if err := r.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		r2, err := c.AcceptGroup(ctx, g, res.PartitionKey, &shardq.ReceiverOptions{Wait: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		ld, err = r2.ReceiveLarge(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := r2.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(io.Discard, ld.Body); !errors.Is(err, shardq.ErrReceiverClosed) {
			t.Fatalf("reading the body of a stopped receiver: %v, want ErrReceiverClosed", err)
		}
	})
}

// A large message's id taken in its partition by another message (an
// ordinary one published first: "squatting") fails PublishLarge before
// any chunk is written, instead of reporting success onto that message;
// so does a chunk id taken by a different chunk. Writing the same large
// message again under its id (a resume after an unknown outcome) is its
// own earlier write and succeeds with the same result.
func TestLargeMessageIDMustBeItsOwn(t *testing.T) {
	eachDatabase(t, func(t *testing.T, _ string, d driver.Driver, c *shardq.Client) {
		ctx := context.Background()
		if _, err := c.Publish(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "inv", ID: "invoice-1", Payload: []byte("squat")}); err != nil {
			t.Fatal(err)
		}
		opts := &shardq.LargeOptions{ChunkSize: 64 << 10}
		_, err := c.PublishLarge(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "inv", ID: "invoice-1"}, payload(200<<10, 4), opts)
		if !errors.Is(err, shardq.ErrLargeIDTaken) {
			t.Fatalf("PublishLarge onto a taken id: %v, want ErrLargeIDTaken", err)
		}
		if msgs, err := d.FetchAfter(ctx, driver.TopicPartition{Tenant: "t", Topic: "x", PartitionKey: "inv"}, 0, 10); err != nil || len(msgs) != 1 {
			t.Fatalf("partition after the refusal: %d messages, %v; want the squatter alone", len(msgs), err)
		}

		msg := shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "doc", ID: "doc-1"}
		first, err := c.PublishLarge(ctx, msg, payload(200<<10, 5), opts)
		if err != nil {
			t.Fatal(err)
		}
		again, err := c.PublishLarge(ctx, msg, payload(200<<10, 5), opts)
		if err != nil || again != first {
			t.Fatalf("the same large message again: %+v, %v; want its first result %+v", again, err, first)
		}
		if _, err := c.PublishLarge(ctx, msg, payload(200<<10, 6), opts); !errors.Is(err, shardq.ErrLargeIDTaken) {
			t.Fatalf("other bytes under a stored large message's id: %v, want ErrLargeIDTaken", err)
		}
	})
}

// A reader never sees a large message before its end marker is stored,
// and passes over one whose writer failed.
func TestLargeMessageIsAllOrNothing(t *testing.T) {
	eachDatabase(t, func(t *testing.T, _ string, _ driver.Driver, c *shardq.Client) {
		ctx := context.Background()
		// A writer that stalls after its first transaction of chunks.
		stall, release := make(chan struct{}), make(chan struct{})
		body := io.MultiReader(payload(64<<10*4, 3), readerFunc(func([]byte) (int, error) {
			close(stall)
			<-release
			return 0, io.EOF
		}))
		type result struct {
			res shardq.LargeResult
			err error
		}
		done := make(chan result, 1)
		go func() {
			res, err := c.PublishLarge(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "slow"}, body,
				&shardq.LargeOptions{ChunkSize: 64 << 10, ChunksPerTx: 2})
			done <- result{res, err}
		}()
		<-stall
		r, err := c.AcceptGroup(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, "k", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Stop(ctx)
		short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		_, err = r.ReceiveLarge(short)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("ReceiveLarge before the end marker = %v; want it to wait", err)
		}
		close(release)
		res := <-done
		if res.err != nil {
			t.Fatal(res.err)
		}
		ld, err := r.ReceiveLarge(ctx)
		if err != nil || ld.ID != "slow" || ld.Size != 64<<10*4 {
			t.Fatalf("after the end marker: %+v, %v", ld, err)
		}
		if _, n := sumOf(t, ld.Body); n != ld.Size {
			t.Fatalf("read %d of %d", n, ld.Size)
		}
		if err := r.Ack(ctx, ld.Delivery); err != nil {
			t.Fatal(err)
		}
		// A writer whose body fails: an aborted end marker; the reader
		// passes over it to the next message.
		_, err = c.PublishLarge(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "broken"},
			io.MultiReader(payload(64<<10*3, 4), readerFunc(func([]byte) (int, error) { return 0, errors.New("disk gone") })),
			&shardq.LargeOptions{ChunkSize: 64 << 10, ChunksPerTx: 1})
		if err == nil {
			t.Fatal("PublishLarge with a failing body succeeded")
		}
		// A body that reports being cut short (as an HTTP body that ends
		// before its length does) is a failure, not the end: the part
		// that came is not stored as the whole message.
		_, err = c.PublishLarge(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "cut"},
			io.MultiReader(payload(64<<10+100, 6), readerFunc(func([]byte) (int, error) { return 0, io.ErrUnexpectedEOF })),
			&shardq.LargeOptions{ChunkSize: 64 << 10, ChunksPerTx: 1})
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("PublishLarge of a body cut short = %v; want it failed with io.ErrUnexpectedEOF", err)
		}
		if _, err := c.Publish(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "after", Payload: []byte("hi")}); err != nil {
			t.Fatal(err)
		}
		ld, err = r.ReceiveLarge(ctx)
		if err != nil || ld.ID != "after" || string(ld.Payload) != "hi" {
			t.Fatalf("after an aborted large message: %+v, %v; want the next message", ld, err)
		}
		if err := r.Ack(ctx, ld.Delivery); err != nil {
			t.Fatal(err)
		}

		// shardq's headers are its own.
		_, err = c.Publish(ctx, shardq.Message{Tenant: "t", Topic: "x", Headers: map[string]string{shardq.HeaderLargeID: "forged"}})
		var ve *shardq.ValidationError
		if !errors.As(err, &ve) {
			t.Fatalf("a publish with a shardq-large- header: %v; want refused", err)
		}
		if _, err := c.PublishLarge(ctx, shardq.Message{Tenant: "t", Topic: "x", Payload: []byte("x")}, payload(1, 5), nil); !errors.As(err, &ve) || ve.Field != "payload" {
			t.Fatalf("PublishLarge with a payload: %v", err)
		}
	})
}

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }

// Waiting for a slow writer's end marker is not the reader's handler
// time: a HandlerTimeout shorter than the wait does not expire it.
func TestLargeMessageWaitIsNotHandlerTime(t *testing.T) {
	eachDatabase(t, func(t *testing.T, _ string, _ driver.Driver, c *shardq.Client) {
		ctx := context.Background()
		stall, release := make(chan struct{}), make(chan struct{})
		body := io.MultiReader(payload(64<<10*2, 6), readerFunc(func([]byte) (int, error) {
			close(stall)
			<-release
			return 0, io.EOF
		}))
		done := make(chan error, 1)
		go func() {
			_, err := c.PublishLarge(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "slow"}, body,
				&shardq.LargeOptions{ChunkSize: 64 << 10, ChunksPerTx: 1})
			done <- err
		}()
		<-stall
		r, err := c.AcceptGroup(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, "k", &shardq.ReceiverOptions{HandlerTimeout: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		defer r.Stop(ctx)
		go func() {
			time.Sleep(500 * time.Millisecond) // five handler timeouts
			close(release)
		}()
		ld, err := r.ReceiveLarge(ctx)
		if err != nil {
			t.Fatalf("ReceiveLarge across a slow writer: %v", err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(io.Discard, ld.Body); err != nil {
			t.Fatal(err)
		}
		if err := r.Ack(ctx, ld.Delivery); err != nil {
			t.Fatalf("Ack right after reading: %v", err)
		}
	})
}
