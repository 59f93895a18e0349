// SPDX-License-Identifier: Apache-2.0

package shardq

import (
	"bytes"
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/consumer"
	"github.com/shardq/shardq/internal/expiry"
	"github.com/shardq/shardq/internal/ident"
	"github.com/shardq/shardq/internal/large"
	"github.com/shardq/shardq/internal/settings"
	"github.com/shardq/shardq/internal/settle"
	"github.com/shardq/shardq/internal/testhook"
)

// Delivery is a message handed to a subscriber's handler.
type Delivery struct {
	Tenant       string
	Topic        string
	PartitionKey string
	ID           string
	Offset       int64
	Headers      map[string]string
	Payload      []byte
	CreatedAt    time.Time
	NotBefore    time.Time // when the message was delayed until (zero: not delayed)
	ExpiresAt    time.Time // when the message expires (zero: never); an expired one is never handed out
	// Attempt is 1 on the message's first delivery to the consumer group,
	// 2 on its first retry, and so on (across subscribers).
	Attempt int
	// Size is the payload's size in bytes; for a large message
	// (PublishLarge), the whole message's, whose Payload is nil: read
	// Body.
	Size int64
	// Chunks is how many chunks a large message has (0 for an ordinary
	// message).
	Chunks int
	body   io.Reader // a large message's chunks (nil: Payload is all)
	// SHA256 is a large message's SHA-256 (hex), as its writer stored it;
	// Body checks it at the end.
	SHA256 string
	// inTx settles the delivery in the application's transaction
	// (AckTx), up to upTo; nil where that is not offered.
	inTx *settle.InTx
	upTo int64
	// deferred is the claim of a delivery of ReceiveDeferred (nil: none).
	deferred *deferredHold
	// rec records Defer and AckTx in place of running them: a delivery
	// shardqtest.Handle built (nil: none).
	rec *testhook.Recorder
}

func init() {
	testhook.Record = func(d any, rec *testhook.Recorder) any {
		c := *d.(*Delivery)
		c.inTx, c.deferred, c.rec = nil, nil, rec
		return &c
	}
}

// ErrNoTxSettle is returned by Delivery.AckTx for a delivery that cannot
// be settled in a transaction: one not handed out by a subscriber's
// handler or a GroupReceiver (a receipt's, or a copy made by an adapter),
// or a subscriber's kept after its handler returned.
var ErrNoTxSettle = errors.New("shardq: this delivery cannot be settled in a transaction")

// AckTx settles d inside tx, the application's own transaction on the
// client's database (for SQLite, begun on the driver's DB; on Vitess,
// with the application's rows on the tenant's shard), so that d's effects
// and its settlement commit together or not at all: the consumer group's
// cursor passes d (for an ungrouped message, its claim is marked done),
// fenced by the lease or claim that delivered it. A crash before the
// commit delivers d again with nothing of it stored; after the commit d
// is never delivered to the group again. When the lease or claim was lost
// AckTx fails (ErrLeaseLost) and the caller must roll tx back: another
// member has d. The fence locks the lease's row until tx ends: keep tx
// short.
//
// Then settle d as usual: a subscriber's handler returns nil (an error
// after the commit would deliver d again), a GroupReceiver's caller calls
// Ack, which finds the cursor already there. A batch handler may AckTx
// each delivery; acks are cumulative, as the cursor's. See
// docs/consumers.md, "Exactly once in your transaction".
func (d *Delivery) AckTx(ctx context.Context, tx *sql.Tx) error {
	if d.rec != nil && tx != nil {
		d.rec.AckTx()
		return nil
	}
	if d.inTx == nil {
		return fmt.Errorf("shardq: ack offset %d of tenant %q topic %q partition %q: %w", d.Offset, d.Tenant, d.Topic, d.PartitionKey, ErrNoTxSettle)
	}
	if tx == nil {
		return &ident.Error{Field: "tx", Rule: "must not be nil"}
	}
	if err := d.inTx.Run(ctx, tx, d.upTo); err != nil {
		if errors.Is(err, settle.ErrClosed) {
			err = fmt.Errorf("%w: %w", ErrNoTxSettle, err)
		}
		return fmt.Errorf("shardq: ack offset %d of tenant %q topic %q partition %q in a transaction: %w", d.Offset, d.Tenant, d.Topic, d.PartitionKey, err)
	}
	return nil
}

