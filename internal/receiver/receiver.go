// SPDX-License-Identifier: Apache-2.0

// Package receiver is the runtime of message-group receivers
// (shardq.GroupReceiver): one message group held under the fenced lease a
// subscriber would hold, its messages handed out one at a time in order,
// failures settled through internal/settle. docs/groups.md describes it;
// the root package holds the public types, validates and converts.
package receiver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/backoff"
	"github.com/shardq/shardq/internal/ident"
	"github.com/shardq/shardq/internal/keepalive"
	"github.com/shardq/shardq/internal/large"
	"github.com/shardq/shardq/internal/lifecycle"
	"github.com/shardq/shardq/internal/settle"
	"github.com/shardq/shardq/internal/telemetry"
	"github.com/shardq/shardq/internal/wakeup"
)

// Errors of receivers; the root package exports them.
var (
	ErrGroupOwned     = errors.New("message group owned by another consumer")
	ErrAcceptTimeout  = errors.New("shardq: accept timed out")
	ErrNoReadyGroup   = errors.New("no free message group with a ready message")
	ErrReceiverClosed = errors.New("shardq: group receiver closed")
	ErrUnsettled      = errors.New("shardq: the previous message of the group is not settled")
	ErrLargeCorrupt   = large.ErrCorrupt
)

// Config is a receiver's settings, validated and with defaults filled.
type Config struct {
	Name string
	// Wait is how long an accept keeps trying while the group is owned
	// or no message is ready (0: fail at once).
	Wait         time.Duration
	RequireReady bool
	LeaseTTL     time.Duration
	IdleTimeout  time.Duration
	PollInterval time.Duration
	// FeedPollInterval replaces PollInterval while the change feed streams.
	FeedPollInterval time.Duration
	HandlerTimeout   time.Duration // <= 0: none
	// LargeWriteTimeout is how long a large message's write may make no
	// progress before a reader waiting for it gives it up (large.Waiter).
	LargeWriteTimeout time.Duration
	LargeStalls       *large.Stalls // the process's (large.Waiter)
	Settler           settle.Settler
	Log               *slog.Logger
	Tel               *telemetry.T
	Local             *wakeup.Registry // the client's wake-ups
	// Owned makes the error for a group another consumer holds; it must
	// match ErrGroupOwned.
	Owned func(ref driver.PartitionRef, held *driver.LeaseHeldError) error
}

const dbTimeout = lifecycle.CallTimeout

// prefetchBytes bounds the payload and header bytes a receiver reads ahead.
const prefetchBytes = 1 << 20

// AcceptGroup takes ref's lease; while another consumer holds it (or,
// with RequireReady, no message is ready) it tries again every
// PollInterval for Wait, and then fails with ErrAcceptTimeout wrapping
// the last reason.
func AcceptGroup(ctx context.Context, drv driver.Driver, cfg Config, ref driver.PartitionRef) (*Receiver, error) {
	deadline := time.Now().Add(cfg.Wait)
	for {
		r, err := tryAccept(ctx, drv, cfg, ref, -1)
		if err == nil {
			return r, nil
		}
		if !errors.Is(err, ErrGroupOwned) && !errors.Is(err, ErrNoReadyGroup) || cfg.Wait == 0 {
			return nil, err
		}
		if err := waitAgain(ctx, cfg, deadline, err); err != nil {
			return nil, err
		}
	}
}

// AcceptNext takes a free group of topic in tenants with a message ready,
// the one whose next message is oldest first, looking again as
// AcceptGroup does.
func AcceptNext(ctx context.Context, drv driver.Driver, cfg Config, tenants []string, topic, group string) (*Receiver, error) {
	deadline := time.Now().Add(cfg.Wait)
	for {
		groups, err := drv.ReadyGroups(ctx, driver.GroupScope{Tenants: tenants, Topic: topic, ConsumerGroup: group}, cfg.Settler.Clock(), 20)
		if err != nil {
			return nil, fmt.Errorf("shardq: accept next group: %w", err)
		}
		for _, g := range groups {
			ref := driver.PartitionRef{Tenant: g.Tenant, ConsumerGroup: group, Topic: topic, PartitionKey: g.PartitionKey}
			r, err := tryAccept(ctx, drv, cfg, ref, g.NextOffset)
			if err == nil {
				return r, nil
			}
			if !errors.Is(err, ErrGroupOwned) && !errors.Is(err, ErrNoReadyGroup) {
				return nil, err
			}
		}
		err = fmt.Errorf("tenants %v topic %q group %q: %w", tenants, topic, group, ErrNoReadyGroup)
		if cfg.Wait == 0 {
			return nil, err
		}
		if err := waitAgain(ctx, cfg, deadline, err); err != nil {
			return nil, err
		}
	}
}

