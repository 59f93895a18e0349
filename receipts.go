// SPDX-License-Identifier: Apache-2.0

package shardq

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/ident"
	"github.com/shardq/shardq/internal/receiptkey"
	"github.com/shardq/shardq/internal/settle"
)

// ErrBadReceipt means a receipt was not made by a server of this
// database (its signature fails, or its key was retired longer than
// MaxVisibility ago): it settles nothing. errors.Is(err, ErrInvalid)
// holds too.
var ErrBadReceipt = errors.New("shardq: receipt not issued here")

// ErrStaleReceipt means a receipt's lease or claim has moved on (its
// visibility timeout passed and another receive took the messages, or a
// Nack of an earlier message gave the group back): settling it changes
// nothing, and the message is delivered again.
var ErrStaleReceipt = errors.New("shardq: stale receipt")

// Limits of a receive.
const (
	MaxReceiveMessages = 100
	MaxReceiveWait     = 20 * time.Second
	MaxVisibility      = 12 * time.Hour
)

// ReceiptOptions configure Client.Receipts.
type ReceiptOptions struct {
	// Name names the receiver for people [host-pid]; each receive's lease
	// or claims are owned by Name#random, new per receive.
	Name        string
	MaxAttempts int    // after this many failed attempts (Nacks) a message is dead-lettered [10]
	DLQSuffix   string // [".dlq"]
	// PollInterval is how often a waiting receive looks again while the
	// change feed is down [100ms]; while it streams, a waiting receive
	// wakes when its partitions move and looks again only every
	// FeedPollInterval, as a safety net [DefaultFeedPollInterval].
	PollInterval     time.Duration
	FeedPollInterval time.Duration
	Clock            func() time.Time
}

// Receipts receive with receipts, as SQS FIFO's ReceiveMessage does: a
// receive hands out messages, each with a receipt that settles it later,
// from any process. Nothing is held in memory between calls: a message
// group's lease (or an ungrouped message's claim) lasts the visibility
// timeout, and the receipt names it. `shardq serve` is built on it.
type Receipts struct {
	c *Client
	o ReceiptOptions

	keys *receiptkey.Ring

	mu       sync.Mutex
	advanced map[[3]string]time.Time // ungrouped cursors moved, by (tenant, topic, group)
}

