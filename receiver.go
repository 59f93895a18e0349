// SPDX-License-Identifier: Apache-2.0

package shardq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/ident"
	"github.com/shardq/shardq/internal/keepalive"
	"github.com/shardq/shardq/internal/settle"
	"github.com/shardq/shardq/internal/telemetry"
)

// Errors of message-group receivers.
var (
	// ErrGroupOwned means another receiver or subscriber of the consumer
	// group holds the group's lease; the error is a *GroupOwnedError naming
	// the holder.
	ErrGroupOwned = errors.New("message group owned by another consumer")
	// ErrAcceptTimeout means an accept with a wait found no group to take
	// before the wait ran out; it wraps the last reason (ErrGroupOwned or
	// ErrNoReadyGroup).
	ErrAcceptTimeout = errors.New("shardq: accept timed out")
	// ErrNoReadyGroup means no free group had a message ready.
	ErrNoReadyGroup = errors.New("no free message group with a ready message")
	// ErrReceiverClosed is returned by a receiver that was closed, released
	// its group after IdleTimeout, or lost its lease (then it also matches
	// ErrLeaseLost).
	ErrReceiverClosed = errors.New("shardq: group receiver closed")
	// ErrUnsettled is returned by Receive while the message it returned
	// last is neither acked, nacked nor dead-lettered: a group's message k+1
	// is never handed out before k is settled.
	ErrUnsettled = errors.New("shardq: the previous message of the group is not settled")
)

// GroupOwnedError names who holds a message group.
type GroupOwnedError struct {
	Tenant, Topic, ConsumerGroup, PartitionKey string
	Owner                                      string
	ExpiresAt                                  time.Time
}

func (e *GroupOwnedError) Error() string {
	return fmt.Sprintf("tenant %q topic %q group %q message group %q: %v: held by %q until %s", e.Tenant, e.Topic,
		e.ConsumerGroup, e.PartitionKey, ErrGroupOwned, e.Owner, e.ExpiresAt.Format(time.RFC3339Nano))
}

func (e *GroupOwnedError) Is(target error) bool { return target == ErrGroupOwned }

// ReceiverOptions configure AcceptGroup and AcceptNextGroup. Zero values
// take the defaults in brackets.
type ReceiverOptions struct {
	// Name names the receiver for people [host-pid]; each accepted group's
	// lease is owned by Name#random, new per receiver.
	Name string
	// Wait is how long an accept keeps trying while the group is owned (or,
	// for AcceptNextGroup and RequireReady, while no message is ready) [0:
	// fail at once].
	Wait time.Duration
	// RequireReady makes AcceptGroup hand the group over only when a
	// message is ready (not waiting for a retry).
	RequireReady bool
	// LeaseTTL is how long the group's lease lasts unless renewed; the
	// receiver renews it after a third of it [30s].
	LeaseTTL time.Duration
	// IdleTimeout releases the group after this long without a message
	// received while none is unsettled [60s].
	IdleTimeout time.Duration
	// PollInterval is how often Receive looks for a new message, and an
	// accept with a wait tries again [200ms]. A Publish through the same
	// Client, and the change feed, wake Receive at once.
	PollInterval time.Duration
	// FeedPollInterval replaces PollInterval in Receive while the
	// client's change feed streams [2s].
	FeedPollInterval time.Duration
	// StartPosition is where the consumer group starts in a partition it
	// has no cursor for, when this receiver is the first to register the
	// group in the topic [StartEarliest] (see SubscriberConfig).
	StartPosition StartPosition
	// HandlerTimeout bounds how long a received message may stay
	// unsettled: then the attempt counts as failed (retried after the
	// backoff by the group's next owner, or dead-lettered after the last
	// attempt) and the receiver closes, releasing the group, so that a
	// stuck application does not hold it; a later Ack fails with
	// ErrHandlerTimeout [5m, as SubscriberConfig]. NoHandlerTimeout: no
	// limit.
	HandlerTimeout time.Duration
	MaxAttempts    int           // after this many failed attempts a message is dead-lettered [10]
	BackoffMin     time.Duration // first retry delay, doubling per attempt, with jitter [1s]
	BackoffMax     time.Duration // [5m]
	DLQSuffix      string        // dead-letter topic = topic + DLQSuffix [".dlq"]
	Clock          func() time.Time
	Logger         *slog.Logger
}

