// SPDX-License-Identifier: Apache-2.0

package sqlcommon

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"slices"
	"time"

	"github.com/shardq/shardq/driver"
)

// InsertHalf stores a half message.
func (d *Store) InsertHalf(ctx context.Context, h *driver.HalfMessage) error {
	headers, err := EncodeHeaders(h.Headers)
	if err != nil {
		return err
	}
	payload := h.Payload
	if payload == nil {
		payload = []byte{}
	}
	_, err = d.exec(ctx, d.Write, d.sql().admin.halfInsert, messageNamed(h.Ref()).with(Args{"producer_group": h.ProducerGroup,
		"headers": string(headers), "payload": payload, "created_at": d.EncodeTime(h.CreatedAt), "next_check_at": d.EncodeTime(h.NextCheckAt),
		"not_before": d.encodeNotBefore(h.NotBefore)}))
	if err != nil {
		return d.Wrap(fmt.Sprintf("write half message tenant %q topic %q partition %q id %q", h.Tenant, h.Topic, h.PartitionKey, h.ID), err)
	}
	return nil
}

// lockHalf reads and locks a pending half message inside tx, checking the
// claim token when one is given.
func (d *Store) lockHalf(ctx context.Context, tx *sql.Tx, ref driver.MessageRef, claimToken int64, op string) (*driver.HalfMessage, error) {
	rows, err := d.query(ctx, tx, d.sql().admin.halfLock, messageNamed(ref))
	if err != nil {
		return nil, d.Wrap(op, err)
	}
	hs, err := d.scanHalves(rows, op)
	if err != nil {
		return nil, err
	}
	if len(hs) == 0 {
		return nil, fmt.Errorf("%s: %w", op, driver.ErrHalfResolved)
	}
	if claimToken > 0 && hs[0].ClaimToken != claimToken {
		return nil, fmt.Errorf("%s: %w (claim %d, now %d)", op, driver.ErrLeaseLost, claimToken, hs[0].ClaimToken)
	}
	return &hs[0], nil
}

// CommitHalves deletes the half rows and appends their messages with fresh
// offsets in one transaction. The row locks make racing resolutions
// (commit twice, commit against check-back, rollback against commit)
// exclusive: the second finds no row and appends nothing. Half rows are
// locked in key order, so two batches never wait on each other in a
// cycle; the messages go in in the order of hs.
func (d *Store) CommitHalves(ctx context.Context, hs []*driver.HalfCommit) error {
	if len(hs) == 0 {
		return nil
	}
	op := fmt.Sprintf("commit %d half messages of tenant %q", len(hs), hs[0].Ref.Tenant)
	if len(hs) == 1 {
		ref := hs[0].Ref
		op = fmt.Sprintf("commit half message tenant %q topic %q partition %q id %q", ref.Tenant, ref.Topic, ref.PartitionKey, ref.ID)
	}
	for _, hc := range hs[1:] {
		if hc.Ref.Tenant != hs[0].Ref.Tenant { // one tenant, one shard
			return fmt.Errorf("%s: half message of tenant %q in the batch", op, hc.Ref.Tenant)
		}
	}
	order := slices.Clone(hs)
	slices.SortFunc(order, func(a, b *driver.HalfCommit) int { return compareRefs(a.Ref, b.Ref) })
	msgs, err := inTx(ctx, d.Begin, func(tx *sql.Tx) ([]*driver.InsertMessage, error) {
		locked := make(map[driver.MessageRef]*driver.InsertMessage, len(hs))
		for _, hc := range order {
			h, err := d.lockHalf(ctx, tx, hc.Ref, hc.ClaimToken, op)
			if err != nil {
				return nil, err
			}
			if _, err := d.exec(ctx, tx, d.sql().admin.halfDelete, messageNamed(hc.Ref)); err != nil {
				return nil, d.Wrap(op, err)
			}
			locked[hc.Ref] = &h.InsertMessage
		}
		msgs := make([]*driver.InsertMessage, len(hs))
		for i, hc := range hs {
			msgs[i] = locked[hc.Ref]
		}
		if err := d.Insert(ctx, tx, msgs); err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		return msgs, nil
	})
	if err != nil {
		return err
	}
	for i, hc := range hs {
		hc.Message = msgs[i]
	}
	return nil
}

func compareRefs(a, b driver.MessageRef) int {
	return cmp.Or(cmp.Compare(a.Tenant, b.Tenant), cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.PartitionKey, b.PartitionKey),
		cmp.Compare(a.ID, b.ID))
}

// RollbackHalf deletes the half row.
func (d *Store) RollbackHalf(ctx context.Context, ref driver.MessageRef, claimToken int64) error {
	op := fmt.Sprintf("roll back half message tenant %q topic %q partition %q id %q", ref.Tenant, ref.Topic, ref.PartitionKey, ref.ID)
	_, err := inTx(ctx, d.Begin, func(tx *sql.Tx) (struct{}, error) {
		if _, err := d.lockHalf(ctx, tx, ref, claimToken, op); err != nil {
			return struct{}{}, err
		}
		_, err := d.exec(ctx, tx, d.sql().admin.halfDelete, messageNamed(ref))
		return struct{}{}, d.wrapNil(op, err)
	})
	return err
}