// ErrNoDefer is returned by Delivery.Defer for a delivery that cannot be
// deferred: a large message, one received as deferred already, or one
// not handed out by a handler or a GroupReceiver (with ErrNoTxSettle).
// A subscriber's delivery kept past its handler fails with ErrNoTxSettle
// alone, as AckTx does.
var ErrNoDefer = errors.New("shardq: this delivery cannot be deferred")

// Defer sets d aside for its consumer group, as Service Bus defers a
// message: the group's cursor passes d (for an ungrouped message, its
// claim is settled) and d is recorded as deferred, in one transaction
// fenced by the lease or claim that delivered it. The partition goes on
// with the messages after d; d is delivered again only when it is asked
// for by its offset (Client.ReceiveDeferred), by any member of the group,
// and is listed meanwhile by Admin.Deferred and counted in the lag
// report. Retention keeps it while it is deferred, up to MaxRetention.
//
// Then settle d as after AckTx: a subscriber's handler returns nil (or
// the error of a failed Defer, so that d is retried), a GroupReceiver's
// caller calls Ack (GroupReceiver.Defer does both). In a batch, Defer
// passes the cursor over the deliveries before d too, as AckTx does:
// defer each that should be. See docs/consumers.md, "Deferral".
func (d *Delivery) Defer(ctx context.Context) error {
	op := fmt.Sprintf("shardq: defer offset %d of tenant %q topic %q partition %q", d.Offset, d.Tenant, d.Topic, d.PartitionKey)
	switch {
	case d.rec != nil:
		d.rec.Defer()
		return nil
	case d.inTx == nil:
		return fmt.Errorf("%s: %w: %w", op, ErrNoDefer, ErrNoTxSettle)
	case d.IsLarge():
		return fmt.Errorf("%s: %w: a large message is not deferred (settle it whole)", op, ErrNoDefer)
	}
	m := driver.Message{Tenant: d.Tenant, Topic: d.Topic, PartitionKey: d.PartitionKey, ID: d.ID, Offset: d.Offset}
	if err := d.inTx.Defer(ctx, m, d.upTo); err != nil {
		switch {
		case errors.Is(err, settle.ErrNoDefer):
			err = ErrNoDefer
		case errors.Is(err, settle.ErrClosed):
			err = fmt.Errorf("%w: %w", ErrNoTxSettle, err)
		}
		return fmt.Errorf("%s: %w", op, err)
	}
	return nil
}

// Body is the payload as a stream. For a large message it reads one chunk
// at a time from the database, once, and fails at the end with
// ErrLargeCorrupt if the size or SHA-256 differs from what the writer
// stored: a handler that returns that error fails the delivery, which is
// retried and dead-lettered like any failure. For an ordinary message it
// reads Payload.
func (d *Delivery) Body() io.Reader {
	if d.body != nil {
		return d.body
	}
	return bytes.NewReader(d.Payload)
}

// IsLarge reports whether d is a large message (PublishLarge): its
// payload is in Body, not Payload.
func (d *Delivery) IsLarge() bool { return d.body != nil }

// Handler processes one message. Returning nil acks it; an error retries
// it after a backoff (the partition waits); RetryAfter chooses the delay;
// DeadLetter moves it to the dead-letter topic at once. The context ends
// when the subscriber loses the partition's lease or is stopped hard.
type Handler func(ctx context.Context, d *Delivery) error

// BatchHandler processes consecutive messages of one partition together
// and settles them together: nil acks all; an error retries the batch, and
// after the last attempt the whole batch is dead-lettered.
type BatchHandler func(ctx context.Context, ds []*Delivery) error

