// SPDX-License-Identifier: Apache-2.0

package sqlcommon

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/shardq/shardq/driver"
)

// Store implements, on top of a Dialect, the parts of driver.Driver that
// are the same SQL on every database: the lease protocol, retry
// bookkeeping, reads after a cursor and partition listings. Drivers embed
// it.
type Store struct {
	Dialect
	// Begin starts a write transaction (the driver's BeginWrite).
	Begin func(ctx context.Context) (*sql.Tx, error)
	// Read serves queries; Write serves single-statement writes.
	Read, Write driver.DBTX
	// Insert appends messages inside a transaction (the driver's
	// InsertMessages), for dead-lettering.
	Insert func(ctx context.Context, tx driver.DBTX, msgs []*driver.InsertMessage) error
	// Sharded, when set, reports whether tenants live on shards of their
	// own (Vitess). A write that spans tenants then takes each tenant's
	// locks in a statement of its own, tenant after tenant (tenantRuns).
	Sharded func() bool
	// TxPool, when set, returns the pool the driver's write transactions
	// begin on (nil until the first; Write when it returns nil): MySQL's
	// pool of sessions with autocommit off. Their prepared statements are
	// that pool's.
	TxPool func() *sql.DB

	once   sync.Once
	stmts  *statements
	caches statementCaches
	// busyClaims remembers, per (tenant, topic, group), that the last
	// claim filled its batch (ClaimMessages).
	busyClaims sync.Map
	// groupStarts remembers registry rows' start offsets (groupStart).
	groupStarts sync.Map
	// markRows remembers, per (tenant, topic, group), that the cursor row
	// holding the claim mark was there (lockMarks).
	markRows sync.Map
}

// sql is the dialect's statements, written on first use.
func (d *Store) sql() *statements {
	d.once.Do(func() { d.stmts = newStatements(d.Syntax) })
	return d.stmts
}

// leases is the lease protocol's statements.
func (d *Store) leases() *leaseSQL { return &d.sql().lease }

// tenantRuns splits tenants, sorted, into the lists that one statement
// may span: all of them on one database; one each when sharded. Through
// vtgate a statement over two shards locks on both at once, and two
// transactions that each hold a row on one shard and wait for the other's
// on the next wait on each other unseen: each shard's database sees only
// its half of the cycle, so neither detects the deadlock, and both wait
// out the lock wait timeout. Taking the tenants' locks one statement
// after another, in tenant order, as CommitOffsets does, keeps every
// transaction to one order, and no cycle forms.
func (d *Store) tenantRuns(tenants []string) [][]string {
	tenants = slices.Sorted(slices.Values(tenants))
	if d.Sharded == nil || !d.Sharded() {
		return [][]string{tenants}
	}
	runs := make([][]string, len(tenants))
	for i, t := range tenants {
		runs[i] = []string{t}
	}
	return runs
}

// inTx runs fn in a write transaction and commits it.
func inTx[T any](ctx context.Context, begin func(context.Context) (*sql.Tx, error), fn func(tx *sql.Tx) (T, error)) (T, error) {
	var zero T
	tx, err := begin(ctx)
	if err != nil {
		return zero, err
	}
	v, err := fn(tx)
	if err != nil {
		if rbErr := tx.Rollback(); rbErr != nil && !errors.Is(rbErr, sql.ErrTxDone) {
			return zero, errors.Join(err, fmt.Errorf("rollback: %w", rbErr))
		}
		return zero, err
	}
	if err := tx.Commit(); err != nil {
		return zero, fmt.Errorf("commit: %w", err)
	}
	return v, nil
}

