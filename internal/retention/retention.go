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
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/ident"
	"github.com/shardq/shardq/internal/large"
	"github.com/shardq/shardq/internal/lifecycle"
	"github.com/shardq/shardq/internal/retry"
)

// Group is the reserved consumer group whose lease on partition "" of a
// topic is the retention claim for (tenant, topic).
const Group = driver.RetentionGroup

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
	PageLimit            int           // topics and head rows read per page
	PartitionIdle        time.Duration // a drained partition idle this long is removed; 0: never
	RemoveBatch          int           // partitions removed per transaction
	DedupWindow          time.Duration // no message younger than this is deleted
	Owner                string        // the claims' owner: one identity per pass
	// Deleted hears how many messages a pass deleted in a tenant's topic
	// (the retention metric); nil: nobody.
	Deleted func(tenant string, n int64)
}

// CheckPolicies refuses policies that cannot mean what they say: a
// minimum (minDefault when unset) longer than the maximum, which would
// delete what the minimum keeps. Topics are checked in name order.
func CheckPolicies(def, deadLetters Policy, topics map[string]Policy, minDefault time.Duration) error {
	check := func(name string, p Policy) error {
		min := p.MinRetention
		if min <= 0 {
			min = minDefault
		}
		if p.MaxRetention > 0 && min > p.MaxRetention {
			return &ident.Error{Field: "retention (" + name + ")", Rule: fmt.Sprintf("minimum %s is longer than maximum %s", min, p.MaxRetention)}
		}
		return nil
	}
	if err := check("default", def); err != nil {
		return err
	}
	if err := check("dead letters", deadLetters); err != nil {
		return err
	}
	for _, t := range slices.Sorted(maps.Keys(topics)) {
		if err := check(fmt.Sprintf("topic %q", t), topics[t]); err != nil {
			return err
		}
	}
	return nil
}

// policy is the topic's: its own, else for a dead-letter topic the dead
// letters', else the tenant's (what it leaves unset the default's), else
// the default.
func (c Config) policy(tenants map[string]Policy, tenant, topic string) Policy {
	if p, ok := c.Topics[topic]; ok {
		return p
	}
	if strings.HasSuffix(topic, c.DLQSuffix) {
		return c.DeadLetters
	}
	p, ok := tenants[tenant]
	if !ok {
		return c.Default
	}
	// Where the tenant's field and the default's cross, the tenant's wins.
	switch {
	case p.MinRetention <= 0:
		p.MinRetention = min(c.Default.MinRetention, p.MaxRetention)
	case p.MaxRetention <= 0:
		p.MaxRetention = max(c.Default.MaxRetention, p.MinRetention)
	}
	return p
}

// tenantPolicies reads the retention the tenants of topics set
// (queue_tenants), a page of tenants per statement.
func tenantPolicies(ctx context.Context, drv driver.Driver, topics []driver.TopicSummary) (map[string]Policy, error) {
	var names []string
	for i, t := range topics {
		if i == 0 || t.Tenant != topics[i-1].Tenant {
			names = append(names, t.Tenant)
		}
	}
	out := map[string]Policy{}
	for len(names) > 0 {
		page := names[:min(len(names), 500)]
		names = names[len(page):]
		settings, err := drv.TenantSettings(ctx, page)
		if err != nil {
			return nil, err
		}
		for _, s := range settings {
			if s.Limits.MinRetention > 0 || s.Limits.MaxRetention > 0 {
				out[s.Tenant] = Policy{MinRetention: s.Limits.MinRetention, MaxRetention: s.Limits.MaxRetention}
			}
		}
	}
	return out, nil
}