// RetryAfter is a handler result: retry the message after d.
func RetryAfter(d time.Duration, err error) error { return &settle.RetryAfterError{After: d, Err: err} }

// DeadLetter is a handler result: move the message to the dead-letter
// topic now, without further attempts.
func DeadLetter(err error) error { return &settle.DeadLetterError{Err: err} }

// ErrSettled is returned by Delivery.Defer when the message was settled
// otherwise meanwhile (the cursor passed it: a later delivery's AckTx, a
// receiver's handler timeout): it is not deferred.
var ErrSettled = driver.ErrSettled

// ErrInstanceFenced is what Stop returns for a static member
// (SubscriberConfig.InstanceID) that stopped by itself because a later
// process with its InstanceID took it over.
var ErrInstanceFenced = consumer.ErrInstanceFenced

// ErrLeaseLost is returned (and logged) when a subscriber's partition lease
// was taken over; the write that found it changed nothing.
var ErrLeaseLost = driver.ErrLeaseLost

// Headers a dead-lettered message carries besides its own.
const (
	HeaderDLQOriginalTopic  = settle.HeaderOriginalTopic
	HeaderDLQOriginalOffset = settle.HeaderOriginalOffset
	HeaderDLQAttempts       = settle.HeaderAttempts
	HeaderDLQLastError      = settle.HeaderLastError
)

