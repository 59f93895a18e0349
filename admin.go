// SPDX-License-Identifier: Apache-2.0

package shardq

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/ident"
)

// Page sizes of the operator's listings.
const (
	DefaultPageLimit = 1000
	MaxPageLimit     = 10000
)

// ErrNoMessage means no message has the given identity.
var ErrNoMessage = driver.ErrNoMessage

// ErrPartitionLeased refuses an offset reset while a live subscriber holds
// a lease on an affected partition (see ResetRequest.Force).
var ErrPartitionLeased = errors.New("partition leased by a live subscriber")

// Admin is the operator's API; the `shardq admin` commands wrap it. Every
// statement is scoped by tenant, except listings an operator asked to run
// across all tenants by name.
type Admin struct {
	c        *Client
	progress func(done int64) // WithProgress
}

// Admin returns the client's operator API.
func (c *Client) Admin() *Admin { return &Admin{c: c} }

// WithProgress returns an Admin whose long operations (RequeueAll,
// RunRetention) call fn as they go with how much more they did: messages
// requeued, messages deleted. fn runs on the caller's goroutine.
func (a *Admin) WithProgress(fn func(done int64)) *Admin {
	b := *a
	b.progress = fn
	return &b
}

func (a *Admin) advance(n int64) {
	if a.progress != nil && n > 0 {
		a.progress(n)
	}
}

func checkScope(s Scope) error {
	if (len(s.Tenants) > 0) == s.AllTenants {
		return &ident.Error{Field: "scope", Rule: "give exactly one of a tenant list or all tenants"}
	}
	if s.AllTenants {
		return nil
	}
	return ident.Tenants("tenants", s.Tenants)
}

func checkRef(ref MessageRef) error {
	for _, err := range []error{ident.Tenant(ref.Tenant), ident.Topic(ref.Topic), ident.PartitionKey(ref.PartitionKey), ident.MessageID(ref.ID)} {
		if err != nil {
			return err
		}
	}
	return nil
}

// scoped checks s, bounds its page, and runs fn with it.
func scoped[T any](s Scope, fn func(s Scope) (T, error)) (T, error) {
	var zero T
	if err := checkScope(s); err != nil {
		return zero, fmt.Errorf("shardq: admin: %w", err)
	}
	switch {
	case s.Limit < 0 || s.Limit > MaxPageLimit:
		return zero, fmt.Errorf("shardq: admin: %w", &ident.Error{Field: "limit", Rule: fmt.Sprintf("%d: want 1 to %d (0: %d)", s.Limit, MaxPageLimit, DefaultPageLimit)})
	case s.Limit == 0:
		s.Limit = DefaultPageLimit
	}
	return fn(s)
}

// Topics lists topics with their partition counts and highest head. Sort
// key: (tenant, topic).
func (a *Admin) Topics(ctx context.Context, s Scope) ([]TopicInfo, error) {
	return scoped(s, func(s Scope) ([]TopicInfo, error) {
		ts, err := a.c.drv.Topics(ctx, s.toDriver())
		return mapSlice(ts, func(t driver.TopicSummary) TopicInfo {
			return TopicInfo{Tenant: t.Tenant, Topic: t.Topic, Partitions: t.Partitions, HeadOffset: t.HeadOffset}
		}), err
	})
}

