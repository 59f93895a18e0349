// SPDX-License-Identifier: Apache-2.0

// Package admin is the operator API's runtime (shardq.Admin, which the
// `shardq admin` commands wrap): listings, requeues, offset resets, group
// summaries and pauses, on driver types. The root package validates the
// operator's input, forwards and converts.
package admin

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
	"github.com/shardq/shardq/internal/large"
)

// MaxPageLimit bounds a listing's page; the reads below that go through
// every page use it.
const MaxPageLimit = 10000

// ErrPartitionLeased refuses an offset reset while a live subscriber holds
// a lease on an affected partition; the root package exports it.
var ErrPartitionLeased = errors.New("partition leased by a live subscriber")

// Offsets lists the cursors of s (of group alone when it is not ""); for
// one group, a page that is not full goes on with the partitions of its
// topics that have messages and no cursor of the group yet.
func Offsets(ctx context.Context, drv driver.Driver, s driver.Scope, group string) ([]driver.OffsetRow, error) {
	rows, err := drv.OffsetReport(ctx, s, group)
	if err == nil && group != "" && len(rows) < s.Limit {
		var unread []driver.OffsetRow
		unread, err = unreadRows(ctx, drv, s, group)
		rows = append(rows, unread...)
	}
	if err != nil {
		return rows, err
	}
	return rows, countDeferred(ctx, drv, rows)
}

// countDeferred fills each row's Deferred: one read per group and topic
// of the page, for its partitions.
func countDeferred(ctx context.Context, drv driver.Driver, rows []driver.OffsetRow) error {
	keys := map[driver.GroupRef][]string{}
	for _, r := range rows {
		g := driver.GroupRef{Tenant: r.Tenant, Topic: r.Topic, ConsumerGroup: r.ConsumerGroup}
		keys[g] = append(keys[g], r.PartitionKey)
	}
	counts := make(map[driver.GroupRef]map[string]int64, len(keys))
	for g, ks := range keys {
		n, err := drv.DeferredCounts(ctx, g, ks)
		if err != nil {
			return err
		}
		counts[g] = n
	}
	for i, r := range rows {
		rows[i].Deferred = counts[driver.GroupRef{Tenant: r.Tenant, Topic: r.Topic, ConsumerGroup: r.ConsumerGroup}][r.PartitionKey]
	}
	return nil
}

// unreadRows lists, for every topic of s that group reads, the partitions
// with messages the group has no cursor for (up to MaxPageLimit a topic).
func unreadRows(ctx context.Context, drv driver.Driver, s driver.Scope, group string) ([]driver.OffsetRow, error) {
	var out []driver.OffsetRow
	err := EachTopic(ctx, drv, s, func(t driver.TopicSummary) error {
		groups, err := drv.TopicGroups(ctx, t.Tenant, t.Topic)
		if err != nil || !slices.Contains(groups, group) {
			return err
		}
		rows, err := drv.UnreadPartitions(ctx, driver.GroupRef{Tenant: t.Tenant, Topic: t.Topic, ConsumerGroup: group}, MaxPageLimit)
		for _, r := range rows {
			if r.HeadOffset > r.CommittedOffset {
				out = append(out, r)
			}
		}
		return err
	})
	return out, err
}

