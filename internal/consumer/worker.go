// SPDX-License-Identifier: Apache-2.0

package consumer

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/expiry"
	"github.com/shardq/shardq/internal/large"
	"github.com/shardq/shardq/internal/lifecycle"
	"github.com/shardq/shardq/internal/settle"
)

// worker delivers one leased partition.
type worker struct {
	s            *Member
	lease        driver.Lease                   // ExpiresAt guarded by s.mu
	cursor       int64                          // last settled offset
	settled      atomic.Int64                   // cursor as the member's committer reads it
	commit       atomic.Int64                   // last committed offset
	states       map[int64]driver.DeliveryState // earlier owners' bookkeeping beyond the cursor, read once
	notBefore    time.Time                      // a taken-over lease: hand out nothing before its earlier holder's expiry
	ctx          context.Context
	cancel       context.CancelFunc // cancels the handler: lease lost or hard stop
	handback     chan struct{}      // closed to ask for a graceful hand-back
	handbackOnce sync.Once
	lost         chan struct{} // closed when the lease is lost
	lostOnce     sync.Once
	wake         chan struct{} // a wake-up, or the head watcher, saw the head move
	// expect is the highest head a wake-up named (0: none): a fetch that
	// finds nothing up to it reads again shortly (feedRereads).
	expect atomic.Int64
	// idleAfter is cursor+1 while the worker waits idle (0 otherwise):
	// the head watcher wakes it when the partition's head passes cursor.
	idleAfter atomic.Int64
	// waiter waits for the end marker of a large message at the cursor;
	// blocked says the last delivery stopped there to wait (large.go).
	waiter  large.Waiter
	blocked bool
	// sawLarge says the last batch held a large message's part: the next
	// reads stay within largeFetchBytes, not BatchSize chunks.
	sawLarge bool
	// prefetched is the batch being delivered.
	prefetched []driver.Message
	// expiry fires at giveUpAt by the member's clock (checkExpiry).
	expiry *time.Timer
}

func (w *worker) handBack() { w.handbackOnce.Do(func() { close(w.handback) }) }

// leaving reports whether the worker was asked to hand back or lost its
// lease: it takes no new message.
func (w *worker) leaving() bool {
	select {
	case <-w.handback:
		return true
	case <-w.lost:
		return true
	default:
		return false
	}
}

func (w *worker) lose() {
	w.lostOnce.Do(func() { close(w.lost) })
	w.cancel()
}

// startWorker works l, acquired when the member's count of lapsed
// heartbeats in its tenant was lapses.
func (s *Member) startWorker(l driver.Lease, lapses uint64) {
	ctx, cancel := context.WithCancel(s.life.HardContext())
	w := &worker{s: s, lease: l, cursor: l.Committed, ctx: ctx, cancel: cancel, notBefore: s.takenUntil(l.PartitionRef),
		handback: make(chan struct{}), lost: make(chan struct{}), wake: make(chan struct{}, 1),
		waiter: large.Waiter{Store: s.drv, Timeout: s.cfg.LargeWriteTimeout, Stalls: s.cfg.LargeStalls}}
	w.settled.Store(l.Committed)
	w.commit.Store(l.Committed)
	if !s.addWorker(w, lapses) {
		w.giveBack()
		return
	}
	if !s.life.Go(w.run) {
		w.finish() // stopping: hand the fresh lease straight back
	}
}

// addWorker adds w to the member's workers, unless a heartbeat lapse was
// handled since its lease was acquired (the count moved from lapses): that
// found no worker to stop, yet the acquisition may have come before a
// freeze and the lease been swept since, and the fresh heartbeat would
// make it look live. The check and the adding are one step under s.mu, so
// a lapse handled after them finds w (beaten).
func (s *Member) addWorker(w *worker, lapses uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lapses[w.lease.Tenant] != lapses {
		s.log.Warn("shardq: heartbeat lapsed while the lease was acquired; giving the partition back, as it may have been swept",
			w.logArgs("token", w.lease.Token)...)
		return false
	}
	s.workers[w.lease.PartitionRef] = w
	return true
}

