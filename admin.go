// SPDX-License-Identifier: Apache-2.0

package shardq

import (
	"context"
	"fmt"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/admin"
	"github.com/shardq/shardq/internal/ident"
)

// Page sizes of the operator's listings.
const (
	DefaultPageLimit = 1000
	MaxPageLimit     = admin.MaxPageLimit
)

// ErrNoMessage means no message has the given identity.
var ErrNoMessage = driver.ErrNoMessage

// ErrPartitionLeased refuses an offset reset while a live subscriber holds
// a lease on an affected partition (see ResetRequest.Force).
var ErrPartitionLeased = admin.ErrPartitionLeased

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
		rows, err := admin.Offsets(ctx, a.c.drv, s.toDriver(), group)
		return mapSlice(rows, func(o driver.OffsetRow) GroupOffset {
			return GroupOffset{Tenant: o.Tenant, Topic: o.Topic, PartitionKey: o.PartitionKey, ConsumerGroup: o.ConsumerGroup,
				HeadOffset: o.HeadOffset, CommittedOffset: o.CommittedOffset, Lag: o.Lag, LagCapped: o.LagCapped, Scheduled: o.Scheduled, OldestUnconsumed: o.OldestUnconsumed,
				NoCursor: o.NoCursor, Deferred: o.Deferred}
		}), err
	})
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
		if err := a.c.syncClock(ctx); err != nil {
			return nil, fmt.Errorf("shardq: admin stale leases: %w", err)
		}
		ls, err := admin.StaleLeases(ctx, a.c.drv, s.toDriver(), staleAfter, a.c.cfg.Clock())
		return mapSlice(ls, leaseOf), err
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
		out[g] = DeliveryState(st)
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

// DeadLetters lists the dead letters of r.Topic (r.Topic + r.Suffix;
// suffix "" means ".dlq") in r.Scope's tenants. Sort key: (tenant, offset).
// A large dead letter is one entry, its end marker (HeaderLargeBytes
// gives its size): its chunks are not listed.
func (a *Admin) DeadLetters(ctx context.Context, r DeadLetterRequest) ([]StoredMessage, error) {
	s, topic, suffix := r.Scope, r.Topic, r.Suffix
	if suffix == "" {
		suffix = DefaultDLQSuffix
	}
	if err := ident.Topic(topic + suffix); err != nil {
		return nil, fmt.Errorf("shardq: admin: %w", err)
	}
	return scoped(s, func(s Scope) ([]StoredMessage, error) {
		ms, err := admin.Listed(ctx, a.c.drv, s.toDriver(), topic+suffix)
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
	if err := a.c.tenants.Check(ctx, ref.Tenant); err != nil { // a requeue is a publish
		return nil, fmt.Errorf("shardq: admin: requeue: %w", err)
	}
	dl := ref
	dl.Topic = ref.Topic + suffix
	im, err := admin.Requeue(ctx, a.c.drv, dl.toDriver(), ref.Topic)
	if err != nil {
		return nil, err
	}
	return &PublishResult{Tenant: im.Tenant, Topic: im.Topic, PartitionKey: im.PartitionKey, ID: im.ID, Offset: im.Offset}, nil
}

// RequeueAll requeues every dead letter of one tenant's topic (its
// dead-letter topic is t.Topic + suffix, ".dlq" when suffix is ""), in
// offset order, and returns how many.
func (a *Admin) RequeueAll(ctx context.Context, t TopicRef, suffix string) (int, error) {
	if suffix == "" {
		suffix = DefaultDLQSuffix
	}
	if err := firstInvalid(ident.Tenant(t.Tenant), ident.Topic(t.Topic), ident.Topic(t.Topic+suffix)); err != nil {
		return 0, fmt.Errorf("shardq: admin: %w", err)
	}
	if err := a.c.tenants.Check(ctx, t.Tenant); err != nil {
		return 0, fmt.Errorf("shardq: admin: requeue: %w", err)
	}
	return admin.RequeueAll(ctx, a.c.drv, t.Tenant, t.Topic, suffix, func() { a.advance(1) })
}

// CommitHalf resolves a pending transactional half message by hand: it
// enters its partition with a fresh offset. ErrTxResolved when it was
// resolved already.
func (a *Admin) CommitHalf(ctx context.Context, ref MessageRef) (*PublishResult, error) {
	if err := checkRef(ref); err != nil {
		return nil, fmt.Errorf("shardq: admin: %w", err)
	}
	if err := a.c.tenants.Check(ctx, ref.Tenant); err != nil { // it enters its partition: a publish
		return nil, fmt.Errorf("shardq: admin: commit half: %w", err)
	}
	hc := &driver.HalfCommit{Ref: ref.toDriver()}
	if err := a.c.drv.CommitHalves(ctx, []*driver.HalfCommit{hc}); err != nil {
		return nil, err
	}
	m := hc.Message
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
	reset := admin.Reset{Tenant: r.Tenant, Topic: r.Topic, Group: r.ConsumerGroup, To: admin.Target(r.To),
		Key: r.Key, Offset: r.Offset, Time: r.Time, Force: r.Force, DryRun: r.DryRun, Create: r.Create}
	if err := reset.Check(); err != nil {
		return nil, fmt.Errorf("shardq: admin: reset offsets: %w", err)
	}
	if err := a.c.syncClock(ctx); err != nil {
		return nil, fmt.Errorf("shardq: admin: reset offsets: %w", err)
	}
	changes, err := admin.ResetOffsets(ctx, a.c.drv, reset, a.c.cfg.Clock())
	return mapSlice(changes, func(c admin.Change) OffsetChange { return OffsetChange(c) }), err
}

// Where a consumer group stands with one message (MessageStatus).
const (
	StatusConsumed = admin.Consumed // the group's cursor is past it
	StatusRetrying = admin.Retrying // it failed and waits for another attempt
	StatusPending  = admin.Pending  // the group has not got to it yet (or is handling it now)
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
	drvStates := make(map[string]driver.DeliveryState, len(states))
	for g, st := range states {
		drvStates[g] = driver.DeliveryState(st)
	}
	standings, err := admin.Standings(ctx, a.c.drv, ref.toDriver(), m.Offset, drvStates)
	return m, mapSlice(standings, func(st admin.Standing) GroupStatus {
		return GroupStatus{ConsumerGroup: st.Group, Status: st.Status, Cursor: st.Cursor, State: DeliveryState(st.State)}
	}), err
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
	if r.Limit == 0 {
		r.Limit = DefaultPageLimit
	}
	b := admin.Browse{Tenant: r.Tenant, Topic: r.Topic, OnePartition: r.OnePartition, PartitionKey: r.PartitionKey,
		AfterOffset: r.AfterOffset, FromTime: r.FromTime, Limit: r.Limit}
	if err := b.Check(); err != nil {
		return nil, fmt.Errorf("shardq: admin: browse: %w", err)
	}
	ms, err := admin.Messages(ctx, a.c.drv, b)
	return mapSlice(ms, storedMessage), err
}
