// SPDX-License-Identifier: Apache-2.0

package shardq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/consumer"
	"github.com/shardq/shardq/internal/ident"
	"github.com/shardq/shardq/internal/settle"
	"github.com/shardq/shardq/internal/telemetry"
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
	// Attempt is 1 on the message's first delivery to the consumer group,
	// 2 on its first retry, and so on (across subscribers).
	Attempt int
}

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
	// comma-separated MQ_TENANTS environment variable is read once at
	// Subscribe; an empty list is an error.
	Tenants []string
	// Name names this member for people (default host-pid; at most 246
	// bytes). Its identity in the group, the owner its leases and
	// heartbeat rows show, is Name + "#" + 8 random hex digits, new for
	// every Subscribe: two running instances given one name are two
	// members, never one (see ID).
	Name string

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
	// tenants with ungrouped messages in another [200ms]. (A Publish
	// through the same Client, and the change feed, wake them at once.)
	PollInterval time.Duration
	// FeedPollInterval replaces PollInterval while the client's change
	// feed streams: the feed wakes partitions within milliseconds, and
	// this poll is only the net under a missed event [2s] (docs/feed.md).
	FeedPollInterval time.Duration
	IdleRelease      time.Duration // a lease without work this long is released [30s]
	// CommitInterval bounds how long settled messages stay uncommitted
	// while a batch is being delivered (a crash redelivers at most that
	// much); the cursor is also committed after every batch [1s].
	CommitInterval time.Duration
	// MaxPartitions bounds the partitions this member delivers at once [64].
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
	d := func(v *time.Duration, def time.Duration) {
		if *v <= 0 {
			*v = def
		}
	}
	n := func(v *int, def int) {
		if *v <= 0 {
			*v = def
		}
	}
	d(&cfg.LeaseTTL, DefaultLeaseTTL)
	d(&cfg.HeartbeatInterval, DefaultHeartbeatInterval)
	d(&cfg.StaleAfter, 3*cfg.HeartbeatInterval)
	d(&cfg.DiscoveryInterval, DefaultDiscoveryInterval)
	d(&cfg.JoinWindow, cfg.DiscoveryInterval/10)
	d(&cfg.DiscoveryWindow, DefaultDiscoveryWindow)
	d(&cfg.FullDiscoveryInterval, DefaultFullDiscoveryInterval)
	d(&cfg.PollInterval, DefaultPollInterval)
	d(&cfg.FeedPollInterval, DefaultFeedPollInterval)
	d(&cfg.IdleRelease, DefaultIdleRelease)
	d(&cfg.CommitInterval, DefaultCommitInterval)
	d(&cfg.BackoffMin, DefaultBackoffMin)
	d(&cfg.BackoffMax, DefaultBackoffMax)
	n(&cfg.BatchSize, DefaultBatchSize)
	n(&cfg.MaxPartitions, DefaultMaxPartitions)
	n(&cfg.UngroupedConcurrency, DefaultUngroupedConcurrency)
	d(&cfg.VisibilityTimeout, DefaultVisibilityTimeout)
	d(&cfg.MaxVisibilityRenewal, DefaultMaxVisibilityRenewal)
	if cfg.HandlerTimeout == 0 {
		cfg.HandlerTimeout = DefaultHandlerTimeout
	} else if cfg.HandlerTimeout < 0 && cfg.HandlerTimeout != NoHandlerTimeout {
		return cfg, &ident.Error{Field: "handler timeout", Rule: fmt.Sprintf("%s is negative; NoHandlerTimeout (-1ns) means no limit", cfg.HandlerTimeout)}
	}
	if err := cfg.StartPosition.check(); err != nil {
		return cfg, err
	}
	if cfg.Take < TakeAll || cfg.Take > TakeUngrouped {
		return cfg, &ident.Error{Field: "take", Rule: fmt.Sprintf("%d is not TakeAll, TakeGrouped or TakeUngrouped", cfg.Take)}
	}
	if err := checkLiveness(cfg.LeaseTTL, cfg.HeartbeatInterval, cfg.StaleAfter); err != nil {
		return cfg, err
	}
	if err := c.settleDefaults(&cfg.MaxAttempts, &cfg.DLQSuffix, &cfg.Clock, &cfg.Logger, &cfg.Name, "subscriber"); err != nil {
		return cfg, err
	}
	if err := ident.ConsumerGroup(cfg.ConsumerGroup); err != nil {
		return cfg, err
	}
	if err := ident.Topic(cfg.Topic); err != nil {
		return cfg, err
	}
	if err := ident.SubscriberName(cfg.Name); err != nil {
		return cfg, err
	}
	if err := dlqTopic(cfg.Topic, cfg.DLQSuffix); err != nil {
		return cfg, err
	}
	if (cfg.Handler == nil) == (cfg.BatchHandler == nil) {
		return cfg, &ident.Error{Field: "handler", Rule: "set exactly one of Handler and BatchHandler"}
	}
	ts, err := consumerTenants("tenants", cfg.Tenants)
	if err != nil {
		return cfg, err
	}
	cfg.Tenants = ts
	return cfg, nil
}