// waitAgain waits a poll before the next try; at the deadline it returns
// ErrAcceptTimeout wrapping last (or ctx's error).
func waitAgain(ctx context.Context, cfg Config, deadline time.Time, last error) error {
	if lifecycle.SleepUntilNext(ctx, nil, nil, deadline, cfg.PollInterval) {
		return nil
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("%w after %s: %w", ErrAcceptTimeout, cfg.Wait, last)
}

// tryAccept acquires ref's lease and, when the receiver must start with a
// ready message (AcceptNext always, AcceptGroup with RequireReady),
// checks that one is; otherwise it releases the lease again. nextOffset is
// the next message as the caller saw it, or -1.
func tryAccept(ctx context.Context, drv driver.Driver, cfg Config, ref driver.PartitionRef, nextOffset int64) (*Receiver, error) {
	clock := cfg.Settler.Clock
	now := clock()
	id := ident.MemberID(cfg.Name) // each receiver is its own owner, even from one configuration
	l, err := drv.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: ref, Owner: id, Now: now, TTL: cfg.LeaseTTL})
	var held *driver.LeaseHeldError
	if errors.As(err, &held) {
		return nil, cfg.Owned(ref, held)
	}
	if err != nil {
		return nil, fmt.Errorf("shardq: accept %s: %w", ref, err)
	}
	r := &Receiver{drv: drv, cfg: cfg, log: cfg.Log.With("tenant", ref.Tenant, "topic", ref.Topic, "group", ref.ConsumerGroup,
		"partition_key", ref.PartitionKey, "member", id), id: id, ref: ref, lease: l, cursor: l.Committed, lastActive: now,
		metrics: cfg.Tel.Group(ref.Topic, ref.ConsumerGroup),
		closing: make(chan struct{}), stopped: make(chan struct{}), wake: make(chan struct{}, 1),
		waiter: large.Waiter{Store: drv, Timeout: cfg.LargeWriteTimeout, Stalls: cfg.LargeStalls}, poll: backoff.NewPoll(cfg.PollInterval)}
	if nextOffset >= 0 || cfg.RequireReady {
		ready, err := r.ready(ctx)
		if err == nil && !ready {
			err = fmt.Errorf("%s: %w", ref, ErrNoReadyGroup)
		}
		if err != nil {
			dctx, cancel := lifecycle.Detached(ctx)
			if rerr := drv.ReleaseLease(dctx, l, clock()); rerr != nil {
				err = errors.Join(err, fmt.Errorf("release %s: %w", ref, rerr))
			}
			cancel()
			return nil, err
		}
	}
	r.metrics.LeaseAcquired(ref.Tenant) // shut counts its end
	r.alive = r.keepAlive()
	cfg.Local.Add(ref.Topic, []string{ref.Tenant}, r, receiverWake{r})
	return r, nil
}

