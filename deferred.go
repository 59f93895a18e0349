// SPDX-License-Identifier: Apache-2.0

package shardq

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/expiry"
	"github.com/shardq/shardq/internal/ident"
	"github.com/shardq/shardq/internal/settle"
)

// MaxDeferredOffsets bounds the offsets of one ReceiveDeferred.
const MaxDeferredOffsets = 100

// DeferredRequest names deferred messages of a consumer group to receive
// by their offsets (Delivery.Offset when they were deferred).
type DeferredRequest struct {
	Tenant, Topic, ConsumerGroup string
	Offsets                      []int64 // 1 to MaxDeferredOffsets
	// Visibility is how long the deliveries are held for this caller:
	// after it, another may receive them [DefaultVisibilityTimeout], at
	// most MaxVisibility.
	Visibility time.Duration
	// Name names the receiving member in the claims [deferred].
	Name string
	// DLQSuffix makes the dead-letter topic of DeadLetterDeferred
	// [DefaultDLQSuffix].
	DLQSuffix string
	// DeadLetterExpired dead-letters an expired message (Message.TTL)
	// instead of ending its deferral; neither hands it out.
	DeadLetterExpired bool
	// MaxBytes bounds what the messages handed out count, each by
	// ReceiptOptions.MessageBytes [0: no bound]: the first is always
	// handed out, and those that would pass it stay deferred, as they
	// were, for a later call.
	MaxBytes int64
}

func (r *DeferredRequest) check() error {
	if err := validateGroupRef(r.Tenant, r.Topic, r.ConsumerGroup); err != nil {
		return err
	}
	if len(r.Offsets) == 0 || len(r.Offsets) > MaxDeferredOffsets {
		return &ident.Error{Field: "offsets", Rule: fmt.Sprintf("%d offsets: want 1 to %d", len(r.Offsets), MaxDeferredOffsets)}
	}
	for i, o := range r.Offsets {
		if o <= 0 {
			return &ident.Error{Field: fmt.Sprintf("offsets[%d]", i), Rule: fmt.Sprintf("%d: must be positive", o)}
		}
	}
	if r.MaxBytes < 0 {
		return &ident.Error{Field: "max_bytes", Rule: fmt.Sprintf("%d: want 0 (no bound) or more", r.MaxBytes)}
	}
	switch {
	case r.Visibility == 0:
		r.Visibility = DefaultVisibilityTimeout
	case r.Visibility < time.Second || r.Visibility > MaxVisibility:
		return &ident.Error{Field: "visibility", Rule: fmt.Sprintf("%s: want 1s to %s", r.Visibility, MaxVisibility)}
	}
	r.Name = cmp.Or(r.Name, "deferred")
	if err := ident.MemberName("name", r.Name); err != nil {
		return err
	}
	r.DLQSuffix = cmp.Or(r.DLQSuffix, DefaultDLQSuffix)
	return ident.Topic(r.Topic + r.DLQSuffix)
}

// deferredHold is what settles a delivery received as deferred: its claim.
type deferredHold struct {
	claim     driver.Claim
	dlqSuffix string
}

// ReceiveDeferred delivers those of r.Offsets that r.ConsumerGroup
// deferred (Delivery.Defer), whose message is still stored and that no
// other caller holds, in offset order; the others are left out (an
// offset never deferred, settled since, or held elsewhere). Each is held
// for r.Visibility under a claim of its own: settle it with AckDeferred
// (or Delivery.AckTx, in the application's transaction), give it back
// with NackDeferred, or move it to the dead-letter topic with
// DeadLetterDeferred. It stays deferred until it is acked or
// dead-lettered. An expired message (Message.TTL) is not delivered: its
// deferral ends, or with r.DeadLetterExpired it is dead-lettered. See
// docs/consumers.md, "Deferral".
func (c *Client) ReceiveDeferred(ctx context.Context, r DeferredRequest) ([]*Delivery, error) {
	if err := r.check(); err != nil {
		return nil, fmt.Errorf("shardq: receive deferred: %w", err)
	}
	if err := c.syncClock(ctx); err != nil {
		return nil, fmt.Errorf("shardq: receive deferred: %w", err)
	}
	if err := c.tenants.Check(ctx, r.Tenant); err != nil {
		return nil, fmt.Errorf("shardq: receive deferred: %w", err)
	}
	g := driver.GroupRef{Tenant: r.Tenant, Topic: r.Topic, ConsumerGroup: r.ConsumerGroup}
	now := c.cfg.Clock()
	claims, err := c.drv.ClaimDeferred(ctx, driver.ClaimDeferredParams{Group: g, Offsets: r.Offsets, Owner: ident.MemberID(r.Name), Now: now, Visibility: r.Visibility})
	if err != nil {
		return nil, fmt.Errorf("shardq: receive deferred: %w", err)
	}
	var out []*Delivery
	var expired []driver.Claim
	for _, cl := range claims {
		if expiry.Expired(&cl.Message, now) {
			expired = append(expired, cl)
			continue
		}
		d := newDelivery(cl.Message, cl.Attempts)
		hold := &deferredHold{claim: cl, dlqSuffix: r.DLQSuffix}
		d.deferred = hold
		d.inTx = &settle.InTx{Ack: func(ctx context.Context, tx driver.DBTX, _ int64) error {
			return c.drv.InTx(tx).AckDeferred(ctx, []driver.Claim{hold.claim}, c.cfg.Clock())
		}}
		out = append(out, d)
	}
	if len(expired) > 0 {
		s := settle.Settler{Driver: c.drv, Policy: settle.Policy{DeadLetterExpired: r.DeadLetterExpired}, DLQSuffix: r.DLQSuffix, Clock: c.cfg.Clock}
		if err := s.ExpiredDeferred(ctx, expired); err != nil {
			return out, fmt.Errorf("shardq: receive deferred: settle expired messages: %w", err)
		}
	}
	return out, nil
}

