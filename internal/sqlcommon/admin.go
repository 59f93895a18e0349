// SPDX-License-Identifier: Apache-2.0

package sqlcommon

import (
	"context"
	"database/sql"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/shardq/shardq/driver"
)

func emptyScope(s driver.Scope) bool { return !s.AllTenants && len(s.Tenants) == 0 }

// listing binds a paged listing over s, whose sort key has n text columns.
func listing(q scoped, s driver.Scope, n int, more Args) (string, Args, error) {
	stmt, args := q.pick(s)
	page, err := pageArgs(s, n)
	if err != nil {
		return "", nil, err
	}
	return stmt, args.with(page).with(more), nil
}

// Topics summarises the head rows per tenant and topic.
func (d *Store) Topics(ctx context.Context, s driver.Scope) ([]driver.TopicSummary, error) {
	if emptyScope(s) {
		return nil, nil
	}
	stmt, args, err := listing(d.sql().admin.topics, s, 2, nil)
	if err != nil {
		return nil, fmt.Errorf("list topics: %w", err)
	}
	rows, err := d.query(ctx, d.Read, stmt, args)
	if err != nil {
		return nil, d.Wrap("list topics", err)
	}
	defer rows.Close()
	var out []driver.TopicSummary
	for rows.Next() {
		var t driver.TopicSummary
		if err := rows.Scan(&t.Tenant, &t.Topic, &t.Partitions, &t.HeadOffset); err != nil {
			return nil, fmt.Errorf("list topics: %w", err)
		}
		out = append(out, t)
	}
	return out, rows.Err()
}

