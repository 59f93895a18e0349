// SPDX-License-Identifier: Apache-2.0

package sqlcommon

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/shardq/shardq/driver"
)

// ReadyGroups lists partitions that can be accepted: work after the
// cursor, no unexpired lease. On one database they come lowest next offset
// first: the order the messages were numbered in (one AUTO_INCREMENT or
// rowid per table).
// When sharded, each shard numbers its messages on its own, so they come
// oldest next message first, by its created_at. Each candidate costs one
// index probe (two when sharded); everything stays inside the tenants'
// shards.
func (d *Store) ReadyGroups(ctx context.Context, g driver.GroupScope, now time.Time, limit int) ([]driver.ReadyGroup, error) {
	tenants, topic, group := g.Tenants, g.Topic, g.ConsumerGroup
	if len(tenants) == 0 {
		return nil, nil
	}
	op := fmt.Sprintf("list ready groups of topic %q group %q", topic, group)
	q := d.sql().group.ready
	if d.Sharded != nil && d.Sharded() {
		q = d.sql().group.readyByAge
	}
	rows, err := d.query(ctx, d.Read, q, Args{"tenants": textList(tenants), "topic": topic, "group": group,
		"now": d.EncodeTime(now), "limit": limit})
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
		err := d.queryRow(ctx, tx, d.leases().readState, refNamed(l.PartitionRef)).Scan(&state)
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
		_, err := d.exec(ctx, tx, d.leases().writeState, refNamed(l.PartitionRef).with(Args{"state": state, "now": d.EncodeTime(now)}))
		return struct{}{}, d.wrapNil(op, err)
	})
	return err
}

// claimArgsOf names a group's claim key.
func claimArgsOf(tenant, topic, group string) Args {
	return Args{"tenant": tenant, "topic": topic, "group": group}
}

// ungroupedArgs is claimArgsOf with :start, where the group starts in
// the ungrouped partition without a cursor.
func (d *Store) ungroupedArgs(ctx context.Context, tenant, topic, group string) (Args, error) {
	start, err := d.groupStart(ctx, tenant, topic, group)
	if err != nil {
		return nil, err
	}
	return claimArgsOf(tenant, topic, group).with(Args{"start": start}), nil
}

// groupStart reads the group's start offset (0 without a registry row).
// A registry row never changes while it exists, so one that was read is
// remembered; a missing one is asked again, as a member may register it.
func (d *Store) groupStart(ctx context.Context, tenant, topic, group string) (int64, error) {
	key := [3]string{tenant, topic, group}
	if v, ok := d.groupStarts.Load(key); ok {
		return v.(int64), nil
	}
	var start int64
	err := d.queryRow(ctx, d.Read, d.leases().start, Args{"tenant": tenant, "topic": topic, "group": group}).Scan(&start)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return 0, nil
	case err != nil:
		return 0, d.Wrap(fmt.Sprintf("read the start of group %q in tenant %q topic %q", group, tenant, topic), err)
	}
	d.groupStarts.Store(key, start)
	return start, nil
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
func (d *Store) ClaimMessages(ctx context.Context, g driver.GroupRef, owner string, now time.Time, visibility time.Duration, limit driver.ClaimLimit) ([]driver.Claim, bool, error) {
	tenant, topic, group := g.Tenant, g.Topic, g.ConsumerGroup
	op := fmt.Sprintf("claim ungrouped messages of tenant %q topic %q group %q", tenant, topic, group)
	// Most polls of an idle group find nothing: ask the read pool first,
	// and open a write transaction only when there is something to
	// claim. After a claim that filled its batch, skip the question:
	// there is most likely more.
	key := [3]string{tenant, topic, group}
	if busy, _ := d.busyClaims.Load(key); busy != true {
		var something bool
		args, err := d.ungroupedArgs(ctx, tenant, topic, group)
		if err != nil {
			return nil, false, err
		}
		if err := d.queryRow(ctx, d.Read, d.sql().group.anyWork, args.with(Args{"now": d.EncodeTime(now)})).Scan(&something); err != nil {
			return nil, false, d.Wrap(op, err)
		}
		if !something {
			return nil, false, nil
		}
	}
	for round := 0; ; round++ {
		claims, contended, truncated, err := d.claimRound(ctx, tenant, topic, group, owner, now, visibility, limit, op)
		d.busyClaims.Store(key, err == nil && (len(claims) == limit.Messages || truncated))
		if err != nil || len(claims) > 0 || !contended || round == 2 {
			for i := range claims {
				claims[i].VisibleUntil = now.Add(visibility)
			}
			return claims, truncated, err
		}
	}
}

