// SPDX-License-Identifier: Apache-2.0

package shardq

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/checkback"
	"github.com/shardq/shardq/internal/ident"
	"github.com/shardq/shardq/internal/settings"
)

// TxState is the outcome of a local transaction, as the sender or the
// checker reports it.
type TxState int

const (
	// TxUnknown leaves the half message pending; the check-back asks again.
	TxUnknown TxState = iota
	// TxCommit delivers the message.
	TxCommit
	// TxRollback discards it.
	TxRollback
)

// A TxState converts to the runtime's checkback.Outcome by value: this
// fails to compile when the two disagree.
func _() {
	var x [1]struct{}
	_ = x[TxUnknown-TxState(checkback.Unknown)]
	_ = x[TxCommit-TxState(checkback.Commit)]
	_ = x[TxRollback-TxState(checkback.Rollback)]
}

func (s TxState) String() string { return checkback.Outcome(s).String() }

// HalfMessage is a transactional message that no consumer sees until it is
// committed: what the local transaction and the checker are given.
type HalfMessage struct {
	Tenant        string
	Topic         string
	PartitionKey  string // chosen by the selector before anything was written
	ID            string
	ProducerGroup string
	Payload       []byte
	Headers       map[string]string
	CreatedAt     time.Time
	Checks        int // check-backs that answered TxUnknown so far
}

// LocalTransaction runs the sender's business transaction after the half
// message is stored and says whether to commit it. An error (or a panic)
// leaves the message unknown, for the check-back.
type LocalTransaction func(ctx context.Context, h *HalfMessage) (TxState, error)

// TransactionChecker answers, for a half message left unknown, whether its
// local transaction committed. An error counts as TxUnknown.
type TransactionChecker func(ctx context.Context, h *HalfMessage) (TxState, error)

// ExhaustedPolicy resolves a half message whose checks ran out.
type ExhaustedPolicy int

const (
	// RollbackWhenExhausted discards it (the default).
	RollbackWhenExhausted ExhaustedPolicy = iota
	// DeadLetterWhenExhausted moves it to queue_half_messages_dead.
	DeadLetterWhenExhausted
)

func (p ExhaustedPolicy) String() string {
	if p == DeadLetterWhenExhausted {
		return "dead-letter"
	}
	return "rollback"
}

// TransactionProducerConfig configures a member of a producer group.
type TransactionProducerConfig struct {
	ProducerGroup string // required
	// Tenants the producer sends to and checks (default SHARDQ_TENANTS).
	Tenants []string
	Checker TransactionChecker // required
	Name    string             // for people; half-message claims are owned by Name#random, new per producer [host-pid]

	TransactionTimeout time.Duration   // a half message is first checked this long after it was written [6s]
	CheckInterval      time.Duration   // between checks that answered unknown [30s]
	MaxChecks          int             // then WhenExhausted applies [15]
	WhenExhausted      ExhaustedPolicy // [RollbackWhenExhausted]
	PollInterval       time.Duration   // how often due half messages are looked for [1s]
	ClaimTTL           time.Duration   // how long a producer owns a check [1m]

	Clock  func() time.Time // [the client's Clock]
	Logger *slog.Logger     // [the client's Logger]
}

// TxResult is the outcome of SendInTransaction.
type TxResult struct {
	State        TxState
	Tenant       string
	Topic        string
	PartitionKey string
	ID           string
	Offset       int64 // when committed
}

// TxStats counts how half messages were resolved by this producer.
type TxStats struct {
	Committed, RolledBack, CheckedCommitted, CheckedRolledBack, Exhausted int64
}

// TransactionProducer sends RocketMQ-style transactional messages with a
// partition selector and runs the producer group's check-back.
type TransactionProducer struct {
	c  *Client
	rt *checkback.Producer // the runtime (internal/checkback)
}

// ErrTxResolved is returned by SendInTransaction when the half message was
// resolved before the sender's own decision arrived (by a check-back or an
// operator); the earlier resolution stands.
var ErrTxResolved = driver.ErrHalfResolved