// Receipts returns a receiver of receipts on c.
func (c *Client) Receipts(opts *ReceiptOptions) (*Receipts, error) {
	var o ReceiptOptions
	if opts != nil {
		o = *opts
	}
	if o.Name == "" {
		host, _ := os.Hostname()
		o.Name = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	if err := ident.MemberName("name", o.Name); err != nil {
		return nil, fmt.Errorf("shardq: receipts: %w", err)
	}
	var err error
	if o.MaxAttempts, err = maxAttempts(o.MaxAttempts); err != nil {
		return nil, fmt.Errorf("shardq: receipts: %w", err)
	}
	if o.DLQSuffix == "" {
		o.DLQSuffix = DefaultDLQSuffix
	}
	if o.PollInterval <= 0 {
		o.PollInterval = 100 * time.Millisecond
	}
	if o.FeedPollInterval <= 0 {
		o.FeedPollInterval = DefaultFeedPollInterval
	}
	if o.Clock == nil {
		o.Clock = c.cfg.Clock
	}
	return &Receipts{c: c, o: o, keys: receiptkey.New(c.drv, MaxVisibility, o.Clock), advanced: map[[3]string]time.Time{}}, nil
}

// ReceiveRequest is one receive. PartitionKey takes that message group;
// NextGroup the free group whose next message is oldest; Ungrouped only
// ungrouped messages (competing consumers). With none of them a receive
// takes what is available, as SQS FIFO's ReceiveMessage does: ungrouped
// messages when there are any, else the next free message group.
type ReceiveRequest struct {
	Tenant, Topic, ConsumerGroup string
	PartitionKey                 string
	NextGroup                    bool
	Ungrouped                    bool
	Max                          int           // [1], at most MaxReceiveMessages
	Wait                         time.Duration // long polling: keep looking this long [0], at most MaxReceiveWait
	Visibility                   time.Duration // [30s], at most MaxVisibility
	// MaxBytes, when > 0, bounds the payload and header bytes a receive
	// holds: it takes no message that would pass it, except that the
	// first is always taken. Messages are sized before they are loaded.
	MaxBytes int64
	// Done, when closed, ends a waiting receive early with what it has
	// (nothing): a server shutting down answers its long polls at once
	// without cancelling the statements of other requests.
	Done <-chan struct{}
}

// ReceiveResult is what a receive hands out.
type ReceiveResult struct {
	Messages []ReceivedMessage
	// Truncated: MaxBytes ended the receive before Max, and more
	// messages may be ready: receive again.
	Truncated bool
}

// ReceivedMessage is a delivery and the receipt that settles it.
type ReceivedMessage struct {
	Delivery
	Receipt string
}

// receipt is what a receipt names. It travels as
// "r2.<key id>.<base64url JSON>.<base64url HMAC-SHA256>", the MAC taken
// over everything before its dot under the database's receipt key
// (internal/receiptkey): a client can neither make nor edit one.
type receipt struct {
	Tenant string `json:"t"`
	Topic  string `json:"p"`
	Group  string `json:"g"`
	Key    string `json:"k,omitempty"`
	Owner  string `json:"w"`
	Token  int64  `json:"n"`
	Offset int64  `json:"o"`
	Last   int64  `json:"l,omitempty"` // grouped: the receive's last offset, whose ack gives the group back
	Claim  bool   `json:"c,omitempty"` // an ungrouped message's claim
	// Attempts counts an ungrouped message's claims, this one included
	// (a message group's failures are stored under its lease instead).
	Attempts int `json:"a,omitempty"`
}

// receiptPrefix starts every receipt; maxReceiptBytes bounds one.
const (
	receiptPrefix   = "r2."
	maxReceiptBytes = 2048
)

// signedPart is a receipt's text before its MAC.
func (r receipt) signedPart(keyID int64) string {
	b, _ := json.Marshal(r) // strings and integers only: cannot fail
	return receiptPrefix + strconv.FormatInt(keyID, 10) + "." + base64.RawURLEncoding.EncodeToString(b)
}

// sign encodes rc with its MAC under the newest receipt key.
func (r *Receipts) sign(ctx context.Context, rc receipt) (string, error) {
	signed, sum, err := r.keys.Sign(ctx, func(id int64) []byte { return []byte(rc.signedPart(id)) })
	if err != nil {
		return "", fmt.Errorf("sign receipt: %w", err)
	}
	return string(signed) + "." + base64.RawURLEncoding.EncodeToString(sum), nil
}

// splitReceipt splits a receipt into its key id, the signed text, the
// JSON it carries and its MAC, checking only their form.
func splitReceipt(s string) (keyID int64, signed string, body, sum []byte, err error) {
	bad := func(rule string) error { return &ident.Error{Field: "receipt", Rule: rule} }
	rest, ok := strings.CutPrefix(s, receiptPrefix)
	if !ok || len(s) > maxReceiptBytes {
		return 0, "", nil, nil, bad(fmt.Sprintf("not a receipt of this server (want %s…, at most %d bytes)", receiptPrefix, maxReceiptBytes))
	}
	id, rest, ok1 := strings.Cut(rest, ".")
	enc, mac, ok2 := strings.Cut(rest, ".")
	if !ok1 || !ok2 {
		return 0, "", nil, nil, bad("malformed")
	}
	keyID, err = strconv.ParseInt(id, 10, 64)
	if err != nil || keyID <= 0 || strconv.FormatInt(keyID, 10) != id {
		return 0, "", nil, nil, bad("malformed key id")
	}
	if body, err = base64.RawURLEncoding.Strict().DecodeString(enc); err != nil {
		return 0, "", nil, nil, bad("not base64url")
	}
	if sum, err = base64.RawURLEncoding.Strict().DecodeString(mac); err != nil || len(sum) != 32 {
		return 0, "", nil, nil, bad("malformed signature")
	}
	return keyID, s[:len(s)-len(mac)-1], body, sum, nil
}

// decode checks a receipt's signature, then its form and that it belongs
// to tenant, topic and group (a receipt is not a credential: the caller's
// access to them is checked elsewhere).
func (r *Receipts) decode(ctx context.Context, s, tenant, topic, group string) (receipt, error) {
	keyID, signed, body, sum, err := splitReceipt(s)
	if err != nil {
		return receipt{}, err
	}
	switch err := r.keys.Verify(ctx, keyID, []byte(signed), sum); {
	case errors.Is(err, receiptkey.ErrSignature), errors.Is(err, receiptkey.ErrUnknownKey):
		return receipt{}, fmt.Errorf("%w: %w", &ident.Error{Field: "receipt", Rule: "not issued by a server of this database (" + err.Error() + ")"}, ErrBadReceipt)
	case err != nil:
		return receipt{}, fmt.Errorf("verify receipt: %w", err)
	}
	return parseReceipt(body, tenant, topic, group)
}

// parseReceipt checks a signed receipt's JSON. It touches no database.
func parseReceipt(b []byte, tenant, topic, group string) (receipt, error) {
	bad := func(rule string) error { return &ident.Error{Field: "receipt", Rule: rule} }
	var r receipt
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return r, bad("malformed")
	}
	if r.Tenant != tenant || r.Topic != topic || r.Group != group {
		return r, bad(fmt.Sprintf("belongs to tenant %q topic %q group %q, not this one", r.Tenant, r.Topic, r.Group))
	}
	if r.Claim != (r.Key == "") || r.Owner == "" || r.Token <= 0 || r.Offset <= 0 || (!r.Claim && r.Last < r.Offset) || r.Attempts < 0 {
		return r, bad("inconsistent")
	}
	if err := ident.PartitionKey(r.Key); err != nil && r.Key != "" {
		return r, bad("inconsistent")
	}
	if err := ident.ASCII("owner", r.Owner); err != nil {
		return r, bad("inconsistent")
	}
	return r, nil
}