// SubscriberConfig configures a member of a consumer group. Zero durations
// and counts take the defaults in brackets.
type SubscriberConfig struct {
	ConsumerGroup string // required
	Topic         string // required
	// Tenants is the explicit list of tenants to serve. When empty, the
	// comma-separated SHARDQ_TENANTS environment variable is read once at
	// Subscribe; an empty list is an error.
	Tenants []string
	// Name names this member for people (default host-pid; at most 246
	// bytes). Its identity in the group, the owner its leases and
	// heartbeat rows show, is Name + "#" + 8 random hex digits, new for
	// every Subscribe: two running instances given one name are two
	// members, never one (see ID).
	Name string
	// InstanceID, when set, makes this a static member, as Kafka's
	// group.instance.id: Stop keeps its place in the group (its
	// heartbeat rows stay, its leases end in its name), and a process
	// that starts with the InstanceID of one that stopped or died within
	// the other members' StaleAfter (set it to cover a restart on every
	// member) takes over its leases and its place, so no other member's
	// partition moves. Its identity is InstanceID + "@" + 8
	// random hex digits, and every write of the earlier process is
	// fenced (its leases get new tokens). Run one process per
	// InstanceID: the later one stops an earlier one that still runs
	// (its Stop reports ErrInstanceFenced; Done closes). To leave the
	// group for good, stop it and let StaleAfter pass. ASCII, at most
	// 246 bytes. See docs/consumers.md, "Static membership".
	InstanceID string

	Handler      Handler      // one of Handler and BatchHandler
	BatchHandler BatchHandler //
	BatchSize    int          // messages fetched (and handed to a BatchHandler) at once [100]

	LeaseTTL          time.Duration // a lease lasts this long unless renewed [30s]
	HeartbeatInterval time.Duration // [3s]
	// StaleAfter is how old a heartbeat may be before its subscriber is
	// dead and its leases are swept [3 × HeartbeatInterval].
	StaleAfter        time.Duration
	DiscoveryInterval time.Duration // how often partitions are rebalanced [1s]
	// JoinWindow is how long a new member waits for peers starting with it
	// before its first rebalance, and how soon it replans after a peer beat
	// it to a partition: members that start together split the partitions
	// at once instead of a discovery interval or two later (like Kafka's
	// group.initial.rebalance.delay.ms) [DiscoveryInterval / 10].
	JoinWindow time.Duration
	// DiscoveryWindow is how far before the previous tick each discovery
	// tick looks for heads that moved (by the publishers' clocks): longer
	// than any publish transaction, plus the clock skew between hosts, so
	// that a publish that commits late is still seen [1m]
	// (docs/consumers.md, "Discovery").
	DiscoveryWindow time.Duration
	// FullDiscoveryInterval is how often a sweep of every head row of
	// the topic starts, a bounded page a tick: the net under a transaction
	// that committed later than DiscoveryWindow [5m].
	FullDiscoveryInterval time.Duration
	// PollInterval is how often the heads of this member's idle partitions
	// are checked for new messages, in one query for all of them, and the
	// tenants with ungrouped messages in another [200ms]. Without a change
	// feed, a poll that finds work brings the next ones forward to a
	// twentieth of it (10 ms; at least 5 ms), and the interval doubles
	// back to PollInterval as polls find none (docs/feed.md). (A
	// Publish through the same Client, and the change feed, wake them at
	// once.)
	PollInterval time.Duration
	// FeedPollInterval replaces PollInterval while the client's change
	// feed streams: the feed wakes partitions within milliseconds, and
	// this poll is only the net under a missed event [2s] (docs/feed.md).
	FeedPollInterval time.Duration
	IdleRelease      time.Duration // a lease without work this long is released [30s]
	// CommitInterval bounds how long settled messages stay uncommitted
	// (a crash redelivers at most that much): every interval the member
	// commits the cursors of all its partitions in one transaction [1s].
	CommitInterval time.Duration
	// MaxPartitions bounds the partitions this member takes new messages
	// from at once [64]; a partition it hands back finishes the message
	// in hand beside them. Its tenants share them fairly (docs/consumers.md).
	MaxPartitions int

	// StartPosition is where the group starts reading a partition it has
	// no cursor for [StartEarliest] (docs/consumers.md, "Start position").
	StartPosition StartPosition

	// Take chooses what this member consumes: grouped messages through
	// fair-share partition leases, ungrouped ones (empty partition key)
	// through per-message claims shared with the group's other members, or
	// both [TakeAll].
	Take Take
	// UngroupedConcurrency bounds the ungrouped messages handled at once
	// [16].
	UngroupedConcurrency int
	// VisibilityTimeout is how long a claimed ungrouped message stays
	// invisible to the group's other members; not settled by then, it is
	// delivered again (and this member's settlement fails) [30s].
	VisibilityTimeout time.Duration
	// MaxVisibilityRenewal bounds how long a handler may hold an
	// ungrouped message: while it runs, its claim is renewed every
	// VisibilityTimeout/4, up to this long after the claim; then the claim
	// lapses and the message is delivered again. Set it to
	// VisibilityTimeout to never renew [5m].
	MaxVisibilityRenewal time.Duration

	// HandlerTimeout bounds one handler call: then its context is
	// cancelled (context.Cause is ErrHandlerTimeout) and the attempt
	// counts as failed, retried after a backoff or dead-lettered like any
	// failure. The partition waits for the handler to return: a handler
	// that ignores its context holds it until it does [5m, as
	// MaxVisibilityRenewal]; NoHandlerTimeout: no limit.
	HandlerTimeout time.Duration

	MaxAttempts int           // after this many failed attempts a message is dead-lettered [10]; UnlimitedAttempts never
	BackoffMin  time.Duration // first retry delay, doubling per attempt, with jitter [1s]
	BackoffMax  time.Duration // [5m]
	DLQSuffix   string        // dead-letter topic = Topic + DLQSuffix [".dlq"]
	// DeadLetterExpired dead-letters a message found expired
	// (Message.TTL) instead of passing over it, as Service Bus's
	// dead-lettering on expiration [false].
	DeadLetterExpired bool

	// Clock is the time used for leases, heartbeats and retry times
	// [the client's Clock].
	Clock  func() time.Time
	Logger *slog.Logger // [the client's Logger]
}

// StartPosition is where a consumer group starts in a partition it has no
// cursor for, as Kafka's auto.offset.reset. It is decided once per
// (tenant, topic, group), by the first member or receiver that registers
// the group there (a registry row that outlives the group's cursors);
// later members follow it whatever they are given, as a committed offset
// wins in Kafka.
type StartPosition int

const (
	// StartEarliest reads every message still stored.
	StartEarliest StartPosition = iota
	// StartLatest reads only messages published after the group was made
	// in the topic; one that already has a cursor there counts as made.
	StartLatest
)

