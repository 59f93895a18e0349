// SPDX-License-Identifier: Apache-2.0

package shardq

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/ident"
	"github.com/shardq/shardq/internal/keepalive"
	"github.com/shardq/shardq/internal/large"
	"github.com/shardq/shardq/internal/receiver"
	"github.com/shardq/shardq/internal/settings"
	"github.com/shardq/shardq/internal/settle"
)

// Errors of message-group receivers.
var (
	// ErrGroupOwned means another receiver or subscriber of the consumer
	// group holds the group's lease; the error is a *GroupOwnedError naming
	// the holder.
	ErrGroupOwned = receiver.ErrGroupOwned
	// ErrAcceptTimeout means an accept with a wait found no group to take
	// before the wait ran out; it wraps the last reason (ErrGroupOwned or
	// ErrNoReadyGroup).
	ErrAcceptTimeout = receiver.ErrAcceptTimeout
	// ErrNoReadyGroup means no free group had a message ready.
	ErrNoReadyGroup = receiver.ErrNoReadyGroup
	// ErrReceiverClosed is returned by a receiver that was closed, released
	// its group after IdleTimeout, or lost its lease (then it also matches
	// ErrLeaseLost).
	ErrReceiverClosed = receiver.ErrReceiverClosed
	// ErrUnsettled is returned by Receive while the message it returned
	// last is neither acked, nacked nor dead-lettered: a group's message k+1
	// is never handed out before k is settled.
	ErrUnsettled = receiver.ErrUnsettled
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
	// accept with a wait tries again [200ms]. Without a change feed,
	// Receive looks again after a twentieth of it (at least 5 ms) once it
	// handed a message out, backing off to PollInterval (docs/feed.md). A
	// Publish through the same Client, and the change feed, wake Receive
	// at once.
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
	// DeadLetterExpired dead-letters a message found expired
	// (Message.TTL) instead of passing over it, as Service Bus's
	// dead-lettering on expiration [false].
	DeadLetterExpired bool
	Clock             func() time.Time
	Logger            *slog.Logger
}

