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
	"github.com/shardq/shardq/internal/coalesce"
	"github.com/shardq/shardq/internal/ident"
	"github.com/shardq/shardq/internal/lifecycle"
	"github.com/shardq/shardq/internal/settle"
	"github.com/shardq/shardq/internal/wakeup"
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
	// PollInterval is how often the heads of this member's idle partitions
	// are checked for new messages, in one query per tenant [200ms]. (A
	// Publish through the same Client wakes them at once.)
	PollInterval time.Duration
	IdleRelease  time.Duration // a lease without work this long is released [30s]
	// CommitInterval bounds how long settled messages stay uncommitted
	// while a batch is being delivered (a crash redelivers at most that
	// much); the cursor is also committed after every batch [1s].
	CommitInterval time.Duration
	// MaxPartitions bounds the partitions this member delivers at once [64].
	MaxPartitions int

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

	MaxAttempts int           // after this many failed attempts a message is dead-lettered [10]; UnlimitedAttempts never
	BackoffMin  time.Duration // first retry delay, doubling per attempt, with jitter [1s]
	BackoffMax  time.Duration // [5m]
	DLQSuffix   string        // dead-letter topic = Topic + DLQSuffix [".dlq"]

	// Clock is the time used for leases, heartbeats and retry times
	// [the client's Clock].
	Clock  func() time.Time
	Logger *slog.Logger // [the client's Logger]
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
	d(&cfg.PollInterval, DefaultPollInterval)
	d(&cfg.IdleRelease, DefaultIdleRelease)
	d(&cfg.CommitInterval, DefaultCommitInterval)
	d(&cfg.BackoffMin, DefaultBackoffMin)
	d(&cfg.BackoffMax, DefaultBackoffMax)
	n(&cfg.BatchSize, DefaultBatchSize)
	n(&cfg.MaxPartitions, DefaultMaxPartitions)
	n(&cfg.UngroupedConcurrency, DefaultUngroupedConcurrency)
	d(&cfg.VisibilityTimeout, DefaultVisibilityTimeout)
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

// Subscriber is a running member of a consumer group.
type Subscriber struct {
	drv    driver.Driver
	client *Client          // owns it: Client.Close stops it
	local  *wakeup.Registry // the client's, for wake-ups on publish
	cfg    SubscriberConfig
	id     string // this instance's identity: ident.MemberID(cfg.Name)
	log    *slog.Logger

	// life runs the loops and workers: its Context ends at Stop (no more
	// fetching or rebalancing), its HardContext at a hard stop (handlers
	// are cancelled).
	life    *lifecycle.Group
	mu      sync.Mutex
	workers map[driver.PartitionRef]*worker
	// ungroupedWake is nudged by a local publish of ungrouped messages.
	ungroupedWake chan struct{}
	// acks coalesces the acks of ungrouped messages per tenant.
	acks       *coalesce.Batcher[string, driver.Claim]
	stopOnce   sync.Once
	stopResult error
}

// Subscribe starts a member of cfg.ConsumerGroup. It validates cfg,
// heartbeats once (so a database that is unreachable or not migrated fails
// here), and then runs until Stop.
func (c *Client) Subscribe(ctx context.Context, cfg SubscriberConfig) (*Subscriber, error) {
	cfg, err := c.subscriberDefaults(cfg)
	if err != nil {
		return nil, fmt.Errorf("shardq: subscribe: %w", err)
	}
	id := ident.MemberID(cfg.Name)
	s := &Subscriber{
		drv:     c.drv,
		cfg:     cfg,
		id:      id,
		log:     cfg.Logger.With("group", cfg.ConsumerGroup, "topic", cfg.Topic, "subscriber", id),
		workers: map[driver.PartitionRef]*worker{},
	}
	// A member that takes grouped messages heartbeats (its first beat also
	// proves the database reachable and migrated); one that takes only
	// ungrouped messages holds no lease and stays out of the fair share,
	// so it only advances the ungrouped cursor.
	if cfg.Take == TakeUngrouped {
		// Members starting together advance together: a deadlock between
		// them is retried, not a failed start.
		err = s.retrying(ctx, func() error {
			_, err := c.drv.AdvanceUngrouped(ctx, cfg.Tenants[0], cfg.Topic, cfg.ConsumerGroup, cfg.Clock())
			return err
		})
	} else {
		err = s.heartbeat(ctx, cfg.Clock())
	}
	if err != nil {
		return nil, fmt.Errorf("shardq: subscribe: %w", err)
	}
	s.life = lifecycle.New(ctx)
	if cfg.Take != TakeUngrouped {
		s.life.Go(s.beat)
		s.life.Go(s.manage)
		s.life.Go(s.watchHeads)
	}
	if cfg.Take != TakeGrouped {
		s.ungroupedWake = make(chan struct{}, 1)
		s.acks = coalesce.New[string](func(ctx context.Context, cs []driver.Claim) error {
			return s.retrying(ctx, func() error { return s.drv.AckClaims(ctx, cs, s.cfg.Clock()) })
		}, 500, 2, 0, dbTimeout)
		s.life.Go(s.ungrouped)
	}
	c.local.Add(cfg.Topic, s, s.wake)
	s.local = &c.local
	s.client = c
	if err := c.track(s); err != nil {
		s.Stop(ctx)
		return nil, fmt.Errorf("shardq: subscribe: %w", err)
	}
	return s, nil
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
	s.stopOnce.Do(func() {
		defer s.client.untrack(s)
		s.local.Remove(s.cfg.Topic, s)
		s.life.Stop(ctx)
		if s.acks != nil {
			s.acks.Close() // every handler has returned: no more acks
		}
		cleanup, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.drv.RemoveHeartbeat(cleanup, s.cfg.Tenants, s.cfg.ConsumerGroup, s.cfg.Topic, s.id); err != nil {
			s.stopResult = fmt.Errorf("shardq: stop: %w", err)
		}
	})
	return s.stopResult
}

// heartbeat upserts the member's rows in every tenant; when that fails
// (one shard down), tenant by tenant, so that it stays alive where the
// database answers. It fails only when no tenant's row was written.
func (s *Subscriber) heartbeat(ctx context.Context, now time.Time) error {
	err := s.drv.Heartbeat(ctx, s.cfg.Tenants, s.cfg.ConsumerGroup, s.cfg.Topic, s.id, now)
	if err == nil || len(s.cfg.Tenants) == 1 {
		return err
	}
	var errs []error
	for _, t := range s.cfg.Tenants {
		if terr := s.drv.Heartbeat(ctx, []string{t}, s.cfg.ConsumerGroup, s.cfg.Topic, s.id, now); terr != nil {
			errs = append(errs, fmt.Errorf("tenant %q: %w", t, terr))
		}
	}
	if len(errs) == len(s.cfg.Tenants) {
		return errors.Join(errs...)
	}
	if len(errs) > 0 && s.life != nil && s.life.Context().Err() == nil {
		s.log.Warn("shardq: heartbeat failed for some tenants; retrying", "err", errors.Join(errs...))
	}
	return nil
}

// policy is the subscriber's retry policy.
func (s *Subscriber) policy() settle.Policy {
	return settle.Policy{MaxAttempts: s.cfg.MaxAttempts, BackoffMin: s.cfg.BackoffMin, BackoffMax: s.cfg.BackoffMax}
}

// errorsIsLost reports a lost lease.
func errorsIsLost(err error) bool { return errors.Is(err, driver.ErrLeaseLost) }
