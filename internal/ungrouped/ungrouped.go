// SPDX-License-Identifier: Apache-2.0

// Package ungrouped is the competing consumers of a group's ungrouped
// messages (empty partition key): per-message claims with a visibility
// timeout, taken in batches by any member, settled one by one under the
// claim's token, acks coalesced, and the group's cursor of partition ""
// advanced past what is done. docs/groups.md describes it; a consumer
// member (internal/consumer) starts it.
package ungrouped

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/backoff"
	"github.com/shardq/shardq/internal/coalesce"
	"github.com/shardq/shardq/internal/expiry"
	"github.com/shardq/shardq/internal/large"
	"github.com/shardq/shardq/internal/lifecycle"
	"github.com/shardq/shardq/internal/retry"
	"github.com/shardq/shardq/internal/settle"
	"github.com/shardq/shardq/internal/telemetry"
)

// Config is the service's settings, validated and with defaults filled.
type Config struct {
	ConsumerGroup, Topic string
	Tenants              []string
	ID                   string // the member's identity: the claims' owner
	// Handle delivers one message as its attempt-th delivery; it must not
	// panic (the caller recovers).
	Handle      func(ctx context.Context, msgs []driver.Message, whole *large.Whole, attempt int) error
	Concurrency int           // messages handled at once
	Visibility  time.Duration // how long a claim hides its message
	// MaxRenewal bounds how long a claim is held in all, renewed while its
	// handler runs; at most Visibility means never renewed.
	MaxRenewal   time.Duration
	PollInterval time.Duration
	// FeedUp reports whether the client's change feed streams (nil: none);
	// while it does, the claimers poll every FeedPollInterval.
	FeedUp            func() bool
	FeedPollInterval  time.Duration
	DiscoveryInterval time.Duration // how often the cursor advances
	Policy            settle.Policy
	DLQSuffix         string
	Clock             func() time.Time
	Log               *slog.Logger
	Metrics           *telemetry.Group // retries and dead letters (nil: none)
	// Paused reports whether the group is paused in a tenant: nothing is
	// claimed there meanwhile (nil: never).
	Paused func(tenant string) bool
}

const dbTimeout = lifecycle.CallTimeout

// Service claims, handles and settles a group's ungrouped messages.
type Service struct {
	drv    driver.Driver
	cfg    Config
	log    *slog.Logger
	life   *lifecycle.Group
	wake   chan struct{} // a wake-up: ungrouped messages were published
	mu     sync.Mutex
	woken  map[string]bool // tenants woken since the loop last looked
	rescan bool            // a rescan was asked for since
	// acks coalesces the acks of ungrouped messages per tenant; a handler
	// does not wait for its ack's commit, but holds one of ackSlots until
	// it is flushed, so that unflushed acks stay bounded.
	acks     *coalesce.Batcher[string, driver.Claim]
	ackSlots chan struct{}
	// settler applies a failure's verdict under the claim's token.
	settler settle.Settler
}

// maxPendingAcks bounds a member's acks not yet committed; ackReruns
// bounds the reruns of one ack flush (retry.Pause apart, growing: about
// 0.3 s in all).
const (
	maxPendingAcks = 2 * maxPrefetch
	ackReruns      = 10
)

// Start runs the service until Stop.
func Start(ctx context.Context, drv driver.Driver, cfg Config) *Service {
	s := &Service{drv: drv, cfg: cfg, log: cfg.Log, life: lifecycle.New(ctx), wake: make(chan struct{}, 1),
		woken: map[string]bool{}, ackSlots: make(chan struct{}, maxPendingAcks),
		settler: settle.Settler{Driver: drv, Policy: cfg.Policy, DLQSuffix: cfg.DLQSuffix, Clock: cfg.Clock}}
	s.acks = coalesce.New[string](func(ctx context.Context, cs []driver.Claim, _ int) error {
		// Acks run beside claims and cursor advances, and nobody waits on
		// them: rerun a deadlock longer than other settlements (a lost ack
		// redelivers its message after the visibility timeout).
		return retry.Do(ctx, ackReruns, s.drv.Retryable, nil, func() error { return s.drv.AckClaims(ctx, cs, s.cfg.Clock()) })
	}, 500, 2, 0, dbTimeout)
	s.life.Go(s.ungrouped)
	return s
}