// AcquireLease makes sure the lease row exists, locks it, and takes it for
// owner with the next token unless another owner holds it unexpired.
//
// A row another owner holds unexpired is refused on a plain read, before
// any transaction: a process frozen inside this one would otherwise keep
// the holder's row locked (the ensuring upsert and the locking read both
// lock it), and the holder's renewals and commits waiting, until the
// server ended its session (docs/leases.md, "Bounded waits").
func (d *Store) AcquireLease(ctx context.Context, in driver.AcquireLeaseParams) (driver.Lease, error) {
	p, owner, now, ttl := in.Partition, in.Owner, in.Now, in.TTL
	op := "acquire lease on " + p.String()
	st, key := d.leases(), refNamed(p)
	var holder string
	var expires any
	switch err := d.queryRow(ctx, d.Read, st.peek, key).Scan(&holder, &expires); {
	case errors.Is(err, sql.ErrNoRows):
	case err != nil:
		return driver.Lease{}, d.Wrap(op, err)
	default:
		exp, err := d.DecodeTime(expires)
		if err != nil {
			return driver.Lease{}, fmt.Errorf("%s: %w", op, err)
		}
		if holder != "" && holder != owner && exp.After(now) {
			return driver.Lease{}, &driver.LeaseHeldError{Partition: p, Owner: holder, ExpiresAt: exp}
		}
	}
	return inTx(ctx, d.Begin, func(tx *sql.Tx) (driver.Lease, error) {
		if _, err := d.exec(ctx, tx, st.ensure, key.with(Args{"now": d.EncodeTime(now), "first_token": now.UnixMicro()})); err != nil {
			return driver.Lease{}, d.Wrap(op, err)
		}
		var holder string
		var token int64
		var expires any
		if err := d.queryRow(ctx, tx, st.lock, key).Scan(&holder, &token, &expires); err != nil {
			return driver.Lease{}, d.Wrap(op, err)
		}
		exp, err := d.DecodeTime(expires)
		if err != nil {
			return driver.Lease{}, fmt.Errorf("%s: %w", op, err)
		}
		if holder != "" && holder != owner && exp.After(now) {
			return driver.Lease{}, &driver.LeaseHeldError{Partition: p, Owner: holder, ExpiresAt: exp}
		}
		l := driver.Lease{PartitionRef: p, Owner: owner, Token: token + 1, ExpiresAt: now.Add(ttl)}
		err = d.queryRow(ctx, tx, st.committed, key).Scan(&l.Committed)
		if errors.Is(err, sql.ErrNoRows) { // no cursor yet: where the group starts
			err = d.queryRow(ctx, tx, st.start, key).Scan(&l.Committed)
		}
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return driver.Lease{}, d.Wrap(op, err)
		}
		if _, err := d.exec(ctx, tx, st.take, key.with(Args{"owner": owner, "token": l.Token, "expires_at": d.EncodeTime(l.ExpiresAt),
			"now": d.EncodeTime(now)})); err != nil {
			return driver.Lease{}, d.Wrap(op, err)
		}
		return l, nil
	})
}

// fence locks l's row if, and only if, l's token and owner are current.
// Every write under a lease runs in a transaction that starts with it, so
// the row stays locked (a takeover waits) until that write commits.
func (d *Store) fence(ctx context.Context, tx driver.DBTX, l driver.Lease, op string) error {
	var one int
	err := d.queryRow(ctx, tx, d.leases().fence, refNamed(l.PartitionRef).with(Args{"token": l.Token, "owner": l.Owner})).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("%s: %w (token %d)", op, driver.ErrLeaseLost, l.Token)
	}
	if err != nil {
		return d.Wrap(op, err)
	}
	return nil
}

// RenewLease extends l, which must not have expired by now: an expired
// lease is lost to its holder even when nobody took it (docs/leases.md).
func (d *Store) RenewLease(ctx context.Context, l driver.Lease, now time.Time, ttl time.Duration) (driver.Lease, error) {
	return inTx(ctx, d.Begin, func(tx *sql.Tx) (driver.Lease, error) {
		op := "renew lease on " + l.PartitionRef.String()
		if err := d.fence(ctx, tx, l, op); err != nil {
			return driver.Lease{}, err
		}
		if !l.ExpiresAt.After(now) {
			return driver.Lease{}, fmt.Errorf("%s: %w (token %d expired at %s)", op, driver.ErrLeaseLost, l.Token, l.ExpiresAt.Format(time.RFC3339Nano))
		}
		l.ExpiresAt = now.Add(ttl)
		if _, err := d.exec(ctx, tx, d.leases().renew, refNamed(l.PartitionRef).with(Args{"expires_at": d.EncodeTime(l.ExpiresAt), "token": l.Token})); err != nil {
			return driver.Lease{}, d.Wrap(op, err)
		}
		return l, nil
	})
}

// ResumeLease extends l under its fence whatever its expiry, and reads
// the cursor.
func (d *Store) ResumeLease(ctx context.Context, l driver.Lease, now time.Time, ttl time.Duration) (driver.Lease, error) {
	return d.ResumeLeaseBelow(ctx, driver.ResumeLeaseBelowParams{Lease: l, Offset: math.MaxInt64, Now: now, TTL: ttl})
}