// Report counts what a pass did.
type Report struct {
	Deleted int64 // messages deleted
	Removed int64 // drained partitions removed (with their leftover rows)
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
	tenants, err := tenantPolicies(ctx, drv, topics)
	if err != nil {
		return rep, err
	}
	var errs []error
	for _, t := range topics {
		r, skipped, err := retainTopic(ctx, drv, clock, t.Tenant, t.Topic, cfg, cfg.policy(tenants, t.Tenant, t.Topic))
		if cfg.Deleted != nil && r.Deleted > 0 {
			cfg.Deleted(t.Tenant, r.Deleted)
		}
		rep.Deleted += r.Deleted
		rep.Removed += r.Removed
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

// retainTopic cleans one tenant's topic under its retention claim: it
// reads the head rows a page at a time, each with its oldest remaining
// message, deletes messages only where some are due, and removes the
// partitions left drained and idle (docs/design.md, "Partition
// lifecycle"), with the rows of partitions already gone.
func retainTopic(ctx context.Context, drv driver.Driver, clock func() time.Time, tenant, topic string, cfg Config, pol Policy) (rep Report, skipped bool, err error) {
	claim, err := drv.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: driver.PartitionRef{Tenant: tenant, ConsumerGroup: Group, Topic: topic}, Owner: cfg.Owner, Now: clock(), TTL: cfg.ClaimTTL})
	if errors.Is(err, driver.ErrLeaseHeld) {
		return rep, true, nil
	}
	if err != nil {
		return rep, false, err
	}
	defer func() {
		if rerr := drv.ReleaseLease(context.WithoutCancel(ctx), claim, clock()); rerr != nil && !errors.Is(rerr, driver.ErrLeaseLost) {
			err = errors.Join(err, rerr)
		}
	}()
	groups, err := drv.TopicGroups(ctx, tenant, topic)
	if err != nil {
		return rep, false, err
	}
	// Every group is registered before anything is removed: removing a
	// partition removes its cursors, and a group with no cursor left must
	// still count among those that have to pass a message.
	for _, g := range groups {
		if err := drv.RegisterGroup(ctx, driver.GroupScope{Tenants: []string{tenant}, Topic: topic, ConsumerGroup: g}, false, clock()); err != nil {
			return rep, false, err
		}
	}
	cursors, err := drv.TopicCursors(ctx, tenant, topic)
	if err != nil {
		return rep, false, err
	}
	cursor := map[[2]string]int64{} // (group, partition) -> committed
	for _, c := range cursors {
		cursor[[2]string{c.ConsumerGroup, c.PartitionKey}] = c.Committed
	}
	// Read after the cursors: a message deferred later had its cursor
	// passed later too (one transaction), so a cursor read that passed
	// it is followed by a read that finds it deferred.
	floors, err := drv.DeferredFloors(ctx, tenant, topic)
	if err != nil {
		return rep, false, err
	}
	now := clock()
	remove := cfg.PartitionIdle > 0
	idleBefore := now.Add(-cfg.PartitionIdle)
	// Rows of partitions whose head row is gone: cursors, and lease rows
	// free since before the idle age. The keys that turn out to have a
	// head are struck off as the pages are read.
	leftover := map[string]bool{}
	if remove {
		for _, c := range cursors {
			leftover[c.PartitionKey] = true
		}
		stale, err := drv.StaleLeaseKeys(ctx, driver.StaleLeaseKeysParams{Tenant: tenant, Topic: topic, Groups: groups, Before: idleBefore})
		if err != nil {
			return rep, false, err
		}
		for _, k := range stale {
			leftover[k] = true
		}
	}
	renew := func() error {
		claim, err = drv.RenewLease(ctx, claim, clock(), cfg.ClaimTTL)
		return err
	}
	// cuts deletes in bounded statements, cutsPerTx a transaction,
	// renewing the claim between transactions, until each cut is done; a
	// lost claim stops the pass.
	var pending []driver.Cut
	cuts := func(force bool) error {
		for len(pending) > 0 && (force || len(pending) >= cutsPerTx) {
			chunk := pending[:min(len(pending), cutsPerTx)]
			var n []int64
			if err := retry.Do(ctx, retry.SettleReruns, drv.Retryable, nil, func() (err error) {
				n, err = drv.DeleteBatches(ctx, driver.DeleteBatchesParams{Tenant: tenant, Topic: topic, Cuts: chunk, Limit: cfg.BatchSize})
				return err
			}); err != nil {
				return err
			}
			var again []driver.Cut
			for i, c := range chunk {
				rep.Deleted += n[i]
				if n[i] == int64(cfg.BatchSize) { // more may be left
					again = append(again, c)
				}
			}
			pending = append(again, pending[len(chunk):]...)
			if err := renew(); err != nil {
				return err
			}
		}
		return nil
	}
	var drained []string
	flush := func(force bool) error {
		for len(drained) > 0 && (force || len(drained) >= cfg.RemoveBatch) {
			chunk := drained[:min(len(drained), cfg.RemoveBatch)]
			drained = drained[len(chunk):]
			// A deadlock with a publisher or a member rolls the removal
			// back whole: run it again, as every writer does.
			var removed []string
			if err := retry.Do(ctx, retry.SettleReruns, drv.Retryable, nil, func() (err error) {
				removed, err = drv.RemovePartitions(ctx, claim, driver.RemovePartitionsRequest{Tenant: tenant, Topic: topic, ConsumerGroups: groups, PartitionKeys: chunk, IdleBefore: idleBefore, Now: clock()})
				return err
			}); err != nil {
				return err
			}
			rep.Removed += int64(len(removed))
			if err := renew(); err != nil {
				return err
			}
		}
		return nil
	}
	// Nothing younger than the de-duplication window goes, whatever the
	// policy: an id stays a duplicate at least that long.
	floor := now.Add(-cfg.DedupWindow)
	minCut, maxCut := earliest(now.Add(-pol.MinRetention), floor), earliest(now.Add(-pol.MaxRetention), floor)
	var after []string
	for {
		page, err := drv.RetentionHeads(ctx, driver.RetentionHeadsParams{Tenant: tenant, Topic: topic, After: after, Limit: cfg.PageLimit})
		if err != nil {
			return rep, false, err
		}
		for _, h := range page {
			delete(leftover, h.PartitionKey)
			empties := h.FirstOffset == 0 // drained already, or this pass may drain it
			if h.FirstOffset > 0 {
				passed := int64(0) // the lowest cursor of every group; no cursor: nothing passed
				if len(groups) > 0 {
					passed = h.HeadOffset
					for _, g := range groups {
						passed = min(passed, cursor[[2]string{g, h.PartitionKey}])
					}
				}
				if f, ok := floors[h.PartitionKey]; ok { // a deferred message is not passed
					passed = min(passed, f-1)
				}
				if passed >= h.FirstOffset && h.FirstCreatedAt.Before(minCut) {
					c, err := wholeCut(ctx, drv, tenant, topic, driver.Cut{PartitionKey: h.PartitionKey, UpTo: passed, Before: minCut})
					if err != nil {
						return rep, false, err
					}
					pending = append(pending, c)
					empties = c.UpTo >= h.HeadOffset
				}
				if h.FirstCreatedAt.Before(maxCut) {
					c, err := wholeCut(ctx, drv, tenant, topic, driver.Cut{PartitionKey: h.PartitionKey, UpTo: -1, Before: maxCut})
					if err != nil {
						return rep, false, err
					}
					pending = append(pending, c)
					empties = c.UpTo < 0 || c.UpTo >= h.HeadOffset
				}
			}
			// RemovePartitions decides under its locks; a partition with
			// a backlog nobody may delete is not offered.
			if remove && empties && h.MovedAt.Before(idleBefore) {
				drained = append(drained, h.PartitionKey)
			}
		}
		// Messages first: a partition this page emptied is removed with it.
		if err := cuts(true); err != nil {
			return rep, false, err
		}
		if err := flush(false); err != nil {
			return rep, false, err
		}
		if len(page) < cfg.PageLimit {
			break
		}
		after = []string{page[len(page)-1].PartitionKey}
	}
	// Deferred rows whose message this pass deleted (MaxRetention) go
	// with it; an operator's deletes, at the next pass that deletes.
	if len(floors) > 0 && rep.Deleted > 0 {
		if _, err := drv.DropDeferredGone(ctx, tenant, topic); err != nil {
			return rep, false, err
		}
	}
	for k := range leftover {
		drained = append(drained, k)
	}
	return rep, false, flush(true)
}

