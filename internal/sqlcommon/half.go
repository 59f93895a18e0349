// SPDX-License-Identifier: Apache-2.0

package sqlcommon

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/shardq/shardq/driver"
)

const halfKey = "tenant = ? AND topic = ? AND partition_key = ? AND id = ?"

const halfColumns = "tenant, topic, partition_key, id, producer_group, headers, payload, created_at, check_count, next_check_at, claim_owner, claim_token"

func halfArgs(r driver.MessageRef) []any { return []any{r.Tenant, r.Topic, r.PartitionKey, r.ID} }

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
	_, err = d.Write.ExecContext(ctx, "INSERT INTO queue_half_messages ("+halfColumns+", claim_expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0, ?, '', 0, ?)",
		h.Tenant, h.Topic, h.PartitionKey, h.ID, h.ProducerGroup, string(headers), payload, d.EncodeTime(h.CreatedAt),
		d.EncodeTime(h.NextCheckAt), d.EncodeTime(h.CreatedAt))
	if err != nil {
		return d.Wrap(fmt.Sprintf("write half message tenant %q topic %q partition %q id %q", h.Tenant, h.Topic, h.PartitionKey, h.ID), err)
	}
	return nil
}

// lockHalf reads and locks a pending half message inside tx, checking the
// claim token when one is given.
func (d *Store) lockHalf(ctx context.Context, tx *sql.Tx, ref driver.MessageRef, claimToken int64, op string) (*driver.HalfMessage, error) {
	rows, err := tx.QueryContext(ctx, "SELECT "+halfColumns+" FROM queue_half_messages WHERE "+halfKey+d.LockClause, halfArgs(ref)...)
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

// CommitHalf deletes the half row and appends the message with a fresh
// offset in one transaction. The row lock makes racing resolutions
// (commit twice, commit against check-back, rollback against commit)
// exclusive: the second finds no row and appends nothing.
func (d *Store) CommitHalf(ctx context.Context, ref driver.MessageRef, claimToken int64) (*driver.InsertMessage, error) {
	op := fmt.Sprintf("commit half message tenant %q topic %q partition %q id %q", ref.Tenant, ref.Topic, ref.PartitionKey, ref.ID)
	return inTx(ctx, d.Begin, func(tx *sql.Tx) (*driver.InsertMessage, error) {
		h, err := d.lockHalf(ctx, tx, ref, claimToken, op)
		if err != nil {
			return nil, err
		}
		if _, err := tx.ExecContext(ctx, "DELETE FROM queue_half_messages WHERE "+halfKey, halfArgs(ref)...); err != nil {
			return nil, d.Wrap(op, err)
		}
		m := h.InsertMessage
		if err := d.Insert(ctx, tx, []*driver.InsertMessage{&m}); err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		return &m, nil
	})
}

// RollbackHalf deletes the half row.
func (d *Store) RollbackHalf(ctx context.Context, ref driver.MessageRef, claimToken int64) error {
	op := fmt.Sprintf("roll back half message tenant %q topic %q partition %q id %q", ref.Tenant, ref.Topic, ref.PartitionKey, ref.ID)
	_, err := inTx(ctx, d.Begin, func(tx *sql.Tx) (struct{}, error) {
		if _, err := d.lockHalf(ctx, tx, ref, claimToken, op); err != nil {
			return struct{}{}, err
		}
		_, err := tx.ExecContext(ctx, "DELETE FROM queue_half_messages WHERE "+halfKey, halfArgs(ref)...)
		return struct{}{}, d.wrapNil(op, err)
	})
	return err
}

// ClaimDueHalves reads due, unclaimed half messages and claims each with a
// conditional update on the token it read: of two producers racing for
// one, exactly one update matches.
func (d *Store) ClaimDueHalves(ctx context.Context, tenants []string, group, owner string, now time.Time, claimTTL time.Duration, limit int) ([]driver.HalfMessage, error) {
	if len(tenants) == 0 {
		return nil, nil
	}
	op := fmt.Sprintf("claim due half messages of producer group %q", group)
	rows, err := d.Read.QueryContext(ctx, "SELECT "+halfColumns+" FROM queue_half_messages WHERE tenant IN ("+Placeholders(len(tenants))+
		") AND producer_group = ? AND next_check_at <= ? AND (claim_owner = '' OR claim_expires_at <= ?) ORDER BY next_check_at LIMIT ?",
		tenantArgs(tenants, group, d.EncodeTime(now), d.EncodeTime(now), limit)...)
	if err != nil {
		return nil, d.Wrap(op, err)
	}
	due, err := d.scanHalves(rows, op)
	if err != nil {
		return nil, err
	}
	var claimed []driver.HalfMessage
	for _, h := range due {
		res, err := d.Write.ExecContext(ctx, "UPDATE queue_half_messages SET claim_owner = ?, claim_token = claim_token + 1, claim_expires_at = ? WHERE "+
			halfKey+" AND claim_token = ?", append(append([]any{owner, d.EncodeTime(now.Add(claimTTL))}, halfArgs(h.Ref())...), h.ClaimToken)...)
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
	res, err := d.Write.ExecContext(ctx, "UPDATE queue_half_messages SET check_count = check_count + 1, next_check_at = ?, claim_owner = '' WHERE "+
		halfKey+" AND claim_token = ?", append(append([]any{d.EncodeTime(nextCheckAt)}, halfArgs(h.Ref())...), h.ClaimToken)...)
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
		if _, err := tx.ExecContext(ctx, "INSERT INTO queue_half_messages_dead (tenant, topic, partition_key, id, producer_group, headers, payload, "+
			"created_at, check_count, dead_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"+d.Upsert("tenant, topic, partition_key, id", ""),
			cur.Tenant, cur.Topic, cur.PartitionKey, cur.ID, cur.ProducerGroup, string(headers), cur.Payload,
			d.EncodeTime(cur.CreatedAt), cur.Checks, d.EncodeTime(now)); err != nil {
			return struct{}{}, d.Wrap(op, err)
		}
		_, err = tx.ExecContext(ctx, "DELETE FROM queue_half_messages WHERE "+halfKey, halfArgs(h.Ref())...)
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
	where, args := scope(s, "tenant")
	after, aargs, limit, largs, err := page(s, "tenant", "topic", "partition_key", "id")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	rows, err := d.Read.QueryContext(ctx, "SELECT "+halfColumns+" FROM queue_half_messages WHERE "+where+after+
		" ORDER BY tenant, topic, partition_key, id"+limit, append(append(args, aargs...), largs...)...)
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
		var created, next any
		if err := rows.Scan(&h.Tenant, &h.Topic, &h.PartitionKey, &h.ID, &h.ProducerGroup, &headers, &h.Payload, &created,
			&h.Checks, &next, &h.ClaimOwner, &h.ClaimToken); err != nil {
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