// ResumeLeaseBelow reads the cursor under l's fence and extends l only
// while the cursor is below offset: one transaction, so that an ack
// passing offset meanwhile either comes first (and the lease is left as
// it was) or waits for the extension.
func (d *Store) ResumeLeaseBelow(ctx context.Context, in driver.ResumeLeaseBelowParams) (driver.Lease, error) {
	l, offset, now, ttl := in.Lease, in.Offset, in.Now, in.TTL
	return inTx(ctx, d.Begin, func(tx *sql.Tx) (driver.Lease, error) {
		op := "resume lease on " + l.PartitionRef.String()
		if err := d.fence(ctx, tx, l, op); err != nil {
			return driver.Lease{}, err
		}
		st, key := d.leases(), refNamed(l.PartitionRef)
		err := d.queryRow(ctx, tx, st.committed, key).Scan(&l.Committed)
		if errors.Is(err, sql.ErrNoRows) { // no cursor yet: where the group starts
			err = d.queryRow(ctx, tx, st.start, key).Scan(&l.Committed)
		}
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return driver.Lease{}, d.Wrap(op, err)
		}
		if l.Committed >= offset {
			return l, nil
		}
		l.ExpiresAt = now.Add(ttl)
		if _, err := d.exec(ctx, tx, st.renew, key.with(Args{"expires_at": d.EncodeTime(l.ExpiresAt), "token": l.Token})); err != nil {
			return driver.Lease{}, d.Wrap(op, err)
		}
		return l, nil
	})
}

// RenewLeases extends many leases of one owner (one group and topic) in
// one transaction: an UPDATE whose WHERE names every lease's token, then a
// read of the owner's rows. A lease whose row still carries its token was
// matched and is locked by the UPDATE until commit; the others are lost,
// and so is every lease that expired by now (RenewLease).
func (d *Store) RenewLeases(ctx context.Context, ls []driver.Lease, now time.Time, ttl time.Duration) ([]driver.Lease, []driver.Lease, error) {
	if len(ls) == 0 {
		return nil, nil, nil
	}
	owner, group, topic := ls[0].Owner, ls[0].ConsumerGroup, ls[0].Topic
	tenantSet := map[string]bool{}
	var tenants []string
	for _, l := range ls {
		if l.Owner != owner || l.ConsumerGroup != group || l.Topic != topic {
			return nil, nil, fmt.Errorf("renew leases: mixed owners, groups or topics (%s and %s)", ls[0].PartitionRef, l.PartitionRef)
		}
		if !tenantSet[l.Tenant] {
			tenantSet[l.Tenant] = true
			tenants = append(tenants, l.Tenant)
		}
	}
	type result struct{ renewed, lost []driver.Lease }
	var expired []driver.Lease
	live := ls[:0:0]
	for _, l := range ls {
		if l.ExpiresAt.After(now) {
			live = append(live, l)
		} else {
			expired = append(expired, l)
		}
	}
	if len(live) == 0 {
		return nil, expired, nil
	}
	ls = live
	res, err := inTx(ctx, d.Begin, func(tx *sql.Tx) (result, error) {
		op := fmt.Sprintf("renew %d leases of %q in group %q topic %q", len(ls), owner, group, topic)
		expires := now.Add(ttl)
		members := memberNamed(tenants, group, topic).with(Args{"owner": owner})
		for _, run := range d.tenantRuns(tenants) {
			var mine []driver.Lease
			for _, l := range ls {
				if slices.Contains(run, l.Tenant) {
					mine = append(mine, l)
				}
			}
			for start := 0; start < len(mine); start += 500 {
				part := mine[start:min(start+500, len(mine))]
				named := make(Rows, len(part))
				for i, l := range part {
					named[i] = []any{l.Tenant, l.PartitionKey, l.Token}
				}
				if _, err := d.exec(ctx, tx, d.leases().renewMany, memberNamed(run, group, topic).with(Args{"owner": owner,
					"expires_at": d.EncodeTime(expires), "leases": named})); err != nil {
					return result{}, d.Wrap(op, err)
				}
			}
		}
		rows, err := d.query(ctx, tx, d.leases().ownedTokens, members)
		if err != nil {
			return result{}, d.Wrap(op, err)
		}
		defer rows.Close()
		current := map[[2]string]int64{}
		for rows.Next() {
			var t, k string
			var token int64
			if err := rows.Scan(&t, &k, &token); err != nil {
				return result{}, fmt.Errorf("%s: %w", op, err)
			}
			current[[2]string{t, k}] = token
		}
		if err := rows.Err(); err != nil {
			return result{}, fmt.Errorf("%s: %w", op, err)
		}
		var r result
		for _, l := range ls {
			if tok, ok := current[[2]string{l.Tenant, l.PartitionKey}]; ok && tok == l.Token {
				l.ExpiresAt = expires
				r.renewed = append(r.renewed, l)
			} else {
				r.lost = append(r.lost, l)
			}
		}
		return r, nil
	})
	return res.renewed, append(res.lost, expired...), err
}