// Offsets lists every known group's cursor per partition with its lag
// (messages after the cursor, counted up to LagCountLimit) and the
// time of the first of them; group "" means all groups. Sort key:
// (tenant, topic, group, partition key). For one group, the last page
// (fewer rows than the limit) goes on with the partitions of its topics
// that have messages and no cursor of the group yet (NoCursor), counted
// from where the group starts.
func (a *Admin) Offsets(ctx context.Context, s Scope, group string) ([]GroupOffset, error) {
	if group != "" {
		if err := ident.ConsumerGroup(group); err != nil {
			return nil, fmt.Errorf("shardq: admin: %w", err)
		}
	}
	return scoped(s, func(s Scope) ([]GroupOffset, error) {
		rows, err := a.c.drv.OffsetReport(ctx, s.toDriver(), group)
		if err == nil && group != "" && len(rows) < s.Limit {
			var unread []driver.OffsetRow
			unread, err = a.unread(ctx, s, group)
			rows = append(rows, unread...)
		}
		return mapSlice(rows, func(o driver.OffsetRow) GroupOffset {
			return GroupOffset{Tenant: o.Tenant, Topic: o.Topic, PartitionKey: o.PartitionKey, ConsumerGroup: o.ConsumerGroup,
				HeadOffset: o.HeadOffset, CommittedOffset: o.CommittedOffset, Lag: o.Lag, LagCapped: o.LagCapped, Scheduled: o.Scheduled, OldestUnconsumed: o.OldestUnconsumed,
				NoCursor: o.NoCursor}
		}), err
	})
}

// unread lists, for every topic of s that group reads, the partitions
// with messages the group has no cursor for (up to MaxPageLimit a topic).
func (a *Admin) unread(ctx context.Context, s Scope, group string) ([]driver.OffsetRow, error) {
	var out []driver.OffsetRow
	err := a.eachTopic(ctx, s, func(t driver.TopicSummary) error {
		groups, err := a.c.drv.TopicGroups(ctx, t.Tenant, t.Topic)
		if err != nil || !slices.Contains(groups, group) {
			return err
		}
		rows, err := a.c.drv.UnreadPartitions(ctx, t.Tenant, t.Topic, group, MaxPageLimit)
		for _, r := range rows {
			if r.HeadOffset > r.CommittedOffset {
				out = append(out, r)
			}
		}
		return err
	})
	return out, err
}

// eachTopic calls fn with every topic of s, reading them a page at a time.
func (a *Admin) eachTopic(ctx context.Context, s Scope, fn func(driver.TopicSummary) error) error {
	page := driver.Scope{Tenants: s.Tenants, AllTenants: s.AllTenants, Limit: MaxPageLimit}
	for {
		ts, err := a.c.drv.Topics(ctx, page)
		if err != nil {
			return err
		}
		for _, t := range ts {
			if err := fn(t); err != nil {
				return err
			}
		}
		if len(ts) < page.Limit {
			return nil
		}
		page.After = []string{ts[len(ts)-1].Tenant, ts[len(ts)-1].Topic}
	}
}

// Leases lists lease rows (free ones included). Sort key: (tenant, group,
// topic, partition key).
func (a *Admin) Leases(ctx context.Context, s Scope) ([]Lease, error) {
	return scoped(s, func(s Scope) ([]Lease, error) {
		ls, err := a.c.drv.AllLeases(ctx, s.toDriver())
		return mapSlice(ls, leaseOf), err
	})
}

func leaseOf(l driver.Lease) Lease {
	return Lease{Tenant: l.Tenant, ConsumerGroup: l.ConsumerGroup, Topic: l.Topic, PartitionKey: l.PartitionKey,
		Owner: l.Owner, Token: l.Token, ExpiresAt: l.ExpiresAt}
}

// StaleLeases lists the held leases of one page of lease rows (the page
// of Leases) that are past expiry or whose holder's heartbeat is older
// than staleAfter.
func (a *Admin) StaleLeases(ctx context.Context, s Scope, staleAfter time.Duration) ([]Lease, error) {
	return scoped(s, func(s Scope) ([]Lease, error) {
		leases, err := a.c.drv.AllLeases(ctx, s.toDriver())
		if err != nil {
			return nil, err
		}
		// The members of the groups on this page, read group by group
		// (each read names its tenant, group and topic).
		now := a.c.cfg.Clock()
		fresh := map[[4]string]bool{}
		read := map[[3]string]bool{}
		for _, l := range leases {
			g := [3]string{l.Tenant, l.ConsumerGroup, l.Topic}
			if l.Owner == "" || read[g] {
				continue
			}
			read[g] = true
			subs, err := a.c.drv.Subscribers(ctx, []string{l.Tenant}, l.ConsumerGroup, l.Topic)
			if err != nil {
				return nil, err
			}
			for _, sub := range subs {
				if now.Sub(sub.HeartbeatAt) < staleAfter {
					fresh[[4]string{sub.Tenant, sub.ConsumerGroup, sub.Topic, sub.Name}] = true
				}
			}
		}
		var out []Lease
		for _, l := range leases {
			if l.Owner != "" && (!l.ExpiresAt.After(now) || !fresh[[4]string{l.Tenant, l.ConsumerGroup, l.Topic, l.Owner}]) {
				out = append(out, leaseOf(l))
			}
		}
		return out, nil
	})
}