// Receiver holds one message group and hands out its messages in order,
// one at a time. Use it from one goroutine at a time.
type Receiver struct {
	drv driver.Driver
	cfg Config
	id  string // lease owner: ident.MemberID(cfg.Name)
	ref driver.PartitionRef
	log *slog.Logger
	// metrics counts the lease, retries and dead letters.
	metrics *telemetry.Group

	cursor int64            // last settled offset
	buf    []driver.Message // fetched after the cursor, not handed out
	// poll is Receive's wait without a feed; handedOut says its last
	// call handed a message out (Receive's own: one caller at a time).
	poll      *backoff.Poll
	handedOut bool
	states    map[int64]driver.DeliveryState // retry bookkeeping of buf
	held      *driver.Message                // handed out, not settled
	// heldAttempt is held's attempt, as handed out.
	heldAttempt int
	// heldInTx: the application settled held in its own transaction
	// (AckTx), which may have committed.
	heldInTx bool
	// heldTimer ends the attempt in hand at HandlerTimeout (expireHeld);
	// expiring counts expiries running, which Close waits for.
	heldTimer *time.Timer
	expiring  sync.WaitGroup
	// heldSpan is, while held is a large message's first chunk
	// (ReceiveLarge), what settling it covers (nil: none). Guarded by
	// mu, as held is (the handler timeout reads them).
	heldSpan *large.Span
	// waiter waits for the end marker of a large message in hand; it
	// lives as long as the receiver, so that calls with short contexts
	// still add up to its LargeWriteTimeout.
	waiter large.Waiter

	mu         sync.Mutex
	lease      driver.Lease // ExpiresAt renewed by keepAlive
	lastActive time.Time
	closedErr  error // why the receiver is closed, once it is
	closing    chan struct{}
	closeOnce  sync.Once
	stopped    chan struct{} // closed once closed and the lease released (or lost)
	stopOnce   sync.Once
	wake       chan struct{}      // a wake-up: the group's head moved
	alive      *keepalive.Service // renews the lease while open
}

// Ref names the accepted group.
func (r *Receiver) Ref() driver.PartitionRef { return r.ref }

// ID is this receiver's identity: the owner its lease shows.
func (r *Receiver) ID() string { return r.id }

func (r *Receiver) now() time.Time { return r.cfg.Settler.Clock() }

func (r *Receiver) current() (driver.Lease, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lease, r.closedErr
}

// shut closes the receiver for reason; the first reason wins.
func (r *Receiver) shut(reason error) {
	r.closeOnce.Do(func() {
		r.mu.Lock()
		r.closedErr = reason
		r.mu.Unlock()
		close(r.closing)
		r.cfg.Local.Remove(r.ref.Topic, r)
		r.metrics.LeaseEnded(r.ref.Tenant, errors.Is(reason, driver.ErrLeaseLost))
	})
}

// Done is closed once the receiver has stopped: closed, and its lease
// released (by Close, by the idle release or the handler timeout) or lost.
func (r *Receiver) Done() <-chan struct{} { return r.stopped }

// finish marks the receiver stopped; its closing came first.
func (r *Receiver) finish() { r.stopOnce.Do(func() { close(r.stopped) }) }

// Abort closes a receiver that its owner could not take on (the client
// closed meanwhile) and releases its group.
func (r *Receiver) Abort(ctx context.Context, reason error) {
	r.shut(reason)
	r.alive.Stop(ctx)
	r.release(r.lease)
	r.finish()
}

// fail records a write's error; a lost lease closes the receiver.
func (r *Receiver) fail(op string, err error) error {
	if errors.Is(err, driver.ErrLeaseLost) {
		r.shut(fmt.Errorf("%w: %w", ErrReceiverClosed, err))
		r.finish()
		r.log.Warn("shardq: group lease lost; the next owner redelivers from the committed cursor", "op", op)
	}
	return fmt.Errorf("shardq: %s %s: %w", op, r.ref, err)
}

// keepAlive starts the lease's keep-alive (internal/keepalive): renewal
// after a third of the TTL, the idle release, a lost lease closing the
// receiver.
func (r *Receiver) keepAlive() *keepalive.Service {
	return keepalive.Start(r.drv, keepalive.Config{TTL: r.cfg.LeaseTTL, IdleTimeout: r.cfg.IdleTimeout, Timeout: dbTimeout,
		Clock: r.cfg.Settler.Clock, Log: r.log, Done: r.closing,
		State: func(now time.Time) (driver.Lease, bool) {
			r.mu.Lock()
			defer r.mu.Unlock()
			return r.lease, r.held == nil && now.Sub(r.lastActive) >= r.cfg.IdleTimeout
		},
		Renewed: func(l driver.Lease) {
			r.mu.Lock()
			r.lease = l
			r.mu.Unlock()
		},
		Idle: func(l driver.Lease) {
			r.shut(fmt.Errorf("%w: idle for %s", ErrReceiverClosed, r.cfg.IdleTimeout))
			r.release(l)
			r.finish()
		},
		Lost: func(err error) { r.fail("renew", err) },
	})
}