// ClaimDueHalves reads due, unclaimed half messages and claims each with a
// conditional update on the token it read: of two producers racing for
// one, exactly one update matches.
func (d *Store) ClaimDueHalves(ctx context.Context, r driver.HalfClaimRequest) ([]driver.HalfMessage, error) {
	tenants, group, owner, now, claimTTL, limit := r.Tenants, r.ProducerGroup, r.Owner, r.Now, r.ClaimTTL, r.Limit
	if len(tenants) == 0 {
		return nil, nil
	}
	op := fmt.Sprintf("claim due half messages of producer group %q", group)
	rows, err := d.query(ctx, d.Read, d.sql().admin.halfDue, Args{"tenants": textList(tenants), "producer_group": group,
		"now": d.EncodeTime(now), "limit": limit})
	if err != nil {
		return nil, d.Wrap(op, err)
	}
	due, err := d.scanHalves(rows, op)
	if err != nil {
		return nil, err
	}
	var claimed []driver.HalfMessage
	for _, h := range due {
		res, err := d.exec(ctx, d.Write, d.sql().admin.halfClaim, messageNamed(h.Ref()).with(Args{"owner": owner,
			"claim_expires_at": d.EncodeTime(now.Add(claimTTL)), "token": h.ClaimToken}))
		if err != nil {
			return claimed, d.Wrap(op, err)
		}
		if n, err := res.RowsAffected(); err != nil || n != 1 {
			continue // another producer claimed it (or it was resolved) meanwhile
		}
		h.ClaimOwner, h.ClaimToken = owner, h.ClaimToken+1
		claimed = append(claimed, h)
	}
	return claimed, nil
}

// RescheduleHalf counts an unknown answer and frees the claim.
func (d *Store) RescheduleHalf(ctx context.Context, h driver.HalfMessage, nextCheckAt time.Time) error {
	op := fmt.Sprintf("reschedule half message tenant %q topic %q id %q", h.Tenant, h.Topic, h.ID)
	res, err := d.exec(ctx, d.Write, d.sql().admin.halfReschedule, messageNamed(h.Ref()).with(Args{"next_check_at": d.EncodeTime(nextCheckAt),
		"token": h.ClaimToken}))
	if err != nil {
		return d.Wrap(op, err)
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		return fmt.Errorf("%s: %w", op, driver.ErrLeaseLost)
	}
	return nil
}

// DeadLetterHalf moves a claimed half message to the dead table.
func (d *Store) DeadLetterHalf(ctx context.Context, h driver.HalfMessage, now time.Time) error {
	op := fmt.Sprintf("dead-letter half message tenant %q topic %q id %q", h.Tenant, h.Topic, h.ID)
	_, err := inTx(ctx, d.Begin, func(tx *sql.Tx) (struct{}, error) {
		cur, err := d.lockHalf(ctx, tx, h.Ref(), h.ClaimToken, op)
		if err != nil {
			return struct{}{}, err
		}
		headers, err := EncodeHeaders(cur.Headers)
		if err != nil {
			return struct{}{}, err
		}
		if _, err := d.exec(ctx, tx, d.sql().admin.halfDead, messageNamed(cur.Ref()).with(Args{"producer_group": cur.ProducerGroup,
			"headers": string(headers), "payload": cur.Payload, "created_at": d.EncodeTime(cur.CreatedAt), "check_count": cur.Checks,
			"now": d.EncodeTime(now)})); err != nil {
			return struct{}{}, d.Wrap(op, err)
		}
		_, err = d.exec(ctx, tx, d.sql().admin.halfDelete, messageNamed(h.Ref()))
		return struct{}{}, d.wrapNil(op, err)
	})
	return err
}

// ListHalves lists pending half messages.
func (d *Store) ListHalves(ctx context.Context, s driver.Scope) ([]driver.HalfMessage, error) {
	op := "list half messages"
	if emptyScope(s) {
		return nil, nil
	}
	stmt, args, err := listing(d.sql().admin.halves, s, 4, nil)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	rows, err := d.query(ctx, d.Read, stmt, args)
	if err != nil {
		return nil, d.Wrap(op, err)
	}
	return d.scanHalves(rows, op)
}

func (d *Store) scanHalves(rows *sql.Rows, op string) ([]driver.HalfMessage, error) {
	defer rows.Close()
	var out []driver.HalfMessage
	for rows.Next() {
		var h driver.HalfMessage
		var headers []byte
		var created, next, notBefore any
		if err := rows.Scan(&h.Tenant, &h.Topic, &h.PartitionKey, &h.ID, &h.ProducerGroup, &headers, &h.Payload, &created,
			&h.Checks, &next, &h.ClaimOwner, &h.ClaimToken, &notBefore); err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		var err error
		if h.Headers, err = DecodeHeaders(headers); err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		if h.CreatedAt, err = d.DecodeTime(created); err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		if h.NextCheckAt, err = d.DecodeTime(next); err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		if h.NotBefore, err = d.decodeNotBefore(notBefore); err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		if h.Payload == nil {
			h.Payload = []byte{}
		}
		out = append(out, h)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	return out, nil
}
