// SPDX-License-Identifier: Apache-2.0

package shardq

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/ident"
	"github.com/shardq/shardq/internal/large"
	"github.com/shardq/shardq/internal/receipts"
	"github.com/shardq/shardq/internal/settings"
	"github.com/shardq/shardq/internal/settle"
)

// ErrBadReceipt means a receipt was not made by a server of this
// database (its signature fails, or its key was retired longer than
// MaxVisibility ago): it settles nothing. errors.Is(err, ErrInvalid)
// holds too.
var ErrBadReceipt = receipts.ErrBad

// ErrStaleReceipt means a receipt's lease or claim has moved on (its
// visibility timeout passed and another receive took the messages, or a
// Nack of an earlier message gave the group back): settling it changes
// nothing, and the message is delivered again.
var ErrStaleReceipt = receipts.ErrStale

// Limits of a receive.
const (
	MaxReceiveMessages = receipts.MaxMessages
	MaxReceiveWait     = 20 * time.Second
	MaxVisibility      = 12 * time.Hour
	// DefaultReceiveMaxBytes is ReceiveRequest.MaxBytes's default: a
	// receive of MaxReceiveMessages holds at most this much payload (and
	// one message, however large), not that many times the largest.
	DefaultReceiveMaxBytes = 8 << 20
)

// ReceiptOptions configure Client.Receipts.
type ReceiptOptions struct {
	// Name names the receiver for people [host-pid]; each receive's lease
	// or claims are owned by Name#random, new per receive.
	Name        string
	MaxAttempts int    // after this many failed attempts (Nacks) a message is dead-lettered [10]
	DLQSuffix   string // [".dlq"]
	// DeadLetterExpired dead-letters a message found expired
	// (Message.TTL) instead of passing over it, as Service Bus's
	// dead-lettering on expiration [false].
	DeadLetterExpired bool
	// PollInterval is how often a waiting receive looks again while the
	// change feed is down [100ms]; while it streams, a waiting receive
	// wakes when its partitions move and looks again only every
	// FeedPollInterval, as a safety net [DefaultFeedPollInterval].
	PollInterval     time.Duration
	FeedPollInterval time.Duration
	// MaxHold bounds how long ChangeVisibility may hold a message in all,
	// from the receive that handed it out, as SQS does [MaxVisibility, 12
	// h; no more, which is also how long a retired receipt key still
	// verifies the receipts it signed].
	MaxHold time.Duration
	// MessageBytes is what a message counts against a receive's MaxBytes
	// [its payload and header bytes]: a server that sends messages on in
	// another form counts that form (shardq serve: their JSON), so that
	// its responses keep to the budget. It is never less than those bytes,
	// which the database sizes first.
	MessageBytes func(StoredMessage) int64
	Clock        func() time.Time
}

// Receipts receive with receipts, as SQS FIFO's ReceiveMessage does: a
// receive hands out messages, each with a receipt that settles it later,
// from any process. Nothing is held in memory between calls: a message
// group's lease (or an ungrouped message's claim) lasts the visibility
// timeout, and the receipt names it. `shardq serve` is built on it.
type Receipts struct {
	c  *Client
	o  ReceiptOptions
	rt *receipts.Receipts // the runtime (internal/receipts)
}

// Receipts returns a receiver of receipts on c.
func (c *Client) Receipts(opts *ReceiptOptions) (*Receipts, error) {
	var o ReceiptOptions
	if opts != nil {
		o = *opts
	}
	o.Name = cmp.Or(o.Name, settings.Name("receipts"))
	if err := ident.MemberName("name", o.Name); err != nil {
		return nil, fmt.Errorf("shardq: receipts: %w", err)
	}
	var err error
	if o.MaxAttempts, err = maxAttempts(o.MaxAttempts); err != nil {
		return nil, fmt.Errorf("shardq: receipts: %w", err)
	}
	o.DLQSuffix = cmp.Or(o.DLQSuffix, DefaultDLQSuffix)
	if o.MaxHold < 0 || o.MaxHold > MaxVisibility {
		return nil, fmt.Errorf("shardq: receipts: %w", &ident.Error{Field: "max hold", Rule: fmt.Sprintf("%s: want 0 (the default) to %s", o.MaxHold, MaxVisibility)})
	}
	settings.Positive(&o.PollInterval, 100*time.Millisecond)
	settings.Positive(&o.FeedPollInterval, DefaultFeedPollInterval)
	if o.Clock == nil {
		o.Clock = c.cfg.Clock
	}
	return &Receipts{c: c, o: o, rt: receipts.New(c.drv, receipts.Config{Name: o.Name,
		Settler: settle.Settler{Driver: c.drv, Policy: settle.Policy{MaxAttempts: o.MaxAttempts, DeadLetterExpired: o.DeadLetterExpired},
			DLQSuffix: o.DLQSuffix, Clock: o.Clock}, Tel: c.tel,
		PollInterval: o.PollInterval, FeedPollInterval: o.FeedPollInterval, MaxVisibility: MaxVisibility, MaxHold: o.MaxHold,
		MaxMessageBytes: c.MaxMessageBytes(), Size: messageBytes(o.MessageBytes), LargeWriteTimeout: c.cfg.LargeWriteTimeout, LargeStalls: &c.stalls, Local: &c.local, Log: c.cfg.Logger})}, nil
}