func (r *receipt) lease() driver.Lease {
	return driver.Lease{PartitionRef: r.ref(), Owner: r.Owner, Token: r.Token}
}

func (r *receipt) ref() driver.PartitionRef {
	return driver.PartitionRef{Tenant: r.Tenant, ConsumerGroup: r.Group, Topic: r.Topic, PartitionKey: r.Key}
}

func (r *receipt) claim(m driver.Message) driver.Claim {
	m.Tenant, m.Topic, m.Offset = r.Tenant, r.Topic, r.Offset
	return driver.Claim{ConsumerGroup: r.Group, Owner: r.Owner, Token: r.Token, Message: m}
}

func (rq *ReceiveRequest) check() error {
	if err := validateGroupRef(rq.Tenant, rq.Topic, rq.ConsumerGroup); err != nil {
		return err
	}
	switch {
	case (rq.PartitionKey != "" && rq.NextGroup) || (rq.Ungrouped && (rq.PartitionKey != "" || rq.NextGroup)):
		return &ident.Error{Field: "key", Rule: "set at most one of key, next_group and ungrouped"}
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
	if rq.Wait < 0 || rq.Wait > MaxReceiveWait {
		return &ident.Error{Field: "wait", Rule: fmt.Sprintf("%s: want 0 to %s", rq.Wait, MaxReceiveWait)}
	}
	switch {
	case rq.Visibility == 0:
		rq.Visibility = DefaultVisibilityTimeout
	case rq.Visibility < time.Second || rq.Visibility > MaxVisibility:
		return &ident.Error{Field: "visibility", Rule: fmt.Sprintf("%s: want 1s to %s", rq.Visibility, MaxVisibility)}
	}
	return nil
}

// Receive hands out up to rq.Max messages (within rq.MaxBytes): of one
// message group, in order, under a lease that lasts rq.Visibility (no
// other receive gets that group meanwhile); or ungrouped ones, each under
// its own claim. With rq.Wait it keeps looking that long while there is
// none, woken by the change feed when the topic's partitions move. No
// message: an empty Messages.
func (r *Receipts) Receive(ctx context.Context, rq ReceiveRequest) (ReceiveResult, error) {
	if err := rq.check(); err != nil {
		return ReceiveResult{}, fmt.Errorf("shardq: receive: %w", err)
	}
	if err := r.c.registerGroup(ctx, []string{rq.Tenant}, rq.Topic, rq.ConsumerGroup, StartEarliest, r.o.Clock()); err != nil {
		return ReceiveResult{}, fmt.Errorf("shardq: receive: %w", err)
	}
	var wake *receiveWake
	deadline := time.Now().Add(rq.Wait)
	for {
		var res ReceiveResult
		var err error
		switch {
		case rq.PartitionKey != "":
			res, err = r.receiveGroup(ctx, rq, rq.PartitionKey)
		case rq.NextGroup:
			res, err = r.receiveNextGroup(ctx, rq)
		case rq.Ungrouped:
			res, err = r.receiveUngrouped(ctx, rq)
		default:
			if res, err = r.receiveUngrouped(ctx, rq); err == nil && len(res.Messages) == 0 {
				res, err = r.receiveNextGroup(ctx, rq)
			}
		}
		if err != nil || len(res.Messages) > 0 || !time.Now().Before(deadline) {
			if res.Messages == nil {
				res.Messages = []ReceivedMessage{}
			}
			return res, err
		}
		if wake == nil {
			// Registered before the next look, so that a move between that
			// look and the wait still wakes it.
			wake = &receiveWake{key: rq.PartitionKey, one: rq.PartitionKey != "", ch: make(chan struct{}, 1)}
			r.c.local.Add(rq.Topic, []string{rq.Tenant}, wake, wake)
			defer r.c.local.Remove(rq.Topic, wake)
			continue
		}
		poll := r.o.PollInterval
		if r.c.local.Up() {
			poll = r.o.FeedPollInterval
		}
		if !sleepUntilNext(ctx, rq.Done, wake.ch, deadline, poll) {
			return ReceiveResult{Messages: []ReceivedMessage{}}, nil
		}
	}
}

// receiveWake wakes a waiting receive when a partition it may take moves
// (wakeup.Consumer).
type receiveWake struct {
	key string // with one: the only partition that matters
	one bool
	ch  chan struct{}
}

func (w *receiveWake) Moved(heads []driver.HeadChange) {
	for _, h := range heads {
		if !w.one || h.PartitionKey == w.key {
			w.Rescan()
			return
		}
	}
}

func (w *receiveWake) Rescan() {
	select {
	case w.ch <- struct{}{}:
	default:
	}
}

// MaxMessageBytes is the most payload and header bytes one message can
// carry under c's Config: what a reader within a byte budget must leave
// room for.
func (c *Client) MaxMessageBytes() int64 {
	return int64(c.cfg.MaxPayloadBytes) + ident.MaxHeaders*(ident.MaxHeaderKeyBytes+ident.MaxHeaderValueBytes)
}

func (r *Receipts) maxMessageBytes() int64 { return r.c.MaxMessageBytes() }

// budgeted reports whether rq's byte budget can bind: Max messages of the
// largest size would pass it.
func (r *Receipts) budgeted(rq ReceiveRequest) bool {
	return rq.MaxBytes > 0 && int64(rq.Max)*r.maxMessageBytes() > rq.MaxBytes
}

func (r *Receipts) receiveUngrouped(ctx context.Context, rq ReceiveRequest) (ReceiveResult, error) {
	owner := ident.MemberID(r.o.Name)
	limit := driver.ClaimLimit{Messages: rq.Max}
	if r.budgeted(rq) {
		limit.Bytes = rq.MaxBytes
	}
	claims, truncated, err := r.c.drv.ClaimMessages(ctx, rq.Tenant, rq.Topic, rq.ConsumerGroup, owner, r.o.Clock(), rq.Visibility, limit)
	if err != nil {
		return ReceiveResult{}, fmt.Errorf("shardq: receive: %w", err)
	}
	res := ReceiveResult{Truncated: truncated}
	for _, c := range claims {
		rc := receipt{Tenant: rq.Tenant, Topic: rq.Topic, Group: rq.ConsumerGroup, Owner: owner, Token: c.Token, Offset: c.Message.Offset, Claim: true, Attempts: c.Attempts}
		signed, err := r.sign(ctx, rc)
		if err != nil {
			return ReceiveResult{}, r.releaseClaims(ctx, claims, fmt.Errorf("shardq: receive: %w", err))
		}
		res.Messages = append(res.Messages, ReceivedMessage{Delivery: *newDelivery(c.Message, c.Attempts), Receipt: signed})
	}
	return res, nil
}

// detached is ctx without its cancellation (a caller gone must not stop
// a give-back that keeps others waiting) but with a bound of its own.
func detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
}