// ReleaseLease frees l; its token stays, so the next owner's is higher.
func (d *Store) ReleaseLease(ctx context.Context, l driver.Lease, now time.Time) error {
	_, err := inTx(ctx, d.Begin, func(tx *sql.Tx) (struct{}, error) {
		op := "release lease on " + l.PartitionRef.String()
		if err := d.fence(ctx, tx, l, op); err != nil {
			return struct{}{}, err
		}
		_, err := d.exec(ctx, tx, d.leases().release, refNamed(l.PartitionRef).with(Args{"now": d.EncodeTime(now), "token": l.Token}))
		return struct{}{}, d.wrapNil(op, err)
	})
	return err
}

// ExpireLeases ends owner's leases at now, its name kept.
func (d *Store) ExpireLeases(ctx context.Context, g driver.GroupScope, owner string, now time.Time) (int64, error) {
	if len(g.Tenants) == 0 {
		return 0, nil
	}
	var n int64
	for _, run := range d.tenantRuns(g.Tenants) {
		res, err := d.exec(ctx, d.Write, d.leases().expire, memberNamed(run, g.ConsumerGroup, g.Topic).with(Args{"owner": owner, "now": d.EncodeTime(now)}))
		if err != nil {
			return n, d.Wrap(fmt.Sprintf("end the leases of %q in group %q topic %q", owner, g.ConsumerGroup, g.Topic), err)
		}
		k, err := res.RowsAffected()
		if err != nil {
			return n, err
		}
		n += k
	}
	return n, nil
}

// CommitOffset moves the group's cursor forward under l and drops the
// bookkeeping of the messages it passed.
func (d *Store) CommitOffset(ctx context.Context, l driver.Lease, offset int64, now time.Time) error {
	_, err := inTx(ctx, d.Begin, func(tx *sql.Tx) (struct{}, error) {
		op := fmt.Sprintf("commit offset %d on %s", offset, l.PartitionRef)
		if err := d.fence(ctx, tx, l, op); err != nil {
			return struct{}{}, err
		}
		return struct{}{}, d.commitOffset(ctx, tx, l, offset, now, op)
	})
	return err
}

// CommitOffsets commits several leases' cursors in one transaction: it
// fences every lease first, in partition order, and only then commits
// and drops bookkeeping, so that it holds no range of
// queue_delivery_state while it waits for another lease's row (a worker
// recording an attempt under that lease would wait for the range: a
// cycle). When any lease is lost it changes nothing and returns
// ErrLeaseLost.
func (d *Store) CommitOffsets(ctx context.Context, cs []driver.OffsetCommit, now time.Time) error {
	if len(cs) == 0 {
		return nil
	}
	cs = slices.Clone(cs)
	slices.SortFunc(cs, func(a, b driver.OffsetCommit) int { return a.Lease.PartitionRef.Compare(b.Lease.PartitionRef) })
	_, err := inTx(ctx, d.Begin, func(tx *sql.Tx) (struct{}, error) {
		for _, c := range cs {
			if err := d.fence(ctx, tx, c.Lease, fmt.Sprintf("commit offset %d on %s", c.Offset, c.Lease.PartitionRef)); err != nil {
				return struct{}{}, err
			}
		}
		for _, c := range cs {
			if err := d.commitOffset(ctx, tx, c.Lease, c.Offset, now, fmt.Sprintf("commit offset %d on %s", c.Offset, c.Lease.PartitionRef)); err != nil {
				return struct{}{}, err
			}
		}
		return struct{}{}, nil
	})
	return err
}