// giveBack ends a worker that never ran: its lease goes back under its
// token, so that nobody waits out its TTL (one swept meanwhile stays the
// sweeper's: the release is fenced), unless the partition was taken over
// and is not yet due (static.go).
func (w *worker) giveBack() {
	s := w.s
	lost := true
	defer func() {
		w.cancel()
		s.cfg.Metrics.LeaseEnded(w.lease.Tenant, lost)
	}()
	if s.cfg.Clock().Before(w.notBefore) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), dbTimeout)
	defer cancel()
	err := s.drv.ReleaseLease(ctx, w.lease, s.cfg.Clock())
	lost = err != nil
	if err != nil && !errorsIsLost(err) {
		s.log.Warn("shardq: giving back a lease failed; it expires on its own", w.logArgs("err", err)...)
	}
}

// stopping reports whether the worker should stop taking new messages.
func (w *worker) stopping() bool {
	return w.s.life.Context().Err() != nil || w.leaving()
}

// wait sleeps d unless the worker is asked to stop first.
func (w *worker) wait(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-w.s.life.Context().Done():
	case <-w.handback:
	case <-w.lost:
	}
	return false
}

// idle waits for d or until a wake-up wakes the worker.
func (w *worker) idle(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-w.wake:
	case <-w.s.life.Context().Done():
	case <-w.handback:
	case <-w.lost:
	}
}

func (w *worker) leaseNow() driver.Lease {
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	return w.lease
}

// giveUpAt is when the worker gives its lease up unless renewed (and the
// member's heartbeat written again): a margin before the lease expires,
// or before the other members may count this one dead and sweep its
// leases. From either moment another member may hold the partition.
func (w *worker) giveUpAt() time.Time {
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	until := w.lease.ExpiresAt
	if live := w.s.liveUntil(w.lease.Tenant); live.Before(until) {
		until = live
	}
	return until.Add(-w.s.holderMargin())
}

// leaseLive reports whether the lease is still the worker's to use by
// this member's clock (giveUpAt); when it is not, the worker stops: a
// message is never handed out once another member may hold the partition
// (a frozen process, renewals or heartbeats that kept failing), even if
// nobody has taken it yet. The partition is acquired again, with a new
// token, by the next tick that plans it.
func (w *worker) leaseLive() bool {
	// The clock first, lost after: a heartbeat that lands past a lapse
	// closes lost before it moves beatAt, so a giveUpAt that saw the new
	// beat is followed by a closed lost.
	live := w.s.cfg.Clock().Before(w.giveUpAt())
	select {
	case <-w.lost:
		return false
	default:
	}
	if live {
		return true
	}
	l := w.leaseNow()
	w.s.log.Warn("shardq: lease about to expire, or the member's heartbeat about to go stale, before delivery; stopping the partition",
		w.logArgs("token", l.Token, "expires_at", l.ExpiresAt)...)
	w.lose()
	return false
}

func (w *worker) logArgs(args ...any) []any {
	return append([]any{"tenant", w.lease.Tenant, "partition_key", w.lease.PartitionKey}, args...)
}

// checkExpiry stops the worker, cancelling its handler, at giveUpAt by
// the member's clock, unless a renewal (or heartbeat) moved it: from then
// on another member may hold the partition, and a handler still running
// would be a second holder of its key. When the timer finds time left, it
// waits for the rest.
func (w *worker) checkExpiry() {
	if w.ctx.Err() != nil {
		return
	}
	if left := w.giveUpAt().Sub(w.s.cfg.Clock()); left > 0 {
		w.expiry.Reset(max(left, lifecycle.ExpiryRecheck)) // an injected clock may stand still
		return
	}
	l := w.leaseNow()
	w.s.log.Warn("shardq: lease about to expire unrenewed, or the member's heartbeat about to go stale; stopping the partition and cancelling its handler",
		w.logArgs("token", l.Token, "expires_at", l.ExpiresAt)...)
	w.lose()
}

