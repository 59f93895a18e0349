// SPDX-License-Identifier: Apache-2.0

package sqlcommon

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/shardq/shardq/driver"
)

func offsetList(offsets []int64) List {
	l := make(List, len(offsets))
	for i, o := range offsets {
		l[i] = o
	}
	return l
}

// ClaimDeferred takes the claimable rows at offsets under a fresh random
// token (an UPDATE, so two claimers serialise on each row and the second
// finds it claimed), then reads back the rows carrying the token with
// their messages: a row whose message is gone claims nothing.
func (d *Store) ClaimDeferred(ctx context.Context, in driver.ClaimDeferredParams) ([]driver.Claim, error) {
	g, offsets, owner, now, visibility := in.Group, in.Offsets, in.Owner, in.Now, in.Visibility
	if len(offsets) == 0 {
		return nil, nil
	}
	op := fmt.Sprintf("receive deferred offsets %v of tenant %q topic %q group %q", offsets, g.Tenant, g.Topic, g.ConsumerGroup)
	st := &d.sql().deferred
	token := rand.Int64N(1<<62) + 1
	visibleUntil := now.Add(visibility)
	key := claimArgsOf(g.Tenant, g.Topic, g.ConsumerGroup).with(Args{"offsets": offsetList(offsets), "token": token})
	return inTx(ctx, d.Begin, func(tx *sql.Tx) ([]driver.Claim, error) {
		res, err := d.exec(ctx, tx, st.claim, key.with(Args{"owner": owner, "visible_at": d.EncodeTime(visibleUntil), "now": d.EncodeTime(now)}))
		if err != nil {
			return nil, d.Wrap(op, err)
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			return nil, err
		}
		rows, err := d.query(ctx, tx, st.claimed, key)
		if err != nil {
			return nil, d.Wrap(op, err)
		}
		defer rows.Close()
		var out []driver.Claim
		for rows.Next() {
			c := driver.Claim{ConsumerGroup: g.ConsumerGroup, Owner: owner, Token: token, VisibleUntil: visibleUntil,
				Message: driver.Message{Tenant: g.Tenant, Topic: g.Topic}}
			var headers []byte
			var created, notBefore any
			if err := rows.Scan(&c.Attempts, &c.Message.PartitionKey, &c.Message.Offset, &c.Message.ID, &headers, &c.Message.Payload, &created, &notBefore); err != nil {
				return nil, fmt.Errorf("%s: %w", op, err)
			}
			if c.Message, err = d.decodeMessage(c.Message, headers, created, op); err != nil {
				return nil, err
			}
			if c.Message.NotBefore, err = d.decodeNotBefore(notBefore); err != nil {
				return nil, fmt.Errorf("%s: not_before: %w", op, err)
			}
			out = append(out, c)
		}
		return out, rows.Err()
	})
}

func deferredOp(verb string, c driver.Claim) string {
	return fmt.Sprintf("%s deferred offset %d of tenant %q topic %q partition %q group %q", verb, c.Message.Offset, c.Message.Tenant, c.Message.Topic, c.Message.PartitionKey, c.ConsumerGroup)
}

// AckDeferred deletes the claimed rows: one DELETE naming every (offset,
// token, owner); fewer rows than claims means one was claimed again, and
// the transaction is rolled back.
func (d *Store) AckDeferred(ctx context.Context, cs []driver.Claim, now time.Time) error {
	if len(cs) == 0 {
		return nil
	}
	_, err := inTx(ctx, d.Begin, func(tx *sql.Tx) (struct{}, error) { return struct{}{}, d.ackDeferred(ctx, tx, cs, "") })
	return err
}