// Subscribers lists heartbeat rows. Sort key: (tenant, group, topic,
// subscriber identity).
func (a *Admin) Subscribers(ctx context.Context, s Scope) ([]Member, error) {
	return scoped(s, func(s Scope) ([]Member, error) {
		subs, err := a.c.drv.AllSubscribers(ctx, s.toDriver())
		return mapSlice(subs, func(m driver.Subscriber) Member {
			return Member{Tenant: m.Tenant, ConsumerGroup: m.ConsumerGroup, Topic: m.Topic, ID: m.Name, StartedAt: m.StartedAt, HeartbeatAt: m.HeartbeatAt}
		}), err
	})
}

// PendingHalves lists pending transactional half messages. Sort key:
// (tenant, topic, partition key, id).
func (a *Admin) PendingHalves(ctx context.Context, s Scope) ([]PendingHalf, error) {
	now := a.c.cfg.Clock()
	return scoped(s, func(s Scope) ([]PendingHalf, error) {
		hs, err := a.c.drv.ListHalves(ctx, s.toDriver())
		return mapSlice(hs, func(h driver.HalfMessage) PendingHalf {
			return PendingHalf{HalfMessage: *toHalf(&h), NextCheckAt: h.NextCheckAt, ClaimOwner: h.ClaimOwner,
				Overdue: h.ClaimOwner == "" && now.Sub(h.NextCheckAt) > HalfOverdueAfter}
		}), err
	})
}

// HalfOverdueAfter is how long past its check time an unclaimed half
// message counts as overdue: a running producer of its group claims a
// due one within its poll interval (1 s by default), so one left this
// long means that none seems to be running.
const HalfOverdueAfter = time.Minute

// Inspect reads one message and its retry bookkeeping per consumer group.
func (a *Admin) Inspect(ctx context.Context, ref MessageRef) (*StoredMessage, map[string]DeliveryState, error) {
	if err := checkRef(ref); err != nil {
		return nil, nil, fmt.Errorf("shardq: admin: %w", err)
	}
	m, states, err := a.c.drv.GetMessage(ctx, ref.toDriver())
	if err != nil {
		return nil, nil, err
	}
	if m == nil {
		return nil, nil, ErrNoMessage
	}
	sm := storedMessage(*m)
	out := make(map[string]DeliveryState, len(states))
	for g, st := range states {
		out[g] = DeliveryState{Attempts: st.Attempts, NextAttemptAt: st.NextAttemptAt, LastError: st.LastError}
	}
	return &sm, out, nil
}

// Delete removes exactly the message with ref's identity and reports
// whether there was one.
func (a *Admin) Delete(ctx context.Context, ref MessageRef) (bool, error) {
	if err := checkRef(ref); err != nil {
		return false, fmt.Errorf("shardq: admin: %w", err)
	}
	return a.c.drv.DeleteMessage(ctx, ref.toDriver())
}

// DeadLetters lists the dead letters of topic (topic+suffix; suffix ""
// means ".dlq"). Sort key: (tenant, offset).
func (a *Admin) DeadLetters(ctx context.Context, s Scope, topic, suffix string) ([]StoredMessage, error) {
	if suffix == "" {
		suffix = DefaultDLQSuffix
	}
	if err := ident.Topic(topic + suffix); err != nil {
		return nil, fmt.Errorf("shardq: admin: %w", err)
	}
	return scoped(s, func(s Scope) ([]StoredMessage, error) {
		ms, err := a.c.drv.TopicMessages(ctx, s.toDriver(), topic+suffix)
		return mapSlice(ms, storedMessage), err
	})
}

