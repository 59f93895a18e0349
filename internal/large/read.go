// SPDX-License-Identifier: Apache-2.0

package large

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"maps"
	"strconv"
	"sync"
	"time"

	"github.com/shardq/shardq/driver"
)

// ErrCorrupt means a large message's stored chunks do not add up to what
// its end marker says.
var ErrCorrupt = errors.New("shardq: large message corrupt")

// Kind is what a stored message is to a reader of large messages.
type Kind int

const (
	Ordinary Kind = iota // a message of its own
	First                // chunk 0 of a large message: where a reader starts it
	Chunk                // a later chunk: read through its large message's Body, or passed over
	End                  // an end marker
)

// KindOf classifies m by its reserved headers (Publish refuses them on
// any other message).
func KindOf(m *driver.Message) Kind {
	switch {
	case m.Headers[HeaderChunk] == "0" && m.Headers[HeaderID] != "":
		return First
	case m.Headers[HeaderID] != "":
		return Chunk
	case m.Headers[HeaderChunks] != "" || m.Headers[HeaderAborted] != "":
		return End
	}
	return Ordinary
}

// IsAborted reports whether end is the end marker of a write that failed.
func IsAborted(end *driver.Message) bool { return end.Headers[HeaderAborted] == "true" }

// Whole is a complete large message as a reader hands it out.
type Whole struct {
	// Message is its view: the end marker's id, headers and time at the
	// first chunk's offset (the end marker's, without chunks), no payload.
	Message driver.Message
	Body    io.Reader
	Size    int64
	Chunks  int
	// Span is what settling it covers; dead-lettering copies its end
	// marker last.
	Span
}

// Span is what settling a large message covers: its end marker, and
// where the cursor goes.
type Span struct {
	End *driver.Message
	// UpTo is the offset settling the message commits: its end
	// marker's; or, when other messages were stored among its chunks
	// (published to its key while it was written), its chunk 0's. Those
	// messages then come after it, in order, and readers pass over its
	// later chunks and end marker as over those of a write that failed:
	// nothing stored is skipped.
	UpTo int64
}

// Counter counts a partition's messages in an offset range
// (driver.Driver.CountBetween).
type Counter interface {
	CountBetween(ctx context.Context, p driver.TopicPartition, after, upTo int64) (int64, error)
}

// SpanOf is the Span of the large message whose chunk 0 is first (nil, or
// end itself, when it has none) and whose end marker is end: one count of
// what lies between them.
func SpanOf(ctx context.Context, c Counter, first, end *driver.Message) (Span, error) {
	s := Span{End: end, UpTo: end.Offset}
	chunks, err := strconv.Atoi(end.Headers[HeaderChunks])
	if first == nil || first.Offset >= end.Offset || err != nil {
		return s, nil // no chunks; or a corrupt marker, which the body's first read fails
	}
	n, err := c.CountBetween(ctx, driver.TopicPartition{Tenant: end.Tenant, Topic: end.Topic, PartitionKey: end.PartitionKey}, first.Offset, end.Offset)
	if err != nil {
		return Span{}, fmt.Errorf("shardq: large message %q: %w", end.ID, err)
	}
	if n != int64(chunks) { // its later chunks and the end marker, and more
		s.UpTo = first.Offset
	}
	return s, nil
}

// Fetch reads the message after offset after in the large message's
// partition (driver.Driver.FetchAfter with limit 1); ok is false when
// there is none.
type Fetch func(after int64) (m driver.Message, ok bool, err error)

// Open makes the Whole of the large message whose chunk 0 is first (nil
// when it has no chunks: end is then all of it) and whose complete end
// marker is end. Its Body reads the other chunks through fetch, one at a
// time, and fails with ErrCorrupt at the end if their numbering, size or
// SHA-256 differs from the end marker's; an end marker that does not
// describe a message fails its first read the same way. So a corrupt
// message is a failed delivery like any other: the reader's handler
// fails, and it is retried and dead-lettered. where names the partition
// in errors.
func Open(first *driver.Message, span Span, fetch Fetch, where fmt.Stringer) Whole {
	end := span.End
	chunks, err1 := strconv.Atoi(end.Headers[HeaderChunks])
	size, err2 := strconv.ParseInt(end.Headers[HeaderBytes], 10, 64)
	b := &body{fetch: fetch, where: where, id: end.ID, chunks: chunks, size: size, want: end.Headers[HeaderSHA256],
		sum: sha256.New(), last: end.Offset, end: end.Offset}
	view := *end
	view.Headers, view.Payload = maps.Clone(end.Headers), nil
	switch {
	case errors.Join(err1, err2) != nil || chunks < 0 || size < 0 || len(b.want) != sha256.Size*2 || IsAborted(end):
		b.err = fmt.Errorf("%w: %s id %q: end marker %v", ErrCorrupt, where, end.ID, end.Headers)
	case (first == nil) != (chunks == 0):
		b.err = fmt.Errorf("%w: %s id %q: %d chunks, chunk 0 present %t", ErrCorrupt, where, end.ID, chunks, first != nil)
	case first != nil && (first.Offset >= end.Offset || KindOf(first) != First || first.Headers[HeaderID] != end.ID):
		b.err = fmt.Errorf("%w: %s id %q: chunk 0 at offset %d does not start it", ErrCorrupt, where, end.ID, first.Offset)
	case first != nil:
		b.next, b.last, b.cur, b.read = 1, first.Offset, first.Payload, int64(len(first.Payload))
		b.sum.Write(first.Payload)
	}
	if first != nil {
		view.Offset = first.Offset
	}
	return Whole{Message: view, Body: b, Size: max(size, 0), Chunks: max(chunks, 0), Span: span}
}