// settleDefaults fills the settings that subscribers and receivers share:
// attempts before dead-lettering, the dead-letter suffix, clock, logger
// and name.
func (c *Client) settleDefaults(attempts *int, dlqSuffix *string, clock *func() time.Time, logger **slog.Logger, name *string, kind string) error {
	n, err := maxAttempts(*attempts)
	if err != nil {
		return err
	}
	*attempts = n
	if *dlqSuffix == "" {
		*dlqSuffix = DefaultDLQSuffix
	}
	if *clock == nil {
		*clock = c.cfg.Clock
	}
	if *logger == nil {
		*logger = c.cfg.Logger
	}
	if *name == "" {
		*name = defaultName(kind)
	}
	return nil
}

// dlqTopic checks that topic's dead-letter topic is a valid topic name.
func dlqTopic(topic, suffix string) error {
	if err := ident.Topic(topic + suffix); err != nil {
		var ie *ident.Error
		if errors.As(err, &ie) {
			return &ident.Error{Field: "dead-letter topic", Rule: fmt.Sprintf("%q + %q: %s", topic, suffix, ie.Rule)}
		}
		return err
	}
	return nil
}

// defaultName names a member for people: host-pid, or kind-pid where the
// host name is not a valid member name. Its identity (lease owner,
// heartbeat row) adds a random suffix: ident.MemberID.
func defaultName(kind string) string {
	host, _ := os.Hostname()
	name := fmt.Sprintf("%s-%d", host, os.Getpid())
	if ident.MemberName("name", name) != nil {
		name = fmt.Sprintf("%s-%d", kind, os.Getpid())
	}
	return name
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

// Subscriber is a running member of a consumer group: the handle of its
// runtime (internal/consumer).
type Subscriber struct {
	client   *Client // owns it: Client.Close stops it
	cfg      SubscriberConfig
	id       string // this instance's identity: ident.MemberID(cfg.Name)
	member   *consumer.Member
	lag      *telemetry.LagSource // nil when taking ungrouped messages only
	unwatch  func() bool          // stops watching Subscribe's context
	done     chan struct{}        // closed once stopped
	stopOnce sync.Once
	stopErr  error
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
	s := &Subscriber{client: c, cfg: cfg, id: ident.MemberID(cfg.Name), done: make(chan struct{})}
	s.member, err = consumer.Start(ctx, c.drv, consumer.Config{
		ConsumerGroup: cfg.ConsumerGroup, Topic: cfg.Topic, Tenants: cfg.Tenants, ID: s.id,
		Handle: s.handle, Batch: cfg.BatchHandler != nil, BatchSize: cfg.BatchSize,
		LeaseTTL: cfg.LeaseTTL, HeartbeatInterval: cfg.HeartbeatInterval, StaleAfter: cfg.StaleAfter,
		DiscoveryInterval: cfg.DiscoveryInterval, JoinWindow: cfg.JoinWindow, PollInterval: cfg.PollInterval,
		FeedUp: c.local.Up, FeedNames: c.local.Names, FeedPollInterval: cfg.FeedPollInterval,
		DiscoveryWindow: cfg.DiscoveryWindow, FullDiscoveryInterval: cfg.FullDiscoveryInterval,
		IdleRelease: cfg.IdleRelease, CommitInterval: cfg.CommitInterval, MaxPartitions: cfg.MaxPartitions,
		Take: consumer.Take(cfg.Take), UngroupedConcurrency: cfg.UngroupedConcurrency, VisibilityTimeout: cfg.VisibilityTimeout,
		MaxVisibilityRenewal: cfg.MaxVisibilityRenewal,
		Policy:               settle.Policy{MaxAttempts: cfg.MaxAttempts, BackoffMin: cfg.BackoffMin, BackoffMax: cfg.BackoffMax},
		DLQSuffix:            cfg.DLQSuffix, Clock: cfg.Clock, Logger: cfg.Logger,
		Metrics: c.tel.Group(cfg.Topic, cfg.ConsumerGroup),
	})
	if err != nil {
		return nil, fmt.Errorf("shardq: subscribe: %w", err)
	}
	if cfg.Take != TakeUngrouped { // a member without leases runs no ticks to learn the lag from
		s.lag = &telemetry.LagSource{Topic: cfg.Topic, Group: cfg.ConsumerGroup, Read: s.member.Lag}
		c.tel.AddLag(s.lag)
	}
	c.local.Add(cfg.Topic, cfg.Tenants, s, s.member)
	if err := c.track(s); err != nil {
		s.Stop(ctx)
		return nil, fmt.Errorf("shardq: subscribe: %w", err)
	}
	// The subscriber lives as long as ctx, as in watermill and River:
	// ending ctx stops it as Stop does, with DefaultCloseTimeout for the
	// handlers in flight.
	s.unwatch = context.AfterFunc(ctx, func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), DefaultCloseTimeout)
		defer cancel()
		if err := s.stop(stopCtx); err != nil {
			s.cfg.Logger.Warn("shardq: stopping the subscriber when its context ended failed", "group", cfg.ConsumerGroup,
				"topic", cfg.Topic, "member", s.id, "err", err)
		}
	})
	return s, nil
}