func (r *Receiver) release(l driver.Lease) {
	ctx, cancel := context.WithTimeout(context.Background(), dbTimeout)
	defer cancel()
	if err := r.drv.ReleaseLease(ctx, l, r.now()); err != nil && !errors.Is(err, driver.ErrLeaseLost) {
		r.log.Warn("shardq: releasing the group lease failed; it expires by itself", "err", err)
	}
}

// ready reports whether the group's next message may be delivered now.
func (r *Receiver) ready(ctx context.Context) (bool, error) {
	if err := r.fill(ctx); err != nil {
		return false, err
	}
	return len(r.buf) > 0 && !r.states[r.buf[0].Offset].NextAttemptAt.After(r.now()), nil
}

// fill fetches the next messages after the cursor when none are buffered.
func (r *Receiver) fill(ctx context.Context) error {
	if len(r.buf) > 0 {
		return nil
	}
	// Up to 100 messages within prefetchBytes: a run of small messages in
	// one read, a large message's chunks a few at a time.
	msgs, _, err := r.drv.FetchWithin(ctx, driver.FetchWithinParams{Partition: driver.TopicPartition{Tenant: r.ref.Tenant, Topic: r.ref.Topic, PartitionKey: r.ref.PartitionKey}, After: r.cursor, Limit: 100, Budget: prefetchBytes})

	if err != nil || len(msgs) == 0 {
		return err
	}
	states, err := r.drv.DeliveryStates(ctx, r.ref, r.cursor, msgs[len(msgs)-1].Offset)
	if err != nil {
		return err
	}
	r.buf, r.states = msgs, states
	return nil
}

// Receive returns the group's next message and its attempt, waiting until
// one arrives (or its retry is due) or ctx ends. It fails with
// ErrUnsettled while the last message is unsettled, and with
// ErrReceiverClosed once the receiver is closed, idle-released or has
// lost its lease.
func (r *Receiver) Receive(ctx context.Context) (driver.Message, int, error) {
	start := time.Now()
	rereads := 0 // reads after a wake-up that found nothing
	for {
		if _, err := r.current(); err != nil {
			return driver.Message{}, 0, err
		}
		if r.held != nil {
			return driver.Message{}, 0, ErrUnsettled
		}
		if err := r.fill(ctx); err != nil {
			if ctx.Err() != nil {
				return driver.Message{}, 0, ctx.Err()
			}
			return driver.Message{}, 0, fmt.Errorf("shardq: receive %s: %w", r.ref, err)
		}
		var wait time.Duration
		if r.cfg.Local.Up() {
			wait = max(r.cfg.PollInterval, r.cfg.FeedPollInterval)
		} else {
			// Without a feed: soon after a message, backing off to
			// PollInterval while none comes.
			wait = r.poll.Next(r.handedOut)
			r.handedOut = false
		}
		if len(r.buf) > 0 {
			m := r.buf[0]
			st := r.states[m.Offset]
			// A retry waits for its time, a delayed message for its
			// NotBefore.
			if wait = later(st.NextAttemptAt, m.NotBefore).Sub(r.now()); wait <= 0 {
				// Never hand out a message once the lease may have
				// expired by this receiver's clock.
				if l, _ := r.current(); !r.now().Before(l.ExpiresAt) {
					err := fmt.Errorf("%w: %w (token %d expired at %s)", ErrReceiverClosed, driver.ErrLeaseLost, l.Token, l.ExpiresAt.Format(time.RFC3339Nano))
					r.shut(err)
					r.finish()
					r.log.Warn("shardq: group lease expired before delivery; the next owner redelivers from the committed cursor")
					return driver.Message{}, 0, err
				}
				r.buf = r.buf[1:]
				r.mu.Lock()
				r.held, r.heldAttempt = &m, st.Attempts+1
				r.lastActive = r.now()
				r.startHeldTimer(m.Offset, st.Attempts+1)
				r.mu.Unlock()
				r.cfg.Tel.Received(ctx, m, r.ref.ConsumerGroup, start)
				r.handedOut = true
				return m, st.Attempts + 1, nil
			}
		}
		if len(r.buf) == 0 && rereads > 0 && rereads <= feedRereads {
			// Woken, found nothing: the commit may not be visible yet
			// (the binary log can run ahead of it). Look again soon.
			wait = min(wait, feedReread<<(rereads-1))
			rereads++
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-r.wake:
			rereads = 1
		case <-r.closing:
		case <-ctx.Done():
			t.Stop()
			return driver.Message{}, 0, ctx.Err()
		}
		t.Stop()
	}
}

