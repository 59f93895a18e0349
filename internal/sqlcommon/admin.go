// SPDX-License-Identifier: Apache-2.0

package sqlcommon

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/shardq/shardq/driver"
)

// scope renders s as a condition on col ("" for all tenants) and its
// arguments. The caller has checked that s names tenants or all of them.
func scope(s driver.Scope, col string) (string, []any) {
	if s.AllTenants {
		return "1 = 1", nil
	}
	return col + " IN (" + Placeholders(len(s.Tenants)) + ")", tenantArgs(s.Tenants)
}

func emptyScope(s driver.Scope) bool { return !s.AllTenants && len(s.Tenants) == 0 }

// page renders s's page over the sort columns cols: a condition that
// the row's sort key comes after s.After (empty when it is not set), and
// a LIMIT clause (empty when s.Limit is 0), each with its arguments.
func page(s driver.Scope, cols ...string) (after string, afterArgs []any, limit string, limitArgs []any, err error) {
	if len(s.After) > 0 {
		if len(s.After) != len(cols) {
			return "", nil, "", nil, fmt.Errorf("page after: %d values, this listing's sort key has %d", len(s.After), len(cols))
		}
		after = " AND (" + strings.Join(cols, ", ") + ") > (" + Placeholders(len(cols)) + ")"
		afterArgs = tenantArgs(s.After)
	}
	if s.Limit > 0 {
		limit, limitArgs = " LIMIT ?", []any{s.Limit}
	}
	return after, afterArgs, limit, limitArgs, nil
}

