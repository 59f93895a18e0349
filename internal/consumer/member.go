// SPDX-License-Identifier: Apache-2.0

// Package consumer is the runtime of one member of a consumer group: its
// liveness (heartbeat and lease renewal), its control loop (orphan sweep,
// discovery, fair share), the head watcher that wakes idle partitions, a
// worker per leased partition that delivers in order and settles under
// the lease's fence; and it starts the competing consumers of ungrouped
// messages (internal/ungrouped).
// docs/consumers.md describes it with its state machine; the root
// package's Subscriber is its handle.
package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/large"
	"github.com/shardq/shardq/internal/lifecycle"
	"github.com/shardq/shardq/internal/retry"
	"github.com/shardq/shardq/internal/settle"
	"github.com/shardq/shardq/internal/telemetry"
	"github.com/shardq/shardq/internal/ungrouped"
)

// Take chooses which messages a member consumes.
type Take int

const (
	TakeAll       Take = iota // grouped and ungrouped messages
	TakeGrouped               // only messages with a partition key, through leases
	TakeUngrouped             // only ungrouped messages, through per-message claims
)

// Config is a member's settings, validated and with defaults filled in by
// the caller (shardq.Subscribe).
type Config struct {
	ConsumerGroup, Topic string
	Tenants              []string
	ID                   string // the member's identity: lease owner and heartbeat row
	// Instance, when set, makes the member static (Kafka's
	// group.instance.id): ID is an incarnation of it
	// (ident.InstanceMemberID), and a new incarnation takes over the
	// leases and heartbeat rows of earlier ones (static.go).
	Instance string

	// Handle delivers msgs (one, or with Batch a run of consecutive
	// messages of one partition) as their attempt-th delivery; whole is
	// not nil when msgs is the first chunk (or the end marker) of a large
	// message, and is then what to hand out. It must not panic (the
	// caller recovers).
	Handle    func(ctx context.Context, msgs []driver.Message, whole *large.Whole, attempt int) error
	Batch     bool
	BatchSize int

	LeaseTTL, HeartbeatInterval, StaleAfter     time.Duration
	DiscoveryInterval, JoinWindow, PollInterval time.Duration
	DiscoveryWindow, FullDiscoveryInterval      time.Duration
	IdleRelease, CommitInterval                 time.Duration
	MaxPartitions                               int
	// LargeWriteTimeout is how long a large message's write may make no
	// progress before a worker waiting for it gives it up (large.Waiter).
	LargeWriteTimeout time.Duration
	LargeStalls       *large.Stalls // the process's (large.Waiter)

	// FeedUp reports whether the client's change feed streams (nil: there
	// is none); while it does, idle partitions are polled every
	// FeedPollInterval instead of PollInterval.
	FeedUp           func() bool
	FeedPollInterval time.Duration
	// FeedNames reports whether the feed streams and names each partition
	// that moves (nil: no feed): a worker that read up to the head then
	// waits for its wake-up instead of reading again.
	FeedNames func() bool

	Take                 Take
	UngroupedConcurrency int
	VisibilityTimeout    time.Duration
	MaxVisibilityRenewal time.Duration

	Policy    settle.Policy
	DLQSuffix string

	Clock  func() time.Time
	Logger *slog.Logger
	// Metrics records leases, ticks, retries and dead letters (nil: none).
	Metrics *telemetry.Group
}

const dbTimeout = lifecycle.CallTimeout