// Requeue moves one dead letter of ref.Topic (ref names the original
// topic) back to its original topic and partition with a fresh offset and
// its attempts reset, atomically.
func (a *Admin) Requeue(ctx context.Context, ref MessageRef, suffix string) (*PublishResult, error) {
	if suffix == "" {
		suffix = DefaultDLQSuffix
	}
	if err := checkRef(ref); err != nil {
		return nil, fmt.Errorf("shardq: admin: %w", err)
	}
	dl := ref
	dl.Topic = ref.Topic + suffix
	m, _, err := a.c.drv.GetMessage(ctx, dl.toDriver())
	if err != nil {
		return nil, err
	}
	if m == nil {
		return nil, fmt.Errorf("shardq: admin: requeue tenant %q topic %q partition %q id %q: %w", dl.Tenant, dl.Topic, dl.PartitionKey, dl.ID, ErrNoMessage)
	}
	headers := maps.Clone(m.Headers)
	maps.DeleteFunc(headers, func(k, _ string) bool { return strings.HasPrefix(k, "dlq_") })
	im, err := a.c.drv.Requeue(ctx, dl.toDriver(), ref.Topic, headers)
	if err != nil {
		return nil, err
	}
	return &PublishResult{Tenant: im.Tenant, Topic: im.Topic, PartitionKey: im.PartitionKey, ID: im.ID, Offset: im.Offset}, nil
}

// RequeueAll requeues every dead letter of one tenant's topic, in offset
// order, and returns how many.
func (a *Admin) RequeueAll(ctx context.Context, tenant, topic, suffix string) (int, error) {
	if err := ident.Tenant(tenant); err != nil {
		return 0, fmt.Errorf("shardq: admin: %w", err)
	}
	n := 0
	for {
		dls, err := a.DeadLetters(ctx, Scope{Tenants: []string{tenant}, Limit: 500}, topic, suffix)
		if err != nil || len(dls) == 0 {
			return n, err
		}
		for _, m := range dls {
			if _, err := a.Requeue(ctx, MessageRef{Tenant: tenant, Topic: topic, PartitionKey: m.PartitionKey, ID: m.ID}, suffix); err != nil {
				return n, err
			}
			n++
			a.advance(1)
		}
	}
}

// CommitHalf resolves a pending transactional half message by hand: it
// enters its partition with a fresh offset. ErrTxResolved when it was
// resolved already.
func (a *Admin) CommitHalf(ctx context.Context, ref MessageRef) (*PublishResult, error) {
	if err := checkRef(ref); err != nil {
		return nil, fmt.Errorf("shardq: admin: %w", err)
	}
	m, err := a.c.drv.CommitHalf(ctx, ref.toDriver(), 0)
	if err != nil {
		return nil, err
	}
	return &PublishResult{Tenant: m.Tenant, Topic: m.Topic, PartitionKey: m.PartitionKey, ID: m.ID, Offset: m.Offset}, nil
}

// RollbackHalf drops a pending transactional half message by hand.
// ErrTxResolved when it was resolved already.
func (a *Admin) RollbackHalf(ctx context.Context, ref MessageRef) error {
	if err := checkRef(ref); err != nil {
		return fmt.Errorf("shardq: admin: %w", err)
	}
	return a.c.drv.RollbackHalf(ctx, ref.toDriver(), 0)
}

// ResetTarget is where ResetOffsets moves cursors.
type ResetTarget int

const (
	ResetToEarliest ResetTarget = iota + 1 // before the first message: everything again
	ResetToLatest                          // at the head: nothing pending
	ResetToOffset                          // Offset, in partition Key only
	ResetToTime                            // before the first message created at or after Time
)