// ParseStartPosition reads "earliest" or "latest".
func ParseStartPosition(s string) (StartPosition, error) {
	switch s {
	case "earliest":
		return StartEarliest, nil
	case "latest":
		return StartLatest, nil
	}
	return 0, &ident.Error{Field: "start position", Rule: fmt.Sprintf("must be earliest or latest, not %q", s)}
}

func (p StartPosition) String() string {
	switch p {
	case StartEarliest:
		return "earliest"
	case StartLatest:
		return "latest"
	}
	return fmt.Sprintf("StartPosition(%d)", int(p))
}

func (p StartPosition) check() error {
	if p != StartEarliest && p != StartLatest {
		return &ident.Error{Field: "start position", Rule: fmt.Sprintf("must be StartEarliest or StartLatest, not %d", int(p))}
	}
	return nil
}

func (c *Client) subscriberDefaults(cfg SubscriberConfig) (SubscriberConfig, error) {
	settings.Positive(&cfg.LeaseTTL, DefaultLeaseTTL)
	settings.Positive(&cfg.HeartbeatInterval, DefaultHeartbeatInterval)
	settings.Positive(&cfg.StaleAfter, 3*cfg.HeartbeatInterval)
	settings.Positive(&cfg.DiscoveryInterval, DefaultDiscoveryInterval)
	settings.Positive(&cfg.JoinWindow, cfg.DiscoveryInterval/10)
	settings.Positive(&cfg.DiscoveryWindow, DefaultDiscoveryWindow)
	settings.Positive(&cfg.FullDiscoveryInterval, DefaultFullDiscoveryInterval)
	settings.Positive(&cfg.PollInterval, DefaultPollInterval)
	settings.Positive(&cfg.FeedPollInterval, DefaultFeedPollInterval)
	settings.Positive(&cfg.IdleRelease, DefaultIdleRelease)
	settings.Positive(&cfg.CommitInterval, DefaultCommitInterval)
	settings.Positive(&cfg.BackoffMin, DefaultBackoffMin)
	settings.Positive(&cfg.BackoffMax, DefaultBackoffMax)
	settings.Positive(&cfg.BatchSize, DefaultBatchSize)
	settings.Positive(&cfg.MaxPartitions, DefaultMaxPartitions)
	settings.Positive(&cfg.UngroupedConcurrency, DefaultUngroupedConcurrency)
	settings.Positive(&cfg.VisibilityTimeout, DefaultVisibilityTimeout)
	settings.Positive(&cfg.MaxVisibilityRenewal, DefaultMaxVisibilityRenewal)
	// cmp.Or is the first error; its arguments are evaluated in order, and
	// none reads what an earlier one fills.
	if err := cmp.Or(settings.HandlerTimeout(&cfg.HandlerTimeout, DefaultHandlerTimeout, NoHandlerTimeout),
		cfg.StartPosition.check(), cfg.Take.check(), checkLiveness(cfg.LeaseTTL, cfg.HeartbeatInterval, cfg.StaleAfter),
		c.settleDefaults(&cfg.MaxAttempts, &cfg.DLQSuffix, &cfg.Clock, &cfg.Logger, &cfg.Name, "subscriber")); err != nil {
		return cfg, err
	}
	if err := cmp.Or(ident.ConsumerGroup(cfg.ConsumerGroup), ident.Topic(cfg.Topic), ident.SubscriberName(cfg.Name),
		dlqTopic(cfg.Topic, cfg.DLQSuffix)); err != nil {
		return cfg, err
	}
	if cfg.InstanceID != "" {
		if err := ident.MemberName("instance id", cfg.InstanceID); err != nil {
			return cfg, err
		}
		if cfg.Take == TakeUngrouped {
			return cfg, &ident.Error{Field: "instance id", Rule: "a member that takes only ungrouped messages holds no lease to keep"}
		}
	}
	if (cfg.Handler == nil) == (cfg.BatchHandler == nil) {
		return cfg, &ident.Error{Field: "handler", Rule: "set exactly one of Handler and BatchHandler"}
	}
	var err error
	if cfg.Tenants, err = consumerTenants("tenants", cfg.Tenants); err != nil {
		return cfg, err
	}
	if cfg.Take != TakeUngrouped {
		c.warnFrozenHold(cfg.Logger, cfg.LeaseTTL, cfg.HeartbeatInterval)
	}
	return cfg, nil
}