// claimRound is one claiming transaction; contended reports candidates
// that a concurrent claimer took first, truncated a ready message that
// limit.Bytes left behind.
func (d *Store) claimRound(ctx context.Context, tenant, topic, group, owner string, now time.Time, visibility time.Duration,
	limit driver.ClaimLimit, op string) (claims []driver.Claim, contended, truncated bool, err error) {
	token := rand.Int64N(1<<62) + 1
	key, err := d.ungroupedArgs(ctx, tenant, topic, group)
	if err != nil {
		return nil, false, false, err
	}
	st := &d.sql().group
	claims, err = inTx(ctx, d.Begin, func(tx *sql.Tx) ([]driver.Claim, error) {
		var cursor, highest int64
		if err := d.queryRow(ctx, tx, st.positions, key).Scan(&cursor, &highest); err != nil {
			return nil, d.Wrap(op, err)
		}
		rows, err := d.query(ctx, tx, st.again, key.with(Args{"cursor": cursor, "now": d.EncodeTime(now), "limit": limit.Messages}))
		if err != nil {
			return nil, d.Wrap(op, err)
		}
		var again []any
		for rows.Next() {
			var o int64
			if err := rows.Scan(&o); err != nil {
				rows.Close()
				return nil, fmt.Errorf("%s: %w", op, err)
			}
			again = append(again, o)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, d.Wrap(op, err)
		}
		// The messages come from the reads that chose them. Under
		// REPEATABLE READ, plain reads see the snapshot of the
		// transaction's first read, and the locking fresh read sees the
		// latest committed rows: a message committed in between is
		// locked and claimed here, and a plain read of it afterwards
		// would miss it, hiding it for a whole visibility timeout
		// (TestClaimSeesWhatItLocks). Messages claimed again are older
		// than their claim rows, which the snapshot holds.
		msgs := map[int64]driver.Message{}
		freshArgs := key.with(Args{"after": max(cursor, highest), "limit": limit.Messages - len(again)})
		var fresh []any
		notBefore := map[int64]time.Time{}
		var withheld []any // chosen fresh messages whose bodies the sized read left out
		if limit.Bytes > 0 {
			// Within a byte budget: choose by sizes; small bodies come with
			// the sizes, the others are read once chosen.
			if again, fresh, withheld, truncated, err = d.claimWithin(ctx, tx, tenant, topic, key, again, freshArgs, limit, now, msgs, notBefore, op); err != nil {
				return nil, err
			}
		} else {
			if fresh, err = d.claimedMessages(ctx, tx, tenant, topic, st.fresh, freshArgs, msgs, op); err != nil {
				return nil, err
			}
			for _, o := range fresh {
				notBefore[o.(int64)] = msgs[o.(int64)].NotBefore
			}
		}
		// A delayed message gets a claim row that nobody holds, visible
		// from its NotBefore: it is claimed then as a retry is, and the
		// messages after it are claimed meanwhile.
		var delayed Rows
		ready := fresh[:0]
		for _, o := range fresh {
			if nb := notBefore[o.(int64)]; nb.After(now) {
				delayed = append(delayed, []any{tenant, group, topic, o, "", 0, 0, d.EncodeTime(nb), 0, d.EncodeTime(now)})
				continue
			}
			ready = append(ready, o)
		}
		fresh = ready
		if len(delayed) > 0 {
			if _, err := d.exec(ctx, tx, st.insert, Args{"rows": delayed}); err != nil {
				return nil, d.Wrap(op, err)
			}
		}
		if len(again)+len(fresh) == 0 {
			return nil, nil
		}
		visibleAt := d.EncodeTime(now.Add(visibility))
		if len(again) > 0 {
			if _, err := d.exec(ctx, tx, st.reclaim, key.with(Args{"owner": owner, "token": token, "visible_at": visibleAt, "now": d.EncodeTime(now),
				"offsets": List(again)})); err != nil {
				return nil, d.Wrap(op, err)
			}
			if _, err := d.claimedMessages(ctx, tx, tenant, topic, st.messagesAt, key.with(Args{"offsets": List(again)}), msgs, op); err != nil {
				return nil, err
			}
		}
		if len(fresh) > 0 {
			rows := make(Rows, len(fresh))
			for i, o := range fresh {
				rows[i] = []any{tenant, group, topic, o, owner, token, 1, visibleAt, 0, d.EncodeTime(now)}
			}
			if _, err := d.exec(ctx, tx, st.insert, Args{"rows": rows}); err != nil {
				return nil, d.Wrap(op, err)
			}
			if len(withheld) > 0 {
				// The sized read was a plain one: these rows are in the
				// transaction's snapshot, which a plain read sees.
				if _, err := d.claimedMessages(ctx, tx, tenant, topic, st.messagesAt, key.with(Args{"offsets": List(withheld)}), msgs, op); err != nil {
					return nil, err
				}
			}
		}
		// A row at or below the cursor is not a claim: a concurrent
		// advance passed that message (done, its claim row deleted) after
		// the reads above, and the insert put the row back. The advance
		// committed before the insert could, so a current read of the
		// cursor (locking: under REPEATABLE READ a plain one would read
		// the transaction's first snapshot) sees it; the next advance
		// deletes such rows.
		if err := d.queryRow(ctx, tx, st.cursorNow, key).Scan(&cursor); err != nil {
			return nil, d.Wrap(op, err)
		}
		// This caller's claims: the rows carrying its token (its own
		// writes, which every read of the transaction sees). A message
		// deleted meanwhile (retention, an operator) has nothing to
		// deliver.
		all := append(again, fresh...)
		rows, err = d.query(ctx, tx, st.claimed, key.with(Args{"offsets": List(all), "token": token, "cursor": cursor}))
		if err != nil {
			return nil, d.Wrap(op, err)
		}
		defer rows.Close()
		var out []driver.Claim
		for rows.Next() {
			c := driver.Claim{ConsumerGroup: group, Owner: owner, Token: token}
			var lastErr sql.NullString
			if err := rows.Scan(&c.Message.Offset, &c.Attempts, &lastErr); err != nil {
				return nil, fmt.Errorf("%s: %w", op, err)
			}
			m, ok := msgs[c.Message.Offset]
			if !ok {
				continue
			}
			c.Message, c.LastError = m, lastErr.String
			out = append(out, c)
		}
		contended = len(out) < len(all)
		return out, rows.Err()
	})
	return claims, contended, truncated, err
}