// ResetRequest moves a consumer group's cursors on one tenant's topic.
type ResetRequest struct {
	Tenant, Topic, ConsumerGroup string
	To                           ResetTarget
	Key                          string // with ResetToOffset
	Offset                       int64  // with ResetToOffset
	Time                         time.Time
	// Force resets even while a live subscriber holds an affected lease.
	Force bool
	// DryRun computes the changes and changes nothing: the preview that
	// `shardq admin reset-offsets` shows without --execute.
	DryRun bool
	// Create allows a group that has never read the topic (no registry
	// row, cursor, lease or member): without it such a name, likely a
	// typo, is refused.
	Create bool
}

// OffsetChange is one cursor a reset moves (or, with DryRun, would move).
type OffsetChange struct {
	PartitionKey string
	From, To     int64
	// Replay counts the messages the group reads again (To before From);
	// Skip those it never reads (To after From). Each is counted up to
	// LagCountLimit; Capped says there are more.
	Replay, Skip int64
	Capped       bool
}

// ResetOffsets moves cursors as r says and returns what changed. It refuses
// (ErrPartitionLeased) while a live lease covers an affected partition,
// unless r.Force.
func (a *Admin) ResetOffsets(ctx context.Context, r ResetRequest) ([]OffsetChange, error) {
	for _, err := range []error{ident.Tenant(r.Tenant), ident.Topic(r.Topic), ident.ConsumerGroup(r.ConsumerGroup)} {
		if err != nil {
			return nil, fmt.Errorf("shardq: admin: reset offsets: %w", err)
		}
	}
	if r.To < ResetToEarliest || r.To > ResetToTime {
		return nil, fmt.Errorf("shardq: admin: reset offsets: %w", &ident.Error{Field: "target", Rule: "choose earliest, latest, an offset or a time"})
	}
	if r.To == ResetToOffset && r.Offset < 0 {
		return nil, fmt.Errorf("shardq: admin: reset offsets: %w", &ident.Error{Field: "offset", Rule: fmt.Sprintf("%d: must not be negative", r.Offset)})
	}
	scope := Scope{Tenants: []string{r.Tenant}}
	if !r.Create {
		groups, err := a.c.drv.TopicGroups(ctx, r.Tenant, r.Topic)
		if err != nil {
			return nil, err
		}
		if !slices.Contains(groups, r.ConsumerGroup) {
			return nil, fmt.Errorf("shardq: admin: reset offsets: %w", &ident.Error{Field: "consumer group",
				Rule: fmt.Sprintf("%q has never read tenant %q topic %q (known: %s); set Create (--create) to start it at the new position",
					r.ConsumerGroup, r.Tenant, r.Topic, strings.Join(groups, ", "))})
		}
	}
	heads, err := a.c.drv.PartitionHeads(ctx, scope.Tenants, r.Topic)
	if err != nil {
		return nil, err
	}
	if r.To == ResetToOffset {
		if err := ident.PartitionKey(r.Key); err != nil {
			return nil, fmt.Errorf("shardq: admin: reset offsets: %w", err)
		}
		heads = filterKey(heads, r.Key)
		if len(heads) == 0 {
			return nil, fmt.Errorf("shardq: admin: reset offsets: tenant %q topic %q has no partition %q", r.Tenant, r.Topic, r.Key)
		}
		// Past the head, the group would skip every message published
		// until the head caught up: refuse, like a negative offset.
		if r.Offset < 0 || r.Offset > heads[0].HeadOffset {
			return nil, fmt.Errorf("shardq: admin: reset offsets: %w", &ident.Error{Field: "offset",
				Rule: fmt.Sprintf("%d is outside partition %q: want 0 (before the first message) up to its head %d", r.Offset, r.Key, heads[0].HeadOffset)})
		}
	}
	affected := map[string]bool{}
	for _, h := range heads {
		affected[h.PartitionKey] = true
	}
	leases, err := a.c.drv.ListLeases(ctx, scope.Tenants, r.ConsumerGroup, r.Topic)
	if err != nil {
		return nil, err
	}
	now := a.c.cfg.Clock()
	for _, l := range leases {
		if l.Topic == r.Topic && l.ConsumerGroup == r.ConsumerGroup && affected[l.PartitionKey] && l.Owner != "" && l.ExpiresAt.After(now) && !r.Force {
			return nil, fmt.Errorf("shardq: admin: reset offsets: %w: %s held by %q until %s (stop it, or force)",
				ErrPartitionLeased, l.PartitionRef, l.Owner, l.ExpiresAt.Format(time.RFC3339))
		}
	}
	cursors, err := a.c.drv.TopicCursors(ctx, r.Tenant, r.Topic)
	if err != nil {
		return nil, err
	}
	current := map[string]int64{}
	for _, c := range cursors {
		if c.ConsumerGroup == r.ConsumerGroup {
			current[c.PartitionKey] = c.Committed
		}
	}
	var changes []OffsetChange
	for _, h := range heads {
		var to int64
		switch r.To {
		case ResetToLatest:
			to = h.HeadOffset
		case ResetToOffset:
			to = r.Offset
		case ResetToTime:
			if to, err = a.c.drv.OffsetBefore(ctx, r.Tenant, r.Topic, h.PartitionKey, r.Time); err != nil {
				return changes, err
			}
		}
		ch := OffsetChange{PartitionKey: h.PartitionKey, From: current[h.PartitionKey], To: to}
		if err := a.countBetween(ctx, r, &ch); err != nil {
			return changes, err
		}
		if !r.DryRun {
			if err := a.c.drv.ResetOffset(ctx, r.Tenant, r.Topic, h.PartitionKey, r.ConsumerGroup, to); err != nil {
				return changes, err
			}
		}
		changes = append(changes, ch)
	}
	return changes, nil
}

