// SPDX-License-Identifier: Apache-2.0

package receipts

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/ident"
	"github.com/shardq/shardq/internal/lifecycle"
)

// A session holds a message group's lease across receives, as a Service
// Bus session receiver does (docs/server.md, "Sessions"). Its id is a
// signed Receipt with Session set that names the lease (owner and token):
// any server of the database continues it, and the lease's fence decides
// whether it still holds. Receives in a session hand out from the group's
// cursor; acks of its messages keep the group, a nack gives it back. It
// ends when closed (a visibility change to 0), at a nack, or when its
// lease lapses and another receive takes the group: a lapsed lease that
// nobody took is resumed.

// Session is a held group, as a receive hands it out.
type Session struct {
	ID        string
	Key       string
	ExpiresAt time.Time // the lease's expiry by the server's clock

	lease Receipt
}

// session signs the session id of l.
func (r *Receipts) session(ctx context.Context, l driver.Lease) (*Session, error) {
	rc := Receipt{Tenant: l.Tenant, Topic: l.Topic, Group: l.ConsumerGroup, Key: l.PartitionKey, Owner: l.Owner, Token: l.Token, Session: true}
	id, err := r.Sign(ctx, rc)
	if err != nil {
		return nil, err
	}
	return &Session{ID: id, Key: l.PartitionKey, ExpiresAt: l.ExpiresAt, lease: rc}, nil
}

// DecodeSession checks a session id as Decode checks a receipt.
func (r *Receipts) DecodeSession(ctx context.Context, s, tenant, topic, group string) (Receipt, error) {
	rc, err := r.decode(ctx, s, "session", tenant, topic, group)
	if err == nil && !rc.Session {
		return Receipt{}, &ident.Error{Field: "session", Rule: "a message's receipt, not a session id"}
	}
	return rc, err
}

// errSessionLost is a session that ended: closed, nacked, or its lapsed
// lease taken by another receive.
func errSessionLost(s Receipt, err error) error {
	return fmt.Errorf("shardq: session on tenant %q topic %q group %q partition %q ended (closed, at a nack, or its group taken by another receive): %w",
		s.Tenant, s.Topic, s.Group, s.Key, errors.Join(ErrStale, err))
}

// receiveSession renews the session's lease and hands out the group's
// ready messages after its cursor.
func (r *Receipts) receiveSession(ctx context.Context, rq Request, s Receipt) (Result, error) {
	now := r.now()
	l, err := r.drv.ResumeLease(ctx, s.lease(), now, rq.Visibility)
	switch {
	case errors.Is(err, driver.ErrLeaseLost):
		return Result{}, errSessionLost(s, err)
	case err != nil:
		return Result{}, fmt.Errorf("shardq: receive %s: %w", s.ref(), err)
	}
	res, err := r.handOut(ctx, rq, l, now, true)
	if err != nil {
		return Result{}, fmt.Errorf("shardq: receive %s: %w", s.ref(), err)
	}
	res.Session = &Session{ID: rq.Session, Key: s.Key, ExpiresAt: l.ExpiresAt, lease: s}
	return res, nil
}

// giveBack gives s's message group back at once: a session that its
// receive could not hand out, or the group of a nack.
func (r *Receipts) giveBack(ctx context.Context, s Receipt) {
	dctx, cancel := lifecycle.Detached(ctx)
	defer cancel()
	if err := r.drv.ReleaseLease(dctx, s.lease(), r.now()); err != nil && !errors.Is(err, driver.ErrLeaseLost) {
		r.cfg.Log.Warn("shardq: giving back a message group failed; it is free when its lease expires",
			"tenant", s.Tenant, "topic", s.Topic, "partition_key", s.Key, "err", err)
	}
}

// CloseSession gives a session's group back at once.
func (r *Receipts) CloseSession(ctx context.Context, tenant, topic, group, session string) error {
	s, err := r.DecodeSession(ctx, session, tenant, topic, group)
	if err != nil {
		return fmt.Errorf("shardq: close session: %w", err)
	}
	switch err := r.drv.ReleaseLease(ctx, s.lease(), r.now()); {
	case errors.Is(err, driver.ErrLeaseLost):
		return errSessionLost(s, err)
	case err != nil:
		return fmt.Errorf("shardq: close session on %s: %w", s.ref(), err)
	}
	return nil
}