// CommitReceived commits like CommitOffset, but only up to the
// partition's head, read in the statement that fences the lease; with
// release it frees the lease in the same transaction.
func (d *Store) CommitReceived(ctx context.Context, in driver.CommitReceivedParams) error {
	l, offset, release, now := in.Lease, in.Offset, in.Release, in.Now
	_, err := inTx(ctx, d.Begin, func(tx *sql.Tx) (struct{}, error) {
		op := fmt.Sprintf("commit received offset %d on %s", offset, l.PartitionRef)
		if err := d.fenceHead(ctx, tx, l, offset, op); err != nil {
			return struct{}{}, err
		}
		if err := d.commitOffset(ctx, tx, l, offset, now, op); err != nil || !release {
			return struct{}{}, err
		}
		_, err := d.exec(ctx, tx, d.leases().release, refNamed(l.PartitionRef).with(Args{"now": d.EncodeTime(now), "token": l.Token}))
		return struct{}{}, d.wrapNil(op+" and release the lease", err)
	})
	return err
}

// CommitReceivedKeep commits as CommitReceived does and then, with the
// head read in the fencing statement past offset, takes the row for
// owner with the next token (the receipts of l go stale); else it frees
// it. The row stays locked from the fence to the commit, so nothing
// takes the group between the two.
func (d *Store) CommitReceivedKeep(ctx context.Context, in driver.CommitReceivedKeepParams) (driver.Lease, bool, error) {
	l, offset, owner, now, ttl := in.Lease, in.Offset, in.Owner, in.Now, in.TTL
	type kept struct {
		l    driver.Lease
		kept bool
	}
	k, err := inTx(ctx, d.Begin, func(tx *sql.Tx) (kept, error) {
		op := fmt.Sprintf("commit received offset %d on %s", offset, l.PartitionRef)
		head, err := d.fenceHeadAt(ctx, tx, l, offset, op)
		if err != nil {
			return kept{}, err
		}
		if err := d.commitOffset(ctx, tx, l, offset, now, op); err != nil {
			return kept{}, err
		}
		st, key := d.leases(), refNamed(l.PartitionRef)
		if head == offset {
			_, err := d.exec(ctx, tx, st.release, key.with(Args{"now": d.EncodeTime(now), "token": l.Token}))
			return kept{}, d.wrapNil(op+" and release the lease", err)
		}
		next := driver.Lease{PartitionRef: l.PartitionRef, Owner: owner, Token: l.Token + 1, ExpiresAt: now.Add(ttl), Committed: offset}
		_, err = d.exec(ctx, tx, st.take, key.with(Args{"owner": owner, "token": next.Token, "expires_at": d.EncodeTime(next.ExpiresAt),
			"now": d.EncodeTime(now)}))
		return kept{next, true}, d.wrapNil(op+" and keep the lease", err)
	})
	return k.l, k.kept, err
}

// fenceHead fences l and refuses an offset past the partition's head,
// read in the fencing statement.
func (d *Store) fenceHead(ctx context.Context, tx driver.DBTX, l driver.Lease, offset int64, op string) error {
	_, err := d.fenceHeadAt(ctx, tx, l, offset, op)
	return err
}

// fenceHeadAt is fenceHead, returning the head.
func (d *Store) fenceHeadAt(ctx context.Context, tx driver.DBTX, l driver.Lease, offset int64, op string) (int64, error) {
	var head sql.NullInt64
	err := d.queryRow(ctx, tx, d.leases().fenceHead, refNamed(l.PartitionRef).with(Args{"token": l.Token, "owner": l.Owner})).Scan(&head)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return 0, fmt.Errorf("%s: %w (token %d)", op, driver.ErrLeaseLost, l.Token)
	case err != nil:
		return 0, d.Wrap(op, err)
	case !head.Valid: // the partition was removed: so was what the lease held
		return 0, fmt.Errorf("%s: %w (no partition)", op, driver.ErrLeaseLost)
	case offset > head.Int64:
		return 0, fmt.Errorf("%s: %w (head %d)", op, driver.ErrPastHead, head.Int64)
	}
	return head.Int64, nil
}

func (d *Store) commitOffset(ctx context.Context, tx driver.DBTX, l driver.Lease, offset int64, now time.Time, op string) error {
	st, args := d.leases(), refNamed(l.PartitionRef).with(Args{"offset": offset, "now": d.EncodeTime(now)})
	if _, err := d.exec(ctx, tx, st.commit, args); err != nil {
		return d.Wrap(op, err)
	}
	if _, err := d.exec(ctx, tx, st.dropStates, args); err != nil {
		return d.Wrap(op, err)
	}
	return nil
}