// messageBytes is size on the runtime's message (nil: nil).
func messageBytes(size func(StoredMessage) int64) func(*driver.Message) int64 {
	if size == nil {
		return nil
	}
	return func(m *driver.Message) int64 { return size(storedMessage(*m)) }
}

// ReceiveRequest is one receive. PartitionKey takes that message group;
// NextGroup a free group whose next message is among the oldest
// (receives in flight together start at different ones; see Ack for the
// group a turn goes on with); Ungrouped only
// ungrouped messages (competing consumers). With none of them a receive
// takes what is available, as SQS FIFO's ReceiveMessage does: ungrouped
// messages when there are any, else the next free message group.
//
// Hold, with PartitionKey or NextGroup, accepts the group as a session
// (a Service Bus session accept): its lease is kept across receives, and
// ReceiveResult.Session names it. A later receive with Session set
// continues it. See docs/server.md, "Sessions".
type ReceiveRequest struct {
	Tenant, Topic, ConsumerGroup string
	PartitionKey                 string
	NextGroup                    bool
	Ungrouped                    bool
	// Hold keeps the group's lease after the receive, as a session: a
	// named group is accepted even while no message of it is ready (then
	// the receive waits for one within the session, up to Wait), unless
	// RequireReady. The next free group is taken only with a message
	// ready.
	Hold bool
	// RequireReady, with Hold and PartitionKey, accepts the group only
	// when a message of it is ready (as ReceiverOptions.RequireReady).
	RequireReady bool
	// Session receives in a session that an earlier receive opened: the
	// session's lease is renewed to Visibility, and the group's messages
	// are handed out from its cursor (those handed out before and not
	// acked come again). It takes no PartitionKey, NextGroup, Ungrouped
	// or Hold.
	Session    string
	Max        int           // [1], at most MaxReceiveMessages
	Wait       time.Duration // long polling: keep looking this long [0], at most MaxReceiveWait
	Visibility time.Duration // [30s], at most MaxVisibility
	// MaxBytes bounds the payload and header bytes a receive holds
	// [DefaultReceiveMaxBytes]: it takes no message that would pass it,
	// except that the first is always taken. Messages are sized before
	// they are loaded.
	MaxBytes int64
	// Done, when closed, ends a waiting receive early with what it has
	// (nothing): a server shutting down answers its long polls at once
	// without cancelling the statements of other requests.
	Done <-chan struct{}
	// Ack holds receipts of earlier receives of this topic and group to
	// acknowledge first, as AckAll does: a consumer's turn in one call
	// (at most MaxReceiveMessages; a malformed one refuses the request
	// whole, as ack[i]). With NextGroup (and not Hold), acks that settle
	// the whole of a group's receive keep that group while it has more
	// stored: this receive goes on with it, under a new lease (the old
	// receipts go stale), for at most MaxGroupTurns receives after the
	// one that took it, as a Service Bus session processor stays with a
	// busy session.
	Ack []string
}

// MaxGroupTurns bounds the receives that go on with one group after the
// one that took it (ReceiveRequest.Ack): the last one's ack gives the
// group back.
const MaxGroupTurns = receipts.MaxTurns

// ReceiveResult is what a receive hands out.
type ReceiveResult struct {
	Messages []ReceivedMessage
	// Truncated: MaxBytes ended the receive before Max, and more
	// messages may be ready: receive again.
	Truncated bool
	// Session is the group a receive with Hold or Session holds; nil
	// when it holds none (with Hold: the group is held elsewhere, or has
	// nothing ready that RequireReady or NextGroup asked for).
	Session *ReceiveSession
	// Acked counts the receipts of ReceiveRequest.Ack settled, and Stale
	// indexes the stale ones (their messages come again). Receive
	// returns them with an error that came after the acks, too.
	Acked int
	Stale []int
}