// releaseTimeout bounds a give-back that outlives its caller.
const releaseTimeout = 10 * time.Second

// releaseClaims gives back claims that cannot be handed out, uncounted.
func (r *Receipts) releaseClaims(ctx context.Context, claims []driver.Claim, cause error) error {
	dctx, cancel := detached(ctx) // one bound for all of them
	defer cancel()
	for _, c := range claims {
		if err := r.c.drv.ReleaseClaim(dctx, c, r.o.Clock()); err != nil && !errors.Is(err, driver.ErrLeaseLost) {
			cause = errors.Join(cause, err)
		}
	}
	return cause
}

// receiveNextGroup takes the free message group whose next message is
// oldest (trying the 20 oldest: others may take some meanwhile).
func (r *Receipts) receiveNextGroup(ctx context.Context, rq ReceiveRequest) (ReceiveResult, error) {
	groups, err := r.c.drv.ReadyGroups(ctx, []string{rq.Tenant}, rq.Topic, rq.ConsumerGroup, r.o.Clock(), 20)
	if err != nil {
		return ReceiveResult{}, fmt.Errorf("shardq: receive: %w", err)
	}
	for _, g := range groups {
		res, err := r.receiveGroup(ctx, rq, g.PartitionKey)
		if err != nil || len(res.Messages) > 0 {
			return res, err
		}
	}
	return ReceiveResult{}, nil
}

