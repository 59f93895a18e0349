// SPDX-License-Identifier: Apache-2.0

package receipts

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/expiry"
	"github.com/shardq/shardq/internal/ident"
)

// deferredClaim is the claim a deferred message's receipt names.
func (rc *Receipt) deferredClaim() driver.Claim {
	return driver.Claim{ConsumerGroup: rc.Group, Owner: rc.Owner, Token: rc.Token, Attempts: rc.Attempts,
		Message: driver.Message{Tenant: rc.Tenant, Topic: rc.Topic, PartitionKey: rc.Key, Offset: rc.Offset}}
}

// ReceiveDeferred hands out those of offsets that group deferred, each
// under a claim of its own until now+vis, with a receipt (Deferred) that
// settles it. An expired one is settled and left out.
func (r *Receipts) ReceiveDeferred(ctx context.Context, tenant, topic, group string, offsets []int64, vis time.Duration, maxBytes int64) (Result, error) {
	owner := ident.MemberID(r.cfg.Name)
	now := r.now()
	claims, err := r.drv.ClaimDeferred(ctx, driver.ClaimDeferredParams{Group: driver.GroupRef{Tenant: tenant, Topic: topic, ConsumerGroup: group}, Offsets: offsets, Owner: owner, Now: now, Visibility: vis})
	if err != nil {
		return Result{}, fmt.Errorf("shardq: receive deferred: %w", err)
	}
	if k, cut := r.fit(len(claims), func(i int) *driver.Message { return &claims[i].Message }, maxBytes); cut {
		if err := r.releaseDeferred(ctx, claims[k:], nil); err != nil {
			return Result{}, r.releaseDeferred(ctx, claims[:k], fmt.Errorf("shardq: receive deferred: %w", err))
		}
		claims = claims[:k]
	}
	var res Result
	var expired []driver.Claim
	for _, c := range claims {
		if expiry.Expired(&c.Message, now) {
			expired = append(expired, c)
			continue
		}
		rc := Receipt{Tenant: tenant, Topic: topic, Group: group, Key: c.Message.PartitionKey, Owner: owner, Token: c.Token,
			Offset: c.Message.Offset, Deferred: true, Attempts: c.Attempts}
		signed, err := r.Sign(ctx, rc)
		if err != nil {
			return Result{}, r.releaseDeferred(ctx, claims, fmt.Errorf("shardq: receive deferred: %w", err))
		}
		res.Messages = append(res.Messages, Received{Message: c.Message, Attempt: c.Attempts, Receipt: signed})
	}
	if len(expired) > 0 {
		if err := r.cfg.Settler.ExpiredDeferred(ctx, expired); err != nil {
			return Result{}, r.releaseDeferred(ctx, claims, fmt.Errorf("shardq: receive deferred: settle expired messages: %w", err))
		}
		r.expired(tenant, topic, group, len(expired))
	}
	return res, nil
}