func (w *worker) run() {
	s := w.s
	// Armed once w.expiry is set: the callback resets it.
	w.expiry = time.AfterFunc(time.Hour, w.checkExpiry)
	w.expiry.Reset(w.giveUpAt().Sub(s.cfg.Clock()))
	defer w.expiry.Stop()
	defer w.finish()
	if d := w.notBefore.Sub(s.cfg.Clock()); d > 0 {
		// Taken over from an earlier incarnation that may still hand
		// out messages until the expiry it knew: wait it out.
		s.log.Info("shardq: waiting for the lease an earlier incarnation held to lapse", w.logArgs("for", d)...)
		if !w.wait(d) {
			return
		}
	}
	s.doneWaiting(w.lease.PartitionRef)
	idleSince := s.cfg.Clock()
	rereads := 0
	drained := false // the last fetch read to the head, and the feed streams
	for !w.stopping() {
		if s.isSuspended(w.lease.Tenant) {
			return // finish() commits and releases the lease
		}
		if s.isPaused(w.lease.Tenant) {
			// Paused: commit what is settled, keep the lease (not idle),
			// and wait for the tick that reads the resume.
			if !w.commitCursor() {
				return
			}
			idleSince, drained = s.cfg.Clock(), false
			w.idle(s.cfg.DiscoveryInterval)
			continue
		}
		var msgs []driver.Message
		fetched := !drained
		if fetched {
			var err error
			if msgs, err = w.fetch(); err != nil {
				if w.stopping() || w.ctx.Err() != nil {
					continue // a stop cancelled the read: nothing to say
				}
				s.log.Warn("shardq: fetch failed; retrying", w.logArgs("err", err)...)
				w.wait(s.cfg.PollInterval)
				continue
			}
		}
		drained = false
		if len(msgs) == 0 {
			if s.cfg.Clock().Sub(idleSince) >= s.cfg.IdleRelease {
				return // idle release: finish() commits and releases
			}
			if fetched && w.expect.Load() > w.cursor && rereads < feedRereads {
				// A replica can read a commit from the binary log before
				// it is visible to readers: read again soon.
				w.wait(feedReread << rereads)
				rereads++
				continue
			}
			rereads = 0
			// The head watcher checks every PollInterval, for all idle
			// partitions at once; a worker fetches on its own only as a
			// fallback.
			// Wake up in time for the idle release; the member's
			// committer commits what is settled.
			wait := min(idleFallback*s.pollEvery(), s.cfg.IdleRelease-s.cfg.Clock().Sub(idleSince))
			w.idleAfter.Store(w.cursor + 1)
			w.idle(wait)
			w.idleAfter.Store(0)
			continue
		}
		idleSince, rereads = s.cfg.Clock(), 0
		if !w.deliver(msgs) {
			return
		}
		// A short batch read up to the head. While a feed that names
		// partitions streams, whatever was committed since has woken
		// this worker already (a pending wake-up), so it waits for that
		// instead of reading again for nothing: one read per message, not
		// two. (A feed that only says "something changed", SQLite's,
		// wakes idle workers only, through the head watcher.)
		drained = len(msgs) < s.cfg.BatchSize && s.cfg.FeedNames != nil && s.cfg.FeedNames() && !w.blocked
	}
}

// A worker woken for a head it then does not see reads again after
// feedReread, doubling, feedRereads times (about 60 ms in all) before it
// waits idle; what it still misses the head watcher finds.
const (
	feedReread  = 2 * time.Millisecond
	feedRereads = 5
)

