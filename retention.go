// SPDX-License-Identifier: Apache-2.0

package shardq

import (
	"context"
	"fmt"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/ident"
	"github.com/shardq/shardq/internal/retention"
	"github.com/shardq/shardq/internal/settings"
)

// RetentionGroup is the reserved consumer group whose lease on partition ""
// of a topic is the retention claim for (tenant, topic): the leader-free,
// fenced claim that keeps two cleaners from working one topic at once.
// Consumer group names starting with "$" are reserved.
const RetentionGroup = retention.Group

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
	// PartitionIdle: a partition with no message left (every group passed
	// it, or it aged out), no live lease, and no publish for this long is
	// removed with its cursors, leases, bookkeeping and state; a later
	// publish to its key makes it anew (docs/design.md, "Partition
	// lifecycle"). Negative: never. [1h]
	PartitionIdle time.Duration
	ClaimTTL      time.Duration // [1m]
	// DedupWindow: retention never deletes a message younger than this
	// (from its CreatedAt), whatever the policies say, so that a publish
	// repeating its id within the window is a duplicate, not a new
	// message (docs/design.md, invariant 5). Negative: none.
	// [5m]
	DedupWindow time.Duration
	Name        string // names the cleaner for people; claims are owned by Name#random, new per pass [host-pid]
}

func (c RetentionConfig) withDefaults() RetentionConfig {
	settings.Positive(&c.Default.MinRetention, DefaultMinRetention)
	settings.Positive(&c.Default.MaxRetention, DefaultMaxRetention)
	settings.Positive(&c.DeadLetters.MinRetention, DefaultMinRetention)
	settings.Positive(&c.DeadLetters.MaxRetention, DefaultDeadLetterRetention)
	settings.Positive(&c.BatchSize, DefaultRetentionBatch)
	settings.Positive(&c.ClaimTTL, DefaultClaimTTL)
	if c.DedupWindow == 0 {
		c.DedupWindow = DefaultDedupWindow
	}
	if c.DLQSuffix == "" {
		c.DLQSuffix = DefaultDLQSuffix
	}
	if c.PartitionIdle == 0 {
		c.PartitionIdle = DefaultPartitionIdle
	}
	if c.Name == "" {
		c.Name = defaultName("cleaner")
	}
	return c
}

// check refuses policies that cannot mean what they say (defaults
// filled): a minimum longer than the maximum.
func (c RetentionConfig) check() error {
	topics := make(map[string]retention.Policy, len(c.Topics))
	for t, p := range c.Topics {
		topics[t] = retention.Policy(p)
	}
	return retention.CheckPolicies(retention.Policy(c.Default), retention.Policy(c.DeadLetters), topics, DefaultMinRetention)
}

// RetentionReport counts what a pass did.
type RetentionReport struct {
	Deleted int64 // messages deleted
	Removed int64 // drained partitions removed (with their leftover rows)
	Topics  int   // topics cleaned
	Skipped int   // topics another cleaner was working on
}

// RunRetention runs one retention pass over the topics of s.
func (a *Admin) RunRetention(ctx context.Context, s Scope, cfg RetentionConfig) (RetentionReport, error) {
	if err := checkScope(s); err != nil {
		return RetentionReport{}, fmt.Errorf("shardq: retention: %w", err)
	}
	cfg = cfg.withDefaults()
	if err := cfg.check(); err != nil {
		return RetentionReport{}, fmt.Errorf("shardq: retention: %w", err)
	}
	if err := ident.MemberName("cleaner name", cfg.Name); err != nil {
		return RetentionReport{}, fmt.Errorf("shardq: retention: %w", err)
	}
	if err := a.c.syncClock(ctx); err != nil {
		return RetentionReport{}, fmt.Errorf("shardq: retention: %w", err)
	}
	pass := a.c.retentionPass(cfg)
	counted := pass.Deleted
	pass.Deleted = func(tenant string, n int64) {
		counted(tenant, n)
		a.advance(n)
	}
	rep, err := retention.Run(ctx, a.c.drv, a.c.cfg.Clock, s.toDriver(), pass)
	return RetentionReport(rep), err
}

// removeBatch bounds the partitions one removal transaction deletes:
// each takes a row of every table per partition and group.
const removeBatch = 200

// pass is cfg (defaults filled) as one pass's settings, with an identity
// of its own.
func (c RetentionConfig) pass() retention.Config {
	conv := func(p RetentionPolicy) retention.Policy { return retention.Policy(p) }
	topics := make(map[string]retention.Policy, len(c.Topics))
	for t, p := range c.Topics {
		topics[t] = conv(p)
	}
	return retention.Config{Default: conv(c.Default), DeadLetters: conv(c.DeadLetters), Topics: topics, DLQSuffix: c.DLQSuffix,
		BatchSize: c.BatchSize, ClaimTTL: c.ClaimTTL, PageLimit: DefaultPageLimit, Owner: ident.MemberID(c.Name),
		PartitionIdle: max(c.PartitionIdle, 0), RemoveBatch: removeBatch, DedupWindow: max(c.DedupWindow, 0)}
}

// retentionPass is cfg as one pass of this client's, counting what it
// deletes in the metrics.
func (c *Client) retentionPass(cfg RetentionConfig) retention.Config {
	p := cfg.pass()
	p.Deleted = c.tel.RetentionDeleted
	return p
}

// Cleaner runs retention passes in the background (internal/retention).
type Cleaner struct {
	c   *Client
	svc *retention.Cleaner
}

// StartCleaner runs a retention pass over tenants (default SHARDQ_TENANTS)
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
	cfg = cfg.withDefaults()
	if err := cfg.check(); err != nil {
		return nil, fmt.Errorf("shardq: cleaner: %w", err)
	}
	if err := ident.MemberName("cleaner name", cfg.Name); err != nil {
		return nil, fmt.Errorf("shardq: cleaner: %w", err)
	}
	if err := c.syncClock(ctx); err != nil {
		return nil, fmt.Errorf("shardq: cleaner: %w", err)
	}
	scope := driver.Scope{Tenants: tenants}
	cl := &Cleaner{c: c, svc: retention.Start(ctx, interval, c.cfg.Logger.With("cleaner", cfg.Name), tenants,
		func(ctx context.Context) (retention.Report, error) {
			return retention.Run(ctx, c.drv, c.cfg.Clock, scope, c.retentionPass(cfg))
		})}
	if err := c.track(cl); err != nil {
		cl.svc.Stop(ctx)
		return nil, fmt.Errorf("shardq: cleaner: %w", err)
	}
	return cl, nil
}

// Stop ends the cleaner, letting a running batch finish until ctx ends;
// it returns ctx's error when the batch had to be cancelled.
func (cl *Cleaner) Stop(ctx context.Context) error {
	defer cl.c.untrack(cl)
	if err := cl.svc.Stop(ctx); err != nil {
		return fmt.Errorf("shardq: stop cleaner: %w", err)
	}
	return nil
}

// Done is closed once the cleaner has stopped: by Stop or Client.Close.
func (cl *Cleaner) Done() <-chan struct{} { return cl.svc.Done() }

func (cl *Cleaner) stopOrder() int                         { return 2 }
func (cl *Cleaner) stopForClose(ctx context.Context) error { return cl.Stop(ctx) }