// receiveGroup takes group key's lease and hands out its ready messages
// after the cursor; with none ready it gives the lease back.
func (r *Receipts) receiveGroup(ctx context.Context, rq ReceiveRequest, key string) (ReceiveResult, error) {
	ref := driver.PartitionRef{Tenant: rq.Tenant, ConsumerGroup: rq.ConsumerGroup, Topic: rq.Topic, PartitionKey: key}
	owner := ident.MemberID(r.o.Name)
	now := r.o.Clock()
	l, err := r.c.drv.AcquireLease(ctx, ref, owner, now, rq.Visibility)
	if errors.Is(err, driver.ErrLeaseHeld) {
		return ReceiveResult{}, nil // in flight elsewhere: its messages are not ours to see
	}
	if err != nil {
		return ReceiveResult{}, fmt.Errorf("shardq: receive %s: %w", ref, err)
	}
	var res ReceiveResult
	msgs, states, truncated, err := r.ready(ctx, l, rq, now)
	if err == nil && len(msgs) > 0 {
		last := msgs[len(msgs)-1].Offset
		res = ReceiveResult{Messages: make([]ReceivedMessage, len(msgs)), Truncated: truncated}
		for i, m := range msgs {
			rc := receipt{Tenant: rq.Tenant, Topic: rq.Topic, Group: rq.ConsumerGroup, Key: key, Owner: owner, Token: l.Token, Offset: m.Offset, Last: last}
			var signed string
			if signed, err = r.sign(ctx, rc); err != nil {
				break
			}
			res.Messages[i] = ReceivedMessage{Delivery: *newDelivery(m, states[m.Offset].Attempts+1), Receipt: signed}
		}
	}
	if err != nil || len(msgs) == 0 {
		dctx, cancel := detached(ctx)
		rerr := r.c.drv.ReleaseLease(dctx, l, now)
		cancel()
		if rerr != nil && !errors.Is(rerr, driver.ErrLeaseLost) {
			err = errors.Join(err, fmt.Errorf("release %s: %w", ref, rerr))
		}
		if err != nil {
			return ReceiveResult{}, fmt.Errorf("shardq: receive %s: %w", ref, err)
		}
		return ReceiveResult{}, nil
	}
	return res, nil
}

