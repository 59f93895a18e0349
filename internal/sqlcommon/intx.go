// SPDX-License-Identifier: Apache-2.0

package sqlcommon

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/shardq/shardq/driver"
)

// InTx settles deliveries inside tx, the caller's transaction: the same
// statements as the settles in their own transactions, on tx.
func (d *Store) InTx(tx driver.DBTX) driver.TxSettler { return txSettler{d, tx} }

type txSettler struct {
	d  *Store
	tx driver.DBTX
}

const inCallersTx = " in the caller's transaction"

func (t txSettler) CommitOffset(ctx context.Context, l driver.Lease, offset int64, now time.Time) error {
	op := fmt.Sprintf("commit offset %d on %s%s", offset, l.PartitionRef, inCallersTx)
	if err := t.d.fence(ctx, t.tx, l, op); err != nil {
		return err
	}
	return t.d.commitOffset(ctx, t.tx, l, offset, now, op)
}

// DeferOffset fences l with the head's bound, then reads the cursor:
// every writer of the cursor under a lease locks its row first, and an
// operator's reset fences it too, so the cursor read is the one the
// commit moves. A cursor at or past offset settled the message already.
func (t txSettler) DeferOffset(ctx context.Context, l driver.Lease, offset int64, now time.Time) error {
	d := t.d
	op := fmt.Sprintf("pass offset %d on %s to defer it", offset, l.PartitionRef)
	if err := d.fenceHead(ctx, t.tx, l, offset, op); err != nil {
		return err
	}
	var cur int64
	err := d.queryRow(ctx, t.tx, d.leases().committed, refNamed(l.PartitionRef)).Scan(&cur)
	if errors.Is(err, sql.ErrNoRows) {
		cur, err = d.groupStart(ctx, l.Tenant, l.Topic, l.ConsumerGroup)
	}
	if err != nil {
		return d.Wrap(op, err)
	}
	if cur >= offset {
		return fmt.Errorf("%s: %w (the cursor is at %d)", op, driver.ErrSettled, cur)
	}
	return d.commitOffset(ctx, t.tx, l, offset, now, op)
}

func (t txSettler) AckClaims(ctx context.Context, cs []driver.Claim, now time.Time) error {
	if len(cs) == 0 {
		return nil
	}
	return t.d.ackClaims(ctx, t.tx, cs, now, inCallersTx)
}

// Defer adds m's deferred row for group, unclaimed; a row there already
// stays as it is.
func (t txSettler) Defer(ctx context.Context, group string, m driver.Message, now time.Time) error {
	d := t.d
	row := []any{m.Tenant, group, m.Topic, m.Offset, m.PartitionKey, "", 0, 0, d.EncodeTime(now), d.EncodeTime(now), d.EncodeTime(now)}
	if _, err := d.exec(ctx, t.tx, d.sql().deferred.insert, Args{"rows": Rows{row}}); err != nil {
		return d.Wrap(fmt.Sprintf("defer offset %d of tenant %q topic %q partition %q for group %q", m.Offset, m.Tenant, m.Topic, m.PartitionKey, group), err)
	}
	return nil
}

func (t txSettler) AckDeferred(ctx context.Context, cs []driver.Claim, _ time.Time) error {
	if len(cs) == 0 {
		return nil
	}
	return t.d.ackDeferred(ctx, t.tx, cs, inCallersTx)
}
