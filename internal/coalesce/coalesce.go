// SPDX-License-Identifier: Apache-2.0

// Package coalesce merges concurrent submissions into shared flushes: group
// commit for publishers.
//
// Submissions are queued per key (the tenant, so that a flush stays on one
// shard). A key runs at most MaxInflight flushes at once; a submission that
// finds a free slot starts a flush at once, so a lone publisher waits for
// nothing but its own commit. Submissions arriving while every slot is busy
// queue up, and the next flush takes all of them (up to MaxItems): batches
// grow with the load and, unless a linger is set, no timer adds latency.
//
// A submission is atomic: its items are never split across flushes. If a
// shared flush fails, each of its submissions is flushed again on its own,
// so that one submission's trouble does not fail the others; flushes must
// therefore be idempotent (shardq's are: publish is idempotent by id).
package coalesce

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/shardq/shardq/internal/lifecycle"
)

// ErrClosed is returned by Submit after Close.
var ErrClosed = errors.New("coalesce: closed")

// FlushFunc writes items, submitted by calls submissions, in one
// transaction.
type FlushFunc[T any] func(ctx context.Context, items []T, calls int) error

// Batcher coalesces submissions. Create it with New.
type Batcher[K comparable, T any] struct {
	flush       FlushFunc[T]
	maxItems    int
	maxInflight int
	linger      time.Duration
	timeout     time.Duration
	maxBytes    int64         // with size: bounds a merged flush's bytes too (WithBytes)
	size        func(T) int64 // an item's bytes

	mu      sync.Mutex
	queues  map[K]*queue[T]
	closed  bool
	closing chan struct{} // closed by Close: lingering ends
	life    *lifecycle.Group
}

type queue[T any] struct {
	pending  []*request[T]
	inflight int
}

type request[T any] struct {
	items []T
	bytes int64       // of items, by size
	done  func(error) // called once, with the flush's result
}

// New returns a Batcher. maxItems bounds the items of a merged flush (a
// larger submission is flushed alone); linger, when positive, is how long a
// flush waits for more submissions unless maxItems are already queued;
// timeout bounds one flush, which runs detached from the submitters'
// contexts because it serves several of them.
func New[K comparable, T any](flush FlushFunc[T], maxItems, maxInflight int, linger, timeout time.Duration) *Batcher[K, T] {
	return &Batcher[K, T]{
		flush:       flush,
		maxItems:    max(1, maxItems),
		maxInflight: max(1, maxInflight),
		linger:      linger,
		timeout:     timeout,
		queues:      map[K]*queue[T]{},
		closing:     make(chan struct{}),
		life:        lifecycle.New(context.Background()),
	}
}

// WithBytes bounds a merged flush by the items' bytes too, each counted
// by size (a larger submission is flushed alone); call it before any
// submission.
func (b *Batcher[K, T]) WithBytes(maxBytes int64, size func(T) int64) *Batcher[K, T] {
	b.maxBytes, b.size = maxBytes, size
	return b
}

// Queued reports the submissions queued under key that no flush has
// taken yet.
func (b *Batcher[K, T]) Queued(key K) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if q := b.queues[key]; q != nil {
		return len(q.pending)
	}
	return 0
}

// Submit queues items under key and waits until they are flushed or ctx is
// done. When ctx ends first, the items may still be flushed later.
func (b *Batcher[K, T]) Submit(ctx context.Context, key K, items []T) error {
	done := make(chan error, 1)
	if err := b.Enqueue(key, items, func(err error) { done <- err }); err != nil {
		return err
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Enqueue queues items under key without waiting: done is called with the
// result once they are flushed (from the flushing goroutine; it must not
// block). Close waits for it.
func (b *Batcher[K, T]) Enqueue(key K, items []T, done func(error)) error {
	r := &request[T]{items: items, done: done}
	if b.size != nil {
		for _, it := range items {
			r.bytes += b.size(it)
		}
	}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return ErrClosed
	}
	q := b.queues[key]
	if q == nil {
		q = &queue[T]{}
		b.queues[key] = q
	}
	q.pending = append(q.pending, r)
	if q.inflight < b.maxInflight {
		q.inflight++
		b.life.Go(func() { b.drain(key, q) }) // not refused: Close sets closed under mu first
	}
	b.mu.Unlock()
	return nil
}

// drain flushes the key's queue until it is empty.
func (b *Batcher[K, T]) drain(key K, q *queue[T]) {
	for {
		b.lingerFor(q)
		b.mu.Lock()
		if len(q.pending) == 0 {
			q.inflight--
			if q.inflight == 0 {
				delete(b.queues, key)
			}
			b.mu.Unlock()
			return
		}
		n, items, bytes := 1, len(q.pending[0].items), q.pending[0].bytes
		for n < len(q.pending) && items+len(q.pending[n].items) <= b.maxItems && (b.size == nil || bytes+q.pending[n].bytes <= b.maxBytes) {
			items += len(q.pending[n].items)
			bytes += q.pending[n].bytes
			n++
		}
		reqs := q.pending[:n:n]
		q.pending = q.pending[n:]
		b.mu.Unlock()
		b.run(reqs, items)
	}
}

// lingerFor waits up to the linger time for the queue to fill, so that
// publishers answered by the previous flush can join the next one. An
// empty queue does not wait (its drain ends; the next Enqueue starts one
// that lingers), and Close ends the wait.
func (b *Batcher[K, T]) lingerFor(q *queue[T]) {
	if b.linger <= 0 {
		return
	}
	b.mu.Lock()
	n := 0
	for _, r := range q.pending {
		n += len(r.items)
	}
	b.mu.Unlock()
	if n == 0 || n >= b.maxItems {
		return
	}
	t := time.NewTimer(b.linger)
	defer t.Stop()
	select {
	case <-t.C:
	case <-b.closing:
	}
}

func (b *Batcher[K, T]) run(reqs []*request[T], n int) {
	if len(reqs) == 1 {
		reqs[0].done(b.flushOnce(reqs[0].items, 1))
		return
	}
	items := make([]T, 0, n)
	for _, r := range reqs {
		items = append(items, r.items...)
	}
	if err := b.flushOnce(items, len(reqs)); err == nil {
		for _, r := range reqs {
			r.done(nil)
		}
		return
	}
	for _, r := range reqs {
		r.done(b.flushOnce(r.items, 1))
	}
}

func (b *Batcher[K, T]) flushOnce(items []T, calls int) error {
	ctx, cancel := context.WithTimeout(context.Background(), b.timeout)
	defer cancel()
	return b.flush(ctx, items, calls)
}

// Close refuses new submissions and waits until everything queued is
// flushed.
func (b *Batcher[K, T]) Close() {
	b.mu.Lock()
	if !b.closed {
		b.closed = true
		close(b.closing)
	}
	b.mu.Unlock()
	b.life.Stop(context.Background()) // flushers end once their queues are empty
}
