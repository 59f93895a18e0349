// SPDX-License-Identifier: Apache-2.0

package shardq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/ident"
	"github.com/shardq/shardq/internal/lifecycle"
)

// RetentionGroup is the reserved consumer group whose lease on partition ""
// of a topic is the retention claim for (tenant, topic): the leader-free,
// fenced claim that keeps two cleaners from working one topic at once.
// Consumer group names starting with "$" are reserved.
const RetentionGroup = "$retention"

// RetentionPolicy says how long a topic's messages are kept.
type RetentionPolicy struct {
	// MinRetention: a message every known consumer group has passed is
	// deleted once it is this old.
	MinRetention time.Duration
	// MaxRetention: any message is deleted once it is this old, consumed
	// or not.
	MaxRetention time.Duration
}

// RetentionConfig configures retention passes. Zero values take the
// defaults in brackets.
type RetentionConfig struct {
	Default     RetentionPolicy            // [1h, 7 days]
	DeadLetters RetentionPolicy            // topics ending in DLQSuffix [1h, 14 days]
	Topics      map[string]RetentionPolicy // per-topic overrides
	DLQSuffix   string                     // [".dlq"]
	BatchSize   int                        // rows per DELETE statement [1000]
	ClaimTTL    time.Duration              // [1m]
	Name        string                     // names the cleaner for people; claims are owned by Name#random, new per pass [host-pid]
}

func (c RetentionConfig) withDefaults() RetentionConfig {
	def := func(p *RetentionPolicy, min, max time.Duration) {
		if p.MinRetention <= 0 {
			p.MinRetention = min
		}
		if p.MaxRetention <= 0 {
			p.MaxRetention = max
		}
	}
	def(&c.Default, DefaultMinRetention, DefaultMaxRetention)
	def(&c.DeadLetters, DefaultMinRetention, DefaultDeadLetterRetention)
	if c.DLQSuffix == "" {
		c.DLQSuffix = DefaultDLQSuffix
	}
	if c.BatchSize <= 0 {
		c.BatchSize = DefaultRetentionBatch
	}
	if c.ClaimTTL <= 0 {
		c.ClaimTTL = DefaultClaimTTL
	}
	if c.Name == "" {
		c.Name = defaultName("cleaner")
	}
	return c
}

func (c RetentionConfig) policy(topic string) RetentionPolicy {
	if p, ok := c.Topics[topic]; ok {
		return p
	}
	if strings.HasSuffix(topic, c.DLQSuffix) {
		return c.DeadLetters
	}
	return c.Default
}

// RetentionReport counts what a pass did.
type RetentionReport struct {
	Deleted int64 // messages deleted
	Topics  int   // topics cleaned
	Skipped int   // topics another cleaner was working on
}

// RunRetention runs one retention pass over the topics of s.
func (a *Admin) RunRetention(ctx context.Context, s Scope, cfg RetentionConfig) (RetentionReport, error) {
	var rep RetentionReport
	if err := checkScope(s); err != nil {
		return rep, fmt.Errorf("shardq: retention: %w", err)
	}
	cfg = cfg.withDefaults()
	if err := ident.MemberName("cleaner name", cfg.Name); err != nil {
		return rep, fmt.Errorf("shardq: retention: %w", err)
	}
	owner := ident.MemberID(cfg.Name)
	// Page through the topics, a bounded read at a time.
	var topics []driver.TopicSummary
	for page := (Scope{Tenants: s.Tenants, AllTenants: s.AllTenants, Limit: DefaultPageLimit}); ; {
		ts, err := a.c.drv.Topics(ctx, page.toDriver())
		if err != nil {
			return rep, err
		}
		topics = append(topics, ts...)
		if len(ts) < page.Limit {
			break
		}
		last := ts[len(ts)-1]
		page.After = []string{last.Tenant, last.Topic}
	}
	var errs []error
	for _, t := range topics {
		n, skipped, err := a.retainTopic(ctx, t.Tenant, t.Topic, owner, cfg)
		rep.Deleted += n
		switch {
		case skipped:
			rep.Skipped++
		case err != nil:
			errs = append(errs, err) // one topic's failure does not stop the others
		default:
			rep.Topics++
		}
	}
	return rep, errors.Join(errs...)
}