// ReceiveSession is a message group held across receives.
type ReceiveSession struct {
	ID           string // pass it as ReceiveRequest.Session, to ChangeVisibility, CloseSession and the state calls
	PartitionKey string
	ExpiresAt    time.Time // when the lease lapses unless a receive or ChangeVisibility renews it
}

// ReceivedMessage is a delivery and the receipt that settles it.
type ReceivedMessage struct {
	Delivery
	Receipt string
}

// receipt is what a receipt names (internal/receipts). It and the
// methods below give the package's own tests (receipts_internal_test.go)
// the runtime's encoding to forge and edit receipts with.
type receipt receipts.Receipt

// receiptPrefix starts every receipt.
const receiptPrefix = receipts.Prefix

func (r *Receipts) sign(ctx context.Context, rc receipt) (string, error) {
	return r.rt.Sign(ctx, receipts.Receipt(rc))
}

func (r *Receipts) decode(ctx context.Context, s, tenant, topic, group string) (receipt, error) {
	rc, err := r.rt.Decode(ctx, s, tenant, topic, group)
	return receipt(rc), err
}

func (rc receipt) claim(m driver.Message) driver.Claim { return (*receipts.Receipt)(&rc).ClaimOf(m) }

// Validate checks rq as Receive does, without running anything: a
// request that also settles receipts (the HTTP API's receive with ack) is
// refused whole before any of them is settled. It checks a Session's form
// only; Receipts.Check also checks its signature.
func (rq ReceiveRequest) Validate() error { return rq.check() }

// Check is Validate with rq.Session's signature and form checked too
// (not whether the session still holds its group).
func (r *Receipts) Check(ctx context.Context, rq ReceiveRequest) error {
	if err := r.checkRequest(&rq); err != nil {
		return err
	}
	if rq.Session != "" {
		if _, err := r.rt.DecodeSession(ctx, rq.Session, rq.Tenant, rq.Topic, rq.ConsumerGroup); err != nil {
			return err
		}
	}
	return nil
}

// checkRequest is rq.check, and room for the topic's dead letters: a
// message that this receiver dead-letters must have a topic to go to.
func (r *Receipts) checkRequest(rq *ReceiveRequest) error {
	return cmp.Or(rq.check(), dlqTopic(rq.Topic, r.o.DLQSuffix))
}

func (rq *ReceiveRequest) check() error {
	if err := validateGroupRef(rq.Tenant, rq.Topic, rq.ConsumerGroup); err != nil {
		return err
	}
	switch {
	case (rq.PartitionKey != "" && rq.NextGroup) || (rq.Ungrouped && (rq.PartitionKey != "" || rq.NextGroup)):
		return &ident.Error{Field: "key", Rule: "set at most one of key, next_group and ungrouped"}
	case rq.Session != "" && (rq.PartitionKey != "" || rq.NextGroup || rq.Ungrouped || rq.Hold || rq.RequireReady):
		return &ident.Error{Field: "session", Rule: "a receive in a session takes no key, next_group, ungrouped, hold or require_ready"}
	case rq.Hold && rq.PartitionKey == "" && !rq.NextGroup:
		return &ident.Error{Field: "hold", Rule: "holds a message group: set key or next_group with it"}
	case rq.RequireReady && (!rq.Hold || rq.PartitionKey == ""):
		return &ident.Error{Field: "require_ready", Rule: "only with hold and key (a receive that does not hold takes a group only for what it has ready)"}
	case rq.PartitionKey != "":
		if err := ident.PartitionKey(rq.PartitionKey); err != nil {
			return err
		}
	}
	switch {
	case rq.Max == 0:
		rq.Max = 1
	case rq.Max < 0 || rq.Max > MaxReceiveMessages:
		return &ident.Error{Field: "max", Rule: fmt.Sprintf("%d: want 1 to %d", rq.Max, MaxReceiveMessages)}
	}
	if len(rq.Ack) > MaxReceiveMessages {
		return &ident.Error{Field: "ack", Rule: fmt.Sprintf("%d receipts, limit %d a request", len(rq.Ack), MaxReceiveMessages)}
	}
	if rq.Wait < 0 || rq.Wait > MaxReceiveWait {
		return &ident.Error{Field: "wait", Rule: fmt.Sprintf("%s: want 0 to %s", rq.Wait, MaxReceiveWait)}
	}
	switch {
	case rq.Visibility == 0:
		rq.Visibility = DefaultVisibilityTimeout
	case rq.Visibility < time.Second || rq.Visibility > MaxVisibility:
		return &ident.Error{Field: "visibility", Rule: fmt.Sprintf("%s: want 1s to %s", rq.Visibility, MaxVisibility)}
	}
	switch {
	case rq.MaxBytes == 0:
		rq.MaxBytes = DefaultReceiveMaxBytes
	case rq.MaxBytes < 0:
		return &ident.Error{Field: "max_bytes", Rule: fmt.Sprintf("%d: want 0 (the default) or more", rq.MaxBytes)}
	}
	return nil
}