// ready reads up to rq.Max messages after l's cursor that may be
// delivered now, within rq.MaxBytes: it stops at a message delayed past
// now or waiting for its retry. truncated says the budget left a message
// behind.
func (r *Receipts) ready(ctx context.Context, l driver.Lease, rq ReceiveRequest, now time.Time) (msgs []driver.Message, states map[int64]driver.DeliveryState, truncated bool, err error) {
	if r.budgeted(rq) {
		msgs, truncated, err = r.c.drv.FetchWithin(ctx, l.Tenant, l.Topic, l.PartitionKey, l.Committed, rq.Max, rq.MaxBytes)
	} else {
		msgs, err = r.c.drv.FetchAfter(ctx, l.Tenant, l.Topic, l.PartitionKey, l.Committed, rq.Max)
	}
	if err != nil || len(msgs) == 0 {
		return nil, nil, false, err
	}
	if states, err = r.c.drv.DeliveryStates(ctx, l.PartitionRef, l.Committed, msgs[len(msgs)-1].Offset); err != nil {
		return nil, nil, false, err
	}
	for i, m := range msgs {
		if m.NotBefore.After(now) || states[m.Offset].NextAttemptAt.After(now) {
			return msgs[:i], states, false, nil
		}
	}
	return msgs, states, truncated, nil
}

// Ack settles the message of a receipt of tenant's topic and group. For
// a message group it commits the cursor past the message, and past the
// ones before it in the same receive: acks are cumulative, like Kafka's
// offset commits; the receive's last message gives the group back at
// once. A receipt whose lease or claim moved on fails with
// ErrStaleReceipt and changes nothing.
func (r *Receipts) Ack(ctx context.Context, tenant, topic, group, rcpt string) error {
	rc, err := r.decode(ctx, rcpt, tenant, topic, group)
	if err != nil {
		return fmt.Errorf("shardq: ack: %w", err)
	}
	now := r.o.Clock()
	if rc.Claim {
		err := r.c.drv.AckClaims(ctx, []driver.Claim{rc.claim(driver.Message{})}, now)
		if err == nil {
			r.advance(ctx, rc, now)
		}
		return r.settled("ack", rc, err)
	}
	return r.commit(ctx, rc, now)
}

// commit commits a message group's cursor past rc's offset, and gives the
// group back when rc is its receive's last message.
func (r *Receipts) commit(ctx context.Context, rc receipt, now time.Time) error {
	// Whatever a receipt says, a cursor never passes the partition's
	// head: that would skip every message published up to it.
	// (A receipt's Last only decides whether its ack gives the group back.)
	l := rc.lease()
	err := r.c.drv.CommitReceived(ctx, l, rc.Offset, now)
	if errors.Is(err, driver.ErrPastHead) {
		return r.settled("ack", rc, &ident.Error{Field: "receipt", Rule: fmt.Sprintf("offset %d is past the partition's head: %v", rc.Offset, err)})
	}
	if err == nil && rc.Offset == rc.Last {
		// Committed: give the group back even if the caller has gone.
		dctx, cancel := detached(ctx)
		rerr := r.c.drv.ReleaseLease(dctx, l, now)
		cancel()
		if rerr != nil && !errors.Is(rerr, driver.ErrLeaseLost) {
			r.c.cfg.Logger.Warn("shardq: giving back a message group after its last ack failed; it is free after its visibility timeout",
				"tenant", rc.Tenant, "topic", rc.Topic, "partition_key", rc.Key, "err", rerr)
		}
	}
	return r.settled("ack", rc, err)
}

// AckAll acknowledges receipts of tenant's topic and group, as Ack does
// each, in few statements: the claims in one transaction, and per receive
// of a message group one cursor commit, at its highest offset (acks are
// cumulative). Every receipt is checked before anything is settled: a
// malformed one fails the call with a ValidationError naming receipts[i],
// and nothing changes. It returns the indexes of the stale receipts, whose
// messages are delivered again; the others are settled.
func (r *Receipts) AckAll(ctx context.Context, tenant, topic, group string, rcpts []string) (stale []int, err error) {
	rcs, err := r.decodeAll(ctx, rcpts, tenant, topic, group)
	if err != nil {
		return nil, fmt.Errorf("shardq: ack: %w", err)
	}
	now := r.o.Clock()
	var claims []int
	receives := map[receipt][]int{} // a receive -> its receipts
	for i, rc := range rcs {
		if rc.Claim {
			claims = append(claims, i)
			continue
		}
		receives[rc.receive()] = append(receives[rc.receive()], i)
	}
	if len(claims) > 0 {
		cs := make([]driver.Claim, len(claims))
		for j, i := range claims {
			cs[j] = rcs[i].claim(driver.Message{})
		}
		switch err := r.c.drv.AckClaims(ctx, cs, now); {
		case errors.Is(err, driver.ErrLeaseLost):
			// One or more moved on: settle the others one by one.
			for j, i := range claims {
				if err := r.c.drv.AckClaims(ctx, cs[j:j+1], now); errors.Is(err, driver.ErrLeaseLost) {
					stale = append(stale, i)
				} else if err != nil {
					return nil, r.settled("ack", rcs[i], err)
				}
			}
		case err != nil:
			return nil, r.settled("ack", rcs[claims[0]], err)
		}
		r.advance(ctx, rcs[claims[0]], now)
	}
	for _, idx := range receives {
		top := rcs[idx[0]]
		for _, i := range idx {
			if rcs[i].Offset > top.Offset {
				top = rcs[i]
			}
		}
		switch err := r.commit(ctx, top, now); {
		case errors.Is(err, ErrStaleReceipt):
			stale = append(stale, idx...)
		case err != nil:
			return nil, err
		}
	}
	slices.Sort(stale)
	return stale, nil
}