// Topics summarises the head rows per tenant and topic.
func (d *Store) Topics(ctx context.Context, s driver.Scope) ([]driver.TopicSummary, error) {
	if emptyScope(s) {
		return nil, nil
	}
	where, args := scope(s, "tenant")
	after, aargs, limit, largs, err := page(s, "tenant", "topic")
	if err != nil {
		return nil, fmt.Errorf("list topics: %w", err)
	}
	rows, err := d.Read.QueryContext(ctx, "SELECT tenant, topic, COUNT(*), MAX(head_offset) FROM queue_partitions WHERE "+where+after+
		" GROUP BY tenant, topic ORDER BY tenant, topic"+limit, append(append(args, aargs...), largs...)...)
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
	where, args := scope(s, "o.tenant")
	if group != "" {
		where += " AND o.consumer_group = ?"
		args = append(args, group)
	}
	after, aargs, limit, largs, err := page(s, "o.tenant", "o.topic", "o.consumer_group", "o.partition_key")
	if err != nil {
		return nil, fmt.Errorf("report offsets: %w", err)
	}
	rows, err := d.Read.QueryContext(ctx, "SELECT o.tenant, o.topic, o.partition_key, o.consumer_group, COALESCE(p.head_offset, 0), o.committed_offset "+
		"FROM queue_offsets o "+
		"LEFT JOIN queue_partitions p ON p.tenant = o.tenant AND p.topic = o.topic AND p.partition_key = o.partition_key "+
		"WHERE "+where+after+" ORDER BY o.tenant, o.topic, o.consumer_group, o.partition_key"+limit, append(append(args, aargs...), largs...)...)
	if err != nil {
		return nil, d.Wrap("report offsets", err)
	}
	var out []driver.OffsetRow
	for rows.Next() {
		var r driver.OffsetRow
		if err := rows.Scan(&r.Tenant, &r.Topic, &r.PartitionKey, &r.ConsumerGroup, &r.HeadOffset, &r.CommittedOffset); err != nil {
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

func (d *Store) countLag(ctx context.Context, r *driver.OffsetRow) error {
	op := fmt.Sprintf("count lag of group %q in tenant %q topic %q partition %q", r.ConsumerGroup, r.Tenant, r.Topic, r.PartitionKey)
	var oldest any
	if err := d.Read.QueryRowContext(ctx, "SELECT COUNT(*), MIN(created_at) FROM (SELECT created_at FROM queue_messages "+
		"WHERE tenant = ? AND topic = ? AND partition_key = ? AND "+d.Offset+" > ? ORDER BY "+d.Offset+" LIMIT ?) unconsumed",
		r.Tenant, r.Topic, r.PartitionKey, r.CommittedOffset, driver.LagCountLimit+1).Scan(&r.Lag, &oldest); err != nil {
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
	rows, err := d.Read.QueryContext(ctx, "SELECT consumer_group, partition_key, committed_offset FROM queue_offsets WHERE tenant = ? AND topic = ?", tenant, topic)
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
	where, args := scope(s, "tenant")
	after, aargs, limit, largs, err := page(s, "tenant", "consumer_group", "topic", "partition_key")
	if err != nil {
		return nil, fmt.Errorf("list leases: %w", err)
	}
	rows, err := d.Read.QueryContext(ctx, "SELECT tenant, consumer_group, topic, partition_key, owner, token, expires_at FROM queue_partition_leases WHERE "+
		where+after+" ORDER BY tenant, consumer_group, topic, partition_key"+limit, append(append(args, aargs...), largs...)...)
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
	where, args := scope(s, "tenant")
	after, aargs, limit, largs, err := page(s, "tenant", "consumer_group", "topic", "subscriber_name")
	if err != nil {
		return nil, fmt.Errorf("list subscribers: %w", err)
	}
	rows, err := d.Read.QueryContext(ctx, "SELECT tenant, consumer_group, topic, subscriber_name, started_at, heartbeat_at FROM queue_subscriber_heartbeats WHERE "+
		where+after+" ORDER BY tenant, consumer_group, topic, subscriber_name"+limit, append(append(args, aargs...), largs...)...)
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

const messageColumns = "tenant, topic, partition_key, id, headers, payload, created_at"

func (d *Store) scanMessages(rows *sql.Rows, op string) ([]driver.Message, error) {
	defer rows.Close()
	var out []driver.Message
	for rows.Next() {
		var m driver.Message
		var headers []byte
		var created any
		if err := rows.Scan(&m.Offset, &m.Tenant, &m.Topic, &m.PartitionKey, &m.ID, &headers, &m.Payload, &created); err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		var err error
		if m.Headers, err = DecodeHeaders(headers); err == nil {
			m.CreatedAt, err = d.DecodeTime(created)
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
	rows, err := d.Read.QueryContext(ctx, "SELECT "+d.Offset+", "+messageColumns+" FROM queue_messages WHERE "+halfKey, halfArgs(ref)...)
	if err != nil {
		return nil, nil, d.Wrap(op, err)
	}
	ms, err := d.scanMessages(rows, op)
	if err != nil || len(ms) == 0 {
		return nil, nil, err
	}
	m := &ms[0]
	rows, err = d.Read.QueryContext(ctx, "SELECT consumer_group, attempts, next_attempt_at, last_error FROM queue_delivery_state "+
		"WHERE tenant = ? AND topic = ? AND partition_key = ? AND message_offset = ?", ref.Tenant, ref.Topic, ref.PartitionKey, m.Offset)
	if err != nil {
		return nil, nil, d.Wrap(op, err)
	}
	defer rows.Close()
	states := map[string]driver.DeliveryState{}
	for rows.Next() {
		var group string
		var st driver.DeliveryState
		var next any
		var lastErr sql.NullString
		if err := rows.Scan(&group, &st.Attempts, &next, &lastErr); err != nil {
			return nil, nil, fmt.Errorf("%s: %w", op, err)
		}
		if next != nil {
			if st.NextAttemptAt, err = d.DecodeTime(next); err != nil {
				return nil, nil, fmt.Errorf("%s: %w", op, err)
			}
		}
		st.LastError = lastErr.String
		states[group] = st
	}
	return m, states, rows.Err()
}

// DeleteMessage deletes exactly the row with ref's identity.
func (d *Store) DeleteMessage(ctx context.Context, ref driver.MessageRef) (bool, error) {
	res, err := d.Write.ExecContext(ctx, "DELETE FROM queue_messages WHERE "+halfKey, halfArgs(ref)...)
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
	where, args := scope(s, "tenant")
	args = append(args, topic)
	var after string
	if len(s.After) > 0 {
		// The offset is a number: compared as one, not as text.
		if len(s.After) != 2 {
			return nil, fmt.Errorf("list messages of topic %q: page after: %d values, want (tenant, offset)", topic, len(s.After))
		}
		off, err := strconv.ParseInt(s.After[1], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("list messages of topic %q: page after: offset %q: %w", topic, s.After[1], err)
		}
		after = " AND (tenant > ? OR (tenant = ? AND " + d.Offset + " > ?))"
		args = append(args, s.After[0], s.After[0], off)
	}
	limit := ""
	if s.Limit > 0 {
		limit = " LIMIT ?"
		args = append(args, s.Limit)
	}
	rows, err := d.Read.QueryContext(ctx, "SELECT "+d.Offset+", "+messageColumns+" FROM queue_messages WHERE "+where+
		" AND topic = ?"+after+" ORDER BY tenant, "+d.Offset+limit, args...)
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
		rows, err := tx.QueryContext(ctx, "SELECT "+d.Offset+", "+messageColumns+" FROM queue_messages WHERE "+halfKey+d.LockClause, halfArgs(ref)...)
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
		var origOffset int64
		err = tx.QueryRowContext(ctx, "SELECT "+d.Offset+" FROM queue_messages WHERE "+halfKey+d.LockClause, halfArgs(orig)...).Scan(&origOffset)
		switch {
		case errors.Is(err, sql.ErrNoRows):
		case err != nil:
			return nil, d.Wrap(op, err)
		default:
			if _, err := tx.ExecContext(ctx, "DELETE FROM queue_messages WHERE "+halfKey, halfArgs(orig)...); err != nil {
				return nil, d.Wrap(op, err)
			}
			if _, err := tx.ExecContext(ctx, "DELETE FROM queue_delivery_state WHERE tenant = ? AND topic = ? AND partition_key = ? AND message_offset = ?",
				orig.Tenant, orig.Topic, orig.PartitionKey, origOffset); err != nil {
				return nil, d.Wrap(op, err)
			}
		}
		if _, err := tx.ExecContext(ctx, "DELETE FROM queue_messages WHERE "+halfKey, halfArgs(ref)...); err != nil {
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
func (d *Store) OffsetBefore(ctx context.Context, tenant, topic, partitionKey string, t time.Time) (int64, error) {
	var off sql.NullInt64
	err := d.Read.QueryRowContext(ctx, "SELECT MAX("+d.Offset+") FROM queue_messages WHERE tenant = ? AND topic = ? AND partition_key = ? AND created_at < ?",
		tenant, topic, partitionKey, d.EncodeTime(t)).Scan(&off)
	if err != nil {
		return 0, d.Wrap(fmt.Sprintf("find offset before %s in tenant %q topic %q partition %q", t.Format(time.RFC3339), tenant, topic, partitionKey), err)
	}
	return off.Int64, nil
}

// DeleteBatch deletes one bounded batch of a partition's oldest messages.
// Each batch is its own short statement, so retention never holds locks
// that publishers of the partition would wait on for long.
func (d *Store) DeleteBatch(ctx context.Context, tenant, topic, partitionKey string, upTo int64, createdBefore time.Time, limit int) (int64, error) {
	cond := "tenant = ? AND topic = ? AND partition_key = ? AND created_at < ?"
	args := []any{tenant, topic, partitionKey, d.EncodeTime(createdBefore)}
	if upTo >= 0 {
		cond += " AND " + d.Offset + " <= ?"
		args = append(args, upTo)
	}
	args = append(args, limit)
	var query string
	if d.DeleteLimit {
		query = "DELETE FROM queue_messages WHERE " + cond + " ORDER BY " + d.Offset + " LIMIT ?"
	} else {
		query = "DELETE FROM queue_messages WHERE " + d.Offset + " IN (SELECT " + d.Offset + " FROM queue_messages WHERE " + cond +
			" ORDER BY " + d.Offset + " LIMIT ?)"
	}
	res, err := d.Write.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, d.Wrap(fmt.Sprintf("retention: delete from tenant %q topic %q partition %q", tenant, topic, partitionKey), err)
	}
	return res.RowsAffected()
}