// Stop stops claiming, lets in-flight handlers finish until ctx ends (then
// cancels them), gives back what was claimed and not started, and flushes
// the acks.
func (s *Service) Stop(ctx context.Context) {
	s.life.Stop(ctx)
	s.acks.Close() // every handler has returned: no more acks
}

// Wake tells the service that ungrouped messages were published to
// tenant (by this client, or as the change feed saw).
func (s *Service) Wake(tenant string) {
	s.mu.Lock()
	s.woken[tenant] = true
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// wakeAt wakes the claim loop for tenant once a retry that this member
// scheduled is due, when that comes before its next poll: no feed
// announces a claim's retry, and a redelivery (a watermill Nack, say)
// should not wait for a poll that the feed has slowed to seconds.
func (s *Service) wakeAt(tenant string, delay time.Duration) {
	if delay >= s.pollEvery() || s.life.Context().Err() != nil {
		return
	}
	if delay <= 0 {
		s.Wake(tenant)
		return
	}
	time.AfterFunc(delay, func() { s.Wake(tenant) }) // Wake only signals: harmless after a stop
}

// Rescan tells the service that any head may have moved: it reads the
// tenants with work again.
func (s *Service) Rescan() {
	s.mu.Lock()
	s.rescan = true
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// retrying runs a settling write again while it fails with a retryable
// error (a deadlock, a busy SQLite file): giving up would leave the message
// to be delivered again after its visibility timeout.
func (s *Service) retrying(ctx context.Context, write func() error) error {
	return retry.Do(ctx, retry.SettleReruns, s.drv.Retryable, nil, write)
}

// After a wake-up whose claim found nothing, the loop claims again after
// feedReread, doubling, up to feedRereads times (as a partition's worker
// does).
const (
	feedReread  = 2 * time.Millisecond
	feedRereads = 5
)

// maxPrefetch bounds the claims a member holds in its local queue (the
// target, split among its tenants).
const maxPrefetch = 500

// ungrouped is the competing-consumer loop for messages with an empty
// partition key. Concurrency handler goroutines take claimed messages from
// a local queue, the tenants' claims in turn; this loop refills each
// tenant's share of it in batches whenever that is at most half full, so
// that one claim transaction serves many messages even while every
// handler is busy, and every DiscoveryInterval it moves the group's
// ungrouped cursor past what is done. Acks are coalesced into
// shared transactions the way publishes are.
//
// The queue's target (prefetch) follows the handlers' measured rate: what
// they finish in an eighth of the visibility timeout, between twice the
// handlers and maxPrefetch. Fast handlers get large claim batches (one
// transaction for hundreds of messages); slow ones never wait on so many
// claims that those lapse in the queue.
func (s *Service) ungrouped() {
	n := s.cfg.Concurrency
	queue := newClaimQueue(s.cfg.Clock, s.lapseAt)
	took := make(chan struct{}, 1) // a handler took a claim off the queue
	var handled atomic.Int64
	for range n {
		s.life.Go(func() { s.handleClaims(queue, took, &handled) })
	}
	prefetch := newPrefetch(n, s.cfg.Visibility, s.cfg.Clock())
	defer func() {
		for _, c := range queue.close() { // claimed, never started: others may take them now
			s.giveBack(c)
		}
	}()
	var advanced time.Time
	var nextProbe, lastProbe time.Time          // when the tenants with work are read again, and were last
	poll := backoff.NewPoll(s.cfg.PollInterval) // without a feed: faster while probes lead to claims
	claimedSince := 0                           // claims since the last probe
	active := map[string]bool{}                 // tenants with work at the last probe, or woken since
	heads := map[string]int64{}                 // the active tenants' ungrouped heads at the last probe
	// dry is the active tenants whose last claim found nothing: their
	// messages are delayed, claimed by others or being handled. They are
	// claimed from again when woken, when a probe finds their head moved,
	// or about a pollEvery after (without a feed at the last probe before
	// then; with one a probe comes then), not at every probe a busy tenant
	// brings forward.
	dry := map[string]dryMark{}
	rereads := 0                   // claims after a wake-up that found nothing (feedRereads)
	rereading := map[string]bool{} // the tenants that wake-up named: not left dry meanwhile
	round := 0                     // turns the tenants' claims when more claim than the target
	for {
		if s.life.Context().Err() != nil {
			return
		}
		// Claims that lapsed in the queue, or that the handlers found
		// lapsed, are given back here, in turn with the claims, which
		// would otherwise take their messages again as retries of
		// deliveries no handler saw.
		at := s.cfg.Clock()
		for _, c := range queue.takeLapsed("", at) {
			_ = s.giveBackLapsed(c, at) // logged: its attempt stays counted
		}
		woken, rescan := s.takeWoken()
		for _, t := range woken {
			active[t] = true
			delete(dry, t)
			rereading[t] = true
		}
		if len(rereading) == 0 {
			rereads = 0 // a rescan alone names nobody to read again
		}
		now := time.Now()
		if rescan {
			// A feed that cannot name partitions (SQLite's) asks after
			// every commit: probe at most once per rescanGap.
			nextProbe = minTime(nextProbe, lastProbe.Add(rescanGap))
		}
		if !now.Before(nextProbe) {
			heads = s.probe()
			active = make(map[string]bool, len(heads)+len(woken))
			for t := range heads {
				active[t] = true
			}
			every, feed := s.pollEvery(), s.feedUp()
			expire := now // with a feed, a probe comes at each mark's end (below)
			if !feed {
				every = poll.Next(claimedSince > 0)
				expire = now.Add(every) // the last probe before the mark's end
			}
			for t, d := range dry {
				if h, ok := heads[t]; !ok || h > d.head || !d.until.After(expire) {
					delete(dry, t)
				}
			}
			for _, t := range woken {
				active[t] = true
			}
			lastProbe, nextProbe, claimedSince = now, now.Add(every), 0
			if feed {
				for _, d := range dry {
					nextProbe = minTime(nextProbe, d.until)
				}
			}
		}
		target := prefetch.target(handled.Load(), s.cfg.Clock())
		claimed := 0
		var claimable []string
		for _, tenant := range s.cfg.Tenants { // in the configured order
			if _, isDry := dry[tenant]; active[tenant] && !isDry && (s.cfg.Paused == nil || !s.cfg.Paused(tenant)) {
				claimable = append(claimable, tenant)
			}
		}
		if len(claimable) > target {
			// More tenants than claims to queue: target of them a round,
			// in turn.
			round = (round + target) % len(claimable)
			claimable = append(claimable[round:], claimable[:round]...)[:target]
		}
		// Each claimable tenant claims within its share of the queue's
		// target, in batches of at least half of it, except that one with
		// nothing queued claims at once: a woken tenant's message does not
		// wait for another tenant's backlog to shrink the queue, and the
		// handlers take the tenants' claims in turn (claimQueue). A
		// tenant whose claim finds nothing is left dry (above).
		share := max(1, target/max(1, len(claimable)))
		for _, tenant := range claimable {
			queued := queue.queued(tenant)
			if room := share - queued; queued == 0 || room >= max(1, share/2) {
				n, ok := s.claimInto(tenant, room, queue)
				if ok && n == 0 && !rereading[tenant] { // woken: look again (feedRereads)
					dry[tenant] = dryMark{head: heads[tenant], until: time.Now().Add(s.pollEvery())}
				}
				claimed += n
			}
		}
		if claimed > 0 && claimedSince == 0 && !s.feedUp() {
			// The first claims since the probe: probe again soon. A tenant
			// whose cursor lags while its messages are delayed, claimed
			// elsewhere or paused has work by the probe, but leads to no
			// claim, and the probes back off.
			nextProbe = minTime(nextProbe, lastProbe.Add(poll.Next(true)))
		}
		claimedSince += claimed
		if now := s.cfg.Clock(); now.Sub(advanced) >= s.cfg.DiscoveryInterval {
			s.advanceUngrouped(active, now)
			advanced = now
		}
		if claimed > 0 && target-queue.len() >= max(1, target/2) {
			continue // there may be more right away
		}
		wait := time.Until(nextProbe)
		if claimed == 0 && rereads > 0 && rereads <= feedRereads {
			// Woken, found nothing: the commit may not be visible yet
			// (the binary log can run ahead of it). Look again soon.
			wait = min(wait, feedReread<<(rereads-1))
			rereads++
		} else {
			rereads = 0
			clear(rereading)
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-s.wake:
			rereads = 1
		case <-took: // the queue shrank: maybe room for a batch
		case <-queue.setAside: // a lapsed claim to give back
		case <-s.life.Context().Done():
		}
		t.Stop()
	}
}

// rescanGap bounds how often rescans make the loop read the tenants with
// work: SQLite's feed asks after every commit of any connection (500 a
// second and more under load), and the read is a join per tenant.
const rescanGap = 10 * time.Millisecond

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// pollEvery is how often the tenants with work are read: PollInterval, or
// FeedPollInterval while the change feed streams.
func (s *Service) pollEvery() time.Duration {
	if s.feedUp() {
		return max(s.cfg.PollInterval, s.cfg.FeedPollInterval)
	}
	return s.cfg.PollInterval
}

// feedUp reports whether the change feed streams.
func (s *Service) feedUp() bool { return s.cfg.FeedUp != nil && s.cfg.FeedUp() }

// probe reads, in one statement for all the member's tenants, those whose
// ungrouped head is past the group's ungrouped cursor, with that head:
// only those are claimed from and advanced until the next probe, so that
// an idle member costs one statement per poll however many tenants it
// serves. On error it returns every tenant (and logs why).
func (s *Service) probe() map[string]int64 {
	ctx, cancel := context.WithTimeout(s.life.Context(), dbTimeout)
	defer cancel()
	ps, err := s.drv.PartitionsWithWorkOf(ctx, driver.GroupScope{Tenants: s.cfg.Tenants, Topic: s.cfg.Topic, ConsumerGroup: s.cfg.ConsumerGroup}, []string{""})
	if err != nil {
		if s.life.Context().Err() == nil {
			s.log.Warn("shardq: reading the tenants with ungrouped messages failed; claiming in every tenant", "tenants", s.cfg.Tenants, "err", err)
		}
		all := make(map[string]int64, len(s.cfg.Tenants))
		for _, t := range s.cfg.Tenants {
			all[t] = -1 // unknown: the next probe that reads a head ends a dry mark
		}
		return all
	}
	work := make(map[string]int64, len(ps))
	for _, p := range ps {
		work[p.Tenant] = p.HeadOffset
	}
	return work
}

// takeWoken returns, and forgets, the tenants woken since the last call
// and whether a rescan was asked for.
func (s *Service) takeWoken() ([]string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ts []string
	for t := range s.woken {
		ts = append(ts, t)
	}
	clear(s.woken)
	r := s.rescan
	s.rescan = false
	return ts, r
}

// handleClaims is one handler goroutine. On stop, and in a paused or
// suspended tenant, it gives back what it takes instead of running it.
func (s *Service) handleClaims(queue *claimQueue, took chan<- struct{}, handled *atomic.Int64) {
	for {
		c, ok := queue.pop()
		if !ok {
			return
		}
		handled.Add(1)
		select {
		case took <- struct{}{}:
		default:
		}
		// Stopping, or the group paused or the tenant suspended since the
		// claim: deliver nothing, give it back uncounted.
		if s.life.Context().Err() != nil || s.cfg.Paused != nil && s.cfg.Paused(c.Message.Tenant) {
			s.giveBack(c)
			continue
		}
		// pop never hands out a claim that lapsed while it waited (a
		// frozen process, a long queue): it may be another member's.
		s.handleClaim(c)
	}
}

// lapseAt is when a queued claim is no longer handed out: a holder's
// margin before its visibility ends, by the member's clock.
func (s *Service) lapseAt(c driver.Claim) time.Time {
	return c.VisibleUntil.Add(-lifecycle.HolderMargin(s.cfg.Visibility))
}

// giveBackLapsed gives back a claim that lapsed in the queue: its
// attempt is uncounted (fenced by its token: a no-op once another member
// claimed it), since no handler saw it; else a loaded member would
// dead-letter messages it never delivered.
func (s *Service) giveBackLapsed(c driver.Claim, now time.Time) error {
	s.log.Warn("shardq: ungrouped claim lapsed before delivery; the message is delivered again by its next claim",
		"tenant", c.Message.Tenant, "offset", c.Message.Offset, "visible_until", c.VisibleUntil)
	return s.giveBackAt(c, now)
}

// prefetch is the local queue's target size.
type prefetch struct {
	min, cur   int
	visibility time.Duration
	since      time.Time
	count      int64
}

func newPrefetch(handlers int, visibility time.Duration, now time.Time) *prefetch {
	return &prefetch{min: 2 * handlers, cur: 2 * handlers, visibility: visibility, since: now}
}

// target updates the target from the handlers' count of messages taken
// (handled, cumulative) at least once a second.
func (p *prefetch) target(handled int64, now time.Time) int {
	if el := now.Sub(p.since); el >= time.Second {
		rate := float64(handled-p.count) / el.Seconds()
		p.cur = min(max(p.min, int(rate*p.visibility.Seconds()/8)), max(p.min, maxPrefetch))
		p.since, p.count = now, handled
	}
	return p.cur
}

// claimInto claims up to room of tenant's ungrouped messages into queue.
// It reports how many, and whether it asked the database at all (false:
// the tenant is paused, a give-back or the claim failed), so that only a
// claim that found nothing leaves the tenant dry.
func (s *Service) claimInto(tenant string, room int, queue *claimQueue) (int, bool) {
	if s.cfg.Paused != nil && s.cfg.Paused(tenant) {
		return 0, false
	}
	// The claims of tenant that lapsed in the queue by now are given back
	// first, and the claim is made as of that same now: whatever it
	// reclaims (visible by now) lapsed in the queue a margin earlier, so
	// a message this member queued is never reclaimed as a retry while its
	// undelivered claim is still counted.
	// A give-back that failed leaves the attempt counted: the tenant is
	// not claimed this round, which would count another.
	now := s.cfg.Clock()
	var failed bool
	for _, c := range queue.takeLapsed(tenant, now) {
		failed = s.giveBackLapsed(c, now) != nil || failed
	}
	if failed {
		return 0, false
	}
	ctx, cancel := context.WithTimeout(s.life.Context(), dbTimeout)
	claims, _, err := s.drv.ClaimMessages(ctx, driver.ClaimMessagesParams{Group: driver.GroupRef{Tenant: tenant, Topic: s.cfg.Topic, ConsumerGroup: s.cfg.ConsumerGroup}, Owner: s.cfg.ID, Now: now, Visibility: s.cfg.Visibility, Limit: driver.ClaimLimit{Messages: room}})
	cancel()
	if err != nil {
		if s.life.Context().Err() == nil {
			s.log.Warn("shardq: claiming ungrouped messages failed; retrying", "tenant", tenant, "err", err)
		}
		return 0, false
	}
	for _, c := range claims {
		if !queue.push(c) {
			s.giveBack(c) // the queue closed: stopping
		}
	}
	return len(claims), true
}

// dryMark is a dry tenant's head at the probe before its empty claim, and
// when it is claimed from again whatever its head does.
type dryMark struct {
	head  int64
	until time.Time
}

// advanceUngrouped moves the ungrouped cursor of the active tenants (the
// others have nothing past it).
func (s *Service) advanceUngrouped(active map[string]bool, now time.Time) {
	for _, tenant := range s.cfg.Tenants {
		if !active[tenant] {
			continue
		}
		ctx, cancel := context.WithTimeout(s.life.Context(), dbTimeout)
		// Members advance together; a deadlock between them is rerun.
		err := s.retrying(ctx, func() error {
			_, err := s.drv.AdvanceUngrouped(ctx, driver.GroupRef{Tenant: tenant, Topic: s.cfg.Topic, ConsumerGroup: s.cfg.ConsumerGroup}, now)
			return err
		})
		cancel()
		if err != nil && s.life.Context().Err() == nil {
			s.log.Warn("shardq: advancing the ungrouped cursor failed; retrying next interval", "tenant", tenant, "err", err)
		}
	}
}

// handleClaim delivers one claimed message and settles it: ack, retry after
// a backoff, or dead-letter, each fenced by the claim's token. While the
// handler runs, its claim is renewed (up to MaxRenewal in all).
func (s *Service) handleClaim(c driver.Claim) {
	m := c.Message
	if expiry.Expired(&m, s.cfg.Clock()) {
		s.expire(c)
		return
	}
	hctx, lost := context.WithCancel(s.life.HardContext())
	defer lost()
	// The handler ends when its claim is about to lapse by this member's
	// clock unrenewed (the holder's margin before): the message is then
	// claimable by another member, and a handler still running would be
	// its second holder.
	margin := lifecycle.HolderMargin(s.cfg.Visibility)
	visible := new(atomic.Int64)
	visible.Store(c.VisibleUntil.UnixNano())
	var lapsed, returned atomic.Bool
	var lapse *time.Timer
	lapse = time.AfterFunc(time.Hour, func() {
		if returned.Load() {
			return
		}
		if left := time.Unix(0, visible.Load()).Add(-margin).Sub(s.cfg.Clock()); left > 0 {
			lapse.Reset(max(left, lifecycle.ExpiryRecheck)) // an injected clock may stand still
			return
		}
		if hctx.Err() == nil {
			s.log.Warn("shardq: ungrouped claim about to lapse unrenewed while its handler runs; cancelling the handler",
				"tenant", m.Tenant, "offset", m.Offset)
		}
		lapsed.Store(true)
		lost()
	})
	lapse.Reset(c.VisibleUntil.Add(-margin).Sub(s.cfg.Clock()))
	defer lapse.Stop()
	handled, renewing := make(chan struct{}), make(chan struct{})
	ack := func(ctx context.Context, tx driver.DBTX, _ int64) error {
		return s.drv.InTx(tx).AckClaims(ctx, []driver.Claim{c}, s.cfg.Clock())
	}
	inTx := &settle.InTx{Ack: ack, Deferrer: &settle.Deferrer{Driver: s.drv, Group: s.cfg.ConsumerGroup, Clock: s.cfg.Clock, Pass: ack}}
	if s.cfg.MaxRenewal <= s.cfg.Visibility || !s.life.Go(func() { defer close(renewing); s.renewWhileHandled(c, handled, lost, inTx, visible) }) {
		close(renewing)
	}
	err := s.cfg.Handle(settle.WithInTx(hctx, inTx), []driver.Message{m}, nil, c.Attempts) // never a chunk: a large message has a key
	returned.Store(true)
	inTx.Close()
	close(handled)
	<-renewing // no renewal runs beside the settlement
	if inTx.Used() {
		s.settledInTx(c, err)
		return
	}
	if err != nil && lapsed.Load() && !s.settler.Policy.Decide(err, c.Attempts).DeadLetter {
		// The claim lapsed and the handler was cancelled: the message is
		// visible again, and its next claim counts the attempt. A retry
		// recorded now would delay it for a failure it did not have. Its
		// last attempt is dead-lettered as any (fenced by the claim's
		// token), or a handler that always outlives its claim would be
		// delivered for ever.
		return
	}
	if err != nil && s.life.HardContext().Err() != nil {
		// A stop cancelled the handler: not the message's failure. Give
		// it back uncounted, as a partition's worker leaves its message
		// to the next owner without recording an attempt.
		s.giveBack(c)
		return
	}
	if err == nil {
		// The ack coalescer stamps its own time: acks of one flush share
		// it. The handler goes on to its next message meanwhile.
		s.ackSlots <- struct{}{}
		if err := s.acks.Enqueue(m.Tenant, []driver.Claim{c}, func(err error) {
			<-s.ackSlots
			s.settled(c, "ack", err)
		}); err != nil {
			<-s.ackSlots
			s.settled(c, "ack", err)
		}
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), dbTimeout)
	defer cancel()
	var v settle.Verdict
	serr := s.retrying(ctx, func() error {
		var err2 error
		v, err2 = s.settler.Claim(ctx, c, err)
		return err2
	})
	op := "retry"
	switch {
	case v.DeadLetter:
		op = "dead-letter"
		if serr == nil {
			s.cfg.Metrics.DeadLettered(m.Tenant, 1)
			s.log.Warn("shardq: message dead-lettered", "tenant", m.Tenant, "offset", m.Offset, "id", m.ID, "attempts", c.Attempts, "err", v.Cause)
		}
	case serr == nil:
		s.cfg.Metrics.Retry(m.Tenant)
		s.wakeAt(m.Tenant, v.Delay)
	}
	s.settled(c, op, serr)
}

// settledInTx settles c after a handler that acked it in its own
// transaction returned err: a claim found done is that transaction's
// (committed); otherwise, as after any handler, an ack or a failure.
func (s *Service) settledInTx(c driver.Claim, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), dbTimeout)
	defer cancel()
	op := "ack"
	serr := s.retrying(ctx, func() error {
		if err == nil {
			return s.drv.AckClaims(ctx, []driver.Claim{c}, s.cfg.Clock())
		}
		op = "retry"
		v, err2 := s.settler.Claim(ctx, c, err)
		if v.DeadLetter {
			op = "dead-letter"
		}
		return err2
	})
	if errors.Is(serr, driver.ErrLeaseLost) {
		return // settled by the handler's transaction (or, had it rolled back, claimed again)
	}
	s.settled(c, op, serr)
}