// OffsetReport joins a page of cursors with their head rows; then, per
// cursor behind its head, one bounded read counts the messages after it
// (at most LagCountLimit+1 rows of the primary key) and takes the first
// one's time.
func (d *Store) OffsetReport(ctx context.Context, s driver.Scope, group string) ([]driver.OffsetRow, error) {
	if emptyScope(s) {
		return nil, nil
	}
	stmt, args, err := listing(d.sql().admin.offsetReport, s, 4, Args{"group": group})
	if err != nil {
		return nil, fmt.Errorf("report offsets: %w", err)
	}
	rows, err := d.query(ctx, d.Read, stmt, args)
	if err != nil {
		return nil, d.Wrap("report offsets", err)
	}
	var out []driver.OffsetRow
	for rows.Next() {
		var r driver.OffsetRow
		var updated any
		if err := rows.Scan(&r.Tenant, &r.Topic, &r.PartitionKey, &r.ConsumerGroup, &r.HeadOffset, &r.CommittedOffset, &updated); err != nil {
			rows.Close()
			return nil, fmt.Errorf("report offsets: %w", err)
		}
		if r.CommittedAt, err = d.DecodeTime(updated); err != nil {
			rows.Close()
			return nil, fmt.Errorf("report offsets: %w", err)
		}
		out = append(out, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("report offsets: %w", err)
	}
	for i := range out {
		if out[i].HeadOffset > out[i].CommittedOffset {
			if err := d.countLag(ctx, &out[i]); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// PartitionLag counts one partition's messages after a cursor: one
// bounded read (at most LagCountLimit+1 rows of the primary key).
func (d *Store) PartitionLag(ctx context.Context, p driver.TopicPartition, after int64) (driver.PartitionLag, error) {
	tenant, topic, partitionKey := p.Tenant, p.Topic, p.PartitionKey
	r := driver.OffsetRow{Tenant: tenant, Topic: topic, PartitionKey: partitionKey, CommittedOffset: after}
	err := d.countLag(ctx, &r)
	return driver.PartitionLag{Lag: r.Lag, Capped: r.LagCapped, OldestUnconsumed: r.OldestUnconsumed}, err
}

func (d *Store) countLag(ctx context.Context, r *driver.OffsetRow) error {
	op := fmt.Sprintf("count lag of group %q in tenant %q topic %q partition %q", r.ConsumerGroup, r.Tenant, r.Topic, r.PartitionKey)
	var oldest any
	if err := d.queryRow(ctx, d.Read, d.sql().admin.lag, Args{"tenant": r.Tenant, "topic": r.Topic, "key": r.PartitionKey,
		"after": r.CommittedOffset, "limit": driver.LagCountLimit + 1, "now": d.EncodeTime(time.Now())}).Scan(&r.Lag, &oldest, &r.Scheduled); err != nil {
		return d.Wrap(op, err)
	}
	if r.Lag > driver.LagCountLimit {
		r.Lag, r.LagCapped = driver.LagCountLimit, true
	}
	if oldest != nil {
		t, err := d.DecodeTime(oldest)
		if err != nil {
			return fmt.Errorf("%s: %w", op, err)
		}
		r.OldestUnconsumed = t
	}
	return nil
}

// TopicCursors lists every group's cursor in one tenant's topic: a range
// of queue_offsets' primary key.
func (d *Store) TopicCursors(ctx context.Context, tenant, topic string) ([]driver.Cursor, error) {
	op := fmt.Sprintf("list cursors of tenant %q topic %q", tenant, topic)
	rows, err := d.query(ctx, d.Read, d.sql().admin.cursors, Args{"tenant": tenant, "topic": topic})
	if err != nil {
		return nil, d.Wrap(op, err)
	}
	defer rows.Close()
	var out []driver.Cursor
	for rows.Next() {
		var c driver.Cursor
		if err := rows.Scan(&c.ConsumerGroup, &c.PartitionKey, &c.Committed); err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

// AllLeases lists lease rows of every group and topic in s.
func (d *Store) AllLeases(ctx context.Context, s driver.Scope) ([]driver.Lease, error) {
	if emptyScope(s) {
		return nil, nil
	}
	stmt, args, err := listing(d.sql().admin.leases, s, 4, nil)
	if err != nil {
		return nil, fmt.Errorf("list leases: %w", err)
	}
	rows, err := d.query(ctx, d.Read, stmt, args)
	if err != nil {
		return nil, d.Wrap("list leases", err)
	}
	defer rows.Close()
	var out []driver.Lease
	for rows.Next() {
		var l driver.Lease
		var exp any
		if err := rows.Scan(&l.Tenant, &l.ConsumerGroup, &l.Topic, &l.PartitionKey, &l.Owner, &l.Token, &exp); err != nil {
			return nil, fmt.Errorf("list leases: %w", err)
		}
		if l.ExpiresAt, err = d.DecodeTime(exp); err != nil {
			return nil, fmt.Errorf("list leases: %w", err)
		}
		out = append(out, l)
	}
	return out, rows.Err()
}

// AllSubscribers lists heartbeat rows of every group and topic in s.
func (d *Store) AllSubscribers(ctx context.Context, s driver.Scope) ([]driver.Subscriber, error) {
	if emptyScope(s) {
		return nil, nil
	}
	stmt, args, err := listing(d.sql().admin.members, s, 4, nil)
	if err != nil {
		return nil, fmt.Errorf("list subscribers: %w", err)
	}
	rows, err := d.query(ctx, d.Read, stmt, args)
	if err != nil {
		return nil, d.Wrap("list subscribers", err)
	}
	defer rows.Close()
	var out []driver.Subscriber
	for rows.Next() {
		var sub driver.Subscriber
		var started, beat any
		if err := rows.Scan(&sub.Tenant, &sub.ConsumerGroup, &sub.Topic, &sub.Name, &started, &beat); err != nil {
			return nil, fmt.Errorf("list subscribers: %w", err)
		}
		if sub.StartedAt, err = d.DecodeTime(started); err == nil {
			sub.HeartbeatAt, err = d.DecodeTime(beat)
		}
		if err != nil {
			return nil, fmt.Errorf("list subscribers: %w", err)
		}
		out = append(out, sub)
	}
	return out, rows.Err()
}

func (d *Store) scanMessages(rows *sql.Rows, op string) ([]driver.Message, error) {
	defer rows.Close()
	var out []driver.Message
	for rows.Next() {
		var m driver.Message
		var headers []byte
		var created, notBefore any
		if err := rows.Scan(&m.Offset, &m.Tenant, &m.Topic, &m.PartitionKey, &m.ID, &headers, &m.Payload, &created, &notBefore); err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		var err error
		if m.Headers, err = DecodeHeaders(headers); err == nil {
			m.CreatedAt, err = d.DecodeTime(created)
		}
		if err == nil {
			m.NotBefore, err = d.decodeNotBefore(notBefore)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		if m.Payload == nil {
			m.Payload = []byte{}
		}
		out = append(out, m)
	}
	return out, rows.Err()
}

// GetMessage reads a message by identity and its bookkeeping per group.
func (d *Store) GetMessage(ctx context.Context, ref driver.MessageRef) (*driver.Message, map[string]driver.DeliveryState, error) {
	op := fmt.Sprintf("inspect tenant %q topic %q partition %q id %q", ref.Tenant, ref.Topic, ref.PartitionKey, ref.ID)
	rows, err := d.query(ctx, d.Read, d.sql().admin.message, messageNamed(ref))
	if err != nil {
		return nil, nil, d.Wrap(op, err)
	}
	ms, err := d.scanMessages(rows, op)
	if err != nil || len(ms) == 0 {
		return nil, nil, err
	}
	m := &ms[0]
	rows, err = d.query(ctx, d.Read, d.sql().admin.messageStates, messageNamed(ref).with(Args{"offset": m.Offset}))
	if err != nil {
		return nil, nil, d.Wrap(op, err)
	}
	defer rows.Close()
	states, err := scanStates[string](d, rows, op)
	return m, states, err
}

// DeleteMessage deletes exactly the row with ref's identity.
func (d *Store) DeleteMessage(ctx context.Context, ref driver.MessageRef) (bool, error) {
	res, err := d.exec(ctx, d.Write, d.sql().admin.deleteMessage, messageNamed(ref))
	if err != nil {
		return false, d.Wrap(fmt.Sprintf("delete tenant %q topic %q partition %q id %q", ref.Tenant, ref.Topic, ref.PartitionKey, ref.ID), err)
	}
	// The identity is a unique key: at most one row matches. Report any
	// deletion as one (n > 0), never as "nothing".
	n, err := res.RowsAffected()
	return n > 0, err
}

// TopicMessages lists a topic's messages in s, oldest first.
func (d *Store) TopicMessages(ctx context.Context, s driver.Scope, topic string) ([]driver.Message, error) {
	if emptyScope(s) {
		return nil, nil
	}
	stmt, args := d.sql().admin.topicMessages.pick(s)
	args = args.with(Args{"topic": topic, "after_tenant": "", "after_offset": int64(0), "limit": limitOf(s)})
	if len(s.After) > 0 {
		// The offset is a number: compared as one, not as text.
		if len(s.After) != 2 {
			return nil, fmt.Errorf("list messages of topic %q: page after: %d values, want (tenant, offset)", topic, len(s.After))
		}
		off, err := strconv.ParseInt(s.After[1], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("list messages of topic %q: page after: offset %q: %w", topic, s.After[1], err)
		}
		args["after_tenant"], args["after_offset"] = s.After[0], off
	}
	rows, err := d.query(ctx, d.Read, stmt, args)
	if err != nil {
		return nil, d.Wrap(fmt.Sprintf("list messages of topic %q", topic), err)
	}
	return d.scanMessages(rows, fmt.Sprintf("list messages of topic %q", topic))
}

// Requeue moves a message to toTopic with a fresh offset: it deletes the
// message and any same-identity row in toTopic (the original the dead
// letter was copied from) with its bookkeeping, then appends.
func (d *Store) Requeue(ctx context.Context, ref driver.MessageRef, toTopic string, headers map[string]string) (*driver.InsertMessage, error) {
	op := fmt.Sprintf("requeue tenant %q topic %q partition %q id %q to topic %q", ref.Tenant, ref.Topic, ref.PartitionKey, ref.ID, toTopic)
	return inTx(ctx, d.Begin, func(tx *sql.Tx) (*driver.InsertMessage, error) {
		st := &d.sql().admin
		rows, err := d.query(ctx, tx, st.lockMessage, messageNamed(ref))
		if err != nil {
			return nil, d.Wrap(op, err)
		}
		ms, err := d.scanMessages(rows, op)
		if err != nil {
			return nil, err
		}
		if len(ms) == 0 {
			return nil, fmt.Errorf("%s: %w", op, driver.ErrNoMessage)
		}
		orig := driver.MessageRef{Tenant: ref.Tenant, Topic: toTopic, PartitionKey: ref.PartitionKey, ID: ref.ID}
		rows, err = d.query(ctx, tx, st.lockMessage, messageNamed(orig))
		if err != nil {
			return nil, d.Wrap(op, err)
		}
		origs, err := d.scanMessages(rows, op)
		if err != nil {
			return nil, err
		}
		if len(origs) > 0 {
			if _, err := d.exec(ctx, tx, st.deleteMessage, messageNamed(orig)); err != nil {
				return nil, d.Wrap(op, err)
			}
			if _, err := d.exec(ctx, tx, st.deleteStates, messageNamed(orig).with(Args{"offset": origs[0].Offset})); err != nil {
				return nil, d.Wrap(op, err)
			}
		}
		if _, err := d.exec(ctx, tx, st.deleteMessage, messageNamed(ref)); err != nil {
			return nil, d.Wrap(op, err)
		}
		m := &driver.InsertMessage{Tenant: ref.Tenant, Topic: toTopic, PartitionKey: ref.PartitionKey, ID: ref.ID,
			Headers: headers, Payload: ms[0].Payload, CreatedAt: ms[0].CreatedAt}
		if err := d.Insert(ctx, tx, []*driver.InsertMessage{m}); err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		return m, nil
	})
}

// OffsetBefore finds the last offset created before t in one partition.
func (d *Store) OffsetBefore(ctx context.Context, p driver.TopicPartition, t time.Time) (int64, error) {
	tenant, topic, partitionKey := p.Tenant, p.Topic, p.PartitionKey
	var off sql.NullInt64
	err := d.queryRow(ctx, d.Read, d.sql().admin.offsetBefore, Args{"tenant": tenant, "topic": topic, "key": partitionKey,
		"before": d.EncodeTime(t)}).Scan(&off)
	if err != nil {
		return 0, d.Wrap(fmt.Sprintf("find offset before %s in tenant %q topic %q partition %q", t.Format(time.RFC3339), tenant, topic, partitionKey), err)
	}
	return off.Int64, nil
}

// DeleteBatches deletes one bounded batch of each cut's oldest messages,
// in one transaction: a commit, not a statement, is what a deletion of
// one message from each of many partitions costs (a flush on both
// databases). Each statement is short and touches rows no publisher
// writes (they append), and the transaction holds at most len(cuts)
// statements' locks.
func (d *Store) DeleteBatches(ctx context.Context, in driver.DeleteBatchesParams) ([]int64, error) {
	tenant, topic, cuts, limit := in.Tenant, in.Topic, in.Cuts, in.Limit
	return inTx(ctx, d.Begin, func(tx *sql.Tx) ([]int64, error) {
		out := make([]int64, len(cuts))
		for i, c := range cuts {
			upTo := c.UpTo
			if upTo < 0 { // no cursor bounds it
				upTo = math.MaxInt64
			}
			res, err := d.exec(ctx, tx, d.sql().admin.deleteBatch, Args{"tenant": tenant, "topic": topic, "key": c.PartitionKey,
				"before": d.EncodeTime(c.Before), "up_to": upTo, "limit": limit})
			if err != nil {
				return nil, d.Wrap(fmt.Sprintf("retention: delete from tenant %q topic %q partition %q", tenant, topic, c.PartitionKey), err)
			}
			if out[i], err = res.RowsAffected(); err != nil {
				return nil, err
			}
		}
		return out, nil
	})
}
