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
		err := tx.QueryRowContext(ctx, "SELECT state FROM queue_group_state WHERE "+leaseKey, refArgs(l.PartitionRef)...).Scan(&state)
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
		_, err := tx.ExecContext(ctx, "INSERT INTO queue_group_state (tenant, consumer_group, topic, partition_key, state, updated_at) "+
			"VALUES (?, ?, ?, ?, ?, ?)"+d.Upsert("tenant, consumer_group, topic, partition_key",
			"state = "+d.Excluded("state")+", updated_at = "+d.Excluded("updated_at")),
			append(refArgs(l.PartitionRef), state, d.EncodeTime(now))...)
		return struct{}{}, d.wrapNil(op, err)
	})
	return err
}

const claimKey = "tenant = ? AND consumer_group = ? AND topic = ?"

// ungroupedCursor is a scalar subquery: the group's cursor of the ungrouped
// partition (args: tenant, topic, group).
const ungroupedCursor = "COALESCE((SELECT committed_offset FROM queue_offsets WHERE tenant = ? AND topic = ? AND partition_key = '' AND consumer_group = ?), 0)"

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
	if err := d.Read.QueryRowContext(ctx, "SELECT EXISTS (SELECT 1 FROM queue_message_claims"+d.UseIndex("idx_claims_open")+" WHERE "+claimKey+
		" AND done = 0 AND visible_at <= ? AND message_offset > "+ungroupedCursor+") OR EXISTS (SELECT 1 FROM queue_messages"+d.PartitionOrder+
		" WHERE tenant = ? AND topic = ? AND partition_key = '' AND "+d.Offset+" > "+d.Greatest+"("+ungroupedCursor+
		", COALESCE((SELECT MAX(message_offset) FROM queue_message_claims WHERE "+claimKey+"), 0)))",
		tenant, group, topic, d.EncodeTime(now), tenant, topic, group,
		tenant, topic, tenant, topic, group, tenant, group, topic).Scan(&something); err != nil {
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
	key := []any{tenant, group, topic}
	claims, err = inTx(ctx, d.Begin, func(tx *sql.Tx) ([]driver.Claim, error) {
		offsets := func(q string, args ...any) ([]any, error) {
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
		if err := tx.QueryRowContext(ctx, "SELECT "+ungroupedCursor+", COALESCE((SELECT MAX(message_offset) FROM queue_message_claims WHERE "+claimKey+"), 0)",
			tenant, topic, group, tenant, group, topic).Scan(&cursor, &highest); err != nil {
			return nil, d.Wrap(op, err)
		}
		again, err := offsets("SELECT message_offset FROM queue_message_claims"+d.UseIndex("idx_claims_open")+" WHERE "+claimKey+" AND done = 0 AND message_offset > ? "+
			"AND visible_at <= ? ORDER BY message_offset LIMIT ?", tenant, group, topic, cursor, d.EncodeTime(now), limit)
		if err != nil {
			return nil, err
		}
		fresh, err := offsets("SELECT "+d.Offset+" FROM queue_messages"+d.PartitionOrder+" WHERE tenant = ? AND topic = ? AND partition_key = '' AND "+
			d.Offset+" > ? ORDER BY "+d.Offset+" LIMIT ?"+d.SkipLocked, tenant, topic, max(cursor, highest), limit-len(again))
		if err != nil {
			return nil, err
		}
		if len(again)+len(fresh) == 0 {
			return nil, nil
		}
		visibleAt := d.EncodeTime(now.Add(visibility))
		if len(again) > 0 {
			if _, err := tx.ExecContext(ctx, "UPDATE queue_message_claims SET owner = ?, token = ?, attempts = attempts + 1, visible_at = ?, updated_at = ? "+
				"WHERE "+claimKey+" AND message_offset IN ("+Placeholders(len(again))+") AND done = 0 AND visible_at <= ?",
				append(append([]any{owner, token, visibleAt, d.EncodeTime(now)}, key...), append(again, d.EncodeTime(now))...)...); err != nil {
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
		if err := tx.QueryRowContext(ctx, "SELECT COALESCE(MAX(committed_offset), 0) FROM queue_offsets WHERE tenant = ? AND topic = ? "+
			"AND partition_key = '' AND consumer_group = ?"+d.ShareLockClause, tenant, topic, group).Scan(&cursor); err != nil {
			return nil, d.Wrap(op, err)
		}
		// This caller's claims with their messages, joined on the
		// messages' full primary key. A message deleted meanwhile
		// (retention, an operator) has nothing to deliver.
		all := append(again, fresh...)
		rows, err := tx.QueryContext(ctx, "SELECT c.attempts, c.last_error, m."+d.Offset+", m.id, m.headers, m.payload, m.created_at "+
			"FROM queue_message_claims c JOIN queue_messages m ON m.tenant = c.tenant AND m.topic = c.topic AND m.partition_key = '' "+
			"AND m."+d.Offset+" = c.message_offset WHERE c.tenant = ? AND c.consumer_group = ? AND c.topic = ? "+
			"AND c.message_offset IN ("+Placeholders(len(all))+") AND c.token = ? AND c.message_offset > ? ORDER BY c.message_offset",
			append(append(append(key, all...), token), cursor)...)
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
	rows, err := tx.QueryContext(ctx, "SELECT m."+d.Offset+" FROM queue_messages m"+d.PartitionOrder+
		" LEFT JOIN queue_message_claims c ON c.tenant = m.tenant AND c.consumer_group = ? AND c.topic = m.topic AND c.message_offset = m."+d.Offset+
		" WHERE m.tenant = ? AND m.topic = ? AND m.partition_key = '' AND m."+d.Offset+" > ? AND m."+d.Offset+" <= ? AND c.message_offset IS NULL"+
		" ORDER BY m."+d.Offset+" LIMIT 500", group, tenant, topic, after, upTo)
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

func claimArgs(c driver.Claim) []any {
	return []any{c.Message.Tenant, c.ConsumerGroup, c.Message.Topic, c.Message.Offset, c.Token}
}

const claimFence = claimKey + " AND message_offset = ? AND token = ? AND done = 0"

// claimWrite runs a write fenced by c's token: no row matched means the
// message was claimed again (or settled) since.
func (d *Store) claimWrite(ctx context.Context, q driver.DBTX, c driver.Claim, op, set string, setArgs ...any) error {
	res, err := q.ExecContext(ctx, "UPDATE queue_message_claims SET "+set+" WHERE "+claimFence, append(setArgs, claimArgs(c)...)...)
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
		args := []any{d.EncodeTime(now), c0.Message.Tenant, c0.ConsumerGroup, c0.Message.Topic}
		for _, c := range cs {
			args = append(args, c.Message.Offset, c.Token)
		}
		res, err := tx.ExecContext(ctx, "UPDATE queue_message_claims SET done = 1, updated_at = ? WHERE "+claimKey+" AND done = 0 AND ("+
			strings.TrimSuffix(strings.Repeat("(message_offset = ? AND token = ?) OR ", len(cs)), " OR ")+")", args...)
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
	return d.claimWrite(ctx, d.Write, c, claimOp("retry", c), "visible_at = ?, last_error = ?, updated_at = ?",
		d.EncodeTime(retryAt), lastError, d.EncodeTime(now))
}

// DeadLetterClaim marks c's message done and appends dlq, atomically.
func (d *Store) DeadLetterClaim(ctx context.Context, c driver.Claim, dlq *driver.InsertMessage, now time.Time) error {
	_, err := inTx(ctx, d.Begin, func(tx *sql.Tx) (struct{}, error) {
		op := claimOp("dead-letter", c) + " to topic " + dlq.Topic
		if err := d.claimWrite(ctx, tx, c, op, "done = 1, updated_at = ?", d.EncodeTime(now)); err != nil {
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
		if err := tx.QueryRowContext(ctx, "SELECT "+ungroupedCursor, tenant, topic, group).Scan(&cur); err != nil {
			return 0, d.Wrap(op, err)
		}
		// The first message not done: the lowest open claim, or the first
		// message above the highest claim (below it, every message has a
		// claim row; see ClaimMessages).
		var open, unclaimed sql.NullInt64
		var highest int64
		if err := tx.QueryRowContext(ctx, "SELECT (SELECT MIN(message_offset) FROM queue_message_claims"+d.UseIndex("idx_claims_open")+" WHERE "+claimKey+
			" AND done = 0 AND message_offset > ?), COALESCE((SELECT MAX(message_offset) FROM queue_message_claims WHERE "+claimKey+"), 0)",
			tenant, group, topic, cur, tenant, group, topic).Scan(&open, &highest); err != nil {
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
		if _, err := tx.ExecContext(ctx, "DELETE FROM queue_message_claims WHERE "+claimKey+" AND message_offset <= ?",
			tenant, group, topic, next); err != nil {
			return 0, d.Wrap(op, err)
		}
		return next, nil
	})
}