// releaseDeferred gives back the claims of a receive that failed.
func (r *Receipts) releaseDeferred(ctx context.Context, claims []driver.Claim, cause error) error {
	errs := []error{cause}
	for _, c := range claims {
		if err := r.drv.ReleaseDeferred(context.WithoutCancel(ctx), c, r.now(), r.now()); err != nil && !errors.Is(err, driver.ErrLeaseLost) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// ackDeferred settles the deferred messages of rcs at idx in one
// transaction, or, when one of them moved on, one by one; it returns
// the stale ones.
func (r *Receipts) ackDeferred(ctx context.Context, rcs []Receipt, idx []int, now time.Time) (stale []int, err error) {
	cs := make([]driver.Claim, len(idx))
	for j, i := range idx {
		cs[j] = rcs[i].deferredClaim()
	}
	switch err := r.drv.AckDeferred(ctx, cs, now); {
	case errors.Is(err, driver.ErrLeaseLost):
		for j, i := range idx {
			if err := r.drv.AckDeferred(ctx, cs[j:j+1], now); errors.Is(err, driver.ErrLeaseLost) {
				stale = append(stale, i)
			} else if err != nil {
				return nil, settled("ack", rcs[i], err)
			}
		}
	case err != nil:
		return nil, settled("ack", rcs[idx[0]], err)
	}
	return stale, nil
}

// Defer sets the messages of receipts aside for their group
// (Delivery.Defer): each in one transaction, its claim settled or its
// group's cursor committed past it under the receive's lease, and the
// message recorded as deferred, to be received later by its offset. A
// receive's messages go in offset order, and deferring one passes the
// cursor over those before it (acks are cumulative); its last gives the
// group back, unless it is a session's. Every receipt is checked first;
// it returns the indexes of the stale ones.
func (r *Receipts) Defer(ctx context.Context, tenant, topic, group string, rcpts []string) (stale []int, err error) {
	rcs, err := r.decodeAll(ctx, rcpts, tenant, topic, group)
	if err != nil {
		return nil, fmt.Errorf("shardq: defer: %w", err)
	}
	for i, rc := range rcs {
		switch {
		case rc.Deferred:
			err = &ident.Error{Field: fmt.Sprintf("receipts[%d]", i), Rule: "a deferred message's receipt: it is deferred already"}
		case rc.End != 0:
			err = &ident.Error{Field: fmt.Sprintf("receipts[%d]", i), Rule: "a large message's receipt: a large message is not deferred"}
		}
		if err != nil {
			return nil, fmt.Errorf("shardq: defer: %w", err)
		}
	}
	order := make([]int, len(rcs))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(rcs[a].Offset, rcs[b].Offset) })
	advanced := false
	for _, i := range order {
		switch err := r.deferOne(ctx, rcs[i]); {
		case errors.Is(err, ErrStale):
			stale = append(stale, i)
		case err != nil:
			return nil, err
		case rcs[i].Claim && !advanced:
			r.advance(ctx, rcs[i], r.now())
			advanced = true
		}
	}
	slices.Sort(stale)
	return stale, nil
}

func (r *Receipts) deferOne(ctx context.Context, rc Receipt) error {
	now := r.now()
	m := driver.Message{Tenant: rc.Tenant, Topic: rc.Topic, PartitionKey: rc.Key, Offset: rc.Offset}
	l := rc.lease()
	tx, err := r.drv.BeginWrite(ctx)
	if err != nil {
		return settled("defer", rc, err)
	}
	if rc.Claim {
		err = r.drv.InTx(tx).AckClaims(ctx, []driver.Claim{rc.ClaimOf(driver.Message{})}, now)
	} else {
		// Under the lease's fence, and not past the head; an ack of a
		// later message of the receive may have settled this one
		// already (ErrSettled): then it is not deferred, and the receipt
		// is stale.
		err = r.drv.InTx(tx).DeferOffset(ctx, l, rc.Offset, now)
	}
	if err == nil {
		err = r.drv.InTx(tx).Defer(ctx, rc.Group, m, now)
	}
	if err != nil {
		err = errors.Join(err, rollback(tx))
		switch {
		case errors.Is(err, driver.ErrSettled):
			err = ErrStale
		case errors.Is(err, driver.ErrPastHead):
			err = &ident.Error{Field: "receipt", Rule: fmt.Sprintf("offset %d is past the partition's head: %v", rc.Offset, err)}
		}
		return settled("defer", rc, err)
	}
	if err := tx.Commit(); err != nil {
		return settled("defer", rc, err)
	}
	if !rc.Claim && rc.Offset == rc.Last && !rc.Held {
		if err := r.drv.ReleaseLease(ctx, l, r.now()); err != nil && !errors.Is(err, driver.ErrLeaseLost) {
			r.cfg.Log.Warn("shardq: giving back a message group after a deferral failed; it is free after its visibility timeout",
				"tenant", rc.Tenant, "topic", rc.Topic, "partition_key", rc.Key, "err", err)
		}
	}
	return nil
}

func rollback(tx interface{ Rollback() error }) error {
	if err := tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
		return err
	}
	return nil
}