// Member is a running member of a consumer group.
type Member struct {
	drv driver.Driver
	cfg Config
	log *slog.Logger
	// settler applies a failed delivery's verdict (retry or dead-letter).
	settler settle.Settler

	// life runs the loops and workers: its Context ends at Stop (no more
	// fetching or rebalancing), its HardContext at a hard stop (handlers
	// are cancelled).
	life    *lifecycle.Group
	mu      sync.Mutex
	workers map[driver.PartitionRef]*worker
	// commitMu orders the cursor commits of the member's workers: the
	// committer's shared transaction and a worker's own (commit.go).
	commitMu sync.Mutex
	disc     discovery // the control loop's
	// heldElsewhere is the partitions other owners held at the last tick:
	// a wake-up for one of those does not run a tick early.
	heldElsewhere map[[2]string]bool
	// turn counts the fair shares planned (fairShare), varying the order
	// of tenants that want equally many slots.
	turn uint64
	// work is the partitions with work at the last tick: what the lag
	// metrics count.
	work []driver.Partition
	// paused is the tenants where the group is paused or that are
	// suspended, as last read (pause.go).
	// Read without s.mu: workers ask before every message.
	paused atomic.Pointer[map[string]bool]
	// suspended is the member's suspended tenants, as last read (also in
	// paused).
	suspended atomic.Pointer[map[string]bool]
	rescan    chan struct{} // the feed asks the head watcher to read now
	kick      chan struct{} // the feed saw a partition nobody here holds move
	// unseen is the keys a wake-up named that no tick has found with work
	// yet, with when first named (guarded by mu): the change feed can
	// report a commit before a reader sees it, so the control loop ticks
	// again soon until it does (control.go).
	unseen map[[2]string]time.Time
	// ungrouped consumes the ungrouped messages (nil with TakeGrouped).
	ungrouped  *ungrouped.Service
	stopOnce   sync.Once
	stopResult error
	// previous is the earlier incarnations of a static member that this
	// one took over (guarded by mu); fenced closes when a later one took
	// this one over (static.go).
	previous map[string]bool
	// taken is the partitions taken over at the start and not yet worked,
	// with the expiry their earlier holder knew (guarded by mu).
	taken     map[driver.PartitionRef]time.Time
	fenced    chan struct{}
	fenceOnce sync.Once
	// beatAt is, per tenant, the time stamped on the member's last
	// heartbeat row written (guarded by mu): from StaleAfter after it the
	// other members count this one dead and sweep its leases (liveUntil).
	beatAt map[string]time.Time
	// lapses counts, per tenant, the heartbeats that landed past the
	// last one's staleness (beaten; guarded by mu). A lease acquired
	// while it moved may have been taken before a freeze and swept since
	// (startWorker).
	lapses map[string]uint64
	// judgeFrom is, per tenant, until when this member spares the peers
	// that may have been held up with it, and heldFrom the stamp of its
	// last heartbeat before the late one that set it (guarded by mu;
	// spareFrom).
	judgeFrom, heldFrom map[string]time.Time
	beatMu              sync.Mutex // one heartbeat write at a time (beatOnce)
}

// Start starts a member: it heartbeats once (or, taking only ungrouped
// messages, advances their cursor), so that a database that is
// unreachable or not migrated fails here, and then runs until Stop.
func Start(ctx context.Context, drv driver.Driver, cfg Config) (*Member, error) {
	s := &Member{
		drv:     drv,
		cfg:     cfg,
		log:     cfg.Logger.With("group", cfg.ConsumerGroup, "topic", cfg.Topic, "member", cfg.ID),
		workers: map[driver.PartitionRef]*worker{},
		rescan:  make(chan struct{}, 1),
		kick:    make(chan struct{}, 1),
		unseen:  map[[2]string]time.Time{},
		settler: settle.Settler{Driver: drv, Policy: cfg.Policy, DLQSuffix: cfg.DLQSuffix, Clock: cfg.Clock},
		fenced:  make(chan struct{}),
	}
	// A member that takes grouped messages heartbeats (its first beat also
	// proves the database reachable and migrated); one that takes only
	// ungrouped messages holds no lease and stays out of the fair share,
	// so it only advances the ungrouped cursor.
	var err error
	if cfg.Take == TakeUngrouped {
		// Members starting together advance together: a deadlock between
		// them is retried, not a failed start.
		err = s.retrying(ctx, func() error {
			_, err := drv.AdvanceUngrouped(ctx, driver.GroupRef{Tenant: cfg.Tenants[0], Topic: cfg.Topic, ConsumerGroup: cfg.ConsumerGroup}, cfg.Clock())
			return err
		})
	} else {
		err = s.takeOver(ctx)
		if err == nil {
			err = s.heartbeat(ctx, cfg.Clock())
		}
		if err != nil && cfg.Instance != "" {
			s.abandon() // what a failed takeover moved does not wait for StaleAfter
		}
	}
	if err != nil {
		return nil, err
	}
	s.life = lifecycle.New(ctx)
	if cfg.Take != TakeUngrouped {
		s.life.Go(s.beat)
		s.life.Go(s.renewals)
		s.life.Go(s.manage)
		s.life.Go(s.watchHeads)
		s.life.Go(s.commits)
	} else {
		s.life.Go(s.watchPaused)
	}
	if cfg.Take != TakeGrouped {
		s.ungrouped = ungrouped.Start(ctx, drv, ungrouped.Config{ConsumerGroup: cfg.ConsumerGroup, Topic: cfg.Topic, Tenants: cfg.Tenants,
			ID: cfg.ID, Handle: cfg.Handle, Concurrency: cfg.UngroupedConcurrency, Visibility: cfg.VisibilityTimeout,
			MaxRenewal:   cfg.MaxVisibilityRenewal,
			PollInterval: cfg.PollInterval, FeedUp: cfg.FeedUp, FeedPollInterval: cfg.FeedPollInterval, DiscoveryInterval: cfg.DiscoveryInterval, Policy: cfg.Policy, DLQSuffix: cfg.DLQSuffix,
			Clock: cfg.Clock, Log: s.log, Metrics: cfg.Metrics, Paused: s.isPaused})
	}
	return s, nil
}