// handle runs the handler (the batch handler with all of msgs, or the
// handler with the one message) in a process span, turning a panic into
// an error.
func (s *Subscriber) handle(ctx context.Context, msgs []driver.Message, attempt int) (err error) {
	start := time.Now()
	tenant := msgs[0].Tenant
	ctx, span := s.client.tel.StartProcess(ctx, tenant, s.cfg.Topic, s.cfg.ConsumerGroup, msgs, attempt)
	if s.cfg.HandlerTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, s.cfg.HandlerTimeout, ErrHandlerTimeout)
		defer cancel()
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("handler panicked: %v", r)
		}
		if context.Cause(ctx) == ErrHandlerTimeout {
			err = fmt.Errorf("%w after %s (it returned %v)", ErrHandlerTimeout, s.cfg.HandlerTimeout, err)
		}
		s.client.tel.EndProcess(ctx, span, tenant, s.cfg.Topic, s.cfg.ConsumerGroup, len(msgs), start, err)
	}()
	if s.cfg.BatchHandler != nil {
		ds := make([]*Delivery, len(msgs))
		for i, m := range msgs {
			ds[i] = newDelivery(m, attempt)
		}
		return s.cfg.BatchHandler(ctx, ds)
	}
	return s.cfg.Handler(ctx, newDelivery(msgs[0], attempt))
}

func newDelivery(m driver.Message, attempt int) *Delivery {
	return &Delivery{Tenant: m.Tenant, Topic: m.Topic, PartitionKey: m.PartitionKey, ID: m.ID, Offset: m.Offset,
		Headers: m.Headers, Payload: m.Payload, CreatedAt: m.CreatedAt, NotBefore: m.NotBefore, Attempt: attempt}
}

func (s *Subscriber) stopOrder() int                         { return 0 }
func (s *Subscriber) stopForClose(ctx context.Context) error { return s.Stop(ctx) }

// Name is the subscriber's name, as configured.
func (s *Subscriber) Name() string { return s.cfg.Name }

// ID is this running instance's identity in its group (Name#suffix): the
// owner its leases and heartbeat rows show.
func (s *Subscriber) ID() string { return s.id }

// Stop stops fetching, lets in-flight handlers finish until ctx ends (then
// cancels them), commits what was acked, releases the leases and deletes
// the heartbeat. No goroutine of the subscriber outlives it.
func (s *Subscriber) Stop(ctx context.Context) error {
	if s.unwatch != nil {
		s.unwatch()
	}
	return s.stop(ctx)
}

// Done is closed once the subscriber has stopped: by Stop, by the end of
// the context given to Subscribe, or by Client.Close.
func (s *Subscriber) Done() <-chan struct{} { return s.done }

func (s *Subscriber) stop(ctx context.Context) error {
	s.stopOnce.Do(func() {
		defer close(s.done)
		defer s.client.untrack(s)
		s.client.local.Remove(s.cfg.Topic, s)
		if s.lag != nil {
			s.client.tel.RemoveLag(s.lag)
		}
		if err := s.member.Stop(ctx); err != nil {
			s.stopErr = fmt.Errorf("shardq: %w", err)
		}
	})
	return s.stopErr
}