func (c *Client) receiverDefaults(o *ReceiverOptions, topic string) (ReceiverOptions, error) {
	var r ReceiverOptions
	if o != nil {
		r = *o
	}
	d := func(v *time.Duration, def time.Duration) {
		if *v <= 0 {
			*v = def
		}
	}
	d(&r.LeaseTTL, DefaultLeaseTTL)
	d(&r.IdleTimeout, DefaultReceiverIdleTimeout)
	d(&r.PollInterval, DefaultPollInterval)
	d(&r.FeedPollInterval, DefaultFeedPollInterval)
	d(&r.BackoffMin, DefaultBackoffMin)
	d(&r.BackoffMax, DefaultBackoffMax)
	switch {
	case r.HandlerTimeout == 0:
		r.HandlerTimeout = DefaultHandlerTimeout
	case r.HandlerTimeout < 0 && r.HandlerTimeout != NoHandlerTimeout:
		return r, &ident.Error{Field: "handler timeout", Rule: fmt.Sprintf("%s is negative; NoHandlerTimeout (-1ns) means no limit", r.HandlerTimeout)}
	}
	if err := c.settleDefaults(&r.MaxAttempts, &r.DLQSuffix, &r.Clock, &r.Logger, &r.Name, "receiver"); err != nil {
		return r, err
	}
	if r.Wait < 0 {
		return r, &ident.Error{Field: "wait", Rule: "must not be negative"}
	}
	if err := r.StartPosition.check(); err != nil {
		return r, err
	}
	if err := ident.SubscriberName(r.Name); err != nil {
		return r, err
	}
	return r, dlqTopic(topic, r.DLQSuffix)
}

// AcceptGroup takes the message group partitionKey of (tenant, topic) for
// consumerGroup exclusively, through the same fenced lease a subscriber
// would hold: a subscriber and a receiver never own a group at once. When
// another consumer holds it, AcceptGroup fails with a *GroupOwnedError, or
// with opts.Wait keeps trying until the holder releases it or its lease
// expires, and then fails with ErrAcceptTimeout.
func (c *Client) AcceptGroup(ctx context.Context, tenant, topic, consumerGroup, partitionKey string, opts *ReceiverOptions) (*GroupReceiver, error) {
	o, err := c.receiverDefaults(opts, topic)
	if err == nil {
		err = validateGroupRef(tenant, topic, consumerGroup)
	}
	if err == nil {
		if partitionKey == "" {
			err = &ident.Error{Field: "partition key", Rule: "must not be empty: ungrouped messages go to competing consumers (SubscriberConfig.Take), not to a receiver"}
		} else {
			err = ident.PartitionKey(partitionKey)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("shardq: accept group: %w", err)
	}
	if err := c.registerGroup(ctx, []string{tenant}, topic, consumerGroup, o.StartPosition, o.Clock()); err != nil {
		return nil, fmt.Errorf("shardq: accept group: %w", err)
	}
	ref := driver.PartitionRef{Tenant: tenant, ConsumerGroup: consumerGroup, Topic: topic, PartitionKey: partitionKey}
	deadline := time.Now().Add(o.Wait)
	for {
		r, err := c.tryAccept(ctx, ref, o, -1)
		if err == nil {
			return r, nil
		}
		if !errors.Is(err, ErrGroupOwned) && !errors.Is(err, ErrNoReadyGroup) {
			return nil, err
		}
		if o.Wait == 0 {
			return nil, err
		}
		if !sleepUntilNext(ctx, nil, nil, deadline, o.PollInterval) {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("%w after %s: %w", ErrAcceptTimeout, o.Wait, err)
		}
	}
}

// AcceptNextGroup takes a free message group of topic in tenants (or
// MQ_TENANTS when tenants is empty) that has a message ready, the one whose
// next message is oldest first. It never hands out an owned group. With no
// group ready it fails with ErrNoReadyGroup, or with opts.Wait keeps
// looking and then fails with ErrAcceptTimeout.
func (c *Client) AcceptNextGroup(ctx context.Context, tenants []string, topic, consumerGroup string, opts *ReceiverOptions) (*GroupReceiver, error) {
	o, err := c.receiverDefaults(opts, topic)
	if err == nil {
		tenants, err = tenantList(tenants)
	}
	if err == nil {
		err = validateGroupRef(tenants[0], topic, consumerGroup)
	}
	if err != nil {
		return nil, fmt.Errorf("shardq: accept next group: %w", err)
	}
	if err := c.registerGroup(ctx, tenants, topic, consumerGroup, o.StartPosition, o.Clock()); err != nil {
		return nil, fmt.Errorf("shardq: accept next group: %w", err)
	}
	deadline := time.Now().Add(o.Wait)
	for {
		groups, err := c.drv.ReadyGroups(ctx, tenants, topic, consumerGroup, o.Clock(), 20)
		if err != nil {
			return nil, fmt.Errorf("shardq: accept next group: %w", err)
		}
		for _, g := range groups {
			ref := driver.PartitionRef{Tenant: g.Tenant, ConsumerGroup: consumerGroup, Topic: topic, PartitionKey: g.PartitionKey}
			r, err := c.tryAccept(ctx, ref, o, g.NextOffset)
			if err == nil {
				return r, nil
			}
			if !errors.Is(err, ErrGroupOwned) && !errors.Is(err, ErrNoReadyGroup) {
				return nil, err
			}
		}
		err = fmt.Errorf("tenants %v topic %q group %q: %w", tenants, topic, consumerGroup, ErrNoReadyGroup)
		if o.Wait == 0 {
			return nil, err
		}
		if !sleepUntilNext(ctx, nil, nil, deadline, o.PollInterval) {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("%w after %s: %w", ErrAcceptTimeout, o.Wait, err)
		}
	}
}

func validateGroupRef(tenant, topic, group string) error {
	if err := ident.Tenant(tenant); err != nil {
		return err
	}
	if err := ident.Topic(topic); err != nil {
		return err
	}
	return ident.ConsumerGroup(group)
}

// tenantList is tenants, or MQ_TENANTS when tenants is empty, validated.
func tenantList(tenants []string) ([]string, error) { return consumerTenants("tenants", tenants) }

// sleepUntilNext waits for a wake-up (nil: none), poll, or deadline,
// whichever is first; false when the deadline has passed, ctx ended or
// done (nil: never) is closed. A poll that ends at the deadline returns
// true: the caller looks once more.
func sleepUntilNext(ctx context.Context, done, wake <-chan struct{}, deadline time.Time, poll time.Duration) bool {
	left := time.Until(deadline)
	if left <= 0 {
		return false
	}
	t := time.NewTimer(min(poll, left))
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-wake:
		return true
	case <-ctx.Done():
		return false
	case <-done:
		return false
	}
}

