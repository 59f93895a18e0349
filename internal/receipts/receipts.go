// SPDX-License-Identifier: Apache-2.0

// Package receipts is the runtime of receives with receipts
// (shardq.Receipts, which `shardq serve` is built on): a receive takes a
// message group's lease, or ungrouped messages' claims, for a visibility
// timeout and hands out signed receipts that settle the messages later,
// from any process. The root package holds the public types, validates
// requests and converts.
package receipts

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/expiry"
	"github.com/shardq/shardq/internal/ident"
	"github.com/shardq/shardq/internal/large"
	"github.com/shardq/shardq/internal/lifecycle"
	"github.com/shardq/shardq/internal/receiptkey"
	"github.com/shardq/shardq/internal/settle"
	"github.com/shardq/shardq/internal/telemetry"
	"github.com/shardq/shardq/internal/wakeup"
)

// Errors of receipts; the root package exports them.
var (
	ErrBad   = errors.New("shardq: receipt not issued here")
	ErrStale = errors.New("shardq: stale receipt")
)

// Config is the receiver's settings, with defaults filled.
type Config struct {
	Name string // each receive's lease or claims are owned by Name#random
	// Settler settles Nacks: its Policy's MaxAttempts, its DLQSuffix and
	// its Clock are the receiver's.
	Settler          settle.Settler
	PollInterval     time.Duration // a waiting receive's poll while the change feed is down
	FeedPollInterval time.Duration // and while it streams
	// MaxVisibility bounds a Nack's delay, and how long a retired key
	// still verifies receipts.
	MaxVisibility time.Duration
	// MaxHold bounds how long visibility changes may hold a message in
	// all, from the receive that handed it out (at most MaxVisibility,
	// so that its receipt's key still verifies it; 0: MaxVisibility).
	MaxHold time.Duration
	// MaxMessageBytes is the most payload and header bytes one message
	// can carry.
	MaxMessageBytes int64
	// Size is what a message counts against a receive's MaxBytes: the
	// form a server sends it on in, never less than its payload and
	// header bytes, which the database sizes first (nil: those bytes).
	Size func(*driver.Message) int64
	// LargeWriteTimeout is how long a large message's write may make no
	// progress before a receive waiting for it gives it up (large.Waiter).
	LargeWriteTimeout time.Duration
	LargeStalls       *large.Stalls    // the process's (large.Waiter)
	Local             *wakeup.Registry // the client's wake-ups
	Log               *slog.Logger
	Tel               *telemetry.T // counts expired messages (nil: not counted)
}

// Receipts receives with receipts.
type Receipts struct {
	drv  driver.Driver
	cfg  Config
	keys *receiptkey.Ring

	mu       sync.Mutex
	advanced map[[3]string]time.Time // ungrouped cursors moved, by (tenant, topic, group)
	// waiters wait for the end markers of large messages at the cursors
	// of groups, across receives (large.go).
	waiters map[driver.PartitionRef]*large.Waiter
	// nextSlots are the slots of the next-group receives in flight, by
	// (tenant, topic, group): nextSlot.
	nextSlots map[[3]string][]bool
}

// New returns a receiver of receipts over drv.
func New(drv driver.Driver, cfg Config) *Receipts {
	return &Receipts{drv: drv, cfg: cfg, keys: receiptkey.New(drv, cfg.MaxVisibility, cfg.Settler.Clock), advanced: map[[3]string]time.Time{},
		waiters: map[driver.PartitionRef]*large.Waiter{}, nextSlots: map[[3]string][]bool{}}
}

func (r *Receipts) now() time.Time { return r.cfg.Settler.Clock() }

// Request is one receive, validated: Key takes that message group;
// NextGroup a free group whose next message is among the oldest (nextSlot)
// or the one its Ack goes on with (goesOn); Ungrouped only
// ungrouped messages; none of them, ungrouped messages when there are
// any, else the next free group. Hold (with Key or NextGroup) keeps the
// group's lease across receives as a session, even while it has no
// message ready unless RequireReady; Session receives in a session.
type Request struct {
	Tenant, Topic, Group string
	Key                  string
	NextGroup, Ungrouped bool
	Hold, RequireReady   bool
	Session              string
	Max                  int
	Wait, Visibility     time.Duration
	MaxBytes             int64 // 0: no bound
	Done                 <-chan struct{}
	// Ack holds receipts to acknowledge first, as AckAll does. With
	// NextGroup (and not Hold), an ack of the whole of a group's receive
	// keeps the group while it has more stored (goesOn).
	Ack []string

	turn int // the receive goes on with a group: the turns in a row, this one included
}

// Result is what a receive hands out; Session, when the receive holds a
// group, is the session's id.
type Result struct {
	Messages  []Received
	Truncated bool
	Session   *Session
	// Acked counts the receipts of Request.Ack settled; Stale indexes
	// the stale ones.
	Acked int
	Stale []int
}

// Received is a message handed out as its Attempt-th delivery, and the
// receipt that settles it.
type Received struct {
	Message driver.Message
	Attempt int
	Receipt string
	// Large, for a large message, is what its end marker says: Message
	// is its view (no payload), and Body reads it by the receipt.
	Large *Large
}

