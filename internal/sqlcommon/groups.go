// SPDX-License-Identifier: Apache-2.0

package sqlcommon

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/shardq/shardq/driver"
)

// ReadyGroups lists partitions that can be accepted: work after the
// cursor, no unexpired lease. On one database they come lowest next offset
// first: the order the messages were numbered in (one AUTO_INCREMENT or
// rowid per table).
// When sharded, each shard numbers its messages on its own, so they come
// oldest next message first, by its created_at. Each tenant's candidates
// are read a page at a time by key (head, cursor and lease rows: no
// message), and each page's next messages by one index probe per
// candidate (readyProbe); the best limit are kept. On one database a
// page is probed lowest cursor first and stops where the cursors reach
// the worst group kept. Memory is a page and limit; everything stays
// inside each tenant's shard.
func (d *Store) ReadyGroups(ctx context.Context, g driver.GroupScope, now time.Time, limit int) ([]driver.ReadyGroup, error) {
	if len(g.Tenants) == 0 || limit <= 0 {
		return nil, nil
	}
	op := fmt.Sprintf("list ready groups of topic %q group %q", g.Topic, g.ConsumerGroup)
	byAge := d.Sharded != nil && d.Sharded()
	var best []readyGroup
	keep := func(next []readyGroup) {
		best = append(best, next...)
		slices.SortFunc(best, func(a, b readyGroup) int {
			if byAge {
				if c := a.createdAt.Compare(b.createdAt); c != 0 {
					return c
				}
			}
			return cmp.Or(cmp.Compare(a.NextOffset, b.NextOffset), cmp.Compare(a.Tenant, b.Tenant), cmp.Compare(a.PartitionKey, b.PartitionKey))
		})
		best = best[:min(len(best), limit)]
	}
	for _, tenant := range g.Tenants {
		for after := ""; ; {
			keys, cursors, err := d.readyCandidates(ctx, tenant, g, now, after)
			if err != nil {
				return nil, d.Wrap(op, err)
			}
			page := len(keys)
			if page > 0 {
				after = keys[page-1]
			}
			if !byAge {
				// Lowest cursor first: a group's next offset is past its
				// cursor, so once the cursors reach the worst group kept,
				// no candidate after them can take its place.
				sortByCursor(keys, cursors)
			}
			for start := 0; start < len(keys); {
				end := len(keys)
				if !byAge && len(best) == limit {
					bound := best[limit-1].NextOffset
					end = start
					for end < len(keys) && cursors[end] < bound {
						end++
					}
				}
				n := min(end-start, readyProbeSizes[len(readyProbeSizes)-1])
				if n == 0 {
					break
				}
				next, err := d.probeReady(ctx, tenant, g.Topic, keys[start:start+n], cursors[start:start+n], byAge)
				if err != nil {
					return nil, d.Wrap(op, err)
				}
				keep(next)
				start += n
			}
			if page < readyPage {
				break
			}
		}
	}
	out := make([]driver.ReadyGroup, len(best))
	for i, r := range best {
		out[i] = r.ReadyGroup
	}
	return out, nil
}

// sortByCursor sorts keys and their cursors by cursor.
func sortByCursor(keys []string, cursors []int64) {
	idx := make([]int, len(keys))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int { return cmp.Compare(cursors[a], cursors[b]) })
	k, c := slices.Clone(keys), slices.Clone(cursors)
	for i, j := range idx {
		keys[i], cursors[i] = k[j], c[j]
	}
}

// readyPage is how many candidates ReadyGroups reads at a time.
const readyPage = 500

// readyGroup is a candidate with its next message's time.
type readyGroup struct {
	driver.ReadyGroup
	createdAt time.Time
}

// readyCandidates reads a page of tenant's free groups with work after
// the cursor, by key after after, with their cursors.
func (d *Store) readyCandidates(ctx context.Context, tenant string, g driver.GroupScope, now time.Time, after string) (keys []string, cursors []int64, err error) {
	rows, err := d.query(ctx, d.Read, d.sql().group.readyCandidates, Args{"tenant": tenant, "topic": g.Topic, "group": g.ConsumerGroup,
		"now": d.EncodeTime(now), "after": after, "page": readyPage})
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var k string
		var c int64
		if err := rows.Scan(&k, &c); err != nil {
			return nil, nil, err
		}
		keys, cursors = append(keys, k), append(cursors, c)
	}
	return keys, cursors, rows.Err()
}

