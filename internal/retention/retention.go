// SPDX-License-Identifier: Apache-2.0

// Package retention deletes what a topic no longer needs: messages every
// consumer group has passed (after a minimum age) and any message past a
// maximum age, in bounded statements, one topic at a time under a fenced
// claim so that two cleaners never work one topic at once. The root
// package's Admin.RunRetention and Cleaner are its handles.
package retention

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/lifecycle"
)

// Group is the reserved consumer group whose lease on partition "" of a
// topic is the retention claim for (tenant, topic).
const Group = "$retention"

// Policy says how long a topic's messages are kept.
type Policy struct {
	MinRetention time.Duration // a message every known group passed goes once this old
	MaxRetention time.Duration // any message goes once this old
}

// Config is a pass's settings, defaults filled in by the caller.
type Config struct {
	Default, DeadLetters Policy
	Topics               map[string]Policy
	DLQSuffix            string
	BatchSize            int
	ClaimTTL             time.Duration
	PageLimit            int    // topics read per listing page
	Owner                string // the claims' owner: one identity per pass
}

func (c Config) policy(topic string) Policy {
	if p, ok := c.Topics[topic]; ok {
		return p
	}
	if strings.HasSuffix(topic, c.DLQSuffix) {
		return c.DeadLetters
	}
	return c.Default
}

// Report counts what a pass did.
type Report struct {
	Deleted int64 // messages deleted
	Topics  int   // topics cleaned
	Skipped int   // topics another cleaner was working on
}

// Run runs one pass over the topics of s (read a page at a time). One
// topic's failure does not stop the others; the errors are joined.
func Run(ctx context.Context, drv driver.Driver, clock func() time.Time, s driver.Scope, cfg Config) (Report, error) {
	var rep Report
	var topics []driver.TopicSummary
	page := driver.Scope{Tenants: s.Tenants, AllTenants: s.AllTenants, Limit: cfg.PageLimit}
	for {
		ts, err := drv.Topics(ctx, page)
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
		n, skipped, err := retainTopic(ctx, drv, clock, t.Tenant, t.Topic, cfg)
		rep.Deleted += n
		switch {
		case skipped:
			rep.Skipped++
		case err != nil:
			errs = append(errs, err)
		default:
			rep.Topics++
		}
	}
	return rep, errors.Join(errs...)
}

// retainTopic cleans one tenant's topic under its retention claim.
func retainTopic(ctx context.Context, drv driver.Driver, clock func() time.Time, tenant, topic string, cfg Config) (deleted int64, skipped bool, err error) {
	claim, err := drv.AcquireLease(ctx, driver.PartitionRef{Tenant: tenant, ConsumerGroup: Group, Topic: topic}, cfg.Owner, clock(), cfg.ClaimTTL)
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
	// message counted.
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

// Cleaner is the background service: a pass over its tenants every
// interval, the first at once, until Stop.
type Cleaner struct {
	life *lifecycle.Group
}

// Start runs pass every interval on a lifecycle of its own; pass gets the
// service's context, which ends at Stop.
func Start(ctx context.Context, interval time.Duration, log *slog.Logger, tenants []string, pass func(ctx context.Context) (Report, error)) *Cleaner {
	c := &Cleaner{life: lifecycle.New(ctx)}
	c.life.Go(func() {
		lifecycle.Every(c.life.Context(), interval, true, func() {
			rep, err := pass(c.life.Context())
			if err != nil && c.life.Context().Err() == nil {
				log.Warn("shardq: retention pass failed in part; retrying next pass", "tenants", tenants, "err", err)
			}
			if rep.Deleted > 0 {
				log.Info("shardq: retention pass", "tenants", tenants, "deleted", rep.Deleted, "topics", rep.Topics, "skipped", rep.Skipped)
			}
		})
	})
	return c
}

// Stop ends the service, letting a running batch finish until ctx ends.
func (c *Cleaner) Stop(ctx context.Context) { c.life.Stop(ctx) }
