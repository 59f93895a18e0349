// SPDX-License-Identifier: Apache-2.0

package sqlcommon

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/shardq/shardq/driver"
)

// ReadyGroups lists accepted-able partitions: work after the cursor, no
// unexpired lease, ordered by their next message's offset. The next offset
// is a correlated MIN over the partition's primary key, so each candidate
// costs one index probe; everything stays inside the tenants' shards.
func (d *Store) ReadyGroups(ctx context.Context, tenants []string, topic, group string, now time.Time, limit int) ([]driver.ReadyGroup, error) {
	if len(tenants) == 0 {
		return nil, nil
	}
	op := fmt.Sprintf("list ready groups of topic %q group %q", topic, group)
	args := append([]any{group, group}, tenantArgs(tenants, topic, d.EncodeTime(now), limit)...)
	rows, err := d.Read.QueryContext(ctx, "SELECT tenant, partition_key, next_offset FROM ("+
		"SELECT p.tenant, p.partition_key, (SELECT MIN(m."+d.Offset+") FROM queue_messages m"+d.PartitionOrder+" WHERE m.tenant = p.tenant AND m.topic = p.topic "+
		"AND m.partition_key = p.partition_key AND m."+d.Offset+" > COALESCE(o.committed_offset, 0)) AS next_offset "+
		"FROM queue_partitions p "+
		"LEFT JOIN queue_offsets o ON o.tenant = p.tenant AND o.topic = p.topic AND o.partition_key = p.partition_key AND o.consumer_group = ? "+
		"LEFT JOIN queue_partition_leases l ON l.tenant = p.tenant AND l.consumer_group = ? AND l.topic = p.topic AND l.partition_key = p.partition_key "+
		"WHERE p.tenant IN ("+Placeholders(len(tenants))+") AND p.topic = ? AND p.partition_key <> '' "+
		"AND p.head_offset > COALESCE(o.committed_offset, 0) AND (l.owner IS NULL OR l.owner = '' OR l.expires_at <= ?)"+
		") ready WHERE next_offset IS NOT NULL ORDER BY next_offset LIMIT ?", args...)
	if err != nil {
		return nil, d.Wrap(op, err)
	}
	defer rows.Close()
	var out []driver.ReadyGroup
	for rows.Next() {
		g := driver.ReadyGroup{Topic: topic}
		if err := rows.Scan(&g.Tenant, &g.PartitionKey, &g.NextOffset); err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		out = append(out, g)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	return out, nil
}

// GroupState reads the partition's state inside a transaction that holds
// l's fence, so a stale owner never reads a state its successor is
// changing.
func (d *Store) GroupState(ctx context.Context, l driver.Lease) ([]byte, error) {
	return inTx(ctx, d.Begin, func(tx *sql.Tx) ([]byte, error) {
		op := "read group state of " + l.PartitionRef.String()
		if err := d.fence(ctx, tx, l, op); err != nil {
			return nil, err
		}
		var state []byte
		err := queryRow(ctx, tx, d.leases().readState, refNamed(l.PartitionRef)).Scan(&state)
		if errors.Is(err, sql.ErrNoRows) {
			return nil, nil
		}
		if err != nil {
			return nil, d.Wrap(op, err)
		}
		if state == nil {
			state = []byte{}
		}
		return state, nil
	})
}

// SetGroupState upserts the partition's state under l's fence.
func (d *Store) SetGroupState(ctx context.Context, l driver.Lease, state []byte, now time.Time) error {
	_, err := inTx(ctx, d.Begin, func(tx *sql.Tx) (struct{}, error) {
		op := "set group state of " + l.PartitionRef.String()
		if err := d.fence(ctx, tx, l, op); err != nil {
			return struct{}{}, err
		}
		if state == nil {
			state = []byte{}
		}
		_, err := exec(ctx, tx, d.leases().writeState, refNamed(l.PartitionRef).with(Args{"state": state, "now": d.EncodeTime(now)}))
		return struct{}{}, d.wrapNil(op, err)
	})
	return err
}

// The claim statements name their parameters (Bind): queue_message_claims
// is keyed (tenant, consumer_group, topic) and queue_offsets (tenant,
// topic, ..., consumer_group), and positional arguments in two key orders
// are easy to swap.

// claimKey selects one group's claim rows (:tenant, :group, :topic).
const claimKey = "tenant = :tenant AND consumer_group = :group AND topic = :topic"

// ungroupedCursor is a scalar subquery: the group's cursor of the ungrouped
// partition.
const ungroupedCursor = "COALESCE((SELECT committed_offset FROM queue_offsets WHERE tenant = :tenant AND topic = :topic AND partition_key = '' AND consumer_group = :group), 0)"

// highestClaim is a scalar subquery: the group's highest claimed offset.
const highestClaim = "COALESCE((SELECT MAX(message_offset) FROM queue_message_claims WHERE " + claimKey + "), 0)"

// claimArgsOf names a group's claim key.
func claimArgsOf(tenant, topic, group string) Args {
	return Args{"tenant": tenant, "topic": topic, "group": group}
}

// with returns a copy of a plus more.
func (a Args) with(more Args) Args {
	out := make(Args, len(a)+len(more))
	for k, v := range a {
		out[k] = v
	}
	for k, v := range more {
		out[k] = v
	}
	return out
}

// ClaimMessages claims, in one transaction under a fresh random token,
// first the messages whose claim is visible again (expired, or retry due),
// then new ones: the next messages after the highest claimed offset. New
// claims are therefore taken contiguously, so every message up to the
// highest claim has a claim row (offsets of a partition become visible in
// order, so none appears below it later), and finding work never scans
// messages that are done. Concurrent claimers of the same new messages
// collide on the claim rows' key: the first insert wins, the others do
// nothing, and the rows carrying the token afterwards are this caller's.
// A few rounds absorb such collisions.
func (d *Store) ClaimMessages(ctx context.Context, tenant, topic, group, owner string, now time.Time, visibility time.Duration, limit int) ([]driver.Claim, error) {
	op := fmt.Sprintf("claim ungrouped messages of tenant %q topic %q group %q", tenant, topic, group)
	// Most polls find nothing: ask the read pool first, and open a write
	// transaction only when there is something to claim.
	var something bool
	q, args := Bind("SELECT EXISTS (SELECT 1 FROM queue_message_claims"+d.UseIndex("idx_claims_open")+" WHERE "+claimKey+
		" AND done = 0 AND visible_at <= :now AND message_offset > "+ungroupedCursor+") OR EXISTS (SELECT 1 FROM queue_messages"+d.PartitionOrder+
		" WHERE tenant = :tenant AND topic = :topic AND partition_key = '' AND "+d.Offset+" > "+d.Greatest+"("+ungroupedCursor+", "+highestClaim+"))",
		claimArgsOf(tenant, topic, group).with(Args{"now": d.EncodeTime(now)}))
	if err := d.Read.QueryRowContext(ctx, q, args...).Scan(&something); err != nil {
		return nil, d.Wrap(op, err)
	}
	if !something {
		return nil, nil
	}
	for round := 0; ; round++ {
		claims, contended, err := d.claimRound(ctx, tenant, topic, group, owner, now, visibility, limit, op)
		if err != nil || len(claims) > 0 || !contended || round == 2 {
			for i := range claims {
				claims[i].VisibleUntil = now.Add(visibility)
			}
			return claims, err
		}
	}
}

// claimRound is one claiming transaction; contended reports candidates
// that a concurrent claimer took first.
func (d *Store) claimRound(ctx context.Context, tenant, topic, group, owner string, now time.Time, visibility time.Duration,
	limit int, op string) (claims []driver.Claim, contended bool, err error) {
	token := rand.Int64N(1<<62) + 1
	key := claimArgsOf(tenant, topic, group)
	claims, err = inTx(ctx, d.Begin, func(tx *sql.Tx) ([]driver.Claim, error) {
		offsets := func(stmt string, named Args) ([]any, error) {
			q, args := Bind(stmt, named)
			rows, err := tx.QueryContext(ctx, q, args...)
			if err != nil {
				return nil, d.Wrap(op, err)
			}
			defer rows.Close()
			var out []any
			for rows.Next() {
				var o int64
				if err := rows.Scan(&o); err != nil {
					return nil, fmt.Errorf("%s: %w", op, err)
				}
				out = append(out, o)
			}
			return out, rows.Err()
		}
		var cursor, highest int64
		q, args := Bind("SELECT "+ungroupedCursor+", "+highestClaim, key)
		if err := tx.QueryRowContext(ctx, q, args...).Scan(&cursor, &highest); err != nil {
			return nil, d.Wrap(op, err)
		}
		again, err := offsets("SELECT message_offset FROM queue_message_claims"+d.UseIndex("idx_claims_open")+" WHERE "+claimKey+" AND done = 0 AND message_offset > :cursor "+
			"AND visible_at <= :now ORDER BY message_offset LIMIT :limit", key.with(Args{"cursor": cursor, "now": d.EncodeTime(now), "limit": limit}))
		if err != nil {
			return nil, err
		}
		fresh, err := offsets("SELECT "+d.Offset+" FROM queue_messages"+d.PartitionOrder+" WHERE tenant = :tenant AND topic = :topic AND partition_key = '' AND "+
			d.Offset+" > :after ORDER BY "+d.Offset+" LIMIT :limit"+d.SkipLocked, key.with(Args{"after": max(cursor, highest), "limit": limit - len(again)}))
		if err != nil {
			return nil, err
		}
		if len(again)+len(fresh) == 0 {
			return nil, nil
		}
		visibleAt := d.EncodeTime(now.Add(visibility))
		if len(again) > 0 {
			q, args := Bind("UPDATE queue_message_claims SET owner = :owner, token = :token, attempts = attempts + 1, visible_at = :visible_at, updated_at = :now "+
				"WHERE "+claimKey+" AND message_offset IN (:offsets) AND done = 0 AND visible_at <= :now",
				key.with(Args{"owner": owner, "token": token, "visible_at": visibleAt, "now": d.EncodeTime(now), "offsets": List(again)}))
			if _, err := tx.ExecContext(ctx, q, args...); err != nil {
				return nil, d.Wrap(op, err)
			}
		}
		if len(fresh) > 0 {
			vals := make([]any, 0, 8*len(fresh))
			for _, o := range fresh {
				vals = append(vals, tenant, group, topic, o, owner, token, visibleAt, d.EncodeTime(now))
			}
			if _, err := tx.ExecContext(ctx, "INSERT INTO queue_message_claims (tenant, consumer_group, topic, message_offset, owner, token, attempts, "+
				"visible_at, done, updated_at) VALUES "+repeatRows("(?, ?, ?, ?, ?, ?, 1, ?, 0, ?)", len(fresh))+
				d.Upsert("tenant, consumer_group, topic, message_offset", ""), vals...); err != nil {
				return nil, d.Wrap(op, err)
			}
		}
		// A row at or below the cursor is not a claim: a concurrent
		// advance passed that message (done, its claim row deleted) after
		// the reads above, and the insert put the row back. The advance
		// committed before the insert could, so a current read of the
		// cursor (locking: under REPEATABLE READ a plain one would read
		// the transaction's first snapshot) sees it; the next advance
		// deletes such rows.
		q, args = Bind("SELECT COALESCE(MAX(committed_offset), 0) FROM queue_offsets WHERE tenant = :tenant AND topic = :topic "+
			"AND partition_key = '' AND consumer_group = :group"+d.ShareLockClause, key)
		if err := tx.QueryRowContext(ctx, q, args...).Scan(&cursor); err != nil {
			return nil, d.Wrap(op, err)
		}
		// This caller's claims with their messages, joined on the
		// messages' full primary key. A message deleted meanwhile
		// (retention, an operator) has nothing to deliver.
		all := append(again, fresh...)
		q, args = Bind("SELECT c.attempts, c.last_error, m."+d.Offset+", m.id, m.headers, m.payload, m.created_at "+
			"FROM queue_message_claims c JOIN queue_messages m ON m.tenant = c.tenant AND m.topic = c.topic AND m.partition_key = '' "+
			"AND m."+d.Offset+" = c.message_offset WHERE c.tenant = :tenant AND c.consumer_group = :group AND c.topic = :topic "+
			"AND c.message_offset IN (:offsets) AND c.token = :token AND c.message_offset > :cursor ORDER BY c.message_offset",
			key.with(Args{"offsets": List(all), "token": token, "cursor": cursor}))
		rows, err := tx.QueryContext(ctx, q, args...)
		if err != nil {
			return nil, d.Wrap(op, err)
		}
		defer rows.Close()
		var out []driver.Claim
		for rows.Next() {
			c := driver.Claim{ConsumerGroup: group, Owner: owner, Token: token, Message: driver.Message{Tenant: tenant, Topic: topic}}
			var lastErr sql.NullString
			var headers []byte
			var created any
			if err := rows.Scan(&c.Attempts, &lastErr, &c.Message.Offset, &c.Message.ID, &headers, &c.Message.Payload, &created); err != nil {
				return nil, fmt.Errorf("%s: %w", op, err)
			}
			if c.Message, err = d.decodeMessage(c.Message, headers, created, op); err != nil {
				return nil, err
			}
			c.LastError = lastErr.String
			out = append(out, c)
		}
		contended = len(out) < len(all)
		return out, rows.Err()
	})
	return claims, contended, err
}

// ungroupedGaps lists (up to 500) messages in (after, upTo] of the
// ungrouped partition that have no claim row.
func (d *Store) ungroupedGaps(ctx context.Context, tx *sql.Tx, tenant, topic, group string, after, upTo int64) ([]int64, error) {
	if upTo <= after {
		return nil, nil
	}
	q, args := Bind("SELECT m."+d.Offset+" FROM queue_messages m"+d.PartitionOrder+
		" LEFT JOIN queue_message_claims c ON c.tenant = m.tenant AND c.consumer_group = :group AND c.topic = m.topic AND c.message_offset = m."+d.Offset+
		" WHERE m.tenant = :tenant AND m.topic = :topic AND m.partition_key = '' AND m."+d.Offset+" > :after AND m."+d.Offset+" <= :up_to AND c.message_offset IS NULL"+
		" ORDER BY m."+d.Offset+" LIMIT 500", claimArgsOf(tenant, topic, group).with(Args{"after": after, "up_to": upTo}))
	rows, err := tx.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []int64
	for rows.Next() {
		var o int64
		if err := rows.Scan(&o); err != nil {
			return nil, err
		}
		out = append(out, o)
	}
	return out, rows.Err()
}

func repeatRows(row string, n int) string {
	b := make([]byte, 0, n*(len(row)+2))
	for i := range n {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = append(b, row...)
	}
	return string(b)
}

// claimFence selects c's claim row while c's token is current.
const claimFence = claimKey + " AND message_offset = :offset AND token = :token AND done = 0"

func claimFenceArgs(c driver.Claim) Args {
	return claimArgsOf(c.Message.Tenant, c.Message.Topic, c.ConsumerGroup).with(Args{"offset": c.Message.Offset, "token": c.Token})
}

// claimWrite runs a write fenced by c's token (set names its own
// parameters): no row matched means the message was claimed again (or
// settled) since.
func (d *Store) claimWrite(ctx context.Context, db driver.DBTX, c driver.Claim, op, set string, setArgs Args) error {
	q, args := Bind("UPDATE queue_message_claims SET "+set+" WHERE "+claimFence, claimFenceArgs(c).with(setArgs))
	res, err := db.ExecContext(ctx, q, args...)
	if err != nil {
		return d.Wrap(op, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if n == 0 {
		return fmt.Errorf("%s: %w (claim token %d)", op, driver.ErrLeaseLost, c.Token)
	}
	return nil
}

func claimOp(verb string, c driver.Claim) string {
	return fmt.Sprintf("%s ungrouped message offset %d of tenant %q topic %q group %q", verb, c.Message.Offset, c.Message.Tenant, c.Message.Topic, c.ConsumerGroup)
}

// AckClaims marks the claimed messages done: one UPDATE naming every
// (offset, token) pair; fewer rows matched than claims means one was
// claimed again, and the transaction is rolled back.
func (d *Store) AckClaims(ctx context.Context, cs []driver.Claim, now time.Time) error {
	if len(cs) == 0 {
		return nil
	}
	c0 := cs[0]
	op := fmt.Sprintf("ack %d ungrouped messages of tenant %q topic %q group %q", len(cs), c0.Message.Tenant, c0.Message.Topic, c0.ConsumerGroup)
	_, err := inTx(ctx, d.Begin, func(tx *sql.Tx) (struct{}, error) {
		// One (offset, token) pair per claim: positional, after the named key.
		q, args := Bind("UPDATE queue_message_claims SET done = 1, updated_at = :now WHERE "+claimKey+" AND done = 0 AND (",
			claimArgsOf(c0.Message.Tenant, c0.Message.Topic, c0.ConsumerGroup).with(Args{"now": d.EncodeTime(now)}))
		for _, c := range cs {
			args = append(args, c.Message.Offset, c.Token)
		}
		res, err := tx.ExecContext(ctx, q+strings.TrimSuffix(strings.Repeat("(message_offset = ? AND token = ?) OR ", len(cs)), " OR ")+")", args...)
		if err != nil {
			return struct{}{}, d.Wrap(op, err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return struct{}{}, fmt.Errorf("%s: %w", op, err)
		}
		if n != int64(len(cs)) {
			return struct{}{}, fmt.Errorf("%s: %w (%d of them claimed again)", op, driver.ErrLeaseLost, int64(len(cs))-n)
		}
		return struct{}{}, nil
	})
	return err
}

// RetryClaim makes c's message claimable again at retryAt.
func (d *Store) RetryClaim(ctx context.Context, c driver.Claim, retryAt time.Time, lastError string, now time.Time) error {
	return d.claimWrite(ctx, d.Write, c, claimOp("retry", c), "visible_at = :retry_at, last_error = :last_error, updated_at = :now",
		Args{"retry_at": d.EncodeTime(retryAt), "last_error": lastError, "now": d.EncodeTime(now)})
}

// DeadLetterClaim marks c's message done and appends dlq, atomically.
func (d *Store) DeadLetterClaim(ctx context.Context, c driver.Claim, dlq *driver.InsertMessage, now time.Time) error {
	_, err := inTx(ctx, d.Begin, func(tx *sql.Tx) (struct{}, error) {
		op := claimOp("dead-letter", c) + " to topic " + dlq.Topic
		if err := d.claimWrite(ctx, tx, c, op, "done = 1, updated_at = :now", Args{"now": d.EncodeTime(now)}); err != nil {
			return struct{}{}, err
		}
		if err := d.Insert(ctx, tx, []*driver.InsertMessage{dlq}); err != nil {
			return struct{}{}, fmt.Errorf("%s: %w", op, err)
		}
		return struct{}{}, nil
	})
	return err
}

// AdvanceUngrouped moves the cursor of the ungrouped partition to just
// below its first message that is not done, and deletes the claim rows it
// passed (orphans included: rows a claimer re-inserted for a message the
// cursor had already passed, which it never counted as claims). The head is read first and
// bounds the scan: a message committed after that read has a higher
// offset than the head (offsets of a partition become visible in order),
// so the cursor never passes a message it did not see.
func (d *Store) AdvanceUngrouped(ctx context.Context, tenant, topic, group string, now time.Time) (int64, error) {
	return inTx(ctx, d.Begin, func(tx *sql.Tx) (int64, error) {
		op := fmt.Sprintf("advance the ungrouped cursor of tenant %q topic %q group %q", tenant, topic, group)
		var head, cur int64
		err := tx.QueryRowContext(ctx, "SELECT head_offset FROM queue_partitions WHERE tenant = ? AND topic = ? AND partition_key = ''",
			tenant, topic).Scan(&head)
		if errors.Is(err, sql.ErrNoRows) {
			return 0, nil
		}
		if err != nil {
			return 0, d.Wrap(op, err)
		}
		key := claimArgsOf(tenant, topic, group)
		q, args := Bind("SELECT "+ungroupedCursor, key)
		if err := tx.QueryRowContext(ctx, q, args...).Scan(&cur); err != nil {
			return 0, d.Wrap(op, err)
		}
		// The first message not done: the lowest open claim, or the first
		// message above the highest claim (below it, every message has a
		// claim row; see ClaimMessages).
		var open, unclaimed sql.NullInt64
		var highest int64
		q, args = Bind("SELECT (SELECT MIN(message_offset) FROM queue_message_claims"+d.UseIndex("idx_claims_open")+" WHERE "+claimKey+
			" AND done = 0 AND message_offset > :cursor), "+highestClaim, key.with(Args{"cursor": cur}))
		if err := tx.QueryRowContext(ctx, q, args...).Scan(&open, &highest); err != nil {
			return 0, d.Wrap(op, err)
		}
		if err := tx.QueryRowContext(ctx, "SELECT MIN("+d.Offset+") FROM queue_messages"+d.PartitionOrder+" WHERE tenant = ? AND topic = ? "+
			"AND partition_key = '' AND "+d.Offset+" <= ? AND "+d.Offset+" > ?", tenant, topic, head, max(cur, highest)).Scan(&unclaimed); err != nil {
			return 0, d.Wrap(op, err)
		}
		// Gaps: messages below the highest claim without a claim row,
		// left by a claim transaction that locked them (SKIP LOCKED kept
		// the others away) and then failed. They count as open, and get
		// claimable rows so that the next claim takes them.
		gaps, err := d.ungroupedGaps(ctx, tx, tenant, topic, group, cur, min(highest, head))
		if err != nil {
			return 0, d.Wrap(op, err)
		}
		if len(gaps) > 0 {
			vals := make([]any, 0, 6*len(gaps))
			for _, o := range gaps {
				vals = append(vals, tenant, group, topic, o, d.EncodeTime(now), d.EncodeTime(now))
			}
			if _, err := tx.ExecContext(ctx, "INSERT INTO queue_message_claims (tenant, consumer_group, topic, message_offset, owner, token, attempts, "+
				"visible_at, done, updated_at) VALUES "+repeatRows("(?, ?, ?, ?, '', 0, 0, ?, 0, ?)", len(gaps))+
				d.Upsert("tenant, consumer_group, topic, message_offset", ""), vals...); err != nil {
				return 0, d.Wrap(op, err)
			}
		}
		next := head
		for _, first := range []sql.NullInt64{open, unclaimed} {
			if first.Valid {
				next = min(next, first.Int64-1)
			}
		}
		if len(gaps) > 0 {
			next = min(next, gaps[0]-1)
		}
		if next <= cur {
			return cur, nil
		}
		if _, err := tx.ExecContext(ctx, "INSERT INTO queue_offsets (tenant, topic, partition_key, consumer_group, committed_offset, updated_at) "+
			"VALUES (?, ?, '', ?, ?, ?)"+d.Upsert("tenant, topic, partition_key, consumer_group",
			"committed_offset = "+d.Greatest+"(committed_offset, "+d.Excluded("committed_offset")+"), updated_at = "+d.Excluded("updated_at")),
			tenant, topic, group, next, d.EncodeTime(now)); err != nil {
			return 0, d.Wrap(op, err)
		}
		q, args = Bind("DELETE FROM queue_message_claims WHERE "+claimKey+" AND message_offset <= :next", key.with(Args{"next": next}))
		if _, err := tx.ExecContext(ctx, q, args...); err != nil {
			return 0, d.Wrap(op, err)
		}
		return next, nil
	})
}