// claimWithin chooses, by size, which of the visible-again offsets and
// of the fresh messages a claim within limit.Bytes takes: in offset
// order, each that fits, and the first whatever its size. The fresh ones
// are read without locks and only the chosen are locked (SKIP LOCKED): a
// row locked and then left unclaimed would make concurrent claimers claim
// above it, hiding it until an advance repairs the gap. Delayed ones
// before the cut are chosen too, for their placeholder rows, with their
// not_before in notBefore. Small bodies come with the sized read into
// msgs; withheld lists the chosen ready ones whose bodies are still to be
// read.
func (d *Store) claimWithin(ctx context.Context, tx *sql.Tx, tenant, topic string, key Args, again []any, freshArgs Args, limit driver.ClaimLimit,
	now time.Time, msgs map[int64]driver.Message, notBefore map[int64]time.Time, op string) (keptAgain, fresh, withheld []any, cut bool, err error) {
	st := &d.sql().group
	sizes := map[int64]int64{}
	if len(again) > 0 {
		rows, err := d.query(ctx, tx, st.sizesAt, key.with(Args{"offsets": List(again)}))
		if err != nil {
			return nil, nil, nil, false, d.Wrap(op, err)
		}
		for rows.Next() {
			var o, n int64
			if err := rows.Scan(&o, &n); err != nil {
				rows.Close()
				return nil, nil, nil, false, fmt.Errorf("%s: %w", op, err)
			}
			sizes[o] = n
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, nil, nil, false, d.Wrap(op, err)
		}
	}
	held := map[int64]bool{}
	var candidates []int64
	rows, err := d.query(ctx, tx, st.freshSized, freshArgs.with(Args{"small": max(limit.Bytes/int64(limit.Messages), 1)}))
	if err != nil {
		return nil, nil, nil, false, d.Wrap(op, err)
	}
	for rows.Next() {
		m := driver.Message{Tenant: tenant, Topic: topic}
		n, h, err := d.scanSized(rows, &m, op)
		if err != nil {
			rows.Close()
			return nil, nil, nil, false, err
		}
		sizes[m.Offset], notBefore[m.Offset], held[m.Offset] = n, m.NotBefore, h
		if !h {
			msgs[m.Offset] = m
		}
		candidates = append(candidates, m.Offset)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, nil, nil, false, d.Wrap(op, err)
	}
	var used int64
	fits := func(o int64) bool {
		n := sizes[o]
		if used > 0 && used+n > limit.Bytes {
			return false
		}
		used += max(n, 1)
		return true
	}
	for _, o := range again {
		if !fits(o.(int64)) {
			return keptAgain, nil, nil, true, nil
		}
		keptAgain = append(keptAgain, o)
	}
	var chosen []any
	for _, o := range candidates {
		if !notBefore[o].After(now) && !fits(o) {
			cut = true
			break
		}
		chosen = append(chosen, o)
	}
	if len(chosen) == 0 {
		return keptAgain, nil, nil, cut, nil
	}
	rows, err = d.query(ctx, tx, st.lockAt, key.with(Args{"offsets": List(chosen)}))
	if err != nil {
		return nil, nil, nil, false, d.Wrap(op, err)
	}
	defer rows.Close()
	for rows.Next() {
		var o int64
		if err := rows.Scan(&o); err != nil {
			return nil, nil, nil, false, fmt.Errorf("%s: %w", op, err)
		}
		fresh = append(fresh, o)
		if held[o] && !notBefore[o].After(now) {
			withheld = append(withheld, o)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, nil, false, d.Wrap(op, err)
	}
	return keptAgain, fresh, withheld, cut, nil
}

// claimedMessages runs stmt, a read of ungrouped messages, adds them to
// into by offset and returns their offsets.
func (d *Store) claimedMessages(ctx context.Context, tx *sql.Tx, tenant, topic, stmt string, args Args, into map[int64]driver.Message, op string) ([]any, error) {
	rows, err := d.query(ctx, tx, stmt, args)
	if err != nil {
		return nil, d.Wrap(op, err)
	}
	defer rows.Close()
	var offsets []any
	for rows.Next() {
		m := driver.Message{Tenant: tenant, Topic: topic}
		if err := d.scanMessage(rows, &m, op); err != nil {
			return nil, err
		}
		into[m.Offset] = m
		offsets = append(offsets, m.Offset)
	}
	if err := rows.Err(); err != nil {
		return nil, d.Wrap(op, err)
	}
	return offsets, nil
}

// ungroupedGaps lists (up to 500) messages in (after, upTo] of the
// ungrouped partition that have no claim row.
func (d *Store) ungroupedGaps(ctx context.Context, db driver.DBTX, key Args, after, upTo int64) ([]int64, error) {
	if upTo <= after {
		return nil, nil
	}
	rows, err := d.query(ctx, db, d.sql().group.gaps, key.with(Args{"after": after, "up_to": upTo, "limit": 500}))
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

func claimFenceArgs(c driver.Claim) Args {
	return claimArgsOf(c.Message.Tenant, c.Message.Topic, c.ConsumerGroup).with(Args{"offset": c.Message.Offset, "token": c.Token, "owner": c.Owner})
}

// claimWrite runs stmt, a write fenced by c's token: no row matched means
// the message was claimed again (or settled) since.
func (d *Store) claimWrite(ctx context.Context, db driver.DBTX, c driver.Claim, op, stmt string, more Args) error {
	res, err := d.exec(ctx, db, stmt, claimFenceArgs(c).with(more))
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
	_, err := inTx(ctx, d.Begin, func(tx *sql.Tx) (struct{}, error) { return struct{}{}, d.ackClaims(ctx, tx, cs, now, "") })
	return err
}

// AckClaimsTx is AckClaims in the caller's transaction, which must roll
// back on an error (some claims may have matched).
func (d *Store) AckClaimsTx(ctx context.Context, tx *sql.Tx, cs []driver.Claim, now time.Time) error {
	if len(cs) == 0 {
		return nil
	}
	return d.ackClaims(ctx, tx, cs, now, " in the caller's transaction")
}

func (d *Store) ackClaims(ctx context.Context, tx *sql.Tx, cs []driver.Claim, now time.Time, where string) error {
	c0 := cs[0]
	op := fmt.Sprintf("ack %d ungrouped messages of tenant %q topic %q group %q%s", len(cs), c0.Message.Tenant, c0.Message.Topic, c0.ConsumerGroup, where)
	pairs := make(Rows, len(cs))
	for i, c := range cs {
		pairs[i] = []any{c.Message.Offset, c.Token, c.Owner}
	}
	res, err := d.exec(ctx, tx, d.sql().group.ack, claimArgsOf(c0.Message.Tenant, c0.Message.Topic, c0.ConsumerGroup).with(
		Args{"now": d.EncodeTime(now), "claims": pairs}))
	if err != nil {
		return d.Wrap(op, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if n != int64(len(cs)) {
		return fmt.Errorf("%s: %w (%d of them claimed again)", op, driver.ErrLeaseLost, int64(len(cs))-n)
	}
	return nil
}

// RetryClaim makes c's message claimable again at retryAt.
func (d *Store) RetryClaim(ctx context.Context, c driver.Claim, retryAt time.Time, lastError string, now time.Time) error {
	return d.claimWrite(ctx, d.Write, c, claimOp("retry", c), d.sql().group.retry, Args{"retry_at": d.EncodeTime(retryAt), "last_error": lastError, "now": d.EncodeTime(now)})
}

// ExtendClaim moves c's visibility timeout to visibleAt.
func (d *Store) ExtendClaim(ctx context.Context, c driver.Claim, visibleAt, now time.Time) error {
	return d.claimWrite(ctx, d.Write, c, claimOp("change the visibility of", c), d.sql().group.extend, Args{"visible_at": d.EncodeTime(visibleAt), "now": d.EncodeTime(now)})
}

// ReleaseClaim makes c's message claimable at once and uncounts the
// claim's attempt.
func (d *Store) ReleaseClaim(ctx context.Context, c driver.Claim, now time.Time) error {
	return d.claimWrite(ctx, d.Write, c, claimOp("release", c), d.sql().group.release, Args{"now": d.EncodeTime(now)})
}

// DeadLetterClaim marks c's message done and appends dlq, atomically.
func (d *Store) DeadLetterClaim(ctx context.Context, c driver.Claim, dlq *driver.InsertMessage, now time.Time) error {
	_, err := inTx(ctx, d.Begin, func(tx *sql.Tx) (struct{}, error) {
		op := claimOp("dead-letter", c) + " to topic " + dlq.Topic
		if err := d.claimWrite(ctx, tx, c, op, d.sql().group.settle, Args{"now": d.EncodeTime(now)}); err != nil {
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
func (d *Store) AdvanceUngrouped(ctx context.Context, g driver.GroupRef, now time.Time) (int64, error) {
	tenant, topic, group := g.Tenant, g.Topic, g.ConsumerGroup
	op := fmt.Sprintf("advance the ungrouped cursor of tenant %q topic %q group %q", tenant, topic, group)
	key, err := d.ungroupedArgs(ctx, tenant, topic, group)
	if err != nil {
		return 0, err
	}
	// Most calls find nothing to do (an idle group, or its first message
	// still in a handler): ask the read pool, and open a write
	// transaction only when the cursor can move or gaps need rows. The
	// read pool's plan looks for gaps up to the highest claim; the
	// transaction's only below the first open claim, which the cursor
	// cannot pass: with a claim held low and thousands claimed above it,
	// the write lock (SQLite's one writer) is not held for a scan of them
	// all at every advance.
	read, err := d.planAdvance(ctx, d.Read, key, false, op)
	if err != nil || !read.moves() {
		return read.cur, err
	}
	return inTx(ctx, d.Begin, func(tx *sql.Tx) (int64, error) {
		p, err := d.planAdvance(ctx, tx, key, true, op)
		if err != nil {
			return p.cur, err
		}
		// The read's gaps above the transaction's scan get their rows too
		// (a row claimed or settled meanwhile is left as it is; one below
		// the cursor by then is deleted below or by the next advance).
		gaps := p.gaps
		for _, o := range read.gaps {
			if o > p.scanned && o > p.cur {
				gaps = append(gaps, o)
			}
		}
		if p.next <= p.cur && len(gaps) == 0 {
			return p.cur, nil
		}
		st := &d.sql().group
		if len(gaps) > 0 {
			rows := make(Rows, len(gaps))
			for i, o := range gaps {
				rows[i] = []any{tenant, group, topic, o, "", 0, 0, d.EncodeTime(now), 0, d.EncodeTime(now)}
			}
			if _, err := d.exec(ctx, tx, st.insert, Args{"rows": rows}); err != nil {
				return 0, d.Wrap(op, err)
			}
		}
		if p.next <= p.cur {
			return p.cur, nil
		}
		// The cursor moves as a lease's commit does: forward only.
		passed := key.with(Args{"key": "", "offset": p.next, "now": d.EncodeTime(now)})
		if _, err := d.exec(ctx, tx, d.leases().commit, passed); err != nil {
			return 0, d.Wrap(op, err)
		}
		if _, err := d.exec(ctx, tx, st.dropPassed, passed); err != nil {
			return 0, d.Wrap(op, err)
		}
		return p.next, nil
	})
}

// advancePlan is where the ungrouped cursor can move: next, and the gaps
// that need claim rows first, looked for up to scanned.
type advancePlan struct {
	cur, next, scanned int64
	gaps               []int64
}

func (p advancePlan) moves() bool { return p.next > p.cur || len(p.gaps) > 0 }

// planAdvance reads, through db, the head, the cursor and the first
// message not done. belowOpen looks for gaps only below the first open
// claim, where the cursor may move; otherwise up to the highest claim.
func (d *Store) planAdvance(ctx context.Context, db driver.DBTX, key Args, belowOpen bool, op string) (advancePlan, error) {
	st := &d.sql().group
	var p advancePlan
	var head int64
	err := d.queryRow(ctx, db, st.head, key).Scan(&head)
	if errors.Is(err, sql.ErrNoRows) {
		return p, nil
	}
	if err != nil {
		return p, d.Wrap(op, err)
	}
	if err := d.queryRow(ctx, db, st.cursor, key).Scan(&p.cur); err != nil {
		return p, d.Wrap(op, err)
	}
	p.next = p.cur
	if head <= p.cur {
		return p, nil
	}
	// The first message not done: the lowest open claim, or the first
	// message above the highest claim (below it, every message has a
	// claim row; see ClaimMessages).
	var open, unclaimed sql.NullInt64
	var highest int64
	if err := d.queryRow(ctx, db, st.firstOpen, key.with(Args{"cursor": p.cur})).Scan(&open, &highest); err != nil {
		return p, d.Wrap(op, err)
	}
	if err := d.queryRow(ctx, db, st.unclaimed, key.with(Args{"head": head, "after": max(p.cur, highest)})).Scan(&unclaimed); err != nil {
		return p, d.Wrap(op, err)
	}
	// Gaps: messages below the highest claim without a claim row, left by
	// a claim transaction that locked them (SKIP LOCKED kept the others
	// away) and then failed. They count as open, and get claimable rows
	// so that the next claim takes them.
	p.scanned = min(highest, head)
	if belowOpen && open.Valid {
		p.scanned = min(p.scanned, open.Int64-1)
	}
	if p.gaps, err = d.ungroupedGaps(ctx, db, key, p.cur, p.scanned); err != nil {
		return p, d.Wrap(op, err)
	}
	p.next = head
	for _, first := range []sql.NullInt64{open, unclaimed} {
		if first.Valid {
			p.next = min(p.next, first.Int64-1)
		}
	}
	if len(p.gaps) > 0 {
		p.next = min(p.next, p.gaps[0]-1)
	}
	return p, nil
}