// RecordAttempt upserts a message's retry bookkeeping under l.
func (d *Store) RecordAttempt(ctx context.Context, in driver.RecordAttemptParams) error {
	l, offset, st, now := in.Lease, in.Offset, in.State, in.Now
	_, err := inTx(ctx, d.Begin, func(tx *sql.Tx) (struct{}, error) {
		op := fmt.Sprintf("record attempt %d of offset %d on %s", st.Attempts, offset, l.PartitionRef)
		if err := d.fence(ctx, tx, l, op); err != nil {
			return struct{}{}, err
		}
		_, err := d.exec(ctx, tx, d.leases().record, refNamed(l.PartitionRef).with(Args{"offset": offset, "attempts": st.Attempts,
			"next_attempt_at": d.EncodeTime(st.NextAttemptAt), "last_error": st.LastError, "now": d.EncodeTime(now)}))
		return struct{}{}, d.wrapNil(op, err)
	})
	return err
}

// DeliveryStates reads the retry bookkeeping of offsets in (after, upTo].
func (d *Store) DeliveryStates(ctx context.Context, p driver.PartitionRef, after, upTo int64) (map[int64]driver.DeliveryState, error) {
	op := fmt.Sprintf("read delivery state of offsets (%d, %d] on %s", after, upTo, p)
	rows, err := d.query(ctx, d.Read, d.leases().states, refNamed(p).with(Args{"after": after, "up_to": upTo}))
	if err != nil {
		return nil, d.Wrap(op, err)
	}
	defer rows.Close()
	return scanStates[int64](d, rows, op)
}