// countBetween fills ch's Replay or Skip: the messages between its two
// cursors, as the difference of two bounded lag counts.
func (a *Admin) countBetween(ctx context.Context, r ResetRequest, ch *OffsetChange) error {
	lo, hi := min(ch.From, ch.To), max(ch.From, ch.To)
	if lo == hi {
		return nil
	}
	fromLo, err := a.c.drv.PartitionLag(ctx, r.Tenant, r.Topic, ch.PartitionKey, lo)
	if err != nil {
		return err
	}
	fromHi, err := a.c.drv.PartitionLag(ctx, r.Tenant, r.Topic, ch.PartitionKey, hi)
	if err != nil {
		return err
	}
	n := fromLo.Lag - fromHi.Lag
	ch.Capped = fromLo.Capped
	if ch.To < ch.From {
		ch.Replay = n
	} else {
		ch.Skip = n
	}
	return nil
}

func filterKey(ps []driver.Partition, key string) []driver.Partition {
	for _, p := range ps {
		if p.PartitionKey == key {
			return []driver.Partition{p}
		}
	}
	return nil
}

// Where a consumer group stands with one message (MessageStatus).
const (
	StatusConsumed = "consumed"    // the group's cursor is past it
	StatusRetrying = "retrying"    // it failed and waits for another attempt
	StatusPending  = "not reached" // the group has not got to it yet (or is handling it now)
)

// GroupStatus is one consumer group's standing with a message.
type GroupStatus struct {
	ConsumerGroup string
	Status        string // StatusConsumed, StatusRetrying or StatusPending
	// Cursor is the group's committed cursor in the message's partition
	// (0 when it has none).
	Cursor int64
	// State is the group's retry bookkeeping of the message (zero when it
	// has none).
	State DeliveryState
}