// Large describes a large message handed out by a receipt.
type Large struct {
	Size   int64
	Chunks int
	SHA256 string // hex
}

func (rc *Receipt) lease() driver.Lease {
	return driver.Lease{PartitionRef: rc.ref(), Owner: rc.Owner, Token: rc.Token}
}

func (rc *Receipt) ref() driver.PartitionRef {
	return driver.PartitionRef{Tenant: rc.Tenant, ConsumerGroup: rc.Group, Topic: rc.Topic, PartitionKey: rc.Key}
}

// ClaimOf is the claim an ungrouped message's receipt names, m its message.
func (rc *Receipt) ClaimOf(m driver.Message) driver.Claim {
	m.Tenant, m.Topic, m.Offset = rc.Tenant, rc.Topic, rc.Offset
	return driver.Claim{ConsumerGroup: rc.Group, Owner: rc.Owner, Token: rc.Token, Attempts: rc.Attempts, Message: m}
}

// receive names the receive of a message group's receipt: the receipt
// without its own offset.
func (rc Receipt) receive() Receipt {
	rc.Offset = 0
	return rc
}

// Receive acknowledges rq.Ack, then hands out up to rq.Max messages
// (within rq.MaxBytes) of one message group under its lease, or
// ungrouped ones under their claims, waiting up to rq.Wait while there
// is none. Its result reports the acks, with an error after them too.
func (r *Receipts) Receive(ctx context.Context, rq Request) (Result, error) {
	if len(rq.Ack) == 0 {
		return r.receive(ctx, rq, nil)
	}
	if rq.Session != "" { // before the acks: a refused request settles nothing
		if _, err := r.DecodeSession(ctx, rq.Session, rq.Tenant, rq.Topic, rq.Group); err != nil {
			return Result{}, fmt.Errorf("shardq: receive: %w", err)
		}
	}
	var keep *keepFor
	if rq.NextGroup && !rq.Hold {
		keep = &keepFor{owner: ident.MemberID(r.cfg.Name), ttl: rq.Visibility}
	}
	stale, kept, err := r.ackAll(ctx, rq.Tenant, rq.Topic, rq.Group, rq.Ack, keep)
	if err != nil {
		return Result{}, err
	}
	res, err := r.receive(ctx, rq, kept)
	res.Acked, res.Stale = len(rq.Ack)-len(stale), stale
	return res, err
}

// MaxTurns bounds the receives in a row that go on with one group after
// the one that took it (each after an ack of the whole of the one
// before): the last one's ack gives it back, so that one busy group holds
// a consumer for at most MaxTurns+1 receives in a row.
const MaxTurns = 10

// goesOn says whether an ack of rc, the highest receipt of its receive,
// may keep the group for the next receive: it settles the whole receive
// (which would give the group back), outside a session, within MaxTurns.
func (rc Receipt) goesOn() bool {
	return !rc.Held && !rc.Claim && !rc.Deferred && rc.upTo() == rc.Last && rc.Turn < MaxTurns
}

// upTo is where an ack of rc, a message group's receipt, commits the
// cursor: its message's offset; for a large message, Last, what settling
// it covers (large.Span.UpTo; in receipts of an earlier version Last is
// the end marker's offset, End).
func (rc Receipt) upTo() int64 {
	if rc.End > 0 {
		return rc.Last
	}
	return rc.Offset
}

// keepFor is the lease a kept group goes on under: its owner (this
// receiver) and how long it lasts (the next receive's visibility).
type keepFor struct {
	owner string
	ttl   time.Duration
}

// kept is a group an ack kept, and the turn the next receive is.
type kept struct {
	lease driver.Lease
	turn  int
}