// Receive acknowledges rq.Ack first (ReceiveResult.Acked and Stale say
// what they settled, with an error that came after them too), then hands
// out up to rq.Max messages (within rq.MaxBytes): of one
// message group, in order, under a lease that lasts rq.Visibility (no
// other receive gets that group meanwhile); or ungrouped ones, each under
// its own claim. With rq.Wait it keeps looking that long while there is
// none, woken by the change feed when the topic's partitions move. No
// message: an empty Messages. In a suspended tenant it fails with
// ErrTenantSuspended, having acknowledged rq.Ack all the same.
func (r *Receipts) Receive(ctx context.Context, rq ReceiveRequest) (ReceiveResult, error) {
	if err := r.checkRequest(&rq); err != nil {
		return ReceiveResult{}, fmt.Errorf("shardq: receive: %w", err)
	}
	if err := r.c.syncClock(ctx); err != nil {
		return ReceiveResult{}, fmt.Errorf("shardq: receive: %w", err)
	}
	if err := r.c.tenants.Check(ctx, rq.Tenant); err != nil {
		return r.ackSuspended(ctx, rq, fmt.Errorf("shardq: receive: %w", err))
	}
	if err := r.c.registerGroup(ctx, []string{rq.Tenant}, rq.Topic, rq.ConsumerGroup, StartEarliest, r.o.Clock()); err != nil {
		return ReceiveResult{}, fmt.Errorf("shardq: receive: %w", err)
	}
	got, err := r.rt.Receive(ctx, receipts.Request{Tenant: rq.Tenant, Topic: rq.Topic, Group: rq.ConsumerGroup, Key: rq.PartitionKey,
		NextGroup: rq.NextGroup, Ungrouped: rq.Ungrouped, Hold: rq.Hold, RequireReady: rq.RequireReady, Session: rq.Session, Max: rq.Max, Wait: rq.Wait,
		Visibility: rq.Visibility, MaxBytes: rq.MaxBytes, Done: rq.Done, Ack: rq.Ack})
	if len(rq.Ack) > 0 {
		err = ackField(err)
	}
	res := ReceiveResult{Messages: make([]ReceivedMessage, len(got.Messages)), Truncated: got.Truncated, Acked: got.Acked, Stale: got.Stale}
	if s := got.Session; s != nil {
		res.Session = &ReceiveSession{ID: s.ID, PartitionKey: s.Key, ExpiresAt: s.ExpiresAt}
	}
	for i, m := range got.Messages {
		res.Messages[i] = ReceivedMessage{Delivery: *newDelivery(m.Message, m.Attempt), Receipt: m.Receipt}
		if lg := m.Large; lg != nil {
			d, rcpt := &res.Messages[i].Delivery, m.Receipt
			g := GroupRef{Tenant: rq.Tenant, Topic: rq.Topic, ConsumerGroup: rq.ConsumerGroup}
			d.Size, d.Chunks, d.SHA256 = lg.Size, lg.Chunks, lg.SHA256
			d.body = &lazyBody{open: func() (io.Reader, error) {
				b, err := r.Body(context.Background(), g, rcpt)
				return b, err
			}}
		}
	}
	return res, err
}

// ackSuspended settles rq.Ack of a receive that err refuses when the
// tenant is suspended: what is in hand is still settled there, only the
// receive is not.
func (r *Receipts) ackSuspended(ctx context.Context, rq ReceiveRequest, err error) (ReceiveResult, error) {
	if len(rq.Ack) == 0 || !errors.Is(err, ErrTenantSuspended) {
		return ReceiveResult{}, err
	}
	stale, aerr := r.rt.AckAll(ctx, rq.Tenant, rq.Topic, rq.ConsumerGroup, rq.Ack)
	if aerr != nil {
		return ReceiveResult{}, ackField(aerr)
	}
	return ReceiveResult{Acked: len(rq.Ack) - len(stale), Stale: stale}, err
}