// MessageStatus reads one message and where each consumer group that
// reads its topic stands with it: consumed (its cursor is past the
// message), retrying (a failed attempt is recorded), or not reached.
func (a *Admin) MessageStatus(ctx context.Context, ref MessageRef) (*StoredMessage, []GroupStatus, error) {
	m, states, err := a.Inspect(ctx, ref)
	if err != nil {
		return nil, nil, err
	}
	groups, err := a.c.drv.TopicGroups(ctx, ref.Tenant, ref.Topic)
	if err != nil {
		return nil, nil, err
	}
	cursors, err := a.c.drv.TopicCursors(ctx, ref.Tenant, ref.Topic)
	if err != nil {
		return nil, nil, err
	}
	cursor := map[string]int64{}
	for _, c := range cursors {
		if c.PartitionKey == ref.PartitionKey {
			cursor[c.ConsumerGroup] = c.Committed
		}
	}
	var out []GroupStatus
	for _, g := range groups {
		if g == RetentionGroup {
			continue
		}
		gs := GroupStatus{ConsumerGroup: g, Cursor: cursor[g], State: states[g], Status: StatusPending}
		switch {
		case gs.Cursor >= m.Offset:
			gs.Status = StatusConsumed
		case gs.State.Attempts > 0:
			gs.Status = StatusRetrying
		}
		out = append(out, gs)
	}
	return m, out, nil
}

// BrowseRequest selects messages to read without a consumer group.
type BrowseRequest struct {
	Tenant, Topic string
	// OnePartition limits the read to partition PartitionKey ("" is the
	// ungrouped one); otherwise every partition of the topic, in offset
	// order.
	OnePartition bool
	PartitionKey string
	// AfterOffset starts after this offset (0: from the first message).
	AfterOffset int64
	// FromTime, with OnePartition, starts at the first message created at
	// or after it (offsets order a partition, not a topic, by time).
	FromTime time.Time
	Limit    int // [DefaultPageLimit], at most MaxPageLimit
}

// Messages reads messages as they are stored, moving no cursor and
// touching no consumer group's state: Kafka's console consumer without a
// group, SQS's peek.
func (a *Admin) Messages(ctx context.Context, r BrowseRequest) ([]StoredMessage, error) {
	op := "shardq: admin: browse"
	if err := firstInvalid(ident.Tenant(r.Tenant), ident.Topic(r.Topic)); err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	if r.OnePartition {
		if err := ident.PartitionKey(r.PartitionKey); err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
	}
	switch {
	case r.AfterOffset < 0:
		return nil, fmt.Errorf("%s: %w", op, &ident.Error{Field: "from offset", Rule: fmt.Sprintf("%d is negative", r.AfterOffset)})
	case !r.FromTime.IsZero() && r.AfterOffset > 0:
		return nil, fmt.Errorf("%s: %w", op, &ident.Error{Field: "from time", Rule: "give an offset or a time, not both"})
	case !r.FromTime.IsZero() && !r.OnePartition:
		return nil, fmt.Errorf("%s: %w", op, &ident.Error{Field: "from time",
			Rule: "needs a partition key: offsets order a partition by time, not a topic"})
	case r.Limit < 0 || r.Limit > MaxPageLimit:
		return nil, fmt.Errorf("%s: %w", op, &ident.Error{Field: "limit", Rule: fmt.Sprintf("%d: want 1 to %d", r.Limit, MaxPageLimit)})
	}
	if r.Limit == 0 {
		r.Limit = DefaultPageLimit
	}
	var ms []driver.Message
	var err error
	if r.OnePartition {
		after := r.AfterOffset
		if !r.FromTime.IsZero() {
			if after, err = a.c.drv.OffsetBefore(ctx, r.Tenant, r.Topic, r.PartitionKey, r.FromTime); err != nil {
				return nil, err
			}
		}
		ms, err = a.c.drv.FetchAfter(ctx, r.Tenant, r.Topic, r.PartitionKey, after, r.Limit)
	} else {
		ms, err = a.c.drv.TopicMessages(ctx, driver.Scope{Tenants: []string{r.Tenant}, Limit: r.Limit,
			After: []string{r.Tenant, strconv.FormatInt(r.AfterOffset, 10)}}, r.Topic)
	}
	if err != nil {
		return nil, err
	}
	return mapSlice(ms, storedMessage), nil
}