// A receiver woken for a head it then does not see reads again after
// feedReread, doubling, feedRereads times (as a subscriber's worker does).
const (
	feedReread  = 2 * time.Millisecond
	feedRereads = 5
)

// later is the later of a and b.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// receiverWake is a receiver's side of wake-ups (internal/wakeup).
type receiverWake struct{ r *Receiver }

func (w receiverWake) Moved(heads []driver.HeadChange) {
	for _, h := range heads {
		if h.PartitionKey == w.r.ref.PartitionKey {
			w.Rescan()
			return
		}
	}
}

func (w receiverWake) Rescan() {
	select {
	case w.r.wake <- struct{}{}:
	default:
	}
}

// settling checks that offset is the message in hand (0: none given).
func (r *Receiver) settling(offset int64) (driver.Lease, error) {
	l, err := r.current()
	if err != nil {
		return l, err
	}
	if r.held == nil || offset != r.held.Offset {
		return l, fmt.Errorf("shardq: settle %s: %w", r.ref, &ident.Error{Field: "delivery",
			Rule: "must be the message this receiver returned last and has not settled"})
	}
	return l, nil
}

func (r *Receiver) settled(cursor int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cursor = cursor
	r.held, r.heldSpan, r.heldInTx = nil, nil, false
	r.stopHeldTimer()
	for len(r.buf) > 0 && r.buf[0].Offset <= cursor { // a large message's chunks
		r.buf = r.buf[1:]
	}
	r.lastActive = r.now()
}

// Ack settles the message in hand at offset: the group's cursor passes
// it, under the lease's fence.
func (r *Receiver) Ack(ctx context.Context, offset int64) error {
	l, err := r.settling(offset)
	if err != nil {
		return err
	}
	upTo := offset
	if r.heldSpan != nil {
		upTo = r.heldSpan.UpTo // a large message: its chunks and end marker
	}
	if err := r.drv.CommitOffset(ctx, l, upTo, r.now()); err != nil {
		return r.fail("ack", err)
	}
	r.settled(upTo)
	return nil
}

// settledInTx reports whether the cursor is past held (with end, the
// large message it starts), read under l's fence: an AckTx whose
// transaction committed. upTo is the offset that settles it.
func (r *Receiver) settledInTx(ctx context.Context, l driver.Lease, held driver.Message, span *large.Span) (upTo int64, done bool, err error) {
	upTo = held.Offset
	if span != nil {
		upTo = span.UpTo
	}
	cur, err := r.drv.ResumeLease(ctx, l, r.now(), r.cfg.LeaseTTL)
	if err != nil {
		return upTo, false, err
	}
	return upTo, cur.Committed >= upTo, nil
}

// AckTx commits the cursor past the message in hand at offset inside
// the application's transaction tx, under the lease's fence; the
// receiver counts it settled only at the Ack that follows the commit.
func (r *Receiver) AckTx(ctx context.Context, tx driver.DBTX, offset int64) error {
	return r.inTx(offset, "ack in the caller's transaction", func(l driver.Lease, upTo int64) error {
		return r.drv.InTx(tx).CommitOffset(ctx, l, upTo, r.now())
	})
}