// ackField names a receipt of ReceiveRequest.Ack in err as the request's
// field.
func ackField(err error) error {
	if bad := (*ident.Error)(nil); errors.As(err, &bad) {
		if rest, ok := strings.CutPrefix(bad.Field, "receipts"); ok {
			bad.Field = "ack" + rest
		} else if bad.Field == "receipt" {
			bad.Field = "ack"
		}
	}
	return err
}

// LargeBody is the body of a large message handed out by a receipt.
type LargeBody struct {
	// Reader reads its chunks one at a time, each read bounded on its
	// own, and fails at the end with ErrLargeCorrupt if the size or
	// SHA-256 differs from what the writer stored.
	io.Reader
	Size   int64
	Chunks int
	SHA256 string // hex, as the writer stored it
	// Headers are the message's, as its receive gave them (the trace
	// context it was published in among them).
	Headers map[string]string
}

// Body opens the body of the large message that receipt (of g's topic and
// group) hands out; ReceivedMessage.Body() does the same. It may be opened
// more than once (to read it again after a cut). The receipt is checked;
// ErrStaleReceipt when the message is gone (deleted, or removed by
// retention).
func (r *Receipts) Body(ctx context.Context, g GroupRef, receipt string) (*LargeBody, error) {
	if err := r.c.syncClock(ctx); err != nil {
		return nil, fmt.Errorf("shardq: body: %w", err)
	}
	w, err := r.rt.Body(ctx, g.Tenant, g.Topic, g.ConsumerGroup, receipt)
	if err != nil {
		return nil, err
	}
	return &LargeBody{Reader: w.Body, Size: w.Size, Chunks: w.Chunks, SHA256: w.End.Headers[large.HeaderSHA256], Headers: w.Message.Headers}, nil
}

// lazyBody opens its reader on the first Read.
type lazyBody struct {
	open func() (io.Reader, error)
	r    io.Reader
	err  error
}

func (b *lazyBody) Read(p []byte) (int, error) {
	if b.r == nil && b.err == nil {
		b.r, b.err = b.open()
	}
	if b.err != nil {
		return 0, b.err
	}
	return b.r.Read(p)
}

// MaxMessageBytes is the most payload and header bytes one message can
// carry under c's Config: what a reader within a byte budget must leave
// room for.
func (c *Client) MaxMessageBytes() int64 {
	return int64(c.cfg.MaxPayloadBytes) + ident.MaxHeaders*(ident.MaxHeaderKeyBytes+ident.MaxHeaderValueBytes)
}

// Ack settles the message of a receipt of g's topic and group. For
// a message group it commits the cursor past the message, and past the
// ones before it in the same receive: acks are cumulative, like Kafka's
// offset commits; the receive's last message gives the group back at
// once (except in a session, which keeps it). A receipt whose lease or
// claim moved on fails with ErrStaleReceipt and changes nothing.
func (r *Receipts) Ack(ctx context.Context, g GroupRef, receipt string) error {
	if err := r.c.syncClock(ctx); err != nil {
		return fmt.Errorf("shardq: ack: %w", err)
	}
	return r.rt.Ack(ctx, g.Tenant, g.Topic, g.ConsumerGroup, receipt)
}

// AckAll acknowledges receipts of g's topic and group, as Ack does
// each, in few statements: the claims in one transaction, and per receive
// of a message group one cursor commit, at its highest offset (acks are
// cumulative). Every receipt is checked before anything is settled: a
// malformed one fails the call with a ValidationError naming receipts[i],
// and nothing changes. It returns the indexes of the stale receipts, whose
// messages are delivered again; the others are settled.
func (r *Receipts) AckAll(ctx context.Context, g GroupRef, receipts []string) (stale []int, err error) {
	if err := r.c.syncClock(ctx); err != nil {
		return nil, fmt.Errorf("shardq: ack: %w", err)
	}
	return r.rt.AckAll(ctx, g.Tenant, g.Topic, g.ConsumerGroup, receipts)
}