func (r *Receipts) receive(ctx context.Context, rq Request, goOn *kept) (Result, error) {
	var held *Receipt // the session's lease, once there is one
	opened := false   // this receive accepted the group: an error gives it back
	if rq.Session != "" {
		s, err := r.DecodeSession(ctx, rq.Session, rq.Tenant, rq.Topic, rq.Group)
		if err != nil {
			return Result{}, fmt.Errorf("shardq: receive: %w", err)
		}
		held, rq.Key = &s, s.Key
	}
	var wake *receiveWake
	deadline := time.Now().Add(rq.Wait)
	for {
		var res Result
		var err error
		if goOn != nil {
			res, err = r.goOn(ctx, rq, *goOn)
			if goOn = nil; err != nil || len(res.Messages) > 0 {
				return res, err
			}
		}
		switch {
		case held != nil:
			res, err = r.receiveSession(ctx, rq, *held)
		case rq.Key != "":
			res, err = r.receiveGroup(ctx, rq, rq.Key)
		case rq.NextGroup:
			res, err = r.receiveNextGroup(ctx, rq)
		case rq.Ungrouped:
			res, err = r.receiveUngrouped(ctx, rq)
		default:
			if res, err = r.receiveUngrouped(ctx, rq); err == nil && len(res.Messages) == 0 {
				res, err = r.receiveNextGroup(ctx, rq)
			}
		}
		if err == nil && res.Session != nil && held == nil {
			// Accepted with nothing ready: the wait goes on in the session.
			held, rq.Session, opened = &res.Session.lease, res.Session.ID, true
		}
		if err != nil && opened {
			r.giveBack(ctx, *held) // the caller never learnt of the session
		}
		if err != nil || len(res.Messages) > 0 || !time.Now().Before(deadline) {
			return res, err
		}
		if wake == nil {
			// Registered before the next look, so that a move between that
			// look and the wait still wakes it.
			wake = &receiveWake{key: rq.Key, one: rq.Key != "", ch: make(chan struct{}, 1)}
			r.cfg.Local.Add(rq.Topic, []string{rq.Tenant}, wake, wake)
			defer r.cfg.Local.Remove(rq.Topic, wake)
			continue
		}
		poll := r.cfg.PollInterval
		if r.cfg.Local.Up() {
			poll = r.cfg.FeedPollInterval
		}
		if held != nil {
			poll = min(poll, rq.Visibility/3) // each look renews the session's lease
		}
		if !lifecycle.SleepUntilNext(ctx, rq.Done, wake.ch, deadline, poll) {
			if ctx.Err() != nil && opened {
				r.giveBack(ctx, *held) // the caller went away: nobody holds the session
				return Result{}, nil
			}
			return Result{Session: res.Session}, nil
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

// budgeted reports whether rq's byte budget can bind: Max messages of the
// largest size would pass it.
func (r *Receipts) budgeted(rq Request) bool {
	return rq.MaxBytes > 0 && int64(rq.Max)*r.cfg.MaxMessageBytes > rq.MaxBytes
}

// rawSize is a message's payload and header bytes.
func rawSize(m *driver.Message) int64 {
	n := int64(len(m.Payload))
	for k, v := range m.Headers {
		n += int64(len(k) + len(v))
	}
	return n
}

// fit is how many of the n messages that at gives fit budget by
// Config.Size (the first whatever its size); cut says it left some out.
func (r *Receipts) fit(n int, at func(int) *driver.Message, budget int64) (k int, cut bool) {
	if budget <= 0 {
		return n, false
	}
	size := r.cfg.Size
	if size == nil {
		size = rawSize
	}
	var used int64
	for i := range n {
		if used += size(at(i)); i > 0 && used > budget {
			return i, true
		}
	}
	return n, false
}

func (r *Receipts) receiveUngrouped(ctx context.Context, rq Request) (Result, error) {
	owner := ident.MemberID(r.cfg.Name)
	limit := driver.ClaimLimit{Messages: rq.Max}
	if r.budgeted(rq) {
		limit.Bytes = rq.MaxBytes
	}
	claims, truncated, err := r.drv.ClaimMessages(ctx, driver.ClaimMessagesParams{Group: driver.GroupRef{Tenant: rq.Tenant, Topic: rq.Topic, ConsumerGroup: rq.Group}, Owner: owner, Now: r.now(), Visibility: rq.Visibility, Limit: limit})
	if err != nil {
		return Result{}, fmt.Errorf("shardq: receive: %w", err)
	}
	if k, cut := r.fit(len(claims), func(i int) *driver.Message { return &claims[i].Message }, rq.MaxBytes); cut {
		if err := r.releaseClaims(ctx, claims[k:], nil); err != nil {
			return Result{}, r.releaseClaims(ctx, claims[:k], fmt.Errorf("shardq: receive: %w", err))
		}
		claims, truncated = claims[:k], true
	}
	res := Result{Truncated: truncated}
	for _, c := range claims {
		if expiry.Expired(&c.Message, r.now()) {
			if err := r.expireClaim(ctx, rq, c); err != nil {
				return Result{}, r.releaseClaims(ctx, claims, err)
			}
			continue
		}
		rc := Receipt{Tenant: rq.Tenant, Topic: rq.Topic, Group: rq.Group, Owner: owner, Token: c.Token, Offset: c.Message.Offset, Claim: true, Attempts: c.Attempts}
		signed, err := r.Sign(ctx, rc)
		if err != nil {
			return Result{}, r.releaseClaims(ctx, claims, fmt.Errorf("shardq: receive: %w", err))
		}
		res.Messages = append(res.Messages, Received{Message: c.Message, Attempt: c.Attempts, Receipt: signed})
	}
	return res, nil
}

// maxExpiredRounds bounds the reads of one receive that find only
// expired messages at a group's cursor.
const maxExpiredRounds = 4

// expireLeading settles the expired messages at the front of msgs (read
// after l's cursor) without handing them out, under l: the cursor passes
// them, or each is dead-lettered. It returns the messages to hand out:
// those after them, up to the next expired one. passed reports that some
// were settled.
func (r *Receipts) expireLeading(ctx context.Context, l *driver.Lease, msgs []driver.Message, states map[int64]driver.DeliveryState,
	now time.Time) (rest []driver.Message, passed bool, err error) {
	n := 0
	for n < len(msgs) && large.KindOf(&msgs[n]) == large.Ordinary && expiry.Expired(&msgs[n], now) {
		n++
	}
	if n > 0 {
		if r.cfg.Settler.Policy.DeadLetterExpired {
			for _, m := range msgs[:n] {
				if _, err := r.cfg.Settler.Leased(ctx, *l, m, nil, states[m.Offset].Attempts+1, &settle.DeadLetterError{Err: expiry.Cause(&m)}); err != nil {
					return nil, false, err
				}
			}
		} else if err := r.drv.CommitOffset(ctx, *l, msgs[n-1].Offset, now); err != nil {
			return nil, false, err
		}
		l.Committed = msgs[n-1].Offset
		r.expired(l.Tenant, l.Topic, l.ConsumerGroup, n)
	}
	rest = msgs[n:]
	for i := range rest {
		if expiry.Expired(&rest[i], now) {
			return rest[:i], n > 0, nil // it goes first in the next receive
		}
	}
	return rest, n > 0, nil
}

// expireClaim settles an expired ungrouped message's claim without
// handing it out: marked done, or dead-lettered.
func (r *Receipts) expireClaim(ctx context.Context, rq Request, c driver.Claim) error {
	var err error
	if r.cfg.Settler.Policy.DeadLetterExpired {
		_, err = r.cfg.Settler.Claim(ctx, c, &settle.DeadLetterError{Err: expiry.Cause(&c.Message)})
	} else {
		err = r.drv.AckClaims(ctx, []driver.Claim{c}, r.now())
	}
	if err != nil && !errors.Is(err, driver.ErrLeaseLost) {
		return fmt.Errorf("shardq: receive: settle an expired message: %w", err)
	}
	r.expired(rq.Tenant, rq.Topic, rq.Group, 1)
	return nil
}

func (r *Receipts) expired(tenant, topic, group string, n int) {
	if r.cfg.Tel != nil {
		r.cfg.Tel.Group(topic, group).Expired(tenant, n)
	}
}

// releaseClaims gives back claims that cannot be handed out, uncounted.
func (r *Receipts) releaseClaims(ctx context.Context, claims []driver.Claim, cause error) error {
	dctx, cancel := lifecycle.Detached(ctx) // one bound for all of them
	defer cancel()
	for _, c := range claims {
		if err := r.drv.ReleaseClaim(dctx, c, r.now()); err != nil && !errors.Is(err, driver.ErrLeaseLost) {
			cause = errors.Join(cause, err)
		}
	}
	return cause
}

// receiveNextGroup takes the free message group whose next message is
// oldest (trying a page of the oldest: others may take some meanwhile).
func (r *Receipts) receiveNextGroup(ctx context.Context, rq Request) (Result, error) {
	// Groups whose next message is a large one still being written come
	// first (their chunk 0 is old) but have nothing to hand out: each is
	// looked at cheaply (once known, its chunk 0 alone, for the Waiter),
	// and when any is on the page the look goes further, to groups not
	// yet looked at.
	slot, done := r.nextSlot(rq)
	defer done()
	seen := map[string]bool{}
	for limit := 20; ; limit = min(limit*4, maxReadyGroups) {
		groups, err := r.drv.ReadyGroups(ctx, driver.GroupScope{Tenants: []string{rq.Tenant}, Topic: rq.Topic, ConsumerGroup: rq.Group}, r.now(), limit)
		if err != nil {
			return Result{}, fmt.Errorf("shardq: receive: %w", err)
		}
		writing := 0
		if len(groups) > 0 {
			k := slot % len(groups)
			groups = slices.Concat(groups[k:], groups[:k])
		}
		for _, g := range groups {
			if seen[g.PartitionKey] {
				continue // looked at on the page before
			}
			seen[g.PartitionKey] = true
			rq.RequireReady = true // a group is taken for what it has ready
			res, err := r.receiveGroup(ctx, rq, g.PartitionKey)
			if err != nil || len(res.Messages) > 0 {
				return res, err
			}
			if r.writing(driver.PartitionRef{Tenant: rq.Tenant, ConsumerGroup: rq.Group, Topic: rq.Topic, PartitionKey: g.PartitionKey}) {
				writing++
			}
		}
		if writing == 0 || len(groups) < limit || limit == maxReadyGroups {
			return Result{}, nil
		}
	}
}

// nextSlot spreads the next-group receives of one consumer group in
// flight here over the oldest free groups: the one in slot k (the lowest
// slot free when it began) tries the k-th oldest first, then the rest of
// the page in order, wrapping round. Receives that start together all
// asking for the oldest would race for it, and each loser pays a failed
// lease acquisition, or an empty one when the winner drained the group
// between the loser's list and its acquisition. The k receives in flight
// before it are taking the k oldest meanwhile. done frees the slot.
func (r *Receipts) nextSlot(rq Request) (slot int, done func()) {
	k := [3]string{rq.Tenant, rq.Topic, rq.Group}
	r.mu.Lock()
	defer r.mu.Unlock()
	slots := r.nextSlots[k]
	for slot < len(slots) && slots[slot] {
		slot++
	}
	if slot == len(slots) {
		slots = append(slots, true)
	}
	slots[slot] = true
	r.nextSlots[k] = slots
	return slot, func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		slots := r.nextSlots[k]
		slots[slot] = false
		for len(slots) > 0 && !slots[len(slots)-1] {
			slots = slots[:len(slots)-1]
		}
		if len(slots) == 0 {
			delete(r.nextSlots, k)
		} else {
			r.nextSlots[k] = slots
		}
	}
}

// maxReadyGroups bounds the groups one receive looks at.
const maxReadyGroups = 320

// receiveGroup takes group key's lease and hands out its ready messages
// after the cursor; with none ready it gives the lease back, unless the
// receive holds the group.
func (r *Receipts) receiveGroup(ctx context.Context, rq Request, key string) (Result, error) {
	ref := driver.PartitionRef{Tenant: rq.Tenant, ConsumerGroup: rq.Group, Topic: rq.Topic, PartitionKey: key}
	owner := ident.MemberID(r.cfg.Name)
	now := r.now()
	l, err := r.drv.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: ref, Owner: owner, Now: now, TTL: rq.Visibility})
	if errors.Is(err, driver.ErrLeaseHeld) {
		return Result{}, nil // in flight elsewhere: its messages are not ours to see
	}
	if err != nil {
		return Result{}, fmt.Errorf("shardq: receive %s: %w", ref, err)
	}
	res, err := r.handOut(ctx, rq, l, now, rq.Hold)
	if err == nil && rq.Hold && (len(res.Messages) > 0 || !rq.RequireReady) {
		res.Session, err = r.session(ctx, l)
	}
	if err != nil || (len(res.Messages) == 0 && res.Session == nil) {
		return Result{}, r.drop(ctx, l, now, err)
	}
	return res, nil
}