// DeferTx passes the cursor over the message in hand at offset inside
// tx for its deferral (driver.TxSettler.DeferOffset: not past a cursor
// that settled it already), as AckTx does.
func (r *Receiver) DeferTx(ctx context.Context, tx driver.DBTX, offset int64) error {
	return r.inTx(offset, "pass in the caller's transaction to defer", func(l driver.Lease, upTo int64) error {
		return r.drv.InTx(tx).DeferOffset(ctx, l, upTo, r.now())
	})
}

// inTx runs pass, a move of the cursor past the message in hand at
// offset (up to its end marker for a large one) in the application's
// transaction, and marks the message settled there.
func (r *Receiver) inTx(offset int64, op string, pass func(l driver.Lease, upTo int64) error) error {
	l, err := r.settling(offset)
	if err != nil {
		return err
	}
	upTo := offset
	if r.heldSpan != nil {
		upTo = r.heldSpan.UpTo
	}
	r.mu.Lock()
	r.heldInTx = true
	r.mu.Unlock()
	if err := pass(l, upTo); err != nil {
		return r.fail(op, err)
	}
	return nil
}

// Nack settles the message in hand at offset as failed by cause: the
// settler records the attempt or dead-letters it.
func (r *Receiver) Nack(ctx context.Context, offset int64, cause error) error {
	l, err := r.settling(offset)
	if err != nil {
		return err
	}
	if cause == nil {
		cause = errors.New("nacked")
	}
	return r.settleFailure(ctx, l, cause, "nack")
}

// DeadLetter settles the message in hand at offset by moving it to the
// dead-letter topic now.
func (r *Receiver) DeadLetter(ctx context.Context, offset int64, reason error) error {
	l, err := r.settling(offset)
	if err != nil {
		return err
	}
	if reason == nil {
		reason = errors.New("dead-lettered by the receiver")
	}
	return r.settleFailure(ctx, l, &settle.DeadLetterError{Err: reason}, "dead-letter")
}

// settleFailure settles the message in hand as failed by cause (op: for errors).
func (r *Receiver) settleFailure(ctx context.Context, l driver.Lease, cause error, op string) error {
	held, span, attempt := *r.held, r.heldSpan, r.heldAttempt
	r.mu.Lock()
	inTx := r.heldInTx
	r.mu.Unlock()
	if inTx {
		// Settled in the application's transaction: if that committed,
		// the message is acked, whatever failed after.
		upTo, done, err := r.settledInTx(ctx, l, held, span)
		if err != nil {
			return r.fail(op, err)
		}
		if done {
			r.settled(upTo)
			return nil
		}
	}
	v, err := r.cfg.Settler.Leased(ctx, l, held, span, attempt, cause)
	if v.DeadLetter {
		op = "dead-letter"
	}
	if err != nil {
		return r.fail(op, err)
	}
	if v.DeadLetter {
		upTo, id := held.Offset, held.ID
		if span != nil {
			upTo, id = span.UpTo, span.End.ID
		}
		r.metrics.DeadLettered(r.ref.Tenant, 1)
		r.log.Warn("shardq: message dead-lettered", "offset", held.Offset, "id", id, "attempts", attempt, "err", v.Cause)
		r.settled(upTo)
		return nil
	}
	r.metrics.Retry(r.ref.Tenant)
	r.mu.Lock()
	r.buf = append([]driver.Message{held}, r.buf...)
	if r.states == nil {
		r.states = map[int64]driver.DeliveryState{}
	}
	r.states[held.Offset] = driver.DeliveryState{Attempts: attempt, NextAttemptAt: v.Due, LastError: settle.ErrText(cause)}
	r.held, r.heldSpan, r.heldInTx = nil, nil, false
	r.stopHeldTimer()
	r.lastActive = r.now()
	r.mu.Unlock()
	return nil
}

// State reads the group's state (nil when never set), under the lease's
// fence.
func (r *Receiver) State(ctx context.Context) ([]byte, error) {
	l, err := r.current()
	if err != nil {
		return nil, err
	}
	st, err := r.drv.GroupState(ctx, l)
	if err != nil {
		return nil, r.fail("read state of", err)
	}
	return st, nil
}