// Stop stops fetching, lets in-flight handlers finish until ctx ends (then
// cancels them), renewing their leases meanwhile, commits what was acked,
// releases the leases and deletes the heartbeat; a static member keeps
// its place instead (static.go). No goroutine of the member outlives it.
func (s *Member) Stop(ctx context.Context) error {
	s.stopOnce.Do(func() {
		// Grouped and ungrouped handlers share ctx's time: stop both at once.
		var wg sync.WaitGroup
		drained := make(chan struct{})
		wg.Go(func() { defer close(drained); s.life.Stop(ctx) })
		if s.ungrouped != nil {
			wg.Go(func() { s.ungrouped.Stop(ctx) })
		}
		// The leases stay renewed while the handlers drain: a lease that
		// lapsed meanwhile would let another member deliver beside them.
		wg.Go(func() { s.renewUntil(drained) })
		wg.Wait()
		cleanup, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if s.cfg.Instance != "" && !s.isFenced() {
			// A static member keeps its place for its next process: its
			// heartbeat rows stay (it counts as live for StaleAfter) and
			// its leases end now in its name, so that the next process
			// takes them over and hands out at once; unless a partition it
			// took over is not yet due (its earlier holder may still hand
			// out): then they lapse by themselves (static.go).
			if !s.pendingTakeover(s.cfg.Clock()) {
				if _, err := s.drv.ExpireLeases(cleanup, s.scope(), s.cfg.ID, s.cfg.Clock()); err != nil {
					s.stopResult = fmt.Errorf("stop: %w", err)
				}
			}
			return
		}
		if err := s.drv.RemoveHeartbeat(cleanup, driver.GroupScope{Tenants: s.cfg.Tenants, Topic: s.cfg.Topic, ConsumerGroup: s.cfg.ConsumerGroup}, s.cfg.ID); err != nil {
			s.stopResult = fmt.Errorf("stop: %w", err)
		}
	})
	return s.stopResult
}