// tryAccept acquires ref's lease and, when the receiver must start with a
// ready message (AcceptNextGroup always, AcceptGroup with RequireReady),
// checks that one is; otherwise it releases the lease again. nextOffset is
// the next message as the caller saw it, or -1.
func (c *Client) tryAccept(ctx context.Context, ref driver.PartitionRef, o ReceiverOptions, nextOffset int64) (*GroupReceiver, error) {
	now := o.Clock()
	id := ident.MemberID(o.Name) // each receiver is its own owner, even from one ReceiverOptions
	l, err := c.drv.AcquireLease(ctx, ref, id, now, o.LeaseTTL)
	var held *driver.LeaseHeldError
	if errors.As(err, &held) {
		return nil, &GroupOwnedError{Tenant: ref.Tenant, Topic: ref.Topic, ConsumerGroup: ref.ConsumerGroup, PartitionKey: ref.PartitionKey,
			Owner: held.Owner, ExpiresAt: held.ExpiresAt}
	}
	if err != nil {
		return nil, fmt.Errorf("shardq: accept %s: %w", ref, err)
	}
	r := &GroupReceiver{c: c, o: o, log: o.Logger.With("tenant", ref.Tenant, "topic", ref.Topic, "group", ref.ConsumerGroup,
		"partition_key", ref.PartitionKey, "member", id), id: id, ref: ref, lease: l, cursor: l.Committed, lastActive: now,
		metrics: c.tel.Group(ref.Topic, ref.ConsumerGroup),
		closing: make(chan struct{}), wake: make(chan struct{}, 1)}
	if nextOffset >= 0 || o.RequireReady {
		ready, err := r.ready(ctx)
		if err == nil && !ready {
			err = fmt.Errorf("%s: %w", ref, ErrNoReadyGroup)
		}
		if err != nil {
			dctx, cancel := detached(ctx)
			if rerr := c.drv.ReleaseLease(dctx, l, o.Clock()); rerr != nil {
				err = errors.Join(err, fmt.Errorf("release %s: %w", ref, rerr))
			}
			cancel()
			return nil, err
		}
	}
	r.metrics.LeaseAcquired(ref.Tenant) // shut counts its end
	r.alive = r.keepAlive()
	c.local.Add(ref.Topic, []string{ref.Tenant}, r, receiverWake{r})
	if err := c.track(r); err != nil {
		r.shut(err)
		r.alive.Stop(ctx)
		r.release(l)
		return nil, err
	}
	return r, nil
}