func (c *Client) receiverDefaults(o *ReceiverOptions, topic string) (ReceiverOptions, error) {
	var r ReceiverOptions
	if o != nil {
		r = *o
	}
	settings.Positive(&r.LeaseTTL, DefaultLeaseTTL)
	settings.Positive(&r.IdleTimeout, DefaultReceiverIdleTimeout)
	settings.Positive(&r.PollInterval, DefaultPollInterval)
	settings.Positive(&r.FeedPollInterval, DefaultFeedPollInterval)
	settings.Positive(&r.BackoffMin, DefaultBackoffMin)
	settings.Positive(&r.BackoffMax, DefaultBackoffMax)
	if err := settings.HandlerTimeout(&r.HandlerTimeout, DefaultHandlerTimeout, NoHandlerTimeout); err != nil {
		return r, err
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
	if err := dlqTopic(topic, r.DLQSuffix); err != nil {
		return r, err
	}
	c.warnFrozenHold(r.Logger, r.LeaseTTL, keepalive.Period(r.LeaseTTL, r.IdleTimeout))
	return r, nil
}

// receiverConfig is the runtime's configuration of o.
func (c *Client) receiverConfig(o ReceiverOptions) receiver.Config {
	return receiver.Config{Name: o.Name, Wait: o.Wait, RequireReady: o.RequireReady, LeaseTTL: o.LeaseTTL, IdleTimeout: o.IdleTimeout,
		PollInterval: o.PollInterval, FeedPollInterval: o.FeedPollInterval, HandlerTimeout: o.HandlerTimeout,
		LargeWriteTimeout: c.cfg.LargeWriteTimeout, LargeStalls: &c.stalls,
		Settler: settle.Settler{Driver: c.drv, Policy: settle.Policy{MaxAttempts: o.MaxAttempts, BackoffMin: o.BackoffMin, BackoffMax: o.BackoffMax,
			DeadLetterExpired: o.DeadLetterExpired},
			DLQSuffix: o.DLQSuffix, Clock: o.Clock},
		Log: o.Logger, Tel: c.tel, Local: &c.local,
		Owned: func(ref driver.PartitionRef, held *driver.LeaseHeldError) error {
			return &GroupOwnedError{Tenant: ref.Tenant, Topic: ref.Topic, ConsumerGroup: ref.ConsumerGroup, PartitionKey: ref.PartitionKey,
				Owner: held.Owner, ExpiresAt: held.ExpiresAt}
		}}
}

// AcceptGroup takes the message group partitionKey of g's topic for g's
// consumer group exclusively, through the same fenced lease a subscriber
// would hold: a subscriber and a receiver never own a group at once. When
// another consumer holds it, AcceptGroup fails with a *GroupOwnedError, or
// with opts.Wait keeps trying until the holder releases it or its lease
// expires, and then fails with ErrAcceptTimeout.
func (c *Client) AcceptGroup(ctx context.Context, g GroupRef, partitionKey string, opts *ReceiverOptions) (*GroupReceiver, error) {
	tenant, topic, consumerGroup := g.Tenant, g.Topic, g.ConsumerGroup
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
	if err == nil {
		err = c.syncClock(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("shardq: accept group: %w", err)
	}
	if err := c.tenants.Check(ctx, tenant); err != nil {
		return nil, fmt.Errorf("shardq: accept group: %w", err)
	}
	if err := c.registerGroup(ctx, []string{tenant}, topic, consumerGroup, o.StartPosition, o.Clock()); err != nil {
		return nil, fmt.Errorf("shardq: accept group: %w", err)
	}
	ref := driver.PartitionRef{Tenant: tenant, ConsumerGroup: consumerGroup, Topic: topic, PartitionKey: partitionKey}
	rt, err := receiver.AcceptGroup(ctx, c.drv, c.receiverConfig(o), ref)
	return c.startReceiver(ctx, o, rt, err)
}

// AcceptNextGroup takes a free message group of r.Topic in r.Tenants (or
// SHARDQ_TENANTS when empty), for r.ConsumerGroup, that has a message ready, the one whose
// next message is oldest first. It never hands out an owned group. With no
// group ready it fails with ErrNoReadyGroup, or with opts.Wait keeps
// looking and then fails with ErrAcceptTimeout.
func (c *Client) AcceptNextGroup(ctx context.Context, r NextGroupRequest, opts *ReceiverOptions) (*GroupReceiver, error) {
	tenants, topic, consumerGroup := r.Tenants, r.Topic, r.ConsumerGroup
	o, err := c.receiverDefaults(opts, topic)
	if err == nil {
		tenants, err = tenantList(tenants)
	}
	if err == nil {
		err = validateGroupRef(tenants[0], topic, consumerGroup)
	}
	if err == nil {
		err = c.syncClock(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("shardq: accept next group: %w", err)
	}
	if tenants, err = c.tenants.Active(ctx, tenants); err != nil {
		return nil, fmt.Errorf("shardq: accept next group: %w", err)
	}
	if err := c.registerGroup(ctx, tenants, topic, consumerGroup, o.StartPosition, o.Clock()); err != nil {
		return nil, fmt.Errorf("shardq: accept next group: %w", err)
	}
	rt, err := receiver.AcceptNext(ctx, c.drv, c.receiverConfig(o), tenants, topic, consumerGroup)
	return c.startReceiver(ctx, o, rt, err)
}

// startReceiver hands out rt, accepted with the result err, once the
// client tracks it.
func (c *Client) startReceiver(ctx context.Context, o ReceiverOptions, rt *receiver.Receiver, err error) (*GroupReceiver, error) {
	if err != nil {
		return nil, err
	}
	r := &GroupReceiver{c: c, o: o, rt: rt}
	if err := c.track(r); err != nil {
		rt.Abort(ctx, err)
		return nil, err
	}
	return r, nil
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

// tenantList is tenants, or SHARDQ_TENANTS when tenants is empty, validated.
func tenantList(tenants []string) ([]string, error) { return consumerTenants("tenants", tenants) }

// GroupReceiver holds one message group exclusively and hands out its
// messages in order, one at a time: Receive returns the next message once
// the previous one is settled by Ack, Nack or DeadLetter. Its lease renews
// itself while it is open. Use it from one goroutine at a time.
type GroupReceiver struct {
	c  *Client
	o  ReceiverOptions
	rt *receiver.Receiver // the runtime (internal/receiver)
}

// Tenant, Topic, ConsumerGroup and PartitionKey name the accepted group.
func (r *GroupReceiver) Tenant() string        { return r.rt.Ref().Tenant }
func (r *GroupReceiver) Topic() string         { return r.rt.Ref().Topic }
func (r *GroupReceiver) ConsumerGroup() string { return r.rt.Ref().ConsumerGroup }
func (r *GroupReceiver) PartitionKey() string  { return r.rt.Ref().PartitionKey }

// Name is the receiver's name, as configured.
func (r *GroupReceiver) Name() string { return r.o.Name }

// ID is this receiver's identity (Name#suffix): the owner its lease shows.
func (r *GroupReceiver) ID() string { return r.rt.ID() }

// Receive returns the group's next message, waiting until one arrives (or
// its retry is due) or ctx ends. It fails with ErrUnsettled while the last
// message is unsettled, and with ErrReceiverClosed once the receiver is
// closed, idle-released or has lost its lease.
//
// A large message (PublishLarge) comes out once, whole (Delivery.Body),
// and only once its end marker is stored: Receive waits for it (until ctx
// ends; ctx bounds only that wait, not the reading of Body, which goes on
// after Receive returns and fails once the receiver is stopped). A write
// that makes no progress for Config.LargeWriteTimeout is given up, and
// its chunks passed over, as are those of a write that failed
// (docs/large.md). Settle it as any delivery: Ack passes the cursor over
// every chunk and the end marker; Nack, Stop or a crash before Ack
// deliver it again from its first chunk.
func (r *GroupReceiver) Receive(ctx context.Context) (*Delivery, error) {
	if err := r.c.tenants.Check(ctx, r.Tenant()); err != nil {
		return nil, fmt.Errorf("shardq: receive: %w", err)
	}
	w, err := r.rt.ReceiveWhole(ctx)
	if err != nil {
		return nil, err
	}
	d := newDelivery(w.Message, w.Attempt)
	if w.Body != nil {
		d.Size, d.Chunks, d.body, d.SHA256 = w.Size, w.Chunks, w.Body, w.Message.Headers[large.HeaderSHA256]
	}
	d.inTx = &settle.InTx{Ack: func(ctx context.Context, tx driver.DBTX, _ int64) error { return r.rt.AckTx(ctx, tx, d.Offset) },
		Deferrer: &settle.Deferrer{Driver: r.c.drv, Group: r.ConsumerGroup(), Clock: r.o.Clock,
			Pass: func(ctx context.Context, tx driver.DBTX, _ int64) error { return r.rt.DeferTx(ctx, tx, d.Offset) }}}
	return d, nil
}

// heldOffset is d's offset, 0 (no message) for nil.
func heldOffset(d *Delivery) int64 {
	if d == nil {
		return 0
	}
	return d.Offset
}

// Ack settles d: the group's cursor passes it, under the lease's fence.
func (r *GroupReceiver) Ack(ctx context.Context, d *Delivery) error {
	return r.rt.Ack(ctx, heldOffset(d))
}

// Defer sets d aside (Delivery.Defer) and settles it: the group goes on
// with the message after d.
func (r *GroupReceiver) Defer(ctx context.Context, d *Delivery) error {
	if d == nil {
		return &ident.Error{Field: "delivery", Rule: "must not be nil"}
	}
	if err := d.Defer(ctx); err != nil {
		return err
	}
	return r.Ack(ctx, d)
}

// Nack settles d as failed: it is delivered again after a backoff
// (BackoffMin doubling to BackoffMax, or the delay of a RetryAfter cause),
// and dead-lettered once it failed MaxAttempts times (at once for a
// DeadLetter cause), as in the subscriber runtime.
func (r *GroupReceiver) Nack(ctx context.Context, d *Delivery, cause error) error {
	return r.rt.Nack(ctx, heldOffset(d), cause)
}

// DeadLetter settles d by moving it to the dead-letter topic now.
func (r *GroupReceiver) DeadLetter(ctx context.Context, d *Delivery, reason error) error {
	return r.rt.DeadLetter(ctx, heldOffset(d), reason)
}

// State reads the group's state (nil when never set), under the lease's
// fence: a receiver that lost the group gets ErrLeaseLost.
func (r *GroupReceiver) State(ctx context.Context) ([]byte, error) { return r.rt.State(ctx) }

// SetState stores the group's state under the lease's fence; it stays
// with the group across owners.
func (r *GroupReceiver) SetState(ctx context.Context, state []byte) error {
	return r.rt.SetState(ctx, state)
}

func (r *GroupReceiver) stopOrder() int                         { return 0 }
func (r *GroupReceiver) stopForClose(ctx context.Context) error { return r.Stop(ctx) }

// Stop releases the group. An unsettled message is delivered again to the
// group's next owner. Stop is safe to call more than once.
func (r *GroupReceiver) Stop(ctx context.Context) error {
	defer r.c.untrack(r)
	return r.rt.Close(ctx)
}

// Done is closed once the receiver has stopped: by Stop, by Client.Close,
// or on its own when it lost or released the group (idle, handler
// timeout); Receive then fails with ErrReceiverClosed.
func (r *GroupReceiver) Done() <-chan struct{} { return r.rt.Done() }
