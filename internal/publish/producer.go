// SPDX-License-Identifier: Apache-2.0

package publish

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/coalesce"
	"github.com/shardq/shardq/internal/lifecycle"
)

// A Producer publishes behind the caller's back: Publish validates a
// message, hands it to a lane and returns a Future at once; the lane
// writes what was handed to it in transactions of up to MaxBatch
// messages, one at a time, its batch growing while the one before is in
// flight. The messages of one key always take one lane, so they are
// stored in the order they were handed in. A write that fails fails
// every message of it and pauses their keys: a later message of a paused
// key fails at once (ErrKeyPaused), never stored ahead of one that failed,
// until Resume. Ungrouped messages ("") have no order and never pause.
//
//	Publish ──► validate, admit (quotas), wait for room ──► lane queue
//	lane: ──► batch (MaxBatch, MaxBatchBytes, Linger) ──► one transaction
//	           ├─ committed: each Future gets its offset
//	           └─ failed:    each Future gets the error; its keys pause
//	Resume(key) ──► the key takes messages again
//	Close ──► refuse; flush ──► ctx ended first: abort (the rest fail, a
//	                              write in flight is cancelled); lanes end
type Producer struct {
	p     *Publisher
	cfg   ProducerConfig
	lanes *coalesce.Batcher[lane, *pending]
	seed  maphash.Seed
	// aborted ends when Close's ctx ends before the flush: what is not
	// written fails, and writes in flight are cancelled.
	aborted context.Context
	abort   context.CancelFunc

	mu      sync.Mutex
	paused  map[keyRef]pause     // until Resume
	seq     uint64               // the last message handed in
	pending map[*Future]struct{} // handed in, not yet resolved (Flush, Resume)
	waiting []*Future            // waiting for room, first come first served
	msgs    int                  // holding room in the buffer, with their bytes
	bytes   int64
	room    chan struct{} // closed (then replaced) when a waiter may go on: room, a pause, a resume, the close
	closed  bool
}

// ProducerConfig shapes a Producer; every field is set.
type ProducerConfig struct {
	MaxBatch         int
	MaxBatchBytes    int64
	Linger           time.Duration
	Lanes            int
	MaxBuffered      int
	MaxBufferedBytes int64
	FailFast         bool
}

// ErrKeyPaused fails a message of a key whose earlier message failed,
// until the key is resumed.
var ErrKeyPaused = errors.New("the key is paused: an earlier message of it failed")

// ErrFull fails a message that finds the producer's buffer full, with
// FailFast.
var ErrFull = errors.New("the producer's buffer is full")

type lane struct {
	tenant string
	n      int
}

type keyRef struct{ tenant, topic, key string }

// wrap names k in err.
func (k keyRef) wrap(err error) error {
	return fmt.Errorf("shardq: publish tenant %q topic %q partition %q: %w", k.tenant, k.topic, k.key, err)
}

// pause is a paused key: the messages of it handed in after the one that
// failed (seq) fail too.
type pause struct {
	cause error
	seq   uint64
}

// pending is one message in a lane.
type pending struct {
	row *driver.InsertMessage
	f   *Future
	end End
}

// Future is a message handed to a Producer: Done is closed once it is
// stored or has failed.
type Future struct {
	done  chan struct{}
	row   *driver.InsertMessage
	err   error
	size  int64
	key   keyRef
	seq   uint64          // its place in the order messages were handed in
	room  bool            // holds room in the buffer (under Producer.mu)
	stale atomic.Bool     // handed in after its key failed, which was resumed while it waited: it fails
	ctx   context.Context // the send span's
	span  trace.Span
	start time.Time
}

// Done is closed once the message is stored or has failed.
func (f *Future) Done() <-chan struct{} { return f.done }