// retainTopic cleans one tenant's topic under its retention claim.
func (a *Admin) retainTopic(ctx context.Context, tenant, topic, owner string, cfg RetentionConfig) (deleted int64, skipped bool, err error) {
	drv, clock := a.c.drv, a.c.cfg.Clock
	claim, err := drv.AcquireLease(ctx, driver.PartitionRef{Tenant: tenant, ConsumerGroup: RetentionGroup, Topic: topic}, owner, clock(), cfg.ClaimTTL)
	if errors.Is(err, driver.ErrLeaseHeld) {
		return 0, true, nil
	}
	if err != nil {
		return 0, false, err
	}
	defer func() {
		if rerr := drv.ReleaseLease(context.WithoutCancel(ctx), claim, clock()); rerr != nil && !errors.Is(rerr, driver.ErrLeaseLost) {
			err = errors.Join(err, rerr)
		}
	}()
	pol := cfg.policy(topic)
	heads, err := drv.PartitionHeads(ctx, []string{tenant}, topic)
	if err != nil {
		return 0, false, err
	}
	// The topic's cursors only: a range of queue_offsets' key, with no
	// message counted (the lag report would count every unconsumed one).
	cursors, err := drv.TopicCursors(ctx, tenant, topic)
	if err != nil {
		return 0, false, err
	}
	groups := map[string]bool{}
	cursor := map[[2]string]int64{} // (group, partition) -> committed
	for _, c := range cursors {
		groups[c.ConsumerGroup] = true
		cursor[[2]string{c.ConsumerGroup, c.PartitionKey}] = c.Committed
	}
	// batches deletes in bounded statements, renewing the claim between
	// them; a lost claim stops the pass.
	batches := func(key string, upTo int64, before time.Time) error {
		for {
			n, err := drv.DeleteBatch(ctx, tenant, topic, key, upTo, before, cfg.BatchSize)
			deleted += n
			if err != nil {
				return err
			}
			if n < int64(cfg.BatchSize) {
				return nil
			}
			if claim, err = drv.RenewLease(ctx, claim, clock(), cfg.ClaimTTL); err != nil {
				return err
			}
		}
	}
	now := clock()
	for _, h := range heads {
		if len(groups) > 0 {
			passed := h.HeadOffset // the lowest cursor of every group known for the topic
			for g := range groups {
				passed = min(passed, cursor[[2]string{g, h.PartitionKey}]) // no cursor: nothing passed
			}
			if passed > 0 {
				if err := batches(h.PartitionKey, passed, now.Add(-pol.MinRetention)); err != nil {
					return deleted, false, err
				}
			}
		}
		if err := batches(h.PartitionKey, -1, now.Add(-pol.MaxRetention)); err != nil {
			return deleted, false, err
		}
	}
	return deleted, false, nil
}

// Cleaner runs retention passes in the background.
type Cleaner struct {
	a       *Admin
	tenants []string
	cfg     RetentionConfig
	log     *slog.Logger
	life    *lifecycle.Group
}

// StartCleaner runs a retention pass over tenants (default MQ_TENANTS)
// every interval (default 5 m) until Stop. Several cleaners may run: the
// per-topic claim keeps them from working one topic at once.
func (c *Client) StartCleaner(ctx context.Context, tenants []string, interval time.Duration, cfg RetentionConfig) (*Cleaner, error) {
	tenants, err := consumerTenants("tenants", tenants)
	if err != nil {
		return nil, fmt.Errorf("shardq: cleaner: %w", err)
	}
	if interval <= 0 {
		interval = DefaultCleanerInterval
	}
	cl := &Cleaner{a: c.Admin(), tenants: tenants, cfg: cfg.withDefaults(), life: lifecycle.New(ctx)}
	cl.log = c.cfg.Logger.With("cleaner", cl.cfg.Name)
	if err := c.track(cl); err != nil {
		return nil, fmt.Errorf("shardq: cleaner: %w", err)
	}
	cl.life.Go(func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			rep, err := cl.a.RunRetention(cl.life.Context(), Scope{Tenants: tenants}, cl.cfg)
			if err != nil && cl.life.Context().Err() == nil {
				cl.log.Warn("shardq: retention pass failed in part; retrying next pass", "tenants", tenants, "err", err)
			}
			if rep.Deleted > 0 {
				cl.log.Info("shardq: retention pass", "tenants", tenants, "deleted", rep.Deleted, "topics", rep.Topics, "skipped", rep.Skipped)
			}
			select {
			case <-cl.life.Context().Done():
				return
			case <-t.C:
			}
		}
	})
	return cl, nil
}

// Stop ends the cleaner, letting a running batch finish until ctx ends.
func (cl *Cleaner) Stop(ctx context.Context) {
	defer cl.a.c.untrack(cl)
	cl.life.Stop(ctx)
}

func (cl *Cleaner) stopOrder() int                         { return 2 }
func (cl *Cleaner) stopForClose(ctx context.Context) error { cl.Stop(ctx); return nil }