// EachTopic calls fn with every topic of s's tenants, reading them a page
// at a time.
func EachTopic(ctx context.Context, drv driver.Driver, s driver.Scope, fn func(driver.TopicSummary) error) error {
	page := driver.Scope{Tenants: s.Tenants, AllTenants: s.AllTenants, Limit: MaxPageLimit}
	for {
		ts, err := drv.Topics(ctx, page)
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

// StaleLeases lists the held leases of one page of lease rows that are
// past expiry by now or whose holder's heartbeat is older than
// staleAfter.
func StaleLeases(ctx context.Context, drv driver.Driver, s driver.Scope, staleAfter time.Duration, now time.Time) ([]driver.Lease, error) {
	leases, err := drv.AllLeases(ctx, s)
	if err != nil {
		return nil, err
	}
	// The members of the groups on this page, read group by group (each
	// read names its tenant, group and topic).
	fresh := map[[4]string]bool{}
	read := map[[3]string]bool{}
	for _, l := range leases {
		g := [3]string{l.Tenant, l.ConsumerGroup, l.Topic}
		if l.Owner == "" || read[g] {
			continue
		}
		read[g] = true
		subs, err := drv.Subscribers(ctx, driver.GroupScope{Tenants: []string{l.Tenant}, Topic: l.Topic, ConsumerGroup: l.ConsumerGroup})
		if err != nil {
			return nil, err
		}
		for _, sub := range subs {
			if now.Sub(sub.HeartbeatAt) < staleAfter {
				fresh[[4]string{sub.Tenant, sub.ConsumerGroup, sub.Topic, sub.Name}] = true
			}
		}
	}
	var out []driver.Lease
	for _, l := range leases {
		if l.Owner != "" && (!l.ExpiresAt.After(now) || !fresh[[4]string{l.Tenant, l.ConsumerGroup, l.Topic, l.Owner}]) {
			out = append(out, l)
		}
	}
	return out, nil
}

// Requeue moves the dead letter dl (in a dead-letter topic) back to the
// topic toTopic with a fresh offset, without its dlq_ headers.
func Requeue(ctx context.Context, drv driver.Driver, dl driver.MessageRef, toTopic string) (*driver.InsertMessage, error) {
	m, _, err := drv.GetMessage(ctx, dl)
	if err != nil {
		return nil, err
	}
	if m == nil {
		return nil, fmt.Errorf("shardq: admin: requeue tenant %q topic %q partition %q id %q: %w", dl.Tenant, dl.Topic, dl.PartitionKey, dl.ID, driver.ErrNoMessage)
	}
	headers := maps.Clone(m.Headers)
	maps.DeleteFunc(headers, func(k, _ string) bool { return strings.HasPrefix(k, "dlq_") })
	if large.KindOf(m) == large.End && !large.IsAborted(m) {
		if err := requeueChunks(ctx, drv, dl, m, toTopic); err != nil {
			return nil, err
		}
	}
	return drv.Requeue(ctx, dl, toTopic, headers)
}

// requeueChunks moves the chunks of the large dead letter whose end
// marker is end back to toTopic, in order, one transaction each; the end
// marker, moved last, makes the message whole there again. A requeue cut
// short is finished by running it again: a chunk already moved is found
// in toTopic and skipped. (Readers in toTopic wait for the end marker up
// to their LargeWriteTimeout from the last move.)
func requeueChunks(ctx context.Context, drv driver.Driver, dl driver.MessageRef, end *driver.Message, toTopic string) error {
	n, err := strconv.Atoi(end.Headers[large.HeaderChunks])
	if err != nil || n < 0 {
		return fmt.Errorf("shardq: admin: requeue tenant %q topic %q partition %q id %q: %w: chunk count %q",
			dl.Tenant, dl.Topic, dl.PartitionKey, dl.ID, large.ErrCorrupt, end.Headers[large.HeaderChunks])
	}
	for i := range n {
		ref := dl
		ref.ID = large.ChunkID(dl.ID, i)
		c, _, err := drv.GetMessage(ctx, ref)
		if err != nil {
			return err
		}
		if c == nil {
			moved := ref
			moved.Topic = toTopic
			if c, _, err = drv.GetMessage(ctx, moved); err != nil {
				return err
			}
			if c == nil {
				return fmt.Errorf("shardq: admin: requeue tenant %q topic %q partition %q id %q: chunk %d: %w",
					dl.Tenant, dl.Topic, dl.PartitionKey, dl.ID, i, driver.ErrNoMessage)
			}
			continue // moved by an earlier requeue
		}
		if _, err := drv.Requeue(ctx, ref, toTopic, c.Headers); err != nil {
			return err
		}
	}
	return nil
}

// Target is where Reset moves cursors (shardq.ResetTarget's values).
type Target int

const (
	ToEarliest Target = iota + 1
	ToLatest
	ToOffset
	ToTime
)

// Reset moves a consumer group's cursors on one tenant's topic, validated
// as far as the input alone allows.
type Reset struct {
	Tenant, Topic, Group string
	To                   Target
	Key                  string // with ToOffset
	Offset               int64  // with ToOffset
	Time                 time.Time
	Force, DryRun        bool
	Create               bool
}

// Change is one cursor a reset moves (shardq.OffsetChange).
type Change struct {
	PartitionKey string
	From, To     int64
	Replay, Skip int64
	Capped       bool
}

// Check validates r before any SQL runs.
func (r Reset) Check() error {
	for _, err := range []error{ident.Tenant(r.Tenant), ident.Topic(r.Topic), ident.ConsumerGroup(r.Group)} {
		if err != nil {
			return err
		}
	}
	switch {
	case r.To < ToEarliest || r.To > ToTime:
		return &ident.Error{Field: "target", Rule: "choose earliest, latest, an offset or a time"}
	case r.To == ToOffset && r.Offset < 0:
		return &ident.Error{Field: "offset", Rule: fmt.Sprintf("%d: must not be negative", r.Offset)}
	case r.To == ToOffset:
		return ident.PartitionKey(r.Key)
	}
	return nil
}

// ResetOffsets moves cursors as r says (not with DryRun) and returns what
// changed, refusing (ErrPartitionLeased) while a lease unexpired by now
// covers an affected partition, unless r.Force.
func ResetOffsets(ctx context.Context, drv driver.Driver, r Reset, now time.Time) ([]Change, error) {
	if !r.Create {
		groups, err := drv.TopicGroups(ctx, r.Tenant, r.Topic)
		if err != nil {
			return nil, err
		}
		if !slices.Contains(groups, r.Group) {
			return nil, fmt.Errorf("shardq: admin: reset offsets: %w", &ident.Error{Field: "consumer group",
				Rule: fmt.Sprintf("%q has never read tenant %q topic %q (known: %s); set Create (--create) to start it at the new position",
					r.Group, r.Tenant, r.Topic, strings.Join(groups, ", "))})
		}
	}
	tenants := []string{r.Tenant}
	heads, err := drv.PartitionHeads(ctx, tenants, r.Topic)
	if err != nil {
		return nil, err
	}
	if r.To == ToOffset {
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
	leases, err := drv.ListLeases(ctx, driver.GroupScope{Tenants: tenants, Topic: r.Topic, ConsumerGroup: r.Group})
	if err != nil {
		return nil, err
	}
	for _, l := range leases {
		if l.Topic == r.Topic && l.ConsumerGroup == r.Group && affected[l.PartitionKey] && l.Owner != "" && l.ExpiresAt.After(now) && !r.Force {
			return nil, fmt.Errorf("shardq: admin: reset offsets: %w: %s held by %q until %s (stop it, or force)",
				ErrPartitionLeased, l.PartitionRef, l.Owner, l.ExpiresAt.Format(time.RFC3339))
		}
	}
	cursors, err := drv.TopicCursors(ctx, r.Tenant, r.Topic)
	if err != nil {
		return nil, err
	}
	current := map[string]int64{}
	for _, c := range cursors {
		if c.ConsumerGroup == r.Group {
			current[c.PartitionKey] = c.Committed
		}
	}
	var changes []Change
	for _, h := range heads {
		var to int64
		switch r.To {
		case ToLatest:
			to = h.HeadOffset
		case ToOffset:
			to = r.Offset
		case ToTime:
			if to, err = drv.OffsetBefore(ctx, driver.TopicPartition{Tenant: r.Tenant, Topic: r.Topic, PartitionKey: h.PartitionKey}, r.Time); err != nil {
				return changes, err
			}
		}
		ch := Change{PartitionKey: h.PartitionKey, From: current[h.PartitionKey], To: to}
		if err := countBetween(ctx, drv, r, &ch); err != nil {
			return changes, err
		}
		if !r.DryRun {
			if err := drv.ResetOffset(ctx, driver.PartitionRef{Tenant: r.Tenant, Topic: r.Topic, PartitionKey: h.PartitionKey, ConsumerGroup: r.Group}, to); err != nil {
				return changes, err
			}
		}
		changes = append(changes, ch)
	}
	return changes, nil
}

// countBetween fills ch's Replay or Skip: the messages between its two
// cursors, as the difference of two bounded lag counts.
func countBetween(ctx context.Context, drv driver.Driver, r Reset, ch *Change) error {
	lo, hi := min(ch.From, ch.To), max(ch.From, ch.To)
	if lo == hi {
		return nil
	}
	fromLo, err := drv.PartitionLag(ctx, driver.TopicPartition{Tenant: r.Tenant, Topic: r.Topic, PartitionKey: ch.PartitionKey}, lo)
	if err != nil {
		return err
	}
	fromHi, err := drv.PartitionLag(ctx, driver.TopicPartition{Tenant: r.Tenant, Topic: r.Topic, PartitionKey: ch.PartitionKey}, hi)
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

// Where a group stands with a message (shardq's StatusConsumed, ...).
const (
	Consumed = "consumed"    // the group's cursor is past it
	Retrying = "retrying"    // it failed and waits for another attempt
	Pending  = "not reached" // the group has not got to it yet (or is handling it now)
)

// Standing is one consumer group's standing with a message.
type Standing struct {
	Group  string
	Status string // Consumed, Retrying or Pending
	Cursor int64  // the group's cursor in the message's partition (0: none)
	State  driver.DeliveryState
}

// Standings lists, for every group that reads the topic of m (at offset,
// its message ref) (retention's claim group aside), its cursor in ref's
// partition, its bookkeeping of the message, from states (GetMessage's),
// and what they say.
func Standings(ctx context.Context, drv driver.Driver, ref driver.MessageRef, offset int64, states map[string]driver.DeliveryState) ([]Standing, error) {
	groups, err := drv.TopicGroups(ctx, ref.Tenant, ref.Topic)
	if err != nil {
		return nil, err
	}
	cursors, err := drv.TopicCursors(ctx, ref.Tenant, ref.Topic)
	if err != nil {
		return nil, err
	}
	cursor := map[string]int64{}
	for _, c := range cursors {
		if c.PartitionKey == ref.PartitionKey {
			cursor[c.ConsumerGroup] = c.Committed
		}
	}
	var out []Standing
	for _, g := range groups {
		if g == driver.RetentionGroup {
			continue
		}
		st := Standing{Group: g, Cursor: cursor[g], State: states[g], Status: Pending}
		switch {
		case st.Cursor >= offset:
			st.Status = Consumed
		case st.State.Attempts > 0:
			st.Status = Retrying
		}
		out = append(out, st)
	}
	return out, nil
}

// Browse selects messages to read without a consumer group, validated.
type Browse struct {
	Tenant, Topic string
	OnePartition  bool
	PartitionKey  string
	AfterOffset   int64
	FromTime      time.Time // with OnePartition
	Limit         int
}

// Check validates r before any SQL runs; a Limit of 0 is the caller's
// default, set before.
func (r Browse) Check() error {
	if err := ident.Tenant(r.Tenant); err != nil {
		return err
	}
	if err := ident.Topic(r.Topic); err != nil {
		return err
	}
	if r.OnePartition {
		if err := ident.PartitionKey(r.PartitionKey); err != nil {
			return err
		}
	}
	switch {
	case r.AfterOffset < 0:
		return &ident.Error{Field: "from offset", Rule: fmt.Sprintf("%d is negative", r.AfterOffset)}
	case !r.FromTime.IsZero() && r.AfterOffset > 0:
		return &ident.Error{Field: "from time", Rule: "give an offset or a time, not both"}
	case !r.FromTime.IsZero() && !r.OnePartition:
		return &ident.Error{Field: "from time", Rule: "needs a partition key: offsets order a partition by time, not a topic"}
	case r.Limit < 1 || r.Limit > MaxPageLimit:
		return &ident.Error{Field: "limit", Rule: fmt.Sprintf("%d: want 1 to %d", r.Limit, MaxPageLimit)}
	}
	return nil
}

// RequeueAll requeues every dead letter of tenant's topic (in its
// dead-letter topic topic+suffix), in offset order, calling done after
// each, and returns how many. A large dead letter counts once: its chunks
// move with its end marker.
func RequeueAll(ctx context.Context, drv driver.Driver, tenant, topic, suffix string, done func()) (int, error) {
	// What is dead-lettered while it runs (a requeued message failing
	// again at once) waits for the next run: it ends at today's head.
	head, err := topicHead(ctx, drv, tenant, topic+suffix)
	if err != nil {
		return 0, err
	}
	n := 0
	after := int64(0)
	for after < head {
		dls, err := drv.TopicMessages(ctx, driver.Scope{Tenants: []string{tenant}, Limit: 100,
			After: []string{tenant, strconv.FormatInt(after, 10)}}, topic+suffix)
		if err != nil || len(dls) == 0 {
			return n, err
		}
		after = dls[len(dls)-1].Offset
		for _, m := range dls {
			if m.Offset > head {
				return n, nil
			}
			if k := large.KindOf(&m); k == large.First || k == large.Chunk {
				continue
			}
			ref := driver.MessageRef{Tenant: tenant, Topic: topic + suffix, PartitionKey: m.PartitionKey, ID: m.ID}
			if _, err := Requeue(ctx, drv, ref, topic); err != nil {
				return n, err
			}
			n++
			done()
		}
	}
	return n, nil
}

// topicHead is the highest offset of tenant's topic (0: none).
func topicHead(ctx context.Context, drv driver.Driver, tenant, topic string) (int64, error) {
	after := []string{tenant, ""}
	for {
		ts, err := drv.Topics(ctx, driver.Scope{Tenants: []string{tenant}, Limit: 1000, After: after})
		if err != nil {
			return 0, err
		}
		for _, t := range ts {
			if t.Topic == topic {
				return t.HeadOffset, nil
			}
		}
		if len(ts) < 1000 {
			return 0, nil
		}
		after = []string{tenant, ts[len(ts)-1].Topic}
	}
}

// Listed lists the messages of topic as one entry each: a large
// message's chunks are left out, its end marker stands for it. It reads
// on past pages of chunks until s.Limit entries or the end, so that a
// short page still means the last one.
func Listed(ctx context.Context, drv driver.Driver, s driver.Scope, topic string) ([]driver.Message, error) {
	var out []driver.Message
	for {
		ms, err := drv.TopicMessages(ctx, s, topic)
		if err != nil {
			return out, err
		}
		for _, m := range ms {
			if k := large.KindOf(&m); k != large.First && k != large.Chunk {
				out = append(out, m)
			}
			if len(out) == s.Limit {
				return out, nil
			}
		}
		if len(ms) < s.Limit {
			return out, nil
		}
		last := ms[len(ms)-1]
		s.After = []string{last.Tenant, strconv.FormatInt(last.Offset, 10)}
	}
}

// Messages reads messages as they are stored, moving no cursor.
func Messages(ctx context.Context, drv driver.Driver, r Browse) ([]driver.Message, error) {
	if !r.OnePartition {
		return drv.TopicMessages(ctx, driver.Scope{Tenants: []string{r.Tenant}, Limit: r.Limit,
			After: []string{r.Tenant, strconv.FormatInt(r.AfterOffset, 10)}}, r.Topic)
	}
	after := r.AfterOffset
	if !r.FromTime.IsZero() {
		var err error
		if after, err = drv.OffsetBefore(ctx, driver.TopicPartition{Tenant: r.Tenant, Topic: r.Topic, PartitionKey: r.PartitionKey}, r.FromTime); err != nil {
			return nil, err
		}
	}
	return drv.FetchAfter(ctx, driver.TopicPartition{Tenant: r.Tenant, Topic: r.Topic, PartitionKey: r.PartitionKey}, after, r.Limit)
}