// goOn hands out the ready messages of the group an ack kept, and gives
// it back when it has none (all delayed, say).
func (r *Receipts) goOn(ctx context.Context, rq Request, k kept) (Result, error) {
	rq.turn = k.turn
	now := r.now()
	res, err := r.handOut(ctx, rq, k.lease, now, false)
	if err != nil || len(res.Messages) == 0 {
		return Result{}, r.drop(ctx, k.lease, now, err)
	}
	return res, nil
}

// drop gives back l, which a receive took and hands nothing out of (err,
// when not nil, is why), and returns err with the release's own.
func (r *Receipts) drop(ctx context.Context, l driver.Lease, now time.Time, err error) error {
	dctx, cancel := lifecycle.Detached(ctx)
	rerr := r.drv.ReleaseLease(dctx, l, now)
	cancel()
	if rerr != nil && !errors.Is(rerr, driver.ErrLeaseLost) {
		err = errors.Join(err, fmt.Errorf("release %s: %w", l.PartitionRef, rerr))
	}
	if err != nil {
		return fmt.Errorf("shardq: receive %s: %w", l.PartitionRef, err)
	}
	return nil
}

// handOut hands out l's ready messages after its cursor, with receipts
// (held: a session's).
func (r *Receipts) handOut(ctx context.Context, rq Request, l driver.Lease, now time.Time, held bool) (Result, error) {
	ref := l.PartitionRef
	if r.writing(ref) {
		rq.Max = 1 // a large message is being written at the cursor: its chunk 0 is all there is to read
	}
	msgs, states, truncated, err := r.ready(ctx, l, rq, now)
	for round := 1; err == nil && len(msgs) > 0; round++ {
		// Every read goes through expireLeading before anything of it is
		// handed out; a read that was all expired is followed by another,
		// a few times at most.
		var passed bool
		if msgs, passed, err = r.expireLeading(ctx, &l, msgs, states, now); err != nil || !passed || len(msgs) > 0 || round == maxExpiredRounds {
			break
		}
		msgs, states, truncated, err = r.ready(ctx, l, rq, now)
	}
	if err == nil && (len(msgs) == 0 || large.KindOf(&msgs[0]) != large.First) {
		r.forget(ref) // whatever was waited for at the cursor is past
	}
	var whole *large.Whole
	if err == nil && len(msgs) > 0 {
		msgs, states, whole, err = r.wholes(ctx, &l, rq, msgs, states, truncated, now)
	}
	if err != nil || len(msgs) == 0 {
		return Result{}, err
	}
	last := msgs[len(msgs)-1].Offset
	if whole != nil {
		last = whole.UpTo
	}
	res := Result{Messages: make([]Received, len(msgs)), Truncated: truncated && whole == nil}
	for i, m := range msgs {
		rc := Receipt{Tenant: rq.Tenant, Topic: rq.Topic, Group: rq.Group, Key: ref.PartitionKey, Owner: l.Owner, Token: l.Token, Offset: m.Offset, Last: last, Held: held,
			Turn: rq.turn}
		rec := Received{Message: m, Attempt: states[m.Offset].Attempts + 1}
		if whole != nil {
			rc.End = whole.End.Offset
			rec.Message = whole.Message
			rec.Large = &Large{Size: whole.Size, Chunks: whole.Chunks, SHA256: whole.End.Headers[large.HeaderSHA256]}
		}
		if rec.Receipt, err = r.Sign(ctx, rc); err != nil {
			return Result{}, err
		}
		res.Messages[i] = rec
	}
	return res, nil
}