// GroupReceiver holds one message group exclusively and hands out its
// messages in order, one at a time: Receive returns the next message once
// the previous one is settled by Ack, Nack or DeadLetter. Its lease renews
// itself while it is open. Use it from one goroutine at a time.
type GroupReceiver struct {
	c   *Client
	o   ReceiverOptions
	id  string // lease owner: ident.MemberID(o.Name)
	ref driver.PartitionRef
	log *slog.Logger
	// metrics counts the lease, retries and dead letters.
	metrics *telemetry.Group

	cursor int64                          // last settled offset
	buf    []driver.Message               // fetched after the cursor, not handed out
	states map[int64]driver.DeliveryState // retry bookkeeping of buf
	held   *driver.Message                // handed out, not settled
	// large: ReceiveLarge is in use, so the prefetch stays small.
	large bool
	// heldTimer ends the attempt in hand at HandlerTimeout (expireHeld);
	// expiring counts expiries running, which Close waits for.
	heldTimer *time.Timer
	expiring  sync.WaitGroup
	// heldEnd is, while held is a large message's first chunk
	// (ReceiveLarge), its end marker: what settling it settles (nil:
	// none). Guarded by mu, as held is (the handler timeout reads them).
	heldEnd *driver.Message

	mu         sync.Mutex
	lease      driver.Lease // ExpiresAt renewed by keepAlive
	lastActive time.Time
	closedErr  error // why the receiver is closed, once it is
	closing    chan struct{}
	closeOnce  sync.Once
	wake       chan struct{}      // a wake-up: the group's head moved
	alive      *keepalive.Service // renews the lease while open
}

// Tenant, Topic, ConsumerGroup and PartitionKey name the accepted group.
func (r *GroupReceiver) Tenant() string        { return r.ref.Tenant }
func (r *GroupReceiver) Topic() string         { return r.ref.Topic }
func (r *GroupReceiver) ConsumerGroup() string { return r.ref.ConsumerGroup }
func (r *GroupReceiver) PartitionKey() string  { return r.ref.PartitionKey }

// Name is the receiver's name, as configured.
func (r *GroupReceiver) Name() string { return r.o.Name }

// ID is this receiver's identity (Name#suffix): the owner its lease shows.
func (r *GroupReceiver) ID() string { return r.id }

func (r *GroupReceiver) current() (driver.Lease, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lease, r.closedErr
}

// shut closes the receiver for reason; the first reason wins.
func (r *GroupReceiver) shut(reason error) {
	r.closeOnce.Do(func() {
		r.mu.Lock()
		r.closedErr = reason
		r.mu.Unlock()
		close(r.closing)
		r.c.local.Remove(r.ref.Topic, r)
		r.metrics.LeaseEnded(r.ref.Tenant, errors.Is(reason, driver.ErrLeaseLost))
	})
}

// fail records a write's error; a lost lease closes the receiver.
func (r *GroupReceiver) fail(op string, err error) error {
	if errors.Is(err, driver.ErrLeaseLost) {
		r.shut(fmt.Errorf("%w: %w", ErrReceiverClosed, err))
		r.log.Warn("shardq: group lease lost; the next owner redelivers from the committed cursor", "op", op)
	}
	return fmt.Errorf("shardq: %s %s: %w", op, r.ref, err)
}