// probeReady reads the next message after each cursor of keys (at most
// the largest probe size), in the smallest probe statement that holds
// them, the last key repeated to fill it.
func (d *Store) probeReady(ctx context.Context, tenant, topic string, keys []string, cursors []int64, byAge bool) ([]readyGroup, error) {
	size := 0
	for size < len(readyProbeSizes)-1 && readyProbeSizes[size] < len(keys) {
		size++
	}
	args := Args{"tenant": tenant, "topic": topic}
	for i := range readyProbeSizes[size] {
		j := min(i, len(keys)-1)
		args["key"+strconv.Itoa(i)], args["cursor"+strconv.Itoa(i)] = keys[j], cursors[j]
	}
	q := d.sql().group.readyProbes[size]
	if byAge {
		q = d.sql().group.readyProbesByAge[size]
	}
	rows, err := d.query(ctx, d.Read, q, args)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []readyGroup
	seen := make(map[string]bool, len(keys))
	for rows.Next() {
		r := readyGroup{ReadyGroup: driver.ReadyGroup{Tenant: tenant, Topic: topic}}
		var next sql.NullInt64
		var created any
		if err := rows.Scan(&r.PartitionKey, &next, &created); err != nil {
			return nil, err
		}
		if !next.Valid || seen[r.PartitionKey] {
			continue // gone meanwhile (retention), or a repeat that filled the statement
		}
		seen[r.PartitionKey], r.NextOffset = true, next.Int64
		if byAge {
			if r.createdAt, err = d.DecodeTime(created); err != nil {
				return nil, err
			}
		}
		out = append(out, r)
	}
	return out, rows.Err()
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
// then new ones: the next messages above the group's claim mark, which the
// transaction locks and moves to the last of them. Claimers of a group
// therefore take turns, and new claims are taken contiguously: every
// message above the cursor and at or below the mark has a claim row until
// it is done (offsets of a partition become visible in order, so none
// appears below the mark later), a missing row there means done, and
// finding work never scans messages that are done. A claim that fails
// rolls its mark back with its rows. docs/groups.md has the state machine.
func (d *Store) ClaimMessages(ctx context.Context, in driver.ClaimMessagesParams) ([]driver.Claim, bool, error) {
	g, owner, now, visibility, limit := in.Group, in.Owner, in.Now, in.Visibility, in.Limit
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
// that it could not claim (a row of schema 12's left above the mark, a
// message deleted meanwhile), truncated a ready message that limit.Bytes
// left behind.
func (d *Store) claimRound(ctx context.Context, tenant, topic, group, owner string, now time.Time, visibility time.Duration,
	limit driver.ClaimLimit, op string) (claims []driver.Claim, contended, truncated bool, err error) {
	token := rand.Int64N(1<<62) + 1
	key, err := d.ungroupedArgs(ctx, tenant, topic, group)
	if err != nil {
		return nil, false, false, err
	}
	for rerun := true; ; rerun = false {
		claims, contended, truncated, err = d.claimTx(ctx, tenant, topic, group, owner, token, now, visibility, limit, key, op)
		if !rerun || !errors.Is(err, errMarkRowGone) {
			return claims, contended, truncated, err
		}
	}
}

// claimTx is claimRound's transaction.
func (d *Store) claimTx(ctx context.Context, tenant, topic, group, owner string, token int64, now time.Time, visibility time.Duration,
	limit driver.ClaimLimit, key Args, op string) (claims []driver.Claim, contended, truncated bool, err error) {
	st := &d.sql().group
	claims, err = inTx(ctx, d.Begin, func(tx *sql.Tx) ([]driver.Claim, error) {
		// The mark's lock comes first: under REPEATABLE READ the plain
		// reads below then see a snapshot taken after the previous
		// claimer's commit, and every read of the transaction sees that
		// one snapshot (the messages come from the reads that chose them).
		cursor, mark, err := d.lockMarks(ctx, tx, key, now)
		if err != nil {
			return nil, d.Wrap(op, err)
		}
		// Up to the mark: a row above it (one of schema 12's) is passed
		// by the walk below first, so that its ack, which deletes it,
		// leaves a message the mark says is done.
		rows, err := d.query(ctx, tx, st.again, key.with(Args{"cursor": cursor, "mark": mark, "now": d.EncodeTime(now), "limit": limit.Messages}))
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
		msgs := map[int64]driver.Message{}
		freshArgs := key.with(Args{"after": max(cursor, mark), "limit": limit.Messages - len(again)})
		var fresh []any
		notBefore := map[int64]time.Time{}
		var withheld []any // chosen fresh messages whose bodies the sized read left out
		if limit.Bytes > 0 {
			// Within a byte budget: choose by sizes; small bodies come with
			// the sizes, the others are read once chosen.
			if again, fresh, withheld, truncated, err = d.claimWithin(ctx, tx, key, again, freshArgs, limit, now, msgs, notBefore, op); err != nil {
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
		if len(fresh) > 0 {
			// Every fresh message gets its row below, delayed or not.
			if _, err := d.exec(ctx, tx, st.setMark, key.with(Args{"mark": fresh[len(fresh)-1]})); err != nil {
				return nil, d.Wrap(op, err)
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
			// A row there already (left by schema 12 above the mark) is
			// kept, and is not this claim's.
			rows := make(Rows, len(fresh))
			for i, o := range fresh {
				rows[i] = []any{tenant, group, topic, o, owner, token, 1, visibleAt, 0, d.EncodeTime(now)}
			}
			if _, err := d.exec(ctx, tx, st.insert, Args{"rows": rows}); err != nil {
				return nil, d.Wrap(op, err)
			}
			if len(withheld) > 0 {
				if _, err := d.claimedMessages(ctx, tx, tenant, topic, st.messagesAt, key.with(Args{"offsets": List(withheld)}), msgs, op); err != nil {
					return nil, err
				}
			}
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

// lockMarks locks the group's cursor row of the ungrouped partition and
// returns the cursor and the claim mark (at least the cursor). A row not
// known to be there is added (or locked) by an upsert before it is read:
// a locking read of a missing row takes a gap lock under REPEATABLE READ,
// and two first claimers' inserts into their gaps would deadlock. A row
// known but gone (the group, its tenant or the drained partition removed)
// is errMarkRowGone: the transaction rolls back, and the caller runs it
// again, then with the upsert.
func (d *Store) lockMarks(ctx context.Context, tx *sql.Tx, key Args, now time.Time) (cursor, mark int64, err error) {
	st := &d.sql().group
	k := markKey(key)
	_, known := d.markRows.Load(k)
	if !known {
		if _, err := d.exec(ctx, tx, st.markRow, key.with(Args{"now": d.EncodeTime(now)})); err != nil {
			return 0, 0, err
		}
	}
	var claimed sql.NullInt64
	err = d.queryRow(ctx, tx, st.marks, key).Scan(&cursor, &claimed)
	if errors.Is(err, sql.ErrNoRows) && known {
		d.markRows.Delete(k)
		return 0, 0, errMarkRowGone
	}
	if err != nil {
		return 0, 0, err
	}
	d.markRows.Store(k, true)
	return cursor, max(cursor, claimed.Int64), nil
}

// errMarkRowGone: the cursor row that lockMarks knew of was removed.
var errMarkRowGone = errors.New("the ungrouped cursor row was removed")

func markKey(key Args) [3]string {
	return [3]string{key["tenant"].(string), key["topic"].(string), key["group"].(string)}
}

// claimWithin chooses, by size, which of the visible-again offsets and
// of the fresh messages a claim within limit.Bytes takes: in offset
// order, each that fits, and the first whatever its size. Delayed ones
// before the cut are chosen too, for their placeholder rows, with their
// not_before in notBefore. Small bodies come with the sized read into
// msgs; withheld lists the chosen ready ones whose bodies are still to be
// read.
func (d *Store) claimWithin(ctx context.Context, tx *sql.Tx, key Args, again []any, freshArgs Args, limit driver.ClaimLimit,
	now time.Time, msgs map[int64]driver.Message, notBefore map[int64]time.Time, op string) (keptAgain, fresh, withheld []any, cut bool, err error) {
	st := &d.sql().group
	tenant, topic := key["tenant"].(string), key["topic"].(string)
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
	for _, o := range candidates {
		delayed := notBefore[o].After(now)
		if !delayed && !fits(o) {
			cut = true
			break
		}
		fresh = append(fresh, o)
		if held[o] && !delayed {
			withheld = append(withheld, o)
		}
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

// AckClaims marks the claimed messages done: one DELETE naming every
// (offset, token, owner) row; fewer rows matched than claims means one
// was claimed again, and the transaction is rolled back. Below the claim
// mark a missing row is a message done.
func (d *Store) AckClaims(ctx context.Context, cs []driver.Claim, now time.Time) error {
	if len(cs) == 0 {
		return nil
	}
	_, err := inTx(ctx, d.Begin, func(tx *sql.Tx) (struct{}, error) { return struct{}{}, d.ackClaims(ctx, tx, cs, now, "") })
	return err
}

func (d *Store) ackClaims(ctx context.Context, tx driver.DBTX, cs []driver.Claim, now time.Time, where string) error {
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
func (d *Store) RetryClaim(ctx context.Context, in driver.RetryClaimParams) error {
	c, retryAt, lastError, now := in.Claim, in.RetryAt, in.LastError, in.Now
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

// DeadLetterClaim marks c's message done (deletes its claim row) and
// appends dlq, atomically.
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
// below its first message that is not done: the lowest open claim, or the
// first message above the claim mark (below it, a message without a claim
// row is done). It deletes the claim rows it passed (done ones that
// schemas before 13 kept).
func (d *Store) AdvanceUngrouped(ctx context.Context, g driver.GroupRef, now time.Time) (int64, error) {
	tenant, topic, group := g.Tenant, g.Topic, g.ConsumerGroup
	op := fmt.Sprintf("advance the ungrouped cursor of tenant %q topic %q group %q", tenant, topic, group)
	key, err := d.ungroupedArgs(ctx, tenant, topic, group)
	if err != nil {
		return 0, err
	}
	// Most calls find nothing to do (an idle group, or its first message
	// still in a handler): ask the read pool, and open a write
	// transaction only when the cursor can move.
	read, err := d.planAdvance(ctx, d.Read, key, false, op)
	if err != nil || read.next <= read.cur {
		return read.cur, err
	}
	return inTx(ctx, d.Begin, func(tx *sql.Tx) (int64, error) {
		// The mark's lock first, as a claim takes it: the reads see every
		// claim committed before, and none commits meanwhile.
		p, err := d.planAdvance(ctx, tx, key, true, op)
		if err != nil || p.next <= p.cur {
			return p.cur, err
		}
		// The cursor moves as a lease's commit does: forward only.
		passed := key.with(Args{"key": "", "offset": p.next, "now": d.EncodeTime(now)})
		if _, err := d.exec(ctx, tx, d.leases().commit, passed); err != nil {
			return 0, d.Wrap(op, err)
		}
		if _, err := d.exec(ctx, tx, d.sql().group.dropPassed, passed); err != nil {
			return 0, d.Wrap(op, err)
		}
		return p.next, nil
	})
}

// advancePlan is where the ungrouped cursor can move: from cur to next.
type advancePlan struct{ cur, next int64 }

// planAdvance reads, through db, the cursor, the claim mark and the lowest
// open claim; locked reads the cursor row with a lock (in a transaction).
func (d *Store) planAdvance(ctx context.Context, db driver.DBTX, key Args, locked bool, op string) (advancePlan, error) {
	st := &d.sql().group
	stmt := st.marksRead
	if locked {
		stmt = st.marks
	}
	var claimed sql.NullInt64
	var p advancePlan
	err := d.queryRow(ctx, db, stmt, key).Scan(&p.cur, &claimed)
	if errors.Is(err, sql.ErrNoRows) {
		// Nothing claimed yet: the first claim adds the row.
		return advancePlan{cur: key["start"].(int64), next: key["start"].(int64)}, nil
	}
	if err != nil {
		return p, d.Wrap(op, err)
	}
	p.next = max(p.cur, claimed.Int64)
	if p.next == p.cur {
		return p, nil
	}
	var open sql.NullInt64
	if err := d.queryRow(ctx, db, st.firstOpen, key.with(Args{"cursor": p.cur})).Scan(&open); err != nil {
		return p, d.Wrap(op, err)
	}
	if open.Valid {
		p.next = min(p.next, open.Int64-1)
	}
	return p, nil
}