// ready reads up to rq.Max messages after l's cursor that may be
// delivered now, within rq.MaxBytes: it stops at a message delayed past
// now or waiting for its retry. truncated says the budget left a message
// behind.
func (r *Receipts) ready(ctx context.Context, l driver.Lease, rq Request, now time.Time) (msgs []driver.Message, states map[int64]driver.DeliveryState, truncated bool, err error) {
	if r.budgeted(rq) {
		msgs, truncated, err = r.drv.FetchWithin(ctx, driver.FetchWithinParams{Partition: driver.TopicPartition{Tenant: l.Tenant, Topic: l.Topic, PartitionKey: l.PartitionKey}, After: l.Committed, Limit: rq.Max, Budget: rq.MaxBytes})
	} else {
		msgs, err = r.drv.FetchAfter(ctx, driver.TopicPartition{Tenant: l.Tenant, Topic: l.Topic, PartitionKey: l.PartitionKey}, l.Committed, rq.Max)
	}
	if err != nil || len(msgs) == 0 {
		return nil, nil, false, err
	}
	if k, cut := r.fit(len(msgs), func(i int) *driver.Message { return &msgs[i] }, rq.MaxBytes); cut {
		msgs, truncated = msgs[:k], true
	}
	if states, err = r.drv.DeliveryStates(ctx, l.PartitionRef, l.Committed, msgs[len(msgs)-1].Offset); err != nil {
		return nil, nil, false, err
	}
	for i, m := range msgs {
		if m.NotBefore.After(now) || states[m.Offset].NextAttemptAt.After(now) {
			return msgs[:i], states, false, nil
		}
	}
	return msgs, states, truncated, nil
}