// NackAll fails the messages of receipts, as Nack does each; every
// receipt is checked first, as in AckAll. Of one receive of a message
// group only the lowest offset is failed: the group is given back, and its
// later messages wait behind that one (in order) and are delivered again
// with it, without an attempt counted against them.
func (r *Receipts) NackAll(ctx context.Context, g GroupRef, receipts []string, opts NackOptions) (stale []int, err error) {
	if err := r.c.syncClock(ctx); err != nil {
		return nil, fmt.Errorf("shardq: nack: %w", err)
	}
	return r.rt.NackAll(ctx, g.Tenant, g.Topic, g.ConsumerGroup, receipts, opts.RetryAfter, opts.Reason)
}

// Nack fails the message of a receipt: delivered again after
// opts.RetryAfter, or dead-lettered once it has failed MaxAttempts times.
// A message group is given back at once, a session's too (ending the
// session): its messages after this one wait behind it, in order, and the
// receipts of that receive become stale. A message that an ack of a later
// one already settled is not failed: ErrStaleReceipt.
func (r *Receipts) Nack(ctx context.Context, g GroupRef, receipt string, opts NackOptions) error {
	if err := r.c.syncClock(ctx); err != nil {
		return fmt.Errorf("shardq: nack: %w", err)
	}
	return r.rt.Nack(ctx, g.Tenant, g.Topic, g.ConsumerGroup, receipt, opts.RetryAfter, opts.Reason)
}

// ChangeVisibility sets the visibility timeout of the messages of
// receipts of g's topic and group to vis from now, as SQS's
// ChangeMessageVisibility does (0 to MaxVisibility). An ungrouped
// message's claim then lapses at now+vis (0: another receive may take it
// at once; the attempt stays counted). A message group's lease, the
// whole receive's, lasts until now+vis; with 0 the group is given back at
// once and its unacked messages are delivered again. A message is held
// at most ReceiptOptions.MaxHold from the receive that handed it out: a
// change past that is refused (ErrInvalid), as SQS refuses one past 12
// h. Session ids may be among receipts: the session's lease is renewed,
// or with 0 closed. Every receipt is checked before anything changes, as
// in AckAll; it returns the indexes of the stale receipts. In a suspended
// tenant a change to more than 0 fails with ErrTenantSuspended.
func (r *Receipts) ChangeVisibility(ctx context.Context, g GroupRef, receipts []string, vis time.Duration) (stale []int, err error) {
	if err := r.c.syncClock(ctx); err != nil {
		return nil, fmt.Errorf("shardq: change visibility: %w", err)
	}
	if vis > 0 {
		// Holding on is refused in a suspended tenant; giving back (0)
		// is settling, which goes on.
		err := validateGroupRef(g.Tenant, g.Topic, g.ConsumerGroup)
		if err == nil {
			err = r.c.tenants.Check(ctx, g.Tenant)
		}
		if err != nil {
			return nil, fmt.Errorf("shardq: change visibility: %w", err)
		}
	}
	return r.rt.ChangeVisibility(ctx, g.Tenant, g.Topic, g.ConsumerGroup, receipts, vis)
}

// CloseSession gives a session's group back at once: its unacked
// messages are delivered again, to any receive. ErrStaleReceipt when the
// session had already ended.
func (r *Receipts) CloseSession(ctx context.Context, g GroupRef, session string) error {
	if err := r.c.syncClock(ctx); err != nil {
		return fmt.Errorf("shardq: close session: %w", err)
	}
	return r.rt.CloseSession(ctx, g.Tenant, g.Topic, g.ConsumerGroup, session)
}

// GroupState reads the state of a session's group (nil when never set),
// under the session's lease: ErrStaleReceipt once the session ended.
func (r *Receipts) GroupState(ctx context.Context, g GroupRef, session string) ([]byte, error) {
	if err := r.c.syncClock(ctx); err != nil {
		return nil, fmt.Errorf("shardq: group state: %w", err)
	}
	return r.rt.State(ctx, g.Tenant, g.Topic, g.ConsumerGroup, session)
}

// SetGroupState stores the state of a session's group (at most
// MaxMessageBytes), under the session's lease; it stays with the group
// for its next holder, as GroupReceiver.SetState's.
func (r *Receipts) SetGroupState(ctx context.Context, g GroupRef, session string, state []byte) error {
	if err := r.c.syncClock(ctx); err != nil {
		return fmt.Errorf("shardq: set group state: %w", err)
	}
	return r.rt.SetState(ctx, g.Tenant, g.Topic, g.ConsumerGroup, session, state)
}