// Take chooses which messages a subscriber consumes.
type Take int

const (
	// TakeAll: grouped and ungrouped messages.
	TakeAll Take = iota
	// TakeGrouped: only messages with a partition key, in order, through
	// fair-share partition leases.
	TakeGrouped
	// TakeUngrouped: only messages with an empty partition key, in
	// parallel, through per-message claims. Such a member does not
	// heartbeat and takes no part in the fair share.
	TakeUngrouped
)

func (t Take) check() error {
	if t < TakeAll || t > TakeUngrouped {
		return &ident.Error{Field: "take", Rule: fmt.Sprintf("%d is not TakeAll, TakeGrouped or TakeUngrouped", t)}
	}
	return nil
}

// Subscriber is a running member of a consumer group: the handle of its
// runtime (internal/consumer).
type Subscriber struct {
	cfg SubscriberConfig
	id  string                 // this instance's identity: ident.MemberID(cfg.Name)
	rt  *consumer.Subscription // the runtime; it untracks s from the client once stopped
}

// Subscribe starts a member of cfg.ConsumerGroup. It validates cfg,
// heartbeats once (so a database that is unreachable or not migrated fails
// here), and then runs until Stop.
func (c *Client) Subscribe(ctx context.Context, cfg SubscriberConfig) (*Subscriber, error) {
	cfg, err := c.subscriberDefaults(cfg)
	if err != nil {
		return nil, fmt.Errorf("shardq: subscribe: %w", err)
	}
	if err := c.registerGroup(ctx, cfg.Tenants, cfg.Topic, cfg.ConsumerGroup, cfg.StartPosition, cfg.Clock()); err != nil {
		return nil, fmt.Errorf("shardq: subscribe: %w", err)
	}
	s := &Subscriber{cfg: cfg, id: ident.MemberID(cfg.Name)}
	if cfg.InstanceID != "" {
		s.id = ident.InstanceMemberID(cfg.InstanceID)
	}
	s.rt, err = consumer.Subscribe(ctx, c.drv, consumer.Config{
		ConsumerGroup: cfg.ConsumerGroup, Topic: cfg.Topic, Tenants: cfg.Tenants, ID: s.id, Instance: cfg.InstanceID,
		Handle: consumer.Process(c.tel, cfg.Topic, cfg.ConsumerGroup, cfg.HandlerTimeout, s.deliver),
		Batch:  cfg.BatchHandler != nil, BatchSize: cfg.BatchSize,
		LeaseTTL: cfg.LeaseTTL, HeartbeatInterval: cfg.HeartbeatInterval, StaleAfter: cfg.StaleAfter,
		DiscoveryInterval: cfg.DiscoveryInterval, JoinWindow: cfg.JoinWindow, PollInterval: cfg.PollInterval,
		FeedUp: c.local.Up, FeedNames: c.local.Names, FeedPollInterval: cfg.FeedPollInterval,
		DiscoveryWindow: cfg.DiscoveryWindow, FullDiscoveryInterval: cfg.FullDiscoveryInterval,
		IdleRelease: cfg.IdleRelease, CommitInterval: cfg.CommitInterval, MaxPartitions: cfg.MaxPartitions,
		LargeWriteTimeout: c.cfg.LargeWriteTimeout, LargeStalls: &c.stalls,
		Take: consumer.Take(cfg.Take), UngroupedConcurrency: cfg.UngroupedConcurrency, VisibilityTimeout: cfg.VisibilityTimeout,
		MaxVisibilityRenewal: cfg.MaxVisibilityRenewal,
		Policy:               settle.Policy{MaxAttempts: cfg.MaxAttempts, BackoffMin: cfg.BackoffMin, BackoffMax: cfg.BackoffMax, DeadLetterExpired: cfg.DeadLetterExpired},
		DLQSuffix:            cfg.DLQSuffix, Clock: cfg.Clock, Logger: cfg.Logger,
		Metrics: c.tel.Group(cfg.Topic, cfg.ConsumerGroup),
	}, c.tel, &c.local, func() { c.untrack(s) })
	if err != nil {
		return nil, fmt.Errorf("shardq: subscribe: %w", err)
	}
	if err := c.track(s); err != nil {
		s.Stop(ctx)
		return nil, fmt.Errorf("shardq: subscribe: %w", err)
	}
	// The subscriber lives as long as ctx, as in watermill and River:
	// ending ctx stops it as Stop does, with DefaultCloseTimeout for the
	// handlers in flight.
	s.rt.Watch(ctx, DefaultCloseTimeout)
	return s, nil
}