func (w *worker) fetch() ([]driver.Message, error) {
	ctx, cancel := context.WithTimeout(w.ctx, dbTimeout)
	defer cancel()
	tp := driver.TopicPartition{Tenant: w.lease.Tenant, Topic: w.lease.Topic, PartitionKey: w.lease.PartitionKey}
	switch {
	case w.blocked:
		return w.s.drv.FetchAfter(ctx, tp, w.cursor, 1) // waiting for a large message's end marker: its chunk 0 is all it needs
	case w.sawLarge:
		msgs, _, err := w.s.drv.FetchWithin(ctx, driver.FetchWithinParams{Partition: tp, After: w.cursor, Limit: w.s.cfg.BatchSize, Budget: largeFetchBytes})
		return msgs, err
	}
	return w.s.drv.FetchAfter(ctx, tp, w.cursor, w.s.cfg.BatchSize)
}

// settledTo records that the messages up to the cursor are settled: the
// member's committer commits them within CommitInterval, in one
// transaction with its other partitions' (commit.go), off the delivery
// path. A crash redelivers at most what was settled in that interval.
func (w *worker) settledTo() { w.settled.Store(w.cursor) }

// commitCursor commits settled progress now, before the worker waits,
// hands back or stops; false when the lease is lost.
func (w *worker) commitCursor() bool {
	w.settledTo()
	w.s.commitMu.Lock()
	defer w.s.commitMu.Unlock()
	if w.cursor <= w.commit.Load() {
		return true
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(w.ctx), dbTimeout)
	defer cancel()
	return w.committed(w.cursor, w.s.drv.CommitOffset(ctx, w.leaseNow(), w.cursor, w.s.cfg.Clock()))
}

// finish commits and releases the lease, also one given up (its expiry
// near, unrenewed) or lost (commitLost).
func (w *worker) finish() {
	s := w.s
	lost := true
	defer func() {
		s.mu.Lock()
		delete(s.workers, w.lease.PartitionRef)
		s.mu.Unlock()
		w.cancel()
		s.cfg.Metrics.LeaseEnded(w.lease.Tenant, lost)
	}()
	select {
	case <-w.lost:
		w.commitLost()
		return
	default:
	}
	if !w.commitCursor() {
		return
	}
	lost = false
	ctx, cancel := context.WithTimeout(context.Background(), dbTimeout)
	defer cancel()
	if s.cfg.Instance != "" && s.life.Context().Err() != nil && !s.isFenced() {
		return // a static member stopping keeps its partitions for its next process (Member.Stop)
	}
	if w.s.cfg.Clock().Before(w.notBefore) {
		return // taken over and not yet due: it lapses by itself (static.go)
	}
	if err := s.drv.ReleaseLease(ctx, w.leaseNow(), s.cfg.Clock()); err != nil && !errorsIsLost(err) {
		s.log.Warn("shardq: releasing a lease failed; it expires on its own", w.logArgs("err", err)...)
	}
}

// commitLost commits what the handlers settled under a lease given up or
// lost, and frees it, in one step fenced by the lease's token, not its
// expiry: it lands while nobody took the partition, so that the next
// holder (this member too) starts after it and any member may take it at
// once; a lease another took refuses it. A lease taken over and not yet
// due is not freed (it lapses by itself: static.go). The worker stays
// among the member's until then, so the member does not take the
// partition again first; the step is bounded on its own, outside the
// member's commit lock, as in an outage many leases end at once.
//
// While the member runs, a commit that fails for any reason but a lost
// lease is tried again every HeartbeatInterval until it lands or the
// token turns out taken: a lease lapses unrenewed when writes fail (on
// SQLite, every writer waits while another process, frozen mid-write,
// holds the file), and once they succeed again what was handled under it
// is committed, not delivered again. A stopping member tries once.
func (w *worker) commitLost() {
	w.settledTo()
	s := w.s
	for {
		ctx, cancel := context.WithTimeout(context.Background(), dbTimeout)
		now := s.cfg.Clock()
		err := s.drv.CommitReceived(ctx, driver.CommitReceivedParams{Lease: w.leaseNow(), Offset: w.cursor, Release: !now.Before(w.notBefore), Now: now})
		cancel()
		if err == nil {
			raise(&w.commit, w.cursor)
			return
		}
		if errorsIsLost(err) {
			return
		}
		t := time.NewTimer(s.cfg.HeartbeatInterval)
		select {
		case <-t.C:
		case <-s.life.Context().Done():
			t.Stop()
			return
		}
	}
}