// StartTransactionProducer validates cfg and starts the check-back loop.
func (c *Client) StartTransactionProducer(ctx context.Context, cfg TransactionProducerConfig) (*TransactionProducer, error) {
	settings.Positive(&cfg.TransactionTimeout, DefaultTransactionTimeout)
	settings.Positive(&cfg.CheckInterval, DefaultCheckInterval)
	settings.Positive(&cfg.PollInterval, DefaultProducerPoll)
	settings.Positive(&cfg.ClaimTTL, DefaultClaimTTL)
	settings.Positive(&cfg.MaxChecks, DefaultMaxChecks)
	if cfg.Clock == nil {
		cfg.Clock = c.cfg.Clock
	}
	cfg.Logger = cmp.Or(cfg.Logger, c.cfg.Logger)
	cfg.Name = cmp.Or(cfg.Name, defaultName("producer"))
	err := cmp.Or(ident.ASCII("producer group", cfg.ProducerGroup), ident.MemberName("producer name", cfg.Name))
	if err == nil && cfg.Checker == nil {
		err = &ident.Error{Field: "checker", Rule: "must not be nil"}
	}
	if err == nil {
		cfg.Tenants, err = consumerTenants("tenants", cfg.Tenants)
	}
	if err == nil {
		err = c.syncClock(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("shardq: transaction producer: %w", err)
	}
	id := ident.MemberID(cfg.Name)
	p := &TransactionProducer{c: c, rt: checkback.StartProducer(ctx, c.drv, c.tel, c.pub, checkback.ProducerConfig{
		Config: checkback.Config{Tenants: cfg.Tenants, Group: cfg.ProducerGroup, Owner: id, Poll: cfg.PollInterval,
			ClaimTTL: cfg.ClaimTTL, CheckInterval: cfg.CheckInterval, MaxChecks: cfg.MaxChecks, Clock: cfg.Clock,
			DeadLetterExhausted: cfg.WhenExhausted == DeadLetterWhenExhausted,
			Log:                 cfg.Logger.With("producer_group", cfg.ProducerGroup, "member", id)},
		Checker: answer(cfg.Checker), TransactionTimeout: cfg.TransactionTimeout})}
	if err := c.track(p); err != nil {
		p.Stop(ctx)
		return nil, fmt.Errorf("shardq: transaction producer: %w", err)
	}
	return p, nil
}

// Stop ends the check-back loop, letting a running check finish until ctx
// ends; it returns ctx's error when the check had to be cancelled.
func (p *TransactionProducer) Stop(ctx context.Context) error {
	defer p.c.untrack(p)
	if err := p.rt.Stop(ctx); err != nil {
		return fmt.Errorf("shardq: stop transaction producer: %w", err)
	}
	return nil
}

// Done is closed once the producer has stopped: by Stop or Client.Close.
func (p *TransactionProducer) Done() <-chan struct{} { return p.rt.Done() }

func (p *TransactionProducer) stopOrder() int                         { return 1 }
func (p *TransactionProducer) stopForClose(ctx context.Context) error { return p.Stop(ctx) }

// Stats reports how this producer resolved half messages so far.
func (p *TransactionProducer) Stats() TxStats { return TxStats(p.rt.Stats()) }

// SendInTransaction sends msg transactionally. The selector (when not nil)
// chooses the partition key from msg and arg before anything is written;
// without one, msg's own partition key (or Selector) is used. It stores a
// half message, runs local, and then commits (the message enters its
// partition with a fresh offset), rolls back, or leaves it unknown for the
// check-back. A commit or rollback that finds the half message already
// resolved returns ErrTxResolved.
func (p *TransactionProducer) SendInTransaction(ctx context.Context, msg Message, sel Selector, arg any, local LocalTransaction) (TxResult, error) {
	twoSelectors := sel != nil && msg.Selector != nil
	if sel != nil {
		msg.Selector, msg.SelectorArg = sel, arg
	}
	r, err := p.rt.Send(ctx, toPublish([]Message{msg})[0], twoSelectors, answer(local))
	return TxResult{State: TxState(r.State), Tenant: r.Tenant, Topic: r.Topic, PartitionKey: r.PartitionKey, ID: r.ID, Offset: r.Offset}, err
}

// answer is fn as the runtime calls it (nil for nil); the runtime
// recovers its panics.
func answer(fn func(context.Context, *HalfMessage) (TxState, error)) checkback.Func {
	if fn == nil {
		return nil
	}
	return func(ctx context.Context, h *driver.HalfMessage) (checkback.Outcome, error) {
		state, err := fn(ctx, toHalf(h))
		return checkback.Outcome(state), err
	}
}

func toHalf(h *driver.HalfMessage) *HalfMessage {
	return &HalfMessage{Tenant: h.Tenant, Topic: h.Topic, PartitionKey: h.PartitionKey, ID: h.ID, ProducerGroup: h.ProducerGroup,
		Payload: h.Payload, Headers: h.Headers, CreatedAt: h.CreatedAt, Checks: h.Checks}
}