// Ack settles the message of a receipt: an ungrouped message's claim is
// marked done; a message group's cursor is committed past it (acks are
// cumulative), and the receive's last message gives the group back.
func (r *Receipts) Ack(ctx context.Context, tenant, topic, group, rcpt string) error {
	rc, err := r.Decode(ctx, rcpt, tenant, topic, group)
	if err != nil {
		return fmt.Errorf("shardq: ack: %w", err)
	}
	now := r.now()
	if rc.Deferred {
		return settled("ack", rc, r.drv.AckDeferred(ctx, []driver.Claim{rc.deferredClaim()}, now))
	}
	if rc.Claim {
		err := r.drv.AckClaims(ctx, []driver.Claim{rc.ClaimOf(driver.Message{})}, now)
		if err == nil {
			r.advance(ctx, rc, now)
		}
		return settled("ack", rc, err)
	}
	return r.commit(ctx, rc, now)
}

// commit commits a message group's cursor past rc's offset, and gives the
// group back when rc is its receive's last message.
func (r *Receipts) commit(ctx context.Context, rc Receipt, now time.Time) error {
	// Whatever a receipt says, a cursor never passes the partition's
	// head: that would skip every message published up to it.
	// (A receipt's Last only decides whether its ack gives the group back.)
	l := rc.lease()
	upTo := rc.upTo()
	// The receive's last ack gives the group back in the same transaction.
	err := r.drv.CommitReceived(ctx, driver.CommitReceivedParams{Lease: l, Offset: upTo, Release: upTo == rc.Last && !rc.Held, Now: now})
	return settled("ack", rc, pastHead(rc, err))
}

// commitKeep commits a group's cursor past rc, the last message of its
// receive, keeping the group under keep when more of it is stored; nil
// when it was given back.
func (r *Receipts) commitKeep(ctx context.Context, rc Receipt, keep keepFor, now time.Time) (*kept, error) {
	l, ok, err := r.drv.CommitReceivedKeep(ctx, driver.CommitReceivedKeepParams{Lease: rc.lease(), Offset: rc.upTo(), Owner: keep.owner, Now: now, TTL: keep.ttl})
	if err != nil && !errors.Is(err, driver.ErrLeaseLost) && !errors.Is(err, driver.ErrPastHead) {
		// The commit's outcome may be unknown (a connection cut at
		// COMMIT): a lease handed on that nobody knows of would hold the
		// group for the visibility. Its release is fenced, so it changes
		// nothing when the hand-on did not commit.
		next := driver.Lease{PartitionRef: rc.ref(), Owner: keep.owner, Token: rc.Token + 1}
		err = errors.Join(err, r.drop(ctx, next, now, nil))
	}
	if err != nil || !ok {
		return nil, settled("ack", rc, pastHead(rc, err))
	}
	return &kept{lease: l, turn: rc.Turn + 1}, nil
}

// pastHead names the receipt in a commit refused past its partition's
// head: a receipt the client edited could say so, a signed one cannot.
func pastHead(rc Receipt, err error) error {
	if errors.Is(err, driver.ErrPastHead) {
		return &ident.Error{Field: "receipt", Rule: fmt.Sprintf("offset %d is past the partition's head: %v", rc.Offset, err)}
	}
	return err
}

// AckAll acknowledges receipts as Ack does each, in few statements: the
// claims in one transaction, and per receive of a message group one
// cursor commit, at its highest offset. Every receipt is checked first;
// it returns the indexes of the stale ones.
func (r *Receipts) AckAll(ctx context.Context, tenant, topic, group string, rcpts []string) (stale []int, err error) {
	stale, _, err = r.ackAll(ctx, tenant, topic, group, rcpts, nil)
	return stale, err
}