// wholeCut bounds c so that it never falls inside a large message
// (docs/large.md): what it deletes ends at the last offset created before
// c.Before (and at c.UpTo); when the message after that is a later chunk
// or the end marker of a large message whose chunk 0 the cut would
// delete, the cut ends before that chunk 0 instead. So a complete large
// message goes whole once its end marker is old enough, and an
// unfinished write's chunks once the last of them is; a dead letter
// never loses its chunks before its end marker.
func wholeCut(ctx context.Context, drv driver.Driver, tenant, topic string, c driver.Cut) (driver.Cut, error) {
	p := driver.TopicPartition{Tenant: tenant, Topic: topic, PartitionKey: c.PartitionKey}
	upTo, err := drv.OffsetBefore(ctx, p, c.Before)
	if err != nil {
		return c, err
	}
	if c.UpTo >= 0 {
		upTo = min(upTo, c.UpTo)
	}
	next, err := drv.FetchAfter(ctx, p, upTo, 1)
	if err != nil || len(next) == 0 {
		return driver.Cut{PartitionKey: c.PartitionKey, UpTo: upTo, Before: c.Before}, err
	}
	id := ""
	switch m := &next[0]; large.KindOf(m) {
	case large.Chunk:
		id = m.Headers[large.HeaderID]
	case large.End:
		if !large.IsAborted(m) && m.Headers[large.HeaderChunks] != "0" {
			id = m.ID
		}
	}
	if id != "" {
		first, _, err := drv.GetMessage(ctx, driver.MessageRef{Tenant: tenant, Topic: topic, PartitionKey: c.PartitionKey, ID: large.ChunkID(id, 0)})
		if err != nil {
			return c, err
		}
		if first != nil && first.Offset <= upTo {
			upTo = first.Offset - 1
		}
	}
	return driver.Cut{PartitionKey: c.PartitionKey, UpTo: upTo, Before: c.Before}, nil
}

// cutsPerTx bounds the partitions one deleting transaction touches.
const cutsPerTx = 100

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
			if rep.Deleted > 0 || rep.Removed > 0 {
				log.Info("shardq: retention pass", "tenants", tenants, "deleted", rep.Deleted, "removed_partitions", rep.Removed,
					"topics", rep.Topics, "skipped", rep.Skipped)
			}
		})
	})
	return c
}

// Stop ends the service, letting a running batch finish until ctx ends.
func (c *Cleaner) Stop(ctx context.Context) error { return c.life.Stop(ctx) }

// Done is closed once the service has stopped.
func (c *Cleaner) Done() <-chan struct{} { return c.life.Done() }

func earliest(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