// Wait waits until the message is stored (its row, offset filled) or has
// failed, or ctx ends.
func (f *Future) Wait(ctx context.Context) (*driver.InsertMessage, error) {
	select {
	case <-f.done:
		return f.row, f.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// NewProducer returns a producer writing through p.
func NewProducer(p *Publisher, cfg ProducerConfig) *Producer {
	pr := &Producer{p: p, cfg: cfg, seed: maphash.MakeSeed(), paused: map[keyRef]pause{}, pending: map[*Future]struct{}{}, room: make(chan struct{})}
	pr.aborted, pr.abort = context.WithCancel(context.Background())
	pr.lanes = coalesce.New[lane](pr.write, cfg.MaxBatch, 1, cfg.Linger, p.cfg.Timeout).
		WithBytes(cfg.MaxBatchBytes, func(m *pending) int64 { return m.f.size })
	return pr
}

// Publish hands msg to its lane and returns its Future: failed already
// when msg is invalid, its key paused, the tenant over a quota, the
// buffer full with FailFast, ctx ended while it waited for room, or the
// producer closed.
func (pr *Producer) Publish(ctx context.Context, msg Message) *Future {
	f := &Future{done: make(chan struct{}), start: time.Now()}
	f.ctx, f.span = pr.p.tel.StartSend(ctx, false)
	rows, err := pr.p.Prepare(f.ctx, []Message{msg}, false)
	if err != nil {
		pr.resolve(f, nil, err)
		return f
	}
	row := rows[0]
	f.row, f.size, f.key = row, rowBytes(row), keyRef{row.Tenant, row.Topic, row.PartitionKey}
	// From here on a failure pauses the key, as a failed write does: no
	// later message of it is stored after one that failed.
	fail := func(err error) *Future {
		pr.pause(err, f)
		pr.resolve(f, nil, err)
		pr.unreserve(f)
		return f
	}
	if err := pr.reserve(ctx, f); err != nil {
		return fail(err)
	}
	end, err := pr.p.Admit(ctx, rows, false)
	if err != nil {
		return fail(f.key.wrap(err))
	}
	l := lane{tenant: row.Tenant, n: int(maphash.String(pr.seed, row.Topic+"\x00"+row.PartitionKey) % uint64(pr.cfg.Lanes))}
	if err := pr.lanes.Enqueue(l, []*pending{{row: row, f: f, end: end}}, func(error) {}); err != nil {
		end(Ended)
		return fail(f.key.wrap(lifecycle.ErrClosed))
	}
	return f
}

// pause pauses the keys of fs (but the ungrouped key, which has no
// order) after their messages failed with cause: the messages of a key
// handed in after its first failed one fail too. A message that a Resume
// marked stale pauses nothing: its failure was decided before the
// resume. Nor does a failure the producer's close caused (every later
// message fails anyway).
func (pr *Producer) pause(cause error, fs ...*Future) {
	if errors.Is(cause, ErrKeyPaused) || errors.Is(cause, lifecycle.ErrClosed) {
		return
	}
	pr.mu.Lock()
	defer pr.mu.Unlock()
	for _, f := range fs {
		if f.key.key == "" || f.stale.Load() {
			continue
		}
		if p, ok := pr.paused[f.key]; !ok || f.seq < p.seq {
			pr.paused[f.key] = pause{cause, f.seq}
		}
	}
	pr.wakeLocked() // waiters of the key fail at once
}

// wakeLocked lets every waiter for room look again. Call with mu held.
func (pr *Producer) wakeLocked() {
	close(pr.room)
	pr.room = make(chan struct{})
}

// rowBytes is what a row counts against the buffer and a batch.
func rowBytes(r *driver.InsertMessage) int64 {
	n := int64(len(r.Payload) + len(r.PartitionKey) + len(r.ID))
	for k, v := range r.Headers {
		n += int64(len(k) + len(v))
	}
	return n
}

// pausedErr is the error f fails with when its key is paused since a
// message handed in before it, or was resumed while f waited (nil:
// neither). Call with mu held.
func (pr *Producer) pausedErr(f *Future) error {
	var cause error
	if p, ok := pr.paused[f.key]; ok && f.seq > p.seq {
		cause = p.cause
	} else if f.stale.Load() {
		cause = errResumed
	}
	if cause == nil {
		return nil
	}
	return f.key.wrap(fmt.Errorf("%w (%w)", ErrKeyPaused, cause))
}

// errResumed is why a message handed in before its key failed, and still
// waiting when the key was resumed, fails: stored after the resume, it
// would come after the messages handed in since.
var errResumed = errors.New("handed in before an earlier message of the key failed")

// reserve registers f as handed in, then takes its room in the buffer,
// waiting for it unless FailFast; it fails when f's key is paused, or is
// resumed after an earlier message of it failed (which Resume marks on
// every message registered, waiting for room or not). Waiters take room
// in the order they came, so that a large message is not passed over for
// ever by small ones.
func (pr *Producer) reserve(ctx context.Context, f *Future) error {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	pr.seq++
	f.seq = pr.seq
	pr.pending[f] = struct{}{}
	for {
		var err error
		fits := pr.msgs == 0 || pr.msgs < pr.cfg.MaxBuffered && pr.bytes+f.size <= pr.cfg.MaxBufferedBytes
		first := len(pr.waiting) == 0 || pr.waiting[0] == f
		switch {
		case pr.pausedErr(f) != nil:
			err = pr.pausedErr(f)
		case pr.closed:
			err = f.key.wrap(lifecycle.ErrClosed)
		case fits && first:
			// An empty buffer takes one message whatever its size.
			pr.leaveQueueLocked(f)
			pr.msgs++
			pr.bytes += f.size
			f.room = true
			return nil
		case pr.cfg.FailFast:
			err = f.key.wrap(fmt.Errorf("%w (%d messages, %d bytes)", ErrFull, pr.cfg.MaxBuffered, pr.cfg.MaxBufferedBytes))
		}
		if err != nil {
			pr.leaveQueueLocked(f)
			return err
		}
		if !slices.Contains(pr.waiting, f) {
			pr.waiting = append(pr.waiting, f)
		}
		room := pr.room
		pr.mu.Unlock()
		select {
		case <-room:
			pr.mu.Lock()
		case <-ctx.Done():
			pr.mu.Lock()
			if pr.pausedErr(f) == nil { // a pause or resume decided first: its error says so
				pr.leaveQueueLocked(f)
				return f.key.wrap(fmt.Errorf("waiting for room in the producer's buffer: %w", ctx.Err()))
			}
		}
	}
}

// leaveQueueLocked takes f out of the waiters; the next one may go on.
// Call with mu held.
func (pr *Producer) leaveQueueLocked(f *Future) {
	if i := slices.Index(pr.waiting, f); i >= 0 {
		pr.waiting = slices.Delete(pr.waiting, i, i+1)
		pr.wakeLocked()
	}
}

// unreserve unregisters f and gives its room back.
func (pr *Producer) unreserve(f *Future) {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if _, ok := pr.pending[f]; !ok {
		return
	}
	delete(pr.pending, f)
	if !f.room {
		return
	}
	f.room = false
	pr.msgs--
	pr.bytes -= f.size
	pr.wakeLocked()
}

// resolve ends f with row stored, or err.
func (pr *Producer) resolve(f *Future, row *driver.InsertMessage, err error) {
	f.err = err
	if err != nil {
		f.row = nil
	} else {
		f.row = row
	}
	var sent []*driver.InsertMessage
	if row != nil {
		sent = []*driver.InsertMessage{row}
	}
	pr.p.tel.EndSend(f.ctx, f.span, f.start, sent, err)
	close(f.done)
}

// write is a lane's flush: the messages of paused keys fail, the others
// go in one transaction (run again on a retryable error); when it fails,
// every message of it fails and its keys pause. After an abort nothing is
// written: each message fails, and a write in flight is cancelled. Each
// message is resolved here: the lane sees no error, so it never splits a
// batch.
func (pr *Producer) write(ctx context.Context, batch []*pending, _ int) error {
	live := batch[:0:0]
	for _, m := range batch {
		pr.mu.Lock()
		err := pr.pausedErr(m.f)
		pr.mu.Unlock()
		if err == nil && pr.aborted.Err() != nil {
			err = m.f.key.wrap(errAborted)
		}
		if err != nil {
			pr.settle(m, err)
			continue
		}
		live = append(live, m)
	}
	if len(live) == 0 {
		return nil
	}
	rows := make([]*driver.InsertMessage, len(live))
	for i, m := range live {
		rows[i] = m.row
	}
	ctx, cancel := context.WithCancel(ctx)
	defer context.AfterFunc(pr.aborted, cancel)()
	err := pr.p.writeBatch(ctx, rows, len(rows))
	cancel()
	if err == nil {
		for _, m := range live {
			pr.settle(m, nil)
		}
		return nil
	}
	if pr.aborted.Err() != nil {
		err = fmt.Errorf("%w (%w)", errAborted, err)
	}
	// Every key pauses before any message is resolved: a Resume that
	// follows the first failure its caller sees is never undone by the
	// pause of a later one.
	errs := make([]error, len(live))
	for i, m := range live {
		errs[i] = m.f.key.wrap(err)
		pr.pause(errs[i], m.f)
	}
	for i, m := range live {
		pr.settle(m, errs[i])
	}
	return nil
}

// errAborted fails the messages a producer had not written when its
// Close gave up waiting.
var errAborted = fmt.Errorf("the producer stopped before the message was written: %w", lifecycle.ErrClosed)

// settle resolves a message of a lane with err (nil: stored), then gives
// its room back: a Flush that no longer finds it pending finds it done.
func (pr *Producer) settle(m *pending, err error) {
	m.end(Ended)
	if err != nil {
		pr.resolve(m.f, nil, err)
	} else {
		pr.resolve(m.f, m.row, nil)
	}
	pr.unreserve(m.f)
}

// Resume lets a paused key take messages again. Its messages handed in
// before the failure and still waiting fail (they would be stored after
// those handed in from now on).
func (pr *Producer) Resume(tenant, topic, key string) {
	k := keyRef{tenant, topic, key}
	pr.mu.Lock()
	defer pr.mu.Unlock()
	p, ok := pr.paused[k]
	if !ok {
		return
	}
	delete(pr.paused, k)
	for f := range pr.pending {
		if f.key == k && f.seq > p.seq {
			f.stale.Store(true)
		}
	}
	pr.wakeLocked() // its waiters fail at once
}

// Flush waits until every message handed in before it is stored or has
// failed, or ctx ends.
func (pr *Producer) Flush(ctx context.Context) error {
	pr.mu.Lock()
	waiting := make([]*Future, 0, len(pr.pending))
	for f := range pr.pending {
		waiting = append(waiting, f)
	}
	pr.mu.Unlock()
	for _, f := range waiting {
		select {
		case <-f.done:
			continue
		default:
		}
		select {
		case <-f.done:
		case <-ctx.Done():
			return fmt.Errorf("shardq: producer flush: %w", ctx.Err())
		}
	}
	return nil
}

// Close refuses new messages, waits until those handed in are stored or
// have failed, and stops the lanes. When ctx ends first it aborts: the
// messages not yet written fail, a write in flight is cancelled (each of
// its messages fails, stored or not: it is ambiguous, and publishing it
// again by id stores it once), and Close returns ctx's error once the
// lanes have ended.
func (pr *Producer) Close(ctx context.Context) error {
	pr.mu.Lock()
	pr.closed = true
	pr.wakeLocked() // waiters for room see the close
	pr.mu.Unlock()
	err := pr.Flush(ctx)
	if err != nil {
		pr.abort()
	}
	pr.lanes.Close()
	pr.abort()
	return err
}

// FailedFuture is a Future that failed with err before it reached a
// producer.
func FailedFuture(err error) *Future {
	f := &Future{done: make(chan struct{}), err: err}
	close(f.done)
	return f
}