// ackAll is AckAll; with keep, the first receive of a message group that
// the acks settle whole and that goesOn keeps its group, under keep,
// while more of it is stored: that lease is returned.
func (r *Receipts) ackAll(ctx context.Context, tenant, topic, group string, rcpts []string, keep *keepFor) (stale []int, goOn *kept, err error) {
	rcs, err := r.decodeAll(ctx, rcpts, tenant, topic, group)
	if err != nil {
		return nil, nil, fmt.Errorf("shardq: ack: %w", err)
	}
	now := r.now()
	var claims, deferred []int
	receives := map[Receipt][]int{} // a receive -> its receipts
	var order []Receipt             // the receives, as the receipts first name them
	for i, rc := range rcs {
		switch {
		case rc.Deferred:
			deferred = append(deferred, i)
		case rc.Claim:
			claims = append(claims, i)
		default:
			if receives[rc.receive()] == nil {
				order = append(order, rc.receive())
			}
			receives[rc.receive()] = append(receives[rc.receive()], i)
		}
	}
	if len(claims) > 0 {
		cs := make([]driver.Claim, len(claims))
		for j, i := range claims {
			cs[j] = rcs[i].ClaimOf(driver.Message{})
		}
		switch err := r.drv.AckClaims(ctx, cs, now); {
		case errors.Is(err, driver.ErrLeaseLost):
			// One or more moved on: settle the others one by one.
			for j, i := range claims {
				if err := r.drv.AckClaims(ctx, cs[j:j+1], now); errors.Is(err, driver.ErrLeaseLost) {
					stale = append(stale, i)
				} else if err != nil {
					return nil, nil, settled("ack", rcs[i], err)
				}
			}
		case err != nil:
			return nil, nil, settled("ack", rcs[claims[0]], err)
		}
		r.advance(ctx, rcs[claims[0]], now)
	}
	if len(deferred) > 0 {
		s, err := r.ackDeferred(ctx, rcs, deferred, now)
		if err != nil {
			return nil, nil, err
		}
		stale = append(stale, s...)
	}
	for _, rv := range order {
		idx := receives[rv]
		top := rcs[idx[0]]
		for _, i := range idx {
			if rcs[i].Offset > top.Offset {
				top = rcs[i]
			}
		}
		var err error
		if keep != nil && goOn == nil && top.goesOn() {
			goOn, err = r.commitKeep(ctx, top, *keep, now)
		} else {
			err = r.commit(ctx, top, now)
		}
		switch {
		case errors.Is(err, ErrStale):
			stale = append(stale, idx...)
		case err != nil:
			if goOn != nil {
				err = errors.Join(err, r.drop(ctx, goOn.lease, now, nil))
			}
			return nil, nil, err
		}
	}
	slices.Sort(stale)
	return stale, goOn, nil
}

// NackAll fails the messages of receipts as Nack does each; of one
// receive of a message group only the lowest offset is failed (the
// others wait behind it, uncounted). Every receipt is checked first; it
// returns the indexes of the stale ones.
func (r *Receipts) NackAll(ctx context.Context, tenant, topic, group string, rcpts []string, retryAfter time.Duration, reason string) (stale []int, err error) {
	rcs, err := r.decodeAll(ctx, rcpts, tenant, topic, group)
	if err != nil {
		return nil, fmt.Errorf("shardq: nack: %w", err)
	}
	first := map[Receipt]int{} // a receive -> its lowest receipt
	var order []int
	for i, rc := range rcs {
		if rc.Claim || rc.Deferred {
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
		case errors.Is(err, ErrStale):
			failed[i] = true
		case err != nil:
			return nil, err
		}
	}
	for i, rc := range rcs {
		if failed[i] || (!rc.Claim && !rc.Deferred && failed[first[rc.receive()]]) {
			stale = append(stale, i)
		}
	}
	return stale, nil
}

// decodeAll decodes every receipt, or names the first bad one.
func (r *Receipts) decodeAll(ctx context.Context, rcpts []string, tenant, topic, group string) ([]Receipt, error) {
	if len(rcpts) == 0 || len(rcpts) > MaxMessages {
		return nil, &ident.Error{Field: "receipts", Rule: fmt.Sprintf("%d receipts: want 1 to %d", len(rcpts), MaxMessages)}
	}
	if err := repeated(rcpts); err != nil {
		return nil, err
	}
	rcs := make([]Receipt, len(rcpts))
	for i, s := range rcpts {
		rc, err := r.Decode(ctx, s, tenant, topic, group)
		if err != nil {
			var ve *ident.Error
			if errors.As(err, &ve) {
				named := &ident.Error{Field: fmt.Sprintf("receipts[%d]", i), Rule: ve.Rule}
				if errors.Is(err, ErrBad) {
					return nil, fmt.Errorf("%w: %w", named, ErrBad)
				}
				return nil, named
			}
			return nil, err
		}
		rcs[i] = rc
	}
	return rcs, nil
}

// repeated refuses a list that names a receipt twice: a settlement's work
// follows its receipts (a nack, a deferral and a visibility change go one
// at a time), so a repeated one would only multiply it.
func repeated(rcpts []string) error {
	seen := make(map[string]int, len(rcpts))
	for i, s := range rcpts {
		if j, ok := seen[s]; ok {
			return &ident.Error{Field: fmt.Sprintf("receipts[%d]", i), Rule: fmt.Sprintf("repeats the receipt at index %d", j)}
		}
		seen[s] = i
	}
	return nil
}