// NackAll fails the messages of receipts, as Nack does each; every
// receipt is checked first, as in AckAll. Of one receive of a message
// group only the lowest offset is failed: the group is given back, and its
// later messages wait behind that one (in order) and are delivered again
// with it, without an attempt counted against them.
func (r *Receipts) NackAll(ctx context.Context, tenant, topic, group string, rcpts []string, retryAfter time.Duration, reason string) (stale []int, err error) {
	rcs, err := r.decodeAll(ctx, rcpts, tenant, topic, group)
	if err != nil {
		return nil, fmt.Errorf("shardq: nack: %w", err)
	}
	first := map[receipt]int{} // a receive -> its lowest receipt
	var order []int
	for i, rc := range rcs {
		if rc.Claim {
			order = append(order, i)
			continue
		}
		if j, ok := first[rc.receive()]; !ok || rc.Offset < rcs[j].Offset {
			first[rc.receive()] = i
		}
	}
	for _, i := range first {
		order = append(order, i)
	}
	slices.Sort(order)
	failed := map[int]bool{} // a receive whose nack found its lease gone
	for _, i := range order {
		switch err := r.Nack(ctx, tenant, topic, group, rcpts[i], retryAfter, reason); {
		case errors.Is(err, ErrStaleReceipt):
			failed[i] = true
		case err != nil:
			return nil, err
		}
	}
	for i, rc := range rcs {
		if failed[i] || (!rc.Claim && failed[first[rc.receive()]]) {
			stale = append(stale, i)
		}
	}
	return stale, nil
}

// receive names the receive of a message group's receipt: the receipt
// without its own offset.
func (r receipt) receive() receipt {
	r.Offset = 0
	return r
}

// decodeAll decodes every receipt, or names the first bad one.
func (r *Receipts) decodeAll(ctx context.Context, rcpts []string, tenant, topic, group string) ([]receipt, error) {
	if len(rcpts) == 0 || len(rcpts) > MaxReceiveMessages {
		return nil, &ident.Error{Field: "receipts", Rule: fmt.Sprintf("%d receipts: want 1 to %d", len(rcpts), MaxReceiveMessages)}
	}
	rcs := make([]receipt, len(rcpts))
	for i, s := range rcpts {
		rc, err := r.decode(ctx, s, tenant, topic, group)
		if err != nil {
			var ve *ident.Error
			if errors.As(err, &ve) {
				named := &ident.Error{Field: fmt.Sprintf("receipts[%d]", i), Rule: ve.Rule}
				if errors.Is(err, ErrBadReceipt) {
					return nil, fmt.Errorf("%w: %w", named, ErrBadReceipt)
				}
				return nil, named
			}
			return nil, err
		}
		rcs[i] = rc
	}
	return rcs, nil
}