// scanStates reads rows of (key, attempts, next_attempt_at, last_error)
// into a map by key (an offset, or a consumer group).
func scanStates[K comparable](d *Store, rows *sql.Rows, op string) (map[K]driver.DeliveryState, error) {
	out := map[K]driver.DeliveryState{}
	for rows.Next() {
		var key K
		var st driver.DeliveryState
		var next any
		var lastErr sql.NullString
		if err := rows.Scan(&key, &st.Attempts, &next, &lastErr); err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		if next != nil {
			var err error
			if st.NextAttemptAt, err = d.DecodeTime(next); err != nil {
				return nil, fmt.Errorf("%s: %w", op, err)
			}
		}
		st.LastError = lastErr.String
		out[key] = st
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	return out, nil
}

// DeadLetter appends dlq (through the driver's InsertMessages), drops
// the message's bookkeeping and passes the cursor over it, all under l in
// one transaction.
func (d *Store) DeadLetter(ctx context.Context, in driver.DeadLetterParams) error {
	l, dlq, offset, now := in.Lease, in.Copy, in.Offset, in.Now
	_, err := inTx(ctx, d.Begin, func(tx *sql.Tx) (struct{}, error) {
		op := fmt.Sprintf("dead-letter offset %d of %s to topic %q", offset, l.PartitionRef, dlq.Topic)
		if err := d.fence(ctx, tx, l, op); err != nil {
			return struct{}{}, err
		}
		if err := d.Insert(ctx, tx, []*driver.InsertMessage{dlq}); err != nil {
			return struct{}{}, fmt.Errorf("%s: %w", op, err)
		}
		return struct{}{}, d.commitOffset(ctx, tx, l, offset, now, op)
	})
	return err
}

func (d Dialect) wrapNil(op string, err error) error {
	if err == nil {
		return nil
	}
	return d.Wrap(op, err)
}

// ListLeases lists lease rows, free ones included.
func (d *Store) ListLeases(ctx context.Context, g driver.GroupScope) ([]driver.Lease, error) {
	tenants, group, topic := g.Tenants, g.ConsumerGroup, g.Topic
	return d.listLeases(ctx, d.leases().list, tenants, group, topic)
}

// HeldLeases lists the lease rows an owner holds: a discovery tick's cost
// then follows the held leases, not every partition the group ever read.
func (d *Store) HeldLeases(ctx context.Context, g driver.GroupScope) ([]driver.Lease, error) {
	tenants, group, topic := g.Tenants, g.ConsumerGroup, g.Topic
	ls, err := d.listLeases(ctx, d.leases().held, tenants, group, topic)
	slices.SortFunc(ls, func(a, b driver.Lease) int {
		return cmp.Or(strings.Compare(a.Tenant, b.Tenant), strings.Compare(a.PartitionKey, b.PartitionKey))
	})
	return ls, err
}

func (d *Store) listLeases(ctx context.Context, stmt string, tenants []string, group, topic string) ([]driver.Lease, error) {
	if len(tenants) == 0 {
		return nil, nil
	}
	op := fmt.Sprintf("list leases of group %q topic %q", group, topic)
	rows, err := d.query(ctx, d.Read, stmt, memberNamed(tenants, group, topic))
	if err != nil {
		return nil, d.Wrap(op, err)
	}
	defer rows.Close()
	var out []driver.Lease
	for rows.Next() {
		l := driver.Lease{PartitionRef: driver.PartitionRef{ConsumerGroup: group, Topic: topic}}
		var exp any
		if err := rows.Scan(&l.Tenant, &l.PartitionKey, &l.Owner, &l.Token, &exp); err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		if l.ExpiresAt, err = d.DecodeTime(exp); err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		out = append(out, l)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	return out, nil
}

// SweepLeases frees the leases, acquired before now, of those of owners
// whose heartbeat row is older than staleBefore (or gone), and advances
// their tokens: one statement per tenant (one shard), which no frozen
// process can leave holding the rows of members that are alive. A
// heartbeat that lands just after it does not make the swept leases live
// again: it came too late, and its member stops the workers they fed
// (docs/leases.md).
func (d *Store) SweepLeases(ctx context.Context, in driver.SweepLeasesParams) (int64, error) {
	g, owners, staleBefore, now := in.Group, in.Owners, in.StaleBefore, in.Now
	if len(owners) == 0 {
		return 0, nil
	}
	var swept int64
	var errs []error
	for _, tenant := range g.Tenants {
		res, err := d.exec(ctx, d.Write, d.leases().sweep, memberNamed([]string{tenant}, g.ConsumerGroup, g.Topic).with(Args{
			"owners": textList(owners), "stale_before": d.EncodeTime(staleBefore), "now": d.EncodeTime(now)}))
		if err == nil {
			var n int64
			if n, err = res.RowsAffected(); err == nil {
				swept += n
			}
		}
		if err != nil {
			errs = append(errs, d.Wrap(fmt.Sprintf("sweep leases of tenant %q group %q topic %q", tenant, g.ConsumerGroup, g.Topic), err))
		}
	}
	return swept, errors.Join(errs...)
}

// TakeOverMember moves previous' leases to member and replaces their
// heartbeat rows, tenant by tenant (each transaction on one shard).
func (d *Store) TakeOverMember(ctx context.Context, in driver.TakeOverMemberParams) ([]driver.Lease, error) {
	g, previous, member, now, ttl := in.Group, in.Previous, in.Member, in.Now, in.TTL
	if len(previous) == 0 {
		return nil, nil
	}
	var moved []driver.Lease
	for _, tenant := range g.Tenants {
		op := fmt.Sprintf("take over the leases of %q for %q in tenant %q group %q topic %q", previous, member, tenant, g.ConsumerGroup, g.Topic)
		ls, err := inTx(ctx, d.Begin, func(tx *sql.Tx) ([]driver.Lease, error) {
			scope := memberNamed([]string{tenant}, g.ConsumerGroup, g.Topic).with(Args{"owners": textList(previous)})
			rows, err := d.query(ctx, tx, d.leases().takenLeases, scope)
			if err != nil {
				return nil, d.Wrap(op, err)
			}
			var ls []driver.Lease
			for rows.Next() {
				l := driver.Lease{PartitionRef: driver.PartitionRef{Tenant: tenant, ConsumerGroup: g.ConsumerGroup, Topic: g.Topic}, Owner: member}
				var exp any
				if err := rows.Scan(&l.PartitionKey, &exp); err != nil {
					rows.Close()
					return nil, fmt.Errorf("%s: %w", op, err)
				}
				if l.ExpiresAt, err = d.DecodeTime(exp); err != nil {
					rows.Close()
					return nil, fmt.Errorf("%s: %w", op, err)
				}
				ls = append(ls, l)
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return nil, fmt.Errorf("%s: %w", op, err)
			}
			// Only the rows read: under READ COMMITTED a lease the earlier
			// incarnation took since is not locked by the read, and its
			// expiry is not known.
			if len(ls) > 0 {
				keys := make([]string, len(ls))
				for i, l := range ls {
					keys[i] = l.PartitionKey
				}
				if _, err := d.exec(ctx, tx, d.leases().takeOver, scope.with(Args{"member": member, "expires_at": d.EncodeTime(now.Add(ttl)), "keys": textList(keys)})); err != nil {
					return nil, d.Wrap(op, err)
				}
			}
			if _, err := d.exec(ctx, tx, d.leases().removeMembers, scope); err != nil {
				return nil, d.Wrap(op, err)
			}
			row := Rows{{tenant, g.ConsumerGroup, g.Topic, member, d.EncodeTime(now), d.EncodeTime(now)}}
			if _, err := d.exec(ctx, tx, d.leases().heartbeat, Args{"rows": row}); err != nil {
				return nil, d.Wrap(op, err)
			}
			return ls, nil
		})
		if err != nil {
			return moved, err
		}
		moved = append(moved, ls...)
	}
	return moved, nil
}

// Heartbeat upserts subscriber's row in each tenant.
func (d *Store) Heartbeat(ctx context.Context, g driver.GroupScope, subscriber string, now time.Time) error {
	tenants, group, topic := g.Tenants, g.ConsumerGroup, g.Topic
	if len(tenants) == 0 {
		return nil
	}
	rows := make(Rows, len(tenants))
	for i, t := range slices.Sorted(slices.Values(tenants)) { // one order of row locks
		rows[i] = []any{t, group, topic, subscriber, d.EncodeTime(now), d.EncodeTime(now)}
	}
	st := d.leases()
	if _, err := d.exec(ctx, d.Write, d.onShards(st.heartbeat, st.heartbeatShards), Args{"rows": rows}); err != nil {
		return d.Wrap(fmt.Sprintf("heartbeat of %q in group %q topic %q", subscriber, group, topic), err)
	}
	return nil
}

// onShards is stmt, or through vtgate its form that each shard commits
// on its own (heartbeat rows are written outside transactions, in one
// statement however many tenants: a member's idle cost does not grow
// with its tenants).
func (d *Store) onShards(stmt, sharded string) string {
	if d.Sharded != nil && d.Sharded() {
		return sharded
	}
	return stmt
}

// RefreshHeartbeat updates subscriber's rows.
func (d *Store) RefreshHeartbeat(ctx context.Context, g driver.GroupScope, subscriber string, now time.Time) (int64, error) {
	if len(g.Tenants) == 0 {
		return 0, nil
	}
	st := d.leases()
	res, err := d.exec(ctx, d.Write, d.onShards(st.refreshBeats, st.refreshBeatsShards),
		memberNamed(g.Tenants, g.ConsumerGroup, g.Topic).with(Args{"member": subscriber, "now": d.EncodeTime(now)}))
	if err != nil {
		return 0, d.Wrap(fmt.Sprintf("heartbeat of %q in group %q topic %q", subscriber, g.ConsumerGroup, g.Topic), err)
	}
	return res.RowsAffected()
}

// RemoveHeartbeat deletes subscriber's rows.
func (d *Store) RemoveHeartbeat(ctx context.Context, g driver.GroupScope, subscriber string) error {
	tenants, group, topic := g.Tenants, g.ConsumerGroup, g.Topic
	if len(tenants) == 0 {
		return nil
	}
	st := d.leases()
	if _, err := d.exec(ctx, d.Write, d.onShards(st.removeBeats, st.removeBeatsShards), memberNamed(tenants, group, topic).with(Args{"member": subscriber})); err != nil {
		return d.Wrap(fmt.Sprintf("remove heartbeat of %q in group %q topic %q", subscriber, group, topic), err)
	}
	return nil
}

// Subscribers lists heartbeat rows.
func (d *Store) Subscribers(ctx context.Context, g driver.GroupScope) ([]driver.Subscriber, error) {
	tenants, group, topic := g.Tenants, g.ConsumerGroup, g.Topic
	if len(tenants) == 0 {
		return nil, nil
	}
	op := fmt.Sprintf("list subscribers of group %q topic %q", group, topic)
	rows, err := d.query(ctx, d.Read, d.leases().members, memberNamed(tenants, group, topic))
	if err != nil {
		return nil, d.Wrap(op, err)
	}
	defer rows.Close()
	var out []driver.Subscriber
	for rows.Next() {
		s := driver.Subscriber{ConsumerGroup: group, Topic: topic}
		var started, beat any
		if err := rows.Scan(&s.Tenant, &s.Name, &started, &beat); err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		if s.StartedAt, err = d.DecodeTime(started); err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		if s.HeartbeatAt, err = d.DecodeTime(beat); err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	return out, nil
}