// ErrNotDeferred is returned by the settling calls of deferred messages
// for a delivery that ReceiveDeferred did not hand out.
var ErrNotDeferred = errors.New("shardq: not a delivery of ReceiveDeferred")

func deferredClaims(op string, ds []*Delivery) ([]driver.Claim, error) {
	cs := make([]driver.Claim, len(ds))
	for i, d := range ds {
		if d == nil || d.deferred == nil {
			return nil, fmt.Errorf("shardq: %s: deliveries[%d]: %w", op, i, ErrNotDeferred)
		}
		cs[i] = d.deferred.claim
		if i > 0 && (cs[i].Message.Tenant != cs[0].Message.Tenant || cs[i].Message.Topic != cs[0].Message.Topic || cs[i].ConsumerGroup != cs[0].ConsumerGroup) {
			return nil, fmt.Errorf("shardq: %s: %w", op, &ident.Error{Field: fmt.Sprintf("deliveries[%d]", i), Rule: "must be of the first's tenant, topic and group"})
		}
	}
	return cs, nil
}

// AckDeferred settles deferred deliveries of one tenant's topic and
// group in one transaction: they are no longer deferred. When one was
// received again by another caller meanwhile (its visibility passed), it
// fails with ErrLeaseLost and settles none.
func (c *Client) AckDeferred(ctx context.Context, ds ...*Delivery) error {
	if len(ds) == 0 {
		return nil
	}
	cs, err := deferredClaims("ack deferred", ds)
	if err != nil {
		return err
	}
	if err := c.drv.AckDeferred(ctx, cs, c.cfg.Clock()); err != nil {
		return fmt.Errorf("shardq: ack deferred: %w", err)
	}
	return nil
}

// NackDeferred gives a deferred delivery back: it stays deferred, and
// may be received again after o.RetryAfter (0: at once).
func (c *Client) NackDeferred(ctx context.Context, d *Delivery, o NackOptions) error {
	cs, err := deferredClaims("nack deferred", []*Delivery{d})
	if err != nil {
		return err
	}
	if o.RetryAfter < 0 || o.RetryAfter > MaxVisibility {
		return fmt.Errorf("shardq: nack deferred: %w", &ident.Error{Field: "retry after", Rule: fmt.Sprintf("%s: want 0 to %s", o.RetryAfter, MaxVisibility)})
	}
	now := c.cfg.Clock()
	if err := c.drv.ReleaseDeferred(ctx, cs[0], now.Add(o.RetryAfter), now); err != nil {
		return fmt.Errorf("shardq: nack deferred: %w", err)
	}
	return nil
}

// DeadLetterDeferred moves a deferred delivery to the dead-letter topic
// (its topic + DeferredRequest.DLQSuffix), with reason as its
// dlq_last_error, and settles it, in one transaction.
func (c *Client) DeadLetterDeferred(ctx context.Context, d *Delivery, reason error) error {
	cs, err := deferredClaims("dead-letter deferred", []*Delivery{d})
	if err != nil {
		return err
	}
	if reason == nil {
		reason = errors.New("dead-lettered")
	}
	cl := cs[0]
	if err := c.drv.DeadLetterDeferred(ctx, cl, settle.DeadLetterCopy(cl.Message, d.deferred.dlqSuffix, cl.Attempts, reason), c.cfg.Clock()); err != nil {
		return fmt.Errorf("shardq: dead-letter deferred: %w", err)
	}
	return nil
}