// ChangeVisibility sets the visibility timeout of the messages of
// receipts (and of sessions, whose ids may be among them) to now+vis, as
// SQS's ChangeMessageVisibility does: an ungrouped message's claim
// lapses then (vis 0: claimable at once, its attempt counted); a message
// group's lease (the whole receive's, or the session's) lasts until then,
// or, with vis 0, is given back at once, its unsettled messages delivered
// again. Every receipt is checked first; it returns the indexes of the
// stale ones.
func (r *Receipts) ChangeVisibility(ctx context.Context, tenant, topic, group string, rcpts []string, vis time.Duration) (stale []int, err error) {
	if vis < 0 || vis > r.cfg.MaxVisibility {
		return nil, fmt.Errorf("shardq: change visibility: %w", &ident.Error{Field: "visibility", Rule: fmt.Sprintf("%s: want 0 to %s", vis, r.cfg.MaxVisibility)})
	}
	if len(rcpts) == 0 || len(rcpts) > MaxMessages {
		return nil, fmt.Errorf("shardq: change visibility: %w", &ident.Error{Field: "receipts", Rule: fmt.Sprintf("%d receipts: want 1 to %d", len(rcpts), MaxMessages)})
	}
	if err := repeated(rcpts); err != nil {
		return nil, fmt.Errorf("shardq: change visibility: %w", err)
	}
	rcs := make([]Receipt, len(rcpts))
	for i, s := range rcpts {
		if rcs[i], err = r.decode(ctx, s, fmt.Sprintf("receipts[%d]", i), tenant, topic, group); err != nil {
			return nil, fmt.Errorf("shardq: change visibility: %w", err)
		}
	}
	now := r.now()
	hold := cmp.Or(r.cfg.MaxHold, r.cfg.MaxVisibility)
	for i, rc := range rcs {
		// A receipt of an earlier version carries no issue time: its
		// key's grace ends it. A session id is held from its opening
		// receive: receives in the session renew it, changes do not.
		if until := time.Unix(rc.Issued, 0).Add(hold); vis > 0 && rc.Issued > 0 && now.Add(vis).After(until) {
			return nil, fmt.Errorf("shardq: change visibility: %w", &ident.Error{Field: fmt.Sprintf("receipts[%d]", i),
				Rule: fmt.Sprintf("a message is held at most %s from its receive: until %s, %s from now", hold, until.UTC().Format(time.RFC3339), max(until.Sub(now), 0).Truncate(time.Second))})
		}
	}
	type leaseID struct {
		key, owner string
		token      int64
	}
	leases := map[leaseID][]int{} // a group's lease -> its receipts
	for i, rc := range rcs {
		if !rc.Claim && !rc.Deferred {
			k := leaseID{rc.Key, rc.Owner, rc.Token}
			leases[k] = append(leases[k], i)
			continue
		}
		c, extend := rc.ClaimOf(driver.Message{}), r.drv.ExtendClaim
		if rc.Deferred {
			c, extend = rc.deferredClaim(), r.drv.ExtendDeferred
		}
		switch err := extend(ctx, c, now.Add(vis), now); {
		case errors.Is(err, driver.ErrLeaseLost):
			stale = append(stale, i)
		case err != nil:
			return nil, settled("change the visibility of", rc, err)
		}
	}
	for _, idx := range leases {
		l := rcs[idx[0]].lease()
		if vis == 0 {
			err = r.drv.ReleaseLease(ctx, l, now)
		} else {
			_, err = r.drv.ResumeLease(ctx, l, now, vis)
		}
		switch {
		case errors.Is(err, driver.ErrLeaseLost):
			stale = append(stale, idx...)
		case err != nil:
			return nil, settled("change the visibility of", rcs[idx[0]], err)
		}
	}
	slices.Sort(stale)
	return stale, nil
}

// State reads the state of a session's group (nil when never set), under
// its lease's fence.
func (r *Receipts) State(ctx context.Context, tenant, topic, group, session string) ([]byte, error) {
	s, err := r.DecodeSession(ctx, session, tenant, topic, group)
	if err != nil {
		return nil, fmt.Errorf("shardq: group state: %w", err)
	}
	st, err := r.drv.GroupState(ctx, s.lease())
	switch {
	case errors.Is(err, driver.ErrLeaseLost):
		return nil, errSessionLost(s, err)
	case err != nil:
		return nil, fmt.Errorf("shardq: read state of %s: %w", s.ref(), err)
	}
	return st, nil
}

// SetState stores the state of a session's group under its lease's
// fence; it stays with the group for its next holder.
func (r *Receipts) SetState(ctx context.Context, tenant, topic, group, session string, state []byte) error {
	s, err := r.DecodeSession(ctx, session, tenant, topic, group)
	if err == nil && int64(len(state)) > r.cfg.MaxMessageBytes {
		err = &ident.Error{Field: "state", Rule: fmt.Sprintf("%d bytes, limit %d (a message's)", len(state), r.cfg.MaxMessageBytes)}
	}
	if err != nil {
		return fmt.Errorf("shardq: set group state: %w", err)
	}
	switch err := r.drv.SetGroupState(ctx, s.lease(), state, r.now()); {
	case errors.Is(err, driver.ErrLeaseLost):
		return errSessionLost(s, err)
	case err != nil:
		return fmt.Errorf("shardq: set state of %s: %w", s.ref(), err)
	}
	return nil
}