// deliver hands msgs to the handler (all of them to the batch handler);
// the runtime (consumer.Process) adds the span, the timeout and the panic
// recovery.
func (s *Subscriber) deliver(ctx context.Context, msgs []driver.Message, whole *large.Whole, attempt int) error {
	var ds []*Delivery
	inTx := settle.InTxFrom(ctx)
	if whole != nil {
		d := wholeDelivery(whole, attempt) // alone, as a batch too
		d.inTx, d.upTo = inTx, whole.UpTo
		ds = []*Delivery{d}
	} else {
		ds = make([]*Delivery, len(msgs))
		for i, m := range msgs {
			ds[i] = newDelivery(m, attempt)
			ds[i].inTx, ds[i].upTo = inTx, m.Offset
		}
	}
	if s.cfg.BatchHandler != nil {
		return s.cfg.BatchHandler(ctx, ds)
	}
	return s.cfg.Handler(ctx, ds[0])
}

func newDelivery(m driver.Message, attempt int) *Delivery {
	d := &Delivery{Tenant: m.Tenant, Topic: m.Topic, PartitionKey: m.PartitionKey, ID: m.ID, Offset: m.Offset,
		Headers: m.Headers, Payload: m.Payload, CreatedAt: m.CreatedAt, NotBefore: m.NotBefore, Attempt: attempt,
		Size: int64(len(m.Payload))}
	d.ExpiresAt, _ = expiry.At(&m)
	return d
}

// wholeDelivery is the delivery of a large message whole.
func wholeDelivery(w *large.Whole, attempt int) *Delivery {
	d := newDelivery(w.Message, attempt)
	d.Size, d.Chunks, d.body, d.SHA256 = w.Size, w.Chunks, w.Body, w.End.Headers[large.HeaderSHA256]
	return d
}

func (s *Subscriber) stopOrder() int                         { return 0 }
func (s *Subscriber) stopForClose(ctx context.Context) error { return s.Stop(ctx) }

// Name is the subscriber's name, as configured.
func (s *Subscriber) Name() string { return s.cfg.Name }

// ID is this running instance's identity in its group (Name#suffix, or
// InstanceID@suffix for a static member): the
// owner its leases and heartbeat rows show.
func (s *Subscriber) ID() string { return s.id }

// Stop stops fetching, lets in-flight handlers finish until ctx ends (then
// cancels them; their leases stay renewed meanwhile), commits what was
// acked, releases the leases and deletes the heartbeat. A static member
// (InstanceID) keeps its place instead: its heartbeat rows stay and its
// leases end in its name, for its next process. No goroutine of the
// subscriber outlives it.
func (s *Subscriber) Stop(ctx context.Context) error {
	if err := s.rt.Stop(ctx); err != nil {
		return fmt.Errorf("shardq: %w", err)
	}
	return nil
}

// Done is closed once the subscriber has stopped: by Stop, by the end of
// the context given to Subscribe, or by Client.Close.
func (s *Subscriber) Done() <-chan struct{} { return s.rt.Done() }