// DeferredMessage is a deferred message as Admin.Deferred lists it
// (without its payload and headers).
type DeferredMessage struct {
	Tenant, Topic, ConsumerGroup, PartitionKey, ID string
	Offset                                         int64
	CreatedAt, DeferredAt                          time.Time
	// Attempts counts its deliveries since it was deferred.
	Attempts int
	// HeldBy is the member that holds it until HeldUntil ("": nobody).
	HeldBy    string
	HeldUntil time.Time
}

// Deferred lists up to limit (1 to MaxPageLimit) of a consumer group's
// deferred messages with offsets above after, in offset order.
func (a *Admin) Deferred(ctx context.Context, g GroupRef, after int64, limit int) ([]DeferredMessage, error) {
	if err := validateGroupRef(g.Tenant, g.Topic, g.ConsumerGroup); err != nil {
		return nil, fmt.Errorf("shardq: admin: deferred: %w", err)
	}
	if after < 0 {
		return nil, fmt.Errorf("shardq: admin: deferred: %w", &ident.Error{Field: "after", Rule: fmt.Sprintf("%d: must not be negative", after)})
	}
	if limit < 1 || limit > MaxPageLimit {
		return nil, fmt.Errorf("shardq: admin: deferred: %w", &ident.Error{Field: "limit", Rule: fmt.Sprintf("%d: want 1 to %d", limit, MaxPageLimit)})
	}
	rows, err := a.c.drv.ListDeferred(ctx, driver.GroupRef(g), after, limit)
	if err != nil {
		return nil, fmt.Errorf("shardq: admin: deferred: %w", err)
	}
	now := a.c.cfg.Clock()
	return mapSlice(rows, func(r driver.Deferred) DeferredMessage {
		m := DeferredMessage{Tenant: g.Tenant, Topic: g.Topic, ConsumerGroup: g.ConsumerGroup, PartitionKey: r.Message.PartitionKey, ID: r.Message.ID,
			Offset: r.Message.Offset, CreatedAt: r.Message.CreatedAt, DeferredAt: r.DeferredAt, Attempts: r.Attempts}
		if r.Owner != "" && r.VisibleUntil.After(now) {
			m.HeldBy, m.HeldUntil = r.Owner, r.VisibleUntil
		}
		return m
	}), nil
}

// ReceiveDeferred hands out, with receipts, those of r.Offsets that
// r.ConsumerGroup deferred, as Client.ReceiveDeferred does (r.Name and
// r.DLQSuffix are the receipts' own). A receipt of a deferred message
// acks it (it is no longer deferred), nacks it (given back, deferred
// still, after the nack's delay; a deferred message is never
// dead-lettered for its attempts) or changes its visibility.
func (r *Receipts) ReceiveDeferred(ctx context.Context, rq DeferredRequest) ([]ReceivedMessage, error) {
	if err := cmp.Or(rq.check(), dlqTopic(rq.Topic, r.o.DLQSuffix)); err != nil {
		return nil, fmt.Errorf("shardq: receive deferred: %w", err)
	}
	if err := r.c.syncClock(ctx); err != nil {
		return nil, fmt.Errorf("shardq: receive deferred: %w", err)
	}
	if err := r.c.tenants.Check(ctx, rq.Tenant); err != nil {
		return nil, fmt.Errorf("shardq: receive deferred: %w", err)
	}
	got, err := r.rt.ReceiveDeferred(ctx, rq.Tenant, rq.Topic, rq.ConsumerGroup, rq.Offsets, rq.Visibility, rq.MaxBytes)
	if err != nil {
		return nil, err
	}
	out := make([]ReceivedMessage, len(got.Messages))
	for i, m := range got.Messages {
		out[i] = ReceivedMessage{Delivery: *newDelivery(m.Message, m.Attempt), Receipt: m.Receipt}
	}
	return out, nil
}

// Defer sets the messages of receipts of g's topic and group aside, as
// Delivery.Defer does: each is settled (its claim, or its group's cursor
// past it) and recorded as deferred in one transaction, to be received
// later by its offset (ReceiveDeferred). Of one receive of a message
// group, deferring a message passes the cursor over those before it
// (acks are cumulative), and its last message gives the group back
// (except in a session). A large message's receipt, or a deferred
// message's, is refused. Every receipt is checked before anything
// changes, as in AckAll; it returns the indexes of the stale receipts.
func (r *Receipts) Defer(ctx context.Context, g GroupRef, receipts []string) (stale []int, err error) {
	if err := r.c.syncClock(ctx); err != nil {
		return nil, fmt.Errorf("shardq: defer: %w", err)
	}
	return r.rt.Defer(ctx, g.Tenant, g.Topic, g.ConsumerGroup, receipts)
}