// deliver hands msgs to the handler in order and settles each. It returns
// false when the worker must stop (lease lost, stop, hand-back mid-retry).
func (w *worker) deliver(msgs []driver.Message) bool {
	if w.states == nil {
		// Retry bookkeeping is written only under the partition's lease,
		// so what exists beyond the cursor now is all there is besides our
		// own attempts (which settle tracks): read it once per lease.
		ctx, cancel := context.WithTimeout(w.ctx, dbTimeout)
		states, err := w.s.drv.DeliveryStates(ctx, w.lease.PartitionRef, w.cursor, math.MaxInt64)
		cancel()
		if err != nil {
			if w.stopping() || w.ctx.Err() != nil {
				return false
			}
			w.s.log.Warn("shardq: reading retry state failed; retrying", w.logArgs("err", err)...)
			return w.wait(w.s.cfg.PollInterval)
		}
		w.states = states
	}
	states := w.states
	w.blocked, w.prefetched, w.sawLarge = false, msgs, false
	for i := range msgs {
		if large.KindOf(&msgs[i]) != large.Ordinary {
			w.sawLarge = true
			break
		}
	}
	defer func() { w.prefetched = nil }()
	defer w.settledTo() // whatever path settled them, the committer sees it
	if w.s.cfg.Batch && large.KindOf(&msgs[0]) == large.Ordinary {
		// A batch stops before a message delayed past its first one's
		// time (the partition waits there, as a FIFO group does), and
		// before a large message's chunk or end marker: a large
		// message is handed out alone.
		now := w.s.cfg.Clock()
		ready := later(now, msgs[0].NotBefore)
		for i := range msgs[1:] {
			if m := &msgs[i+1]; m.NotBefore.After(ready) || large.KindOf(m) != large.Ordinary || expiry.Expired(m, now) {
				msgs = msgs[:i+1]
				break
			}
		}
		return w.settle(msgs, nil, states[msgs[0].Offset])
	}
	for i := range msgs {
		if msgs[i].Offset <= w.cursor {
			continue // a large message's, settled with it
		}
		if i > 0 && w.stopping() {
			return false // the rest is redelivered by the next owner
		}
		if i > 0 && w.s.isPaused(w.lease.Tenant) {
			return true // the rest is read again after the resume
		}
		ok, more := w.deliverOne(&msgs[i], states[msgs[i].Offset])
		w.settledTo()
		if !ok || !more {
			return ok
		}
		if w.s.cfg.Batch {
			return true // one large message: the next batch starts after it
		}
	}
	return true
}

// deliverOne delivers m, one message or the start of a large one. more
// is false when the worker must stop here for now: it waits for a large
// message's end marker (and reads again from the cursor).
func (w *worker) deliverOne(m *driver.Message, st driver.DeliveryState) (ok, more bool) {
	if large.KindOf(m) == large.Ordinary {
		return w.settle([]driver.Message{*m}, nil, st), true
	}
	// The body reads m's later chunks again, one at a time: do not hold
	// the prefetched ones meanwhile. (Only m's: chunk 0 of a large
	// message after it is read from the batch when its turn comes.)
	if id := m.Headers[large.HeaderID]; id != "" {
		for i := range w.prefetched {
			if p := &w.prefetched[i]; p.Offset > m.Offset && p.Headers[large.HeaderID] == id && large.KindOf(p) == large.Chunk {
				p.Payload = nil
			}
		}
	}
	end, ok := w.largeEnd(m)
	switch {
	case !ok:
		return false, false
	case w.cursor >= m.Offset:
		return true, true // passed over
	case end == nil:
		w.blocked = true
		return true, false
	case large.IsAborted(end):
		// Chunk 0 only: the chunks after it are passed over one by one,
		// so that a message published between them and the aborted end
		// marker (after a writer's crash) is still delivered.
		return w.passOver(m, m.Offset, "a large message whose write failed or was abandoned"), true
	}
	span, ok := w.span(m, end)
	if !ok {
		return false, false
	}
	return w.settle([]driver.Message{*m}, span, st), true
}