// Nack fails the message of a receipt: delivered again after retryAfter,
// or dead-lettered once it has failed MaxAttempts times. A message group
// is given back at once (its messages after this one wait behind it, in
// order); the receipts of that receive become stale.
func (r *Receipts) Nack(ctx context.Context, tenant, topic, group, rcpt string, retryAfter time.Duration, reason string) error {
	rc, err := r.decode(ctx, rcpt, tenant, topic, group)
	if err == nil && (retryAfter < 0 || retryAfter > MaxVisibility) {
		err = &ident.Error{Field: "retry_after", Rule: fmt.Sprintf("%s: want 0 to %s", retryAfter, MaxVisibility)}
	}
	if err != nil {
		return fmt.Errorf("shardq: nack: %w", err)
	}
	if reason == "" {
		reason = "nacked"
	}
	cause := errors.New(reason)
	now := r.o.Clock()
	key := rc.Key
	msgs, err := r.c.drv.FetchAfter(ctx, tenant, topic, key, rc.Offset-1, 1)
	if err == nil && (len(msgs) == 0 || msgs[0].Offset != rc.Offset) {
		err = ErrStaleReceipt // removed meanwhile (retention, delete)
	}
	if err != nil {
		return r.settled("nack", rc, err)
	}
	m := msgs[0]
	if rc.Claim {
		c := rc.claim(m)
		if r.o.MaxAttempts != settle.Unlimited && rc.Attempts >= r.o.MaxAttempts {
			err = r.c.drv.DeadLetterClaim(ctx, c, settle.DeadLetterCopy(m, r.o.DLQSuffix, rc.Attempts, cause), now)
		} else {
			err = r.c.drv.RetryClaim(ctx, c, now.Add(retryAfter), settle.ErrText(cause), now)
		}
		return r.settled("nack", rc, err)
	}
	l := rc.lease()
	states, err := r.c.drv.DeliveryStates(ctx, rc.ref(), rc.Offset-1, rc.Offset)
	if err != nil {
		return r.settled("nack", rc, err)
	}
	attempt := states[rc.Offset].Attempts + 1
	if r.o.MaxAttempts != settle.Unlimited && attempt >= r.o.MaxAttempts {
		err = r.c.drv.DeadLetter(ctx, l, settle.DeadLetterCopy(m, r.o.DLQSuffix, attempt, cause), rc.Offset, now)
	} else {
		err = r.c.drv.RecordAttempt(ctx, l, rc.Offset,
			driver.DeliveryState{Attempts: attempt, NextAttemptAt: now.Add(retryAfter), LastError: settle.ErrText(cause)}, now)
	}
	if err == nil {
		if rerr := r.c.drv.ReleaseLease(ctx, l, now); rerr != nil && !errors.Is(rerr, driver.ErrLeaseLost) {
			r.c.cfg.Logger.Warn("shardq: giving back a message group after a nack failed; it is free after its visibility timeout",
				"tenant", tenant, "topic", topic, "partition_key", key, "err", rerr)
		}
	}
	return r.settled("nack", rc, err)
}

// settled maps a settlement's error: a moved lease or claim is a stale
// receipt.
func (r *Receipts) settled(op string, rc receipt, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, driver.ErrLeaseLost), errors.Is(err, ErrStaleReceipt):
		return fmt.Errorf("shardq: %s offset %d of tenant %q topic %q partition %q: %w", op, rc.Offset, rc.Tenant, rc.Topic, rc.Key, ErrStaleReceipt)
	}
	return fmt.Errorf("shardq: %s offset %d of tenant %q topic %q partition %q: %w", op, rc.Offset, rc.Tenant, rc.Topic, rc.Key, err)
}

// maxAdvanced bounds Receipts.advanced before it sheds old entries.
const maxAdvanced = 10_000

// advance moves the group's ungrouped cursor past what is done, at most
// once a second per tenant, topic and group (subscribers do it on their
// discovery ticks; a receipt's receiver has no ticks).
func (r *Receipts) advance(ctx context.Context, rc receipt, now time.Time) {
	k := [3]string{rc.Tenant, rc.Topic, rc.Group}
	r.mu.Lock()
	due := now.Sub(r.advanced[k]) >= time.Second
	if due {
		if len(r.advanced) >= maxAdvanced {
			// Groups come from clients: the map only spaces advances out,
			// so forgetting all of it costs one early advance per group.
			clear(r.advanced)
		}
		r.advanced[k] = now
	}
	r.mu.Unlock()
	if !due {
		return
	}
	if _, err := r.c.drv.AdvanceUngrouped(ctx, rc.Tenant, rc.Topic, rc.Group, now); err != nil {
		r.c.cfg.Logger.Warn("shardq: advancing the ungrouped cursor failed; the next ack retries", "tenant", rc.Tenant, "topic", rc.Topic,
			"group", rc.Group, "err", err)
	}
}
