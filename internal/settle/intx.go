// SPDX-License-Identifier: Apache-2.0

package settle

import (
	"context"
	"database/sql"
	"errors"
	"sync/atomic"
	"time"

	"github.com/shardq/shardq/driver"
)

// InTx settles a delivery inside the application's own transaction
// (Delivery.AckTx): Ack runs the settlement's statements on tx, fenced
// by the lease or claim that delivered it; upTo is the offset a
// partition's cursor passes (a claim settles its own message). The
// runtime that made it hands it to the handler through the context and
// reads Used afterwards.
type InTx struct {
	Ack func(ctx context.Context, tx driver.DBTX, upTo int64) error
	// Deferrer, when set, lets the delivery be deferred (Defer).
	Deferrer *Deferrer
	used     atomic.Bool
	closed   atomic.Bool
}

// Deferrer records deliveries of one consumer group as deferred.
type Deferrer struct {
	Driver interface {
		BeginWrite(ctx context.Context) (driver.Tx, error)
		InTx(tx driver.DBTX) driver.TxSettler
	}
	// Pass settles the delivery in tx for its deferral, up to upTo, under
	// its lease or claim; it fails (driver.ErrSettled, ErrLeaseLost) when
	// the delivery was settled otherwise meanwhile.
	Pass  func(ctx context.Context, tx driver.DBTX, upTo int64) error
	Group string
	Clock func() time.Time
}

// ErrNoDefer is Defer's error where deferral is not offered.
var ErrNoDefer = errors.New("this delivery cannot be deferred")

// Defer sets m aside for its group: in one transaction of its own, it
// settles m as Ack does (up to upTo) and records m as deferred, so that
// the partition goes on and m is fetched later by its offset.
func (t *InTx) Defer(ctx context.Context, m driver.Message, upTo int64) error {
	if t.Deferrer == nil {
		return ErrNoDefer
	}
	if t.closed.Load() {
		return ErrClosed
	}
	t.used.Store(true)
	tx, err := t.Deferrer.Driver.BeginWrite(ctx)
	if err != nil {
		return err
	}
	if err := t.Deferrer.Pass(ctx, tx, upTo); err != nil {
		return errors.Join(err, rollback(tx))
	}
	if err := t.Deferrer.Driver.InTx(tx).Defer(ctx, t.Deferrer.Group, m, t.Deferrer.Clock()); err != nil {
		return errors.Join(err, rollback(tx))
	}
	return tx.Commit()
}

func rollback(tx driver.Tx) error {
	if err := tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
		return err
	}
	return nil
}

// ErrClosed is Run's error once the handler has returned.
var ErrClosed = errors.New("the handler that received this delivery has returned: settle it there")

// Run settles in tx and records that the handler asked for it.
func (t *InTx) Run(ctx context.Context, tx driver.DBTX, upTo int64) error {
	if t.closed.Load() {
		return ErrClosed
	}
	t.used.Store(true)
	return t.Ack(ctx, tx, upTo)
}

// Close ends t when its handler returns: a delivery kept past it would
// settle out of turn.
func (t *InTx) Close() { t.closed.Store(true) }

// Used reports whether the handler settled in its transaction (which may
// since have rolled back).
func (t *InTx) Used() bool { return t.used.Load() }

type inTxKey struct{}

// WithInTx gives a handler's context t.
func WithInTx(ctx context.Context, t *InTx) context.Context {
	return context.WithValue(ctx, inTxKey{}, t)
}

// InTxFrom is the InTx of a handler's context, or nil.
func InTxFrom(ctx context.Context) *InTx {
	t, _ := ctx.Value(inTxKey{}).(*InTx)
	return t
}