// heartbeat upserts the member's rows in every tenant; when that fails
// (one shard down), tenant by tenant, so that it stays alive where the
// database answers. It fails only when no tenant's row was written.
func (s *Member) heartbeat(ctx context.Context, now time.Time) error {
	err := s.drv.Heartbeat(ctx, driver.GroupScope{Tenants: s.cfg.Tenants, Topic: s.cfg.Topic, ConsumerGroup: s.cfg.ConsumerGroup}, s.cfg.ID, now)
	if err == nil {
		s.beaten(s.cfg.Tenants, now)
	}
	if err == nil || len(s.cfg.Tenants) == 1 {
		return err
	}
	var errs []error
	for _, t := range s.cfg.Tenants {
		if terr := s.drv.Heartbeat(ctx, driver.GroupScope{Tenants: []string{t}, Topic: s.cfg.Topic, ConsumerGroup: s.cfg.ConsumerGroup}, s.cfg.ID, now); terr != nil {
			errs = append(errs, fmt.Errorf("tenant %q: %w", t, terr))
		} else {
			s.beaten([]string{t}, now)
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

// beaten records heartbeat rows written in tenants, stamped at. A write
// that ends when the member's last heartbeat is already within the
// holder's margin of going stale vouches for nothing held before it: the
// others may have counted the member dead meanwhile and swept its leases,
// unexpired ones too (a frozen process, a write stuck that long). The
// workers of those tenants stop, as their expiry timers would have, so
// that the fresh heartbeat does not make their leases look live again.
func (s *Member) beaten(tenants []string, at time.Time) {
	done := s.cfg.Clock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.beatAt == nil {
		s.beatAt = map[string]time.Time{}
	}
	if s.lapses == nil {
		s.lapses = map[string]uint64{}
		s.judgeFrom, s.heldFrom = map[string]time.Time{}, map[string]time.Time{}
	}
	for _, t := range tenants {
		if last, ok := s.beatAt[t]; ok && done.Sub(last) > s.lateAfter() {
			s.judgeFrom[t], s.heldFrom[t] = done.Add(s.cfg.StaleAfter), last // late: spareFrom
		}
		if last, ok := s.beatAt[t]; ok && !done.Before(s.liveUntil(t).Add(-s.holderMargin())) {
			s.lapses[t]++
			for _, w := range s.workers {
				if w.lease.Tenant == t {
					s.log.Warn("shardq: heartbeat written after it could have gone stale; stopping the partition, which may have been swept",
						w.logArgs("token", w.lease.Token, "last_heartbeat", last)...)
					w.lose()
				}
			}
		}
		if at.After(s.beatAt[t]) {
			s.beatAt[t] = at
		}
	}
}

// liveUntil is when the other members may count this one dead in tenant
// and sweep its leases there, even unexpired ones: StaleAfter after its
// last heartbeat. Its workers give their leases up before then, as before
// an expiry (worker.giveUpAt). Called with s.mu held.
func (s *Member) liveUntil(tenant string) time.Time {
	return s.beatAt[tenant].Add(s.cfg.StaleAfter)
}

// spareFrom is the heartbeat time from which this member spares the
// others in tenant at now: it sweeps no member whose last heartbeat is
// that recent, however stale it looks, and, when held is true, takes no
// other owner's lease that expired after it. A peer that beat no more
// than an interval and a half before this member's own last heartbeat
// may have been held up as long as it was (another process frozen inside
// a write on SQLite's file, a slow database) and is as live as it is.
// While its own heartbeat is late (lateAfter), and for StaleAfter after a
// late one landed, the mark stays at its last heartbeat before the
// delay, so that those peers get StaleAfter to write theirs again; a
// peer already stale before it is judged as ever (docs/leases.md,
// "Liveness"). Called with s.mu held.
func (s *Member) spareFrom(tenant string, now time.Time) (from time.Time, held bool) {
	mark := s.beatAt[tenant]
	held = now.Sub(mark) > s.lateAfter()
	if now.Before(s.judgeFrom[tenant]) {
		mark, held = s.heldFrom[tenant], true
	}
	return mark.Add(-s.cfg.HeartbeatInterval * 3 / 2), held
}

// lateAfter is the age at which the member's own heartbeat is late:
// halfway from its interval to StaleAfter.
func (s *Member) lateAfter() time.Duration {
	return (s.cfg.HeartbeatInterval + s.cfg.StaleAfter) / 2
}

// lapsesIn is the count of lapsed heartbeats in tenant so far (lapses).
func (s *Member) lapsesIn(tenant string) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lapses[tenant]
}

// beatStale reports whether the member's heartbeat in any of tenants (by
// default its own) is within the holder's margin of going stale at now.
func (s *Member) beatStale(now time.Time, tenants ...string) bool {
	if len(tenants) == 0 {
		tenants = s.cfg.Tenants
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, t := range tenants {
		if !now.Before(s.liveUntil(t).Add(-s.holderMargin())) {
			return true
		}
	}
	return false
}

// holderMargin is how long before a lease's expiry, or before the
// member may count as dead, a worker gives its lease up.
func (s *Member) holderMargin() time.Duration {
	return lifecycle.HolderMargin(min(s.cfg.LeaseTTL, s.cfg.StaleAfter))
}

// retrying runs a settling write again while it fails with a retryable
// error (a deadlock, a busy SQLite file): giving up would leave the message
// to be delivered again after its visibility timeout.
func (s *Member) retrying(ctx context.Context, write func() error) error {
	return retry.Do(ctx, retry.SettleReruns, s.drv.Retryable, nil, write)
}

// pollEvery is how often idle work is polled: PollInterval, or the slower
// FeedPollInterval while the change feed streams.
func (s *Member) pollEvery() time.Duration {
	if s.feedUp() {
		return max(s.cfg.PollInterval, s.cfg.FeedPollInterval)
	}
	return s.cfg.PollInterval
}

// feedUp reports whether the change feed streams.
func (s *Member) feedUp() bool { return s.cfg.FeedUp != nil && s.cfg.FeedUp() }

// errorsIsLost reports a lost lease.
func errorsIsLost(err error) bool { return errors.Is(err, driver.ErrLeaseLost) }