// keepAlive starts the lease's keep-alive (internal/keepalive): renewal
// after a third of the TTL, the idle release, a lost lease closing the
// receiver.
func (r *GroupReceiver) keepAlive() *keepalive.Service {
	return keepalive.Start(r.c.drv, keepalive.Config{TTL: r.o.LeaseTTL, IdleTimeout: r.o.IdleTimeout, Timeout: dbTimeout,
		Clock: r.o.Clock, Log: r.log, Done: r.closing,
		State: func(now time.Time) (driver.Lease, bool) {
			r.mu.Lock()
			defer r.mu.Unlock()
			return r.lease, r.held == nil && now.Sub(r.lastActive) >= r.o.IdleTimeout
		},
		Renewed: func(l driver.Lease) {
			r.mu.Lock()
			r.lease = l
			r.mu.Unlock()
		},
		Idle: func(l driver.Lease) {
			r.shut(fmt.Errorf("%w: idle for %s", ErrReceiverClosed, r.o.IdleTimeout))
			r.release(l)
		},
		Lost: func(err error) { r.fail("renew", err) },
	})
}

func (r *GroupReceiver) release(l driver.Lease) {
	ctx, cancel := context.WithTimeout(context.Background(), dbTimeout)
	defer cancel()
	if err := r.c.drv.ReleaseLease(ctx, l, r.o.Clock()); err != nil && !errors.Is(err, driver.ErrLeaseLost) {
		r.log.Warn("shardq: releasing the group lease failed; it expires by itself", "err", err)
	}
}

// ready reports whether the group's next message may be delivered now.
func (r *GroupReceiver) ready(ctx context.Context) (bool, error) {
	if err := r.fill(ctx); err != nil {
		return false, err
	}
	return len(r.buf) > 0 && !r.states[r.buf[0].Offset].NextAttemptAt.After(r.o.Clock()), nil
}

// fill fetches the next messages after the cursor when none are buffered.
func (r *GroupReceiver) fill(ctx context.Context) error {
	if len(r.buf) > 0 {
		return nil
	}
	limit := 100
	if r.large {
		limit = 8 // chunks of large messages: a few, not 100 × 256 KiB
	}
	msgs, err := r.c.drv.FetchAfter(ctx, r.ref.Tenant, r.ref.Topic, r.ref.PartitionKey, r.cursor, limit)
	if err != nil || len(msgs) == 0 {
		return err
	}
	states, err := r.c.drv.DeliveryStates(ctx, r.ref, r.cursor, msgs[len(msgs)-1].Offset)
	if err != nil {
		return err
	}
	r.buf, r.states = msgs, states
	return nil
}