// body reads a large message's chunks in order, one at a time.
type body struct {
	fetch      Fetch
	where      fmt.Stringer
	id         string
	chunks     int
	size, read int64
	want       string // the end marker's SHA-256
	next       int    // the next chunk's number
	last       int64  // the offset of the last chunk read
	end        int64  // the end marker's
	cur        []byte // what is left of the chunk being read
	sum        hash.Hash
	err        error // sticky
}

func (b *body) Read(p []byte) (int, error) {
	for len(b.cur) == 0 && b.err == nil {
		b.err = b.nextChunk()
	}
	if len(b.cur) == 0 {
		return 0, b.err
	}
	n := copy(p, b.cur)
	b.cur = b.cur[n:]
	return n, nil
}

// nextChunk loads the next chunk into cur, or checks the whole at the end
// (io.EOF when it adds up).
func (b *body) nextChunk() error {
	if b.next >= b.chunks {
		if got := hex.EncodeToString(b.sum.Sum(nil)); b.read != b.size || got != b.want {
			return fmt.Errorf("%w: %s id %q: %d bytes with SHA-256 %s; the end marker says %d bytes, %s",
				ErrCorrupt, b.where, b.id, b.read, got, b.size, b.want)
		}
		return io.EOF
	}
	m, ok, err := b.fetch(b.last)
	for err == nil && ok && m.Offset < b.end && m.Headers[HeaderID] != b.id {
		// Another message, published to the key while this one was
		// written: it comes after this one (Span).
		m, ok, err = b.fetch(m.Offset)
	}
	if err != nil {
		return fmt.Errorf("shardq: read large %s id %q chunk %d: %w", b.where, b.id, b.next, err)
	}
	if !ok || m.Headers[HeaderID] != b.id || m.Headers[HeaderChunk] != strconv.Itoa(b.next) {
		return fmt.Errorf("%w: %s id %q: chunk %d is not next in the group", ErrCorrupt, b.where, b.id, b.next)
	}
	if b.read += int64(len(m.Payload)); b.read > b.size {
		return fmt.Errorf("%w: %s id %q: more than the end marker's %d bytes by chunk %d", ErrCorrupt, b.where, b.id, b.size, b.next)
	}
	b.sum.Write(m.Payload)
	b.cur, b.last = m.Payload, m.Offset
	b.next++
	return nil
}

// FetchNext is the Fetch of a partition through drv: each read is bounded
// by timeout and ends with ctx (the reader's life, not one call's).
func FetchNext(ctx context.Context, drv interface {
	FetchAfter(context.Context, driver.TopicPartition, int64, int) ([]driver.Message, error)
}, p driver.TopicPartition, timeout time.Duration) Fetch {
	return func(after int64) (driver.Message, bool, error) {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		ms, err := drv.FetchAfter(ctx, p, after, 1)
		if err != nil || len(ms) == 0 {
			return driver.Message{}, false, err
		}
		return ms[0], true, nil
	}
}

// Store is what a reader of large messages reads and writes through (a
// driver.Driver is one).
type Store interface {
	GetMessage(ctx context.Context, ref driver.MessageRef) (*driver.Message, map[string]driver.DeliveryState, error)
	BeginWrite(ctx context.Context) (driver.Tx, error)
	InsertMessages(ctx context.Context, tx driver.DBTX, msgs []*driver.InsertMessage) error
}

// Waiter is a reader's wait for the end marker of the large message whose
// chunk 0 it holds. Once no new chunk of it has been stored for Timeout
// (the reader's LargeWriteTimeout) since a reader of the process first
// saw it so (Stalls), the write is
// abandoned: the reader stores an aborted end marker under the message's
// id. The database's unique id decides a race with a writer that is only
// slow: whichever end marker is stored first is the message's, and the
// writer's comes back a duplicate, which fails its write with
// ErrAbandoned. So no reader passes over chunks that a writer then
// completes.
type Waiter struct {
	Store   Store
	Timeout time.Duration
	// Stalls is where the stall's start is kept: the process's, shared by
	// its readers [the Waiter's own].
	Stalls *Stalls
	mu     sync.Mutex // receives of one group may overlap after a lease expired
	own    Stalls
}