// SetState stores the group's state under the lease's fence.
func (r *Receiver) SetState(ctx context.Context, state []byte) error {
	l, err := r.current()
	if err != nil {
		return err
	}
	if err := r.drv.SetGroupState(ctx, l, state, r.now()); err != nil {
		return r.fail("set state of", err)
	}
	r.mu.Lock()
	r.lastActive = r.now()
	r.mu.Unlock()
	return nil
}

// Close releases the group. An unsettled message is delivered again to
// the group's next owner. Close is safe to call more than once.
func (r *Receiver) Close(ctx context.Context) error {
	defer r.finish()
	r.mu.Lock()
	r.stopHeldTimer()
	r.mu.Unlock()
	r.expiring.Wait() // an expiry already running finishes first
	_, err := r.current()
	r.shut(ErrReceiverClosed)
	r.alive.Stop(ctx) // it sees closing and returns
	if err != nil {
		return nil // idle-released or lost: nothing left to release
	}
	l, _ := r.current() // keepAlive has returned: the lease is final
	if err := r.drv.ReleaseLease(ctx, l, r.now()); err != nil && !errors.Is(err, driver.ErrLeaseLost) {
		return fmt.Errorf("shardq: close %s: %w", r.ref, err)
	}
	return nil
}

// startHeldTimer arms the handler timeout of the message at offset,
// handed out as its attempt-th delivery. r.mu is held.
func (r *Receiver) startHeldTimer(offset int64, attempt int) {
	if r.cfg.HandlerTimeout <= 0 {
		return
	}
	r.expiring.Add(1)
	r.heldTimer = time.AfterFunc(r.cfg.HandlerTimeout, func() {
		defer r.expiring.Done()
		r.expireHeld(offset, attempt)
	})
}

// stopHeldTimer disarms the handler timeout. r.mu is held.
func (r *Receiver) stopHeldTimer() {
	if r.heldTimer != nil && r.heldTimer.Stop() {
		r.expiring.Done()
	}
	r.heldTimer = nil
}

// expireHeld ends an attempt the application did not settle within
// HandlerTimeout: it counts as failed (recorded, or the message
// dead-lettered after its last attempt), and the receiver closes and
// releases the group, so that its next owner delivers the message again.
func (r *Receiver) expireHeld(offset int64, attempt int) {
	r.mu.Lock()
	if r.held == nil || r.held.Offset != offset || r.closedErr != nil {
		r.mu.Unlock()
		return // settled meanwhile
	}
	held, span, l, inTx := *r.held, r.heldSpan, r.lease, r.heldInTx
	r.heldTimer = nil
	r.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), dbTimeout)
	defer cancel()
	cause := fmt.Errorf("%w after %s", settle.ErrHandlerTimeout, r.cfg.HandlerTimeout)
	var v settle.Verdict
	var err error
	done := false
	if inTx { // settled in the application's transaction, if that committed
		_, done, _ = r.settledInTx(ctx, l, held, span) // unknown: the attempt failed
	}
	if !done {
		v, err = r.cfg.Settler.Leased(ctx, l, held, span, attempt, cause)
	}
	switch {
	case err == nil && v.DeadLetter:
		r.metrics.DeadLettered(r.ref.Tenant, 1)
	case err == nil:
		r.metrics.Retry(r.ref.Tenant)
	}
	r.shut(fmt.Errorf("%w: %w", ErrReceiverClosed, cause))
	r.log.Warn("shardq: a received message was not settled in time; the attempt failed and the group is released",
		"offset", offset, "id", held.ID, "attempt", attempt, "timeout", r.cfg.HandlerTimeout, "dead_lettered", v.DeadLetter && err == nil, "err", err)
	if rerr := r.drv.ReleaseLease(ctx, l, r.now()); rerr != nil && !errors.Is(rerr, driver.ErrLeaseLost) {
		r.log.Warn("shardq: releasing the group lease failed; it expires by itself", "err", rerr)
	}
	r.finish()
}