// MaxMessages bounds one receive, and the receipts of one AckAll or
// NackAll: as Pub/Sub's pull, 1,000. A receive's fixed cost (the round
// trip, the group's lease, the ack's fenced commit) is paid per receive,
// so a busy group drains several times faster in receives of hundreds;
// a server bounds their bytes (Request.MaxBytes) whatever the count.
const MaxMessages = 1000

// nackHold is how long a nack holds its group's lease between reading
// the cursor and giving the group back (which it does, failed or not,
// unless the process dies between them or the release fails too): long
// enough for the settlement's statements, each bounded by the lock wait
// (5 s), and well under a receive's default visibility, since a server
// that dies mid-nack leaves its group held this long.
const nackHold = 10 * time.Second

// Nack fails the message of a receipt: the settler delivers it again
// after retryAfter, or dead-letters it once it has failed MaxAttempts
// times. A message group is given back at once (its messages after this
// one wait behind it, in order); the receipts of that receive become
// stale. A session's nack ends the session the same way.
func (r *Receipts) Nack(ctx context.Context, tenant, topic, group, rcpt string, retryAfter time.Duration, reason string) error {
	rc, err := r.Decode(ctx, rcpt, tenant, topic, group)
	if err == nil && (retryAfter < 0 || retryAfter > r.cfg.MaxVisibility) {
		err = &ident.Error{Field: "retry_after", Rule: fmt.Sprintf("%s: want 0 to %s", retryAfter, r.cfg.MaxVisibility)}
	}
	if err != nil {
		return fmt.Errorf("shardq: nack: %w", err)
	}
	if reason == "" {
		reason = "nacked"
	}
	if rc.Deferred {
		// Given back, deferred still: a deferred message leaves only by
		// an ack or a dead letter.
		now := r.now()
		return settled("nack", rc, r.drv.ReleaseDeferred(ctx, rc.deferredClaim(), now.Add(retryAfter), now))
	}
	cause := &settle.NackError{After: retryAfter, Err: errors.New(reason)}
	msgs, err := r.drv.FetchAfter(ctx, driver.TopicPartition{Tenant: tenant, Topic: topic, PartitionKey: rc.Key}, rc.Offset-1, 1)
	if err == nil && (len(msgs) == 0 || msgs[0].Offset != rc.Offset) {
		err = ErrStale // removed meanwhile (retention, delete)
	}
	if err != nil {
		return settled("nack", rc, err)
	}
	m := msgs[0]
	if rc.Claim {
		_, err = r.cfg.Settler.Claim(ctx, rc.ClaimOf(m), cause)
		return settled("nack", rc, err)
	}
	// An ack of a later message of the receive may have passed this one
	// already (acks are cumulative): then it is settled, the nack stale,
	// and the lease left to the receive's visibility. The cursor is read
	// under the lease's fence.
	l, err := r.drv.ResumeLeaseBelow(ctx, driver.ResumeLeaseBelowParams{Lease: rc.lease(), Offset: rc.Offset, Now: r.now(), TTL: nackHold})
	if err == nil && l.Committed >= rc.Offset {
		err = ErrStale
	}
	if err != nil {
		return settled("nack", rc, err)
	}
	// The group is given back, a session's too, whether the nack is
	// settled or fails (a cut connection, say): the receive's later
	// messages must not be acked past this one (acks are cumulative), and
	// a failure must not leave the group held for nackHold.
	defer r.giveBack(ctx, rc)
	var span *large.Span
	if rc.End > 0 {
		end, err := r.endAt(ctx, rc, m)
		if err != nil {
			return settled("nack", rc, err)
		}
		span = &large.Span{End: end, UpTo: rc.upTo()}
	}
	states, err := r.drv.DeliveryStates(ctx, rc.ref(), rc.Offset-1, rc.Offset)
	if err != nil {
		return settled("nack", rc, err)
	}
	_, err = r.cfg.Settler.Leased(ctx, l, m, span, states[rc.Offset].Attempts+1, cause)
	return settled("nack", rc, err)
}

// settled maps a settlement's error: a moved lease or claim is a stale
// receipt.
func settled(op string, rc Receipt, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, driver.ErrLeaseLost), errors.Is(err, ErrStale):
		return fmt.Errorf("shardq: %s offset %d of tenant %q topic %q partition %q: %w", op, rc.Offset, rc.Tenant, rc.Topic, rc.Key, ErrStale)
	}
	return fmt.Errorf("shardq: %s offset %d of tenant %q topic %q partition %q: %w", op, rc.Offset, rc.Tenant, rc.Topic, rc.Key, err)
}

// maxAdvanced bounds Receipts.advanced before it sheds old entries.
const maxAdvanced = 10_000

// advance moves the group's ungrouped cursor past what is done, at most
// once a second per tenant, topic and group (subscribers do it on their
// discovery ticks; a receipt's receiver has no ticks).
func (r *Receipts) advance(ctx context.Context, rc Receipt, now time.Time) {
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
	if _, err := r.drv.AdvanceUngrouped(ctx, driver.GroupRef{Tenant: rc.Tenant, Topic: rc.Topic, ConsumerGroup: rc.Group}, now); err != nil {
		r.cfg.Log.Warn("shardq: advancing the ungrouped cursor failed; the next ack retries", "tenant", rc.Tenant, "topic", rc.Topic,
			"group", rc.Group, "err", err)
	}
}