// settle delivers msgs (one, or one batch) until acked or dead-lettered;
// with span, msgs is a large message's chunk 0 (or its end marker) and
// span what settling it covers.
func (w *worker) settle(msgs []driver.Message, span *large.Span, st driver.DeliveryState) bool {
	s := w.s
	first, last := msgs[0].Offset, msgs[len(msgs)-1].Offset
	if span != nil {
		last = span.UpTo
	}
	attempt := st.Attempts + 1
	// A retry waits for its time, and a delayed message for its
	// NotBefore: the partition waits with it.
	if wait := later(st.NextAttemptAt, msgs[0].NotBefore).Sub(s.cfg.Clock()); wait > 0 && !expiry.Expired(&msgs[0], s.cfg.Clock()) {
		if !w.commitCursor() || !w.wait(wait) {
			return false
		}
	}
	for {
		if !w.leaseLive() {
			return false
		}
		// Expiry is checked just before each attempt, by now's clock: a
		// batch stops before an expired message, and one expired first is
		// settled without delivery.
		if span == nil {
			now := s.cfg.Clock()
			if expiry.Expired(&msgs[0], now) {
				return w.expire(msgs[0], attempt)
			}
			for i := 1; i < len(msgs); i++ {
				if expiry.Expired(&msgs[i], now) {
					msgs, last = msgs[:i], msgs[i-1].Offset
					break
				}
			}
		}
		inTx, err := w.call(msgs, span, attempt)
		if err == nil {
			w.cursor = last
			return true
		}
		if w.ctx.Err() != nil {
			return false // lease lost or hard stop: the next owner redelivers
		}
		if inTx.Used() {
			// The handler settled in its transaction and then failed: what
			// that transaction committed stays settled.
			if committed, ok := w.committedNow(); ok && committed >= first {
				w.cursor = min(committed, last)
				return true // the rest, if any, is read again after the cursor
			}
		}
		// The verdict is the batch's: its first message records the
		// attempt, or every message is dead-lettered.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(w.ctx), dbTimeout)
		v, serr := s.settler.Leased(ctx, w.leaseNow(), msgs[0], span, attempt, err)
		cancel()
		if v.DeadLetter {
			if !w.deadLetter(msgs, span, attempt, v.Cause, serr) {
				return false
			}
			w.cursor = last
			w.settled.Store(last)
			raise(&w.commit, last) // the dead-letter transaction committed the cursor
			return true
		}
		if errorsIsLost(serr) {
			w.lose()
			return false
		}
		if serr != nil {
			s.log.Warn("shardq: recording a failed attempt failed", w.logArgs("offset", first, "err", serr)...)
		}
		s.cfg.Metrics.Retry(w.lease.Tenant)
		s.log.Info("shardq: handler failed; retrying after backoff", w.logArgs("offset", first, "attempt", attempt, "delay", v.Delay, "err", err)...)
		if !w.commitCursor() || !w.wait(v.Delay) {
			return false
		}
		if s.isSuspended(w.lease.Tenant) {
			return false // the attempt is recorded: the retry waits for the resume
		}
		attempt++
	}
}

// committedNow reads the partition's cursor under the lease's fence (the
// lease renewed by the way); false when it cannot.
func (w *worker) committedNow() (int64, bool) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(w.ctx), dbTimeout)
	defer cancel()
	l, err := w.s.drv.ResumeLease(ctx, w.leaseNow(), w.s.cfg.Clock(), w.s.cfg.LeaseTTL)
	if err != nil {
		w.s.log.Warn("shardq: reading the cursor after a handler's transaction failed", w.logArgs("err", err)...)
		return 0, false
	}
	return l.Committed, true
}