// expire settles c's message, expired, without handing it out: its
// claim is marked done, or it is dead-lettered.
func (s *Service) expire(c driver.Claim) {
	m := c.Message
	s.cfg.Metrics.Expired(m.Tenant, 1)
	ctx, cancel := context.WithTimeout(context.Background(), dbTimeout)
	defer cancel()
	op := "pass over an expired"
	err := s.retrying(ctx, func() error {
		if s.cfg.Policy.DeadLetterExpired {
			op = "dead-letter an expired"
			_, err := s.settler.Claim(ctx, c, &settle.DeadLetterError{Err: expiry.Cause(&m)})
			return err
		}
		return s.drv.AckClaims(ctx, []driver.Claim{c}, s.cfg.Clock())
	})
	if err == nil && s.cfg.Policy.DeadLetterExpired {
		s.cfg.Metrics.DeadLettered(m.Tenant, 1)
	}
	s.settled(c, op, err)
}

// settled logs a settlement op of c that failed.
func (s *Service) settled(c driver.Claim, op string, err error) {
	m := c.Message
	switch {
	case errors.Is(err, driver.ErrLeaseLost):
		s.log.Warn("shardq: ungrouped message claimed again before it was settled (visibility timeout); the other claim settles it",
			"tenant", m.Tenant, "offset", m.Offset, "op", op)
	case err != nil:
		s.log.Warn("shardq: settling an ungrouped message failed; it is delivered again after its visibility timeout",
			"tenant", m.Tenant, "offset", m.Offset, "op", op, "err", err)
	}
}