// Receive returns the group's next message, waiting until one arrives (or
// its retry is due) or ctx ends. It fails with ErrUnsettled while the last
// message is unsettled, and with ErrReceiverClosed once the receiver is
// closed, idle-released or has lost its lease.
func (r *GroupReceiver) Receive(ctx context.Context) (*Delivery, error) {
	start := time.Now()
	rereads := 0 // reads after a wake-up that found nothing
	for {
		if _, err := r.current(); err != nil {
			return nil, err
		}
		if r.held != nil {
			return nil, ErrUnsettled
		}
		if err := r.fill(ctx); err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("shardq: receive %s: %w", r.ref, err)
		}
		wait := r.o.PollInterval
		if r.c.local.Up() {
			wait = max(wait, r.o.FeedPollInterval)
		}
		if len(r.buf) > 0 {
			m := r.buf[0]
			st := r.states[m.Offset]
			// A retry waits for its time, a delayed message for its
			// NotBefore.
			if wait = later(st.NextAttemptAt, m.NotBefore).Sub(r.o.Clock()); wait <= 0 {
				// Never hand out a message once the lease may have
				// expired by this receiver's clock.
				if l, _ := r.current(); !r.o.Clock().Before(l.ExpiresAt) {
					err := fmt.Errorf("%w: %w (token %d expired at %s)", ErrReceiverClosed, driver.ErrLeaseLost, l.Token, l.ExpiresAt.Format(time.RFC3339Nano))
					r.shut(err)
					r.log.Warn("shardq: group lease expired before delivery; the next owner redelivers from the committed cursor")
					return nil, err
				}
				r.buf = r.buf[1:]
				r.mu.Lock()
				r.held = &m
				r.lastActive = r.o.Clock()
				r.startHeldTimer(m.Offset, st.Attempts+1)
				r.mu.Unlock()
				r.c.tel.Received(ctx, m, r.ref.ConsumerGroup, start)
				return newDelivery(m, st.Attempts+1), nil
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
			return nil, ctx.Err()
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

// receiverWake is a receiver's side of wake-ups (internal/wakeup).
type receiverWake struct{ r *GroupReceiver }

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

// settling checks that d is the message in hand.
func (r *GroupReceiver) settling(d *Delivery) (driver.Lease, error) {
	l, err := r.current()
	if err != nil {
		return l, err
	}
	if r.held == nil || d == nil || d.Offset != r.held.Offset {
		return l, fmt.Errorf("shardq: settle %s: %w", r.ref, &ident.Error{Field: "delivery",
			Rule: "must be the message this receiver returned last and has not settled"})
	}
	return l, nil
}

func (r *GroupReceiver) settled(cursor int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cursor = cursor
	r.held, r.heldEnd = nil, nil
	r.stopHeldTimer()
	for len(r.buf) > 0 && r.buf[0].Offset <= cursor { // a large message's chunks
		r.buf = r.buf[1:]
	}
	r.lastActive = r.o.Clock()
}

// Ack settles d: the group's cursor passes it, under the lease's fence.
func (r *GroupReceiver) Ack(ctx context.Context, d *Delivery) error {
	l, err := r.settling(d)
	if err != nil {
		return err
	}
	upTo := d.Offset
	if r.heldEnd != nil {
		upTo = r.heldEnd.Offset // a large message: its chunks and end marker
	}
	if err := r.c.drv.CommitOffset(ctx, l, upTo, r.o.Clock()); err != nil {
		return r.fail("ack", err)
	}
	r.settled(upTo)
	return nil
}

// Nack settles d as failed: it is delivered again after a backoff
// (BackoffMin doubling to BackoffMax, or the delay of a RetryAfter cause),
// and dead-lettered once it failed MaxAttempts times (at once for a
// DeadLetter cause), as in the subscriber runtime.
func (r *GroupReceiver) Nack(ctx context.Context, d *Delivery, cause error) error {
	l, err := r.settling(d)
	if err != nil {
		return err
	}
	if cause == nil {
		cause = errors.New("nacked")
	}
	v := settle.Policy{MaxAttempts: r.o.MaxAttempts, BackoffMin: r.o.BackoffMin, BackoffMax: r.o.BackoffMax}.Decide(cause, d.Attempt)
	if v.DeadLetter {
		return r.deadLetter(ctx, l, d, v.Cause)
	}
	now := r.o.Clock()
	st := driver.DeliveryState{Attempts: d.Attempt, NextAttemptAt: now.Add(v.Delay), LastError: settle.ErrText(cause)}
	if err := r.c.drv.RecordAttempt(ctx, l, d.Offset, st, now); err != nil {
		return r.fail("nack", err)
	}
	r.metrics.Retry(r.ref.Tenant)
	r.mu.Lock()
	r.buf = append([]driver.Message{*r.held}, r.buf...)
	if r.states == nil {
		r.states = map[int64]driver.DeliveryState{}
	}
	r.states[d.Offset] = st
	r.held, r.heldEnd = nil, nil
	r.stopHeldTimer()
	r.lastActive = now
	r.mu.Unlock()
	return nil
}

// DeadLetter settles d by moving it to the dead-letter topic now.
func (r *GroupReceiver) DeadLetter(ctx context.Context, d *Delivery, reason error) error {
	l, err := r.settling(d)
	if err != nil {
		return err
	}
	if reason == nil {
		reason = errors.New("dead-lettered by the receiver")
	}
	return r.deadLetter(ctx, l, d, reason)
}

func (r *GroupReceiver) deadLetter(ctx context.Context, l driver.Lease, d *Delivery, cause error) error {
	// A large message goes to the dead-letter topic as its end marker
	// (its id, headers, size and checksum); the cursor passes its chunks.
	copied, upTo := *r.held, d.Offset
	if r.heldEnd != nil {
		copied, upTo = *r.heldEnd, r.heldEnd.Offset
	}
	if err := r.c.drv.DeadLetter(ctx, l, settle.DeadLetterCopy(copied, r.o.DLQSuffix, d.Attempt, cause), upTo, r.o.Clock()); err != nil {
		return r.fail("dead-letter", err)
	}
	r.metrics.DeadLettered(r.ref.Tenant, 1)
	r.log.Warn("shardq: message dead-lettered", "offset", d.Offset, "id", d.ID, "attempts", d.Attempt, "err", cause)
	r.settled(upTo)
	return nil
}

// State reads the group's state (nil when never set), under the lease's
// fence: a receiver that lost the group gets ErrLeaseLost.
func (r *GroupReceiver) State(ctx context.Context) ([]byte, error) {
	l, err := r.current()
	if err != nil {
		return nil, err
	}
	st, err := r.c.drv.GroupState(ctx, l)
	if err != nil {
		return nil, r.fail("read state of", err)
	}
	return st, nil
}

// SetState stores the group's state under the lease's fence; it stays
// with the group across owners.
func (r *GroupReceiver) SetState(ctx context.Context, state []byte) error {
	l, err := r.current()
	if err != nil {
		return err
	}
	if err := r.c.drv.SetGroupState(ctx, l, state, r.o.Clock()); err != nil {
		return r.fail("set state of", err)
	}
	r.mu.Lock()
	r.lastActive = r.o.Clock()
	r.mu.Unlock()
	return nil
}

func (r *GroupReceiver) stopOrder() int                         { return 0 }
func (r *GroupReceiver) stopForClose(ctx context.Context) error { return r.Close(ctx) }

// Close releases the group. An unsettled message is delivered again to
// the group's next owner. Close is safe to call more than once.
func (r *GroupReceiver) Close(ctx context.Context) error {
	defer r.c.untrack(r)
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
	if err := r.c.drv.ReleaseLease(ctx, l, r.o.Clock()); err != nil && !errors.Is(err, driver.ErrLeaseLost) {
		return fmt.Errorf("shardq: close %s: %w", r.ref, err)
	}
	return nil
}

// startHeldTimer arms the handler timeout of the message at offset,
// handed out as its attempt-th delivery. r.mu is held.
func (r *GroupReceiver) startHeldTimer(offset int64, attempt int) {
	if r.o.HandlerTimeout <= 0 {
		return
	}
	r.expiring.Add(1)
	r.heldTimer = time.AfterFunc(r.o.HandlerTimeout, func() {
		defer r.expiring.Done()
		r.expireHeld(offset, attempt)
	})
}

// stopHeldTimer disarms the handler timeout. r.mu is held.
func (r *GroupReceiver) stopHeldTimer() {
	if r.heldTimer != nil && r.heldTimer.Stop() {
		r.expiring.Done()
	}
	r.heldTimer = nil
}

// expireHeld ends an attempt the application did not settle within
// HandlerTimeout: it counts as failed (recorded, or the message
// dead-lettered after its last attempt), and the receiver closes and
// releases the group, so that its next owner delivers the message again.
func (r *GroupReceiver) expireHeld(offset int64, attempt int) {
	r.mu.Lock()
	if r.held == nil || r.held.Offset != offset || r.closedErr != nil {
		r.mu.Unlock()
		return // settled meanwhile
	}
	held, end, l := *r.held, r.heldEnd, r.lease
	r.heldTimer = nil
	r.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), dbTimeout)
	defer cancel()
	now := r.o.Clock()
	cause := fmt.Errorf("%w after %s", ErrHandlerTimeout, r.o.HandlerTimeout)
	v := settle.Policy{MaxAttempts: r.o.MaxAttempts, BackoffMin: r.o.BackoffMin, BackoffMax: r.o.BackoffMax}.Decide(cause, attempt)
	var err error
	if v.DeadLetter {
		copied, upTo := held, offset
		if end != nil {
			copied, upTo = *end, end.Offset
		}
		if err = r.c.drv.DeadLetter(ctx, l, settle.DeadLetterCopy(copied, r.o.DLQSuffix, attempt, v.Cause), upTo, now); err == nil {
			r.metrics.DeadLettered(r.ref.Tenant, 1)
		}
	} else {
		st := driver.DeliveryState{Attempts: attempt, NextAttemptAt: now.Add(v.Delay), LastError: settle.ErrText(cause)}
		if err = r.c.drv.RecordAttempt(ctx, l, offset, st, now); err == nil {
			r.metrics.Retry(r.ref.Tenant)
		}
	}
	r.shut(fmt.Errorf("%w: %w", ErrReceiverClosed, cause))
	r.log.Warn("shardq: a received message was not settled in time; the attempt failed and the group is released",
		"offset", offset, "id", held.ID, "attempt", attempt, "timeout", r.o.HandlerTimeout, "dead_lettered", v.DeadLetter && err == nil, "err", err)
	if rerr := r.c.drv.ReleaseLease(ctx, l, now); rerr != nil && !errors.Is(rerr, driver.ErrLeaseLost) {
		r.log.Warn("shardq: releasing the group lease failed; it expires by itself", "err", rerr)
	}
}