// call hands msgs to the handler as their attempt-th delivery; with span,
// the large message msgs[0] starts, whole, its body read afresh. It
// returns the handler's result and what it could settle in its own
// transaction.
func (w *worker) call(msgs []driver.Message, span *large.Span, attempt int) (*settle.InTx, error) {
	var whole *large.Whole
	if span != nil {
		whole = w.open(&msgs[0], *span)
	}
	// The handler may settle in its own transaction (Delivery.AckTx):
	// the cursor commit under this lease's fence joins it.
	inTx := &settle.InTx{Ack: func(ctx context.Context, tx driver.DBTX, upTo int64) error {
		return w.s.drv.InTx(tx).CommitOffset(ctx, w.leaseNow(), upTo, w.s.cfg.Clock())
	}, Deferrer: &settle.Deferrer{Driver: w.s.drv, Group: w.s.cfg.ConsumerGroup, Clock: w.s.cfg.Clock,
		Pass: func(ctx context.Context, tx driver.DBTX, upTo int64) error {
			return w.s.drv.InTx(tx).DeferOffset(ctx, w.leaseNow(), upTo, w.s.cfg.Clock())
		}}}
	err := w.s.cfg.Handle(settle.WithInTx(w.ctx, inTx), msgs, whole, attempt)
	inTx.Close() // a delivery kept past its handler settles nothing
	return inTx, err
}

// deadLetter copies msgs to the dead-letter topic and passes the cursor
// over them, one message per fenced transaction. The settler has tried
// the first already, with the result err; after a failure it starts
// again from the first (a dead letter is stored once, and a cursor never
// moves back).
func (w *worker) deadLetter(msgs []driver.Message, span *large.Span, attempts int, cause, err error) bool {
	s := w.s
	for i, m := range msgs {
		if i > 0 {
			err = w.deadLetterOne(m, attempts, cause)
		}
		if errorsIsLost(err) {
			w.lose()
			return false
		}
		if err != nil {
			s.log.Warn("shardq: dead-lettering failed; retrying", w.logArgs("offset", m.Offset, "err", err)...)
			return w.wait(s.cfg.PollInterval) && w.deadLetter(msgs, span, attempts, cause, w.deadLetterOneOf(msgs[0], span, attempts, cause))
		}
		s.cfg.Metrics.DeadLettered(w.lease.Tenant, 1)
		s.log.Warn("shardq: message dead-lettered", w.logArgs("offset", m.Offset, "id", m.ID, "attempts", attempts, "err", cause)...)
	}
	return true
}

// expire settles m, expired, without handing it out: the cursor passes
// it, or it is dead-lettered.
func (w *worker) expire(m driver.Message, attempt int) bool {
	s := w.s
	s.cfg.Metrics.Expired(w.lease.Tenant, 1)
	if s.cfg.Policy.DeadLetterExpired {
		cause := expiry.Cause(&m)
		if !w.deadLetter([]driver.Message{m}, nil, attempt, cause, w.deadLetterOneOf(m, nil, attempt, cause)) {
			return false
		}
		w.settled.Store(m.Offset)
		raise(&w.commit, m.Offset) // the dead-letter transaction committed the cursor
	} else {
		s.log.Debug("shardq: passed over an expired message", w.logArgs("offset", m.Offset, "id", m.ID)...)
	}
	w.cursor = m.Offset
	return true
}

// deadLetterOne dead-letters m, one of a batch that cause dead-lettered.
func (w *worker) deadLetterOne(m driver.Message, attempts int, cause error) error {
	return w.deadLetterOneOf(m, nil, attempts, cause)
}

// deadLetterOneOf dead-letters m (with span, the large message m starts).
func (w *worker) deadLetterOneOf(m driver.Message, span *large.Span, attempts int, cause error) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(w.ctx), dbTimeout)
	defer cancel()
	_, err := w.s.settler.Leased(ctx, w.leaseNow(), m, span, attempts, &settle.DeadLetterError{Err: cause})
	return err
}

// later is the later of a and b.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