func (d *Store) ackDeferred(ctx context.Context, tx driver.DBTX, cs []driver.Claim, where string) error {
	c0 := cs[0]
	op := fmt.Sprintf("ack %d deferred messages of tenant %q topic %q group %q%s", len(cs), c0.Message.Tenant, c0.Message.Topic, c0.ConsumerGroup, where)
	triples := make(Rows, len(cs))
	for i, c := range cs {
		triples[i] = []any{c.Message.Offset, c.Token, c.Owner}
	}
	res, err := d.exec(ctx, tx, d.sql().deferred.ack, claimArgsOf(c0.Message.Tenant, c0.Message.Topic, c0.ConsumerGroup).with(Args{"claims": triples}))
	if err != nil {
		return d.Wrap(op, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if n != int64(len(cs)) {
		return fmt.Errorf("%s: %w (%d of them claimed again or settled)", op, driver.ErrLeaseLost, int64(len(cs))-n)
	}
	return nil
}

// ReleaseDeferred makes c's row claimable from visibleAt, deferred still.
func (d *Store) ReleaseDeferred(ctx context.Context, c driver.Claim, visibleAt, now time.Time) error {
	return d.claimWrite(ctx, d.Write, c, deferredOp("release", c), d.sql().deferred.release, Args{"visible_at": d.EncodeTime(visibleAt), "now": d.EncodeTime(now)})
}

// ExtendDeferred moves c's claim to visibleAt.
func (d *Store) ExtendDeferred(ctx context.Context, c driver.Claim, visibleAt, now time.Time) error {
	return d.claimWrite(ctx, d.Write, c, deferredOp("change the visibility of", c), d.sql().deferred.extend, Args{"visible_at": d.EncodeTime(visibleAt), "now": d.EncodeTime(now)})
}

// DeadLetterDeferred deletes c's row and appends dlq, atomically.
func (d *Store) DeadLetterDeferred(ctx context.Context, c driver.Claim, dlq *driver.InsertMessage, now time.Time) error {
	_, err := inTx(ctx, d.Begin, func(tx *sql.Tx) (struct{}, error) {
		op := deferredOp("dead-letter", c) + " to topic " + dlq.Topic
		if err := d.claimWrite(ctx, tx, c, op, d.sql().deferred.settle, nil); err != nil {
			return struct{}{}, err
		}
		if err := d.Insert(ctx, tx, []*driver.InsertMessage{dlq}); err != nil {
			return struct{}{}, fmt.Errorf("%s: %w", op, err)
		}
		return struct{}{}, nil
	})
	return err
}

// ListDeferred reads a page of the group's deferred rows whose message is
// stored.
func (d *Store) ListDeferred(ctx context.Context, g driver.GroupRef, after int64, limit int) ([]driver.Deferred, error) {
	op := fmt.Sprintf("list deferred messages of tenant %q topic %q group %q", g.Tenant, g.Topic, g.ConsumerGroup)
	rows, err := d.query(ctx, d.Read, d.sql().deferred.list, claimArgsOf(g.Tenant, g.Topic, g.ConsumerGroup).with(Args{"after": after, "limit": limit}))
	if err != nil {
		return nil, d.Wrap(op, err)
	}
	defer rows.Close()
	var out []driver.Deferred
	for rows.Next() {
		r := driver.Deferred{ConsumerGroup: g.ConsumerGroup, Message: driver.Message{Tenant: g.Tenant, Topic: g.Topic}}
		var visible, deferredAt, created, notBefore any
		if err := rows.Scan(&r.Message.Offset, &r.Message.PartitionKey, &r.Attempts, &r.Owner, &visible, &deferredAt, &r.Message.ID, &created, &notBefore); err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		for _, t := range []struct {
			dst *time.Time
			src any
		}{{&r.VisibleUntil, visible}, {&r.DeferredAt, deferredAt}, {&r.Message.CreatedAt, created}} {
			if *t.dst, err = d.DecodeTime(t.src); err != nil {
				return nil, fmt.Errorf("%s: %w", op, err)
			}
		}
		if r.Message.NotBefore, err = d.decodeNotBefore(notBefore); err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// DeferredCounts counts the group's deferred rows of keys, per key
// (ranges of idx_deferred_partition).
func (d *Store) DeferredCounts(ctx context.Context, g driver.GroupRef, keys []string) (map[string]int64, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	op := fmt.Sprintf("count deferred messages of tenant %q topic %q group %q", g.Tenant, g.Topic, g.ConsumerGroup)
	out := map[string]int64{}
	for chunk := range slices.Chunk(keys, countKeys) {
		m, err := d.keyedInts(ctx, d.sql().deferred.counts, claimArgsOf(g.Tenant, g.Topic, g.ConsumerGroup).with(Args{"keys": textList(chunk)}), op)
		if errors.Is(err, driver.ErrNotMigrated) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		maps.Copy(out, m)
	}
	return out, nil
}

// countKeys bounds the keys of one count statement.
const countKeys = 500

// DeferredFloors reads each partition's lowest deferred offset (a range of
// idx_deferred_partition). A schema without the table has none.
func (d *Store) DeferredFloors(ctx context.Context, tenant, topic string) (map[string]int64, error) {
	op := fmt.Sprintf("read the deferred messages of tenant %q topic %q", tenant, topic)
	m, err := d.keyedInts(ctx, d.sql().deferred.floors, Args{"tenant": tenant, "topic": topic}, op)
	if errors.Is(err, driver.ErrNotMigrated) {
		return nil, nil
	}
	return m, err
}

func (d *Store) keyedInts(ctx context.Context, stmt string, args Args, op string) (map[string]int64, error) {
	rows, err := d.query(ctx, d.Read, stmt, args)
	if err != nil {
		return nil, d.Wrap(op, err)
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var k string
		var n int64
		if err := rows.Scan(&k, &n); err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		out[k] = n
	}
	return out, rows.Err()
}

// goneBatch bounds one read and delete of dangling deferred rows, and
// goneBatches the batches of one call (the next pass goes on).
const (
	goneBatch   = 500
	goneBatches = 20
)

// DropDeferredGone deletes the deferred rows of a topic whose message
// retention (or an operator) deleted, a batch at a time: a row is read
// as gone, and deleted by its key; a message never comes back at an
// offset once deleted, so the read cannot go stale.
func (d *Store) DropDeferredGone(ctx context.Context, tenant, topic string) (int64, error) {
	op := fmt.Sprintf("drop the deferred rows of tenant %q topic %q whose message is gone", tenant, topic)
	st := &d.sql().deferred
	var total int64
	for range goneBatches {
		rows, err := d.query(ctx, d.Read, st.gone, Args{"tenant": tenant, "topic": topic, "limit": goneBatch})
		if err != nil {
			return total, d.Wrap(op, err)
		}
		byGroup := map[string][]int64{}
		var n int
		for rows.Next() {
			var g string
			var o int64
			if err := rows.Scan(&g, &o); err != nil {
				rows.Close()
				return total, fmt.Errorf("%s: %w", op, err)
			}
			byGroup[g] = append(byGroup[g], o)
			n++
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return total, fmt.Errorf("%s: %w", op, err)
		}
		for g, offs := range byGroup {
			res, err := d.exec(ctx, d.Write, st.dropGone, claimArgsOf(tenant, topic, g).with(Args{"offsets": offsetList(offs)}))
			if err != nil {
				return total, d.Wrap(op, err)
			}
			k, err := res.RowsAffected()
			if err != nil {
				return total, fmt.Errorf("%s: %w", op, err)
			}
			total += k
		}
		if n < goneBatch {
			break
		}
	}
	return total, nil
}