// Stalls remembers, per large message being written, the highest chunk
// a reader of this process has seen stored and since when: readers come
// and go (a worker per lease, a receiver per accepted group, each ended
// by a fault or an idle release), and a clock that restarted with each of
// them would never reach the timeout, so the partition would wait for
// ever. It holds at most maxStalls writes; past that it forgets them all,
// and their clocks start again.
type Stalls struct {
	mu sync.Mutex
	m  map[stallKey]stall
}

type stallKey struct{ tenant, topic, key, id string }

type stall struct {
	chunk int // the highest chunk seen stored
	since time.Time
}

const maxStalls = 10_000

// seen returns the highest chunk of k's write seen so far (0: chunk 0).
func (s *Stalls) seen(k stallKey) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[k].chunk
}

// progress records that chunk is the highest of k's write stored at now,
// and returns since when it has been.
func (s *Stalls) progress(k stallKey, chunk int, now time.Time) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, ok := s.m[k]
	if ok && chunk <= st.chunk {
		return st.since
	}
	if s.m == nil {
		s.m = map[stallKey]stall{}
	}
	if !ok && len(s.m) >= maxStalls {
		clear(s.m)
	}
	s.m[k] = stall{chunk, now}
	return now
}

// forget drops k's write: it ended.
func (s *Stalls) forget(k stallKey) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, k)
}

// maxProbes bounds the chunks one End call looks for.
const maxProbes = 64

// End returns the end marker of the large message whose chunk 0 is first,
// or nil while it is still being written. At now, a write stalled for
// Timeout is given up: End stores an aborted marker and returns what is
// then stored (the aborted marker, or the writer's if it won the race).
func (w *Waiter) End(ctx context.Context, first *driver.Message, now time.Time) (*driver.Message, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	id := first.Headers[HeaderID]
	ref := driver.MessageRef{Tenant: first.Tenant, Topic: first.Topic, PartitionKey: first.PartitionKey, ID: id}
	stalls, key := w.Stalls, stallKey{first.Tenant, first.Topic, first.PartitionKey, id}
	if stalls == nil {
		stalls = &w.own
	}
	end, _, err := w.Store.GetMessage(ctx, ref)
	if err != nil {
		return nil, err
	}
	if endOf(first, end) {
		stalls.forget(key)
		return end, nil
	}
	// Progress is the write's own chunks (the partition's head moves with
	// anyone's messages): the highest stored, looked for from the last
	// one seen.
	chunk := stalls.seen(key)
	for range maxProbes {
		next := driver.MessageRef{Tenant: first.Tenant, Topic: first.Topic, PartitionKey: first.PartitionKey, ID: ChunkID(id, chunk+1)}
		m, _, err := w.Store.GetMessage(ctx, next)
		if err != nil {
			return nil, err
		}
		if m == nil {
			break
		}
		chunk++
	}
	if now.Sub(stalls.progress(key, chunk, now)) < w.Timeout {
		return nil, nil
	}
	stalls.forget(key)
	marker := &driver.InsertMessage{Tenant: first.Tenant, Topic: first.Topic, PartitionKey: first.PartitionKey, ID: id,
		CreatedAt: now.UTC().Truncate(time.Microsecond),
		Headers:   map[string]string{HeaderAborted: "true", HeaderAbandoned: "no progress for " + w.Timeout.String()}}
	tx, err := w.Store.BeginWrite(ctx)
	if err != nil {
		return nil, err
	}
	if err := w.Store.InsertMessages(ctx, tx, []*driver.InsertMessage{marker}); err != nil {
		return nil, errors.Join(err, tx.Rollback())
	}
	if err := tx.Commit(); err != nil {
		return nil, err
	}
	if end, _, err = w.Store.GetMessage(ctx, ref); err != nil || endOf(first, end) {
		return end, err
	}
	// What holds the id cannot end this write (another message, or a
	// copy below it that a requeue has not moved yet) and took the
	// aborted marker's place: give the write up all the same.
	return &driver.Message{Tenant: first.Tenant, Topic: first.Topic, PartitionKey: first.PartitionKey, ID: id, Offset: first.Offset,
		Headers: map[string]string{HeaderAborted: "true", HeaderAbandoned: "its id is held by another message"}}, nil
}

// endOf reports whether m, the message stored under the id of the large
// message whose chunk 0 is first, is its end marker: an end marker after
// it. A message under that id before chunk 0 (the end marker of a copy
// that a requeue is moving, chunks first) or of another kind (an
// ordinary message published under the id meanwhile) is not.
func endOf(first, m *driver.Message) bool {
	return m != nil && KindOf(m) == End && m.Offset > first.Offset
}