// renewWhileHandled moves c's claim forward every Visibility/4 until
// handled closes, to now + Visibility but never past the claim's time +
// MaxRenewal (there it lapses, and the message is delivered again). A
// claim found lost cancels the handler through lost: another member has
// the message. Each renewal is stored in visible, the handler's deadline.
func (s *Service) renewWhileHandled(c driver.Claim, handled <-chan struct{}, lost context.CancelFunc, inTx *settle.InTx, visible *atomic.Int64) {
	limit := c.VisibleUntil.Add(s.cfg.MaxRenewal - s.cfg.Visibility)
	tick := time.NewTicker(s.cfg.Visibility / 4)
	defer tick.Stop()
	for {
		select {
		case <-handled:
			return
		case <-tick.C:
		}
		now := s.cfg.Clock()
		until := now.Add(s.cfg.Visibility)
		if until.After(limit) {
			until = limit
		}
		if !until.After(c.VisibleUntil) {
			if until.Equal(limit) {
				return // held as long as allowed
			}
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), dbTimeout)
		// Renewing is making the message claimable again later, under the
		// claim's token.
		err := s.retrying(ctx, func() error {
			return s.drv.RetryClaim(ctx, driver.RetryClaimParams{Claim: c, RetryAt: until, LastError: c.LastError, Now: now})
		})
		cancel()
		switch {
		case errors.Is(err, driver.ErrLeaseLost) && inTx.Used():
			return // the handler's transaction settled it (done), or it was claimed again: the handler's own ack says which
		case errors.Is(err, driver.ErrLeaseLost):
			s.log.Warn("shardq: ungrouped claim lost while its handler ran; cancelling the handler",
				"tenant", c.Message.Tenant, "offset", c.Message.Offset)
			lost()
			return
		case err != nil:
			s.log.Warn("shardq: renewing an ungrouped claim failed; retrying", "tenant", c.Message.Tenant, "offset", c.Message.Offset,
				"visible_until", c.VisibleUntil, "err", err)
		default:
			c.VisibleUntil = until
			visible.Store(until.UnixNano())
		}
	}
}

// giveBack makes a claim visible again at once, its attempt uncounted.
func (s *Service) giveBack(c driver.Claim) {
	_ = s.giveBackAt(c, s.cfg.Clock()) // logged; the claim lapses by itself
}

// giveBackAt makes a claim visible again as of now, its attempt
// uncounted: a no-op once another member claimed it. An error is logged
// and returned.
func (s *Service) giveBackAt(c driver.Claim, now time.Time) error {
	ctx, cancel := context.WithTimeout(context.Background(), dbTimeout)
	defer cancel()
	err := s.retrying(ctx, func() error { return s.drv.ReleaseClaim(ctx, c, now) })
	if errors.Is(err, driver.ErrLeaseLost) {
		return nil
	}
	if err != nil {
		s.log.Warn("shardq: giving back an ungrouped claim failed; it is delivered again after its visibility timeout",
			"tenant", c.Message.Tenant, "offset", c.Message.Offset, "err", err)
	}
	return err
}
