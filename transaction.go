// SPDX-License-Identifier: Apache-2.0

package shardq

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/checkback"
	"github.com/shardq/shardq/internal/ident"
	"github.com/shardq/shardq/internal/telemetry"
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

func (s TxState) String() string {
	switch s {
	case TxCommit:
		return "commit"
	case TxRollback:
		return "rollback"
	}
	return "unknown"
}

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
	// Tenants the producer sends to and checks (default MQ_TENANTS).
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
	c   *Client
	cfg TransactionProducerConfig
	id  string // half-message claim owner: ident.MemberID(cfg.Name)
	log *slog.Logger
	svc *checkback.Service // the group's check-back, run by this member
	// halves reports the group's pending half messages to the metrics.
	halves *telemetry.HalfSource

	committed, rolledBack atomic.Int64
}

// ErrTxResolved is returned by SendInTransaction when the half message was
// resolved before the sender's own decision arrived (by a check-back or an
// operator); the earlier resolution stands.
var ErrTxResolved = driver.ErrHalfResolved

// StartTransactionProducer validates cfg and starts the check-back loop.
func (c *Client) StartTransactionProducer(ctx context.Context, cfg TransactionProducerConfig) (*TransactionProducer, error) {
	d := func(v *time.Duration, def time.Duration) {
		if *v <= 0 {
			*v = def
		}
	}
	d(&cfg.TransactionTimeout, DefaultTransactionTimeout)
	d(&cfg.CheckInterval, DefaultCheckInterval)
	d(&cfg.PollInterval, DefaultProducerPoll)
	d(&cfg.ClaimTTL, DefaultClaimTTL)
	if cfg.MaxChecks <= 0 {
		cfg.MaxChecks = DefaultMaxChecks
	}
	if cfg.Clock == nil {
		cfg.Clock = c.cfg.Clock
	}
	if cfg.Logger == nil {
		cfg.Logger = c.cfg.Logger
	}
	if cfg.Name == "" {
		cfg.Name = defaultName("producer")
	}
	err := ident.ASCII("producer group", cfg.ProducerGroup)
	if err == nil {
		err = ident.MemberName("producer name", cfg.Name)
	}
	if err == nil && cfg.Checker == nil {
		err = &ident.Error{Field: "checker", Rule: "must not be nil"}
	}
	if err == nil {
		cfg.Tenants, err = consumerTenants("tenants", cfg.Tenants)
	}
	if err != nil {
		return nil, fmt.Errorf("shardq: transaction producer: %w", err)
	}
	id := ident.MemberID(cfg.Name)
	p := &TransactionProducer{c: c, cfg: cfg, id: id, log: cfg.Logger.With("producer_group", cfg.ProducerGroup, "member", id)}
	p.svc = checkback.Start(ctx, c.drv, checkback.Config{Tenants: cfg.Tenants, Group: cfg.ProducerGroup, Owner: id,
		Poll: cfg.PollInterval, ClaimTTL: cfg.ClaimTTL, CheckInterval: cfg.CheckInterval, MaxChecks: cfg.MaxChecks,
		DeadLetterExhausted: cfg.WhenExhausted == DeadLetterWhenExhausted, Timeout: dbTimeout, Clock: cfg.Clock, Log: p.log,
		Check: func(ctx context.Context, h driver.HalfMessage) (checkback.Outcome, error) {
			ctx, span := c.tel.StartCheck(ctx, cfg.ProducerGroup, h.Tenant, h.Topic, h.Headers)
			state, err := runLocal(ctx, cfg.Checker, toHalf(&h))
			c.tel.EndCheck(span, cfg.ProducerGroup, h.Tenant, state.String(), err)
			switch state {
			case TxCommit:
				return checkback.Commit, err
			case TxRollback:
				return checkback.Rollback, err
			}
			return checkback.Unknown, err
		}})
	p.halves = &telemetry.HalfSource{ProducerGroup: cfg.ProducerGroup, Read: p.pendingHalves}
	c.tel.AddHalves(p.halves)
	if err := c.track(p); err != nil {
		p.Stop(ctx)
		return nil, fmt.Errorf("shardq: transaction producer: %w", err)
	}
	return p, nil
}

// pendingHalves counts the group's pending half messages per tenant (the
// half-message gauge), reading at most maxHalvesCounted.
func (p *TransactionProducer) pendingHalves(ctx context.Context) (map[string]int64, error) {
	hs, err := p.c.drv.ListHalves(ctx, driver.Scope{Tenants: p.cfg.Tenants, Limit: maxHalvesCounted})
	if err != nil {
		return nil, fmt.Errorf("count half messages of producer group %q: %w", p.cfg.ProducerGroup, err)
	}
	counts := make(map[string]int64, len(p.cfg.Tenants))
	for _, t := range p.cfg.Tenants {
		counts[t] = 0
	}
	for _, h := range hs {
		if h.ProducerGroup == p.cfg.ProducerGroup {
			counts[h.Tenant]++
		}
	}
	return counts, nil
}

// maxHalvesCounted bounds the half messages one reading of the gauge
// lists: a few are normal, thousands mean a stuck producer group, which
// the gauge shows either way.
const maxHalvesCounted = 10_000

// Stop ends the check-back loop, letting a running check finish until ctx
// ends.
func (p *TransactionProducer) Stop(ctx context.Context) error {
	defer p.c.untrack(p)
	p.c.tel.RemoveHalves(p.halves)
	p.svc.Stop(ctx)
	return nil
}

func (p *TransactionProducer) stopOrder() int                         { return 1 }
func (p *TransactionProducer) stopForClose(ctx context.Context) error { return p.Stop(ctx) }

// Stats reports how this producer resolved half messages so far.
func (p *TransactionProducer) Stats() TxStats {
	st := p.svc.Stats()
	return TxStats{Committed: p.committed.Load(), RolledBack: p.rolledBack.Load(), CheckedCommitted: st.Committed,
		CheckedRolledBack: st.RolledBack, Exhausted: st.Exhausted}
}

// SendInTransaction sends msg transactionally. The selector (when not nil)
// chooses the partition key from msg and arg before anything is written;
// without one, msg's own partition key (or Selector) is used. It stores a
// half message, runs local, and then commits (the message enters its
// partition with a fresh offset), rolls back, or leaves it unknown for the
// check-back. A commit or rollback that finds the half message already
// resolved returns ErrTxResolved.
func (p *TransactionProducer) SendInTransaction(ctx context.Context, msg Message, sel Selector, arg any, local LocalTransaction) (_ TxResult, err error) {
	start := time.Now()
	ctx, span := p.c.tel.StartSend(ctx, true)
	var sent []*driver.InsertMessage
	defer func() { p.c.tel.EndSend(ctx, span, start, sent, err) }()
	if sel != nil {
		if msg.Selector != nil {
			return TxResult{}, fmt.Errorf("shardq: send in transaction: %w",
				&ident.Error{Field: "selector", Rule: "given both as an argument and in Message.Selector"})
		}
		msg.Selector, msg.SelectorArg = sel, arg
	}
	if local == nil {
		return TxResult{}, fmt.Errorf("shardq: send in transaction: %w", &ident.Error{Field: "local transaction", Rule: "must not be nil"})
	}
	rows, err := p.c.prepare(ctx, []Message{msg}, false)
	if err != nil {
		return TxResult{}, fmt.Errorf("shardq: send in transaction: %w", err)
	}
	row := rows[0]
	if !slices.Contains(p.cfg.Tenants, row.Tenant) {
		return TxResult{}, fmt.Errorf("shardq: send in transaction: %w", &ident.Error{Field: "tenant",
			Rule: fmt.Sprintf("%q is not among producer group %q's tenants, whose check-back would never see it", row.Tenant, p.cfg.ProducerGroup)})
	}
	now := p.cfg.Clock()
	half := &driver.HalfMessage{InsertMessage: *row, ProducerGroup: p.cfg.ProducerGroup, NextCheckAt: now.Add(p.cfg.TransactionTimeout)}
	res := TxResult{Tenant: row.Tenant, Topic: row.Topic, PartitionKey: row.PartitionKey, ID: row.ID}
	sent = rows
	if err := p.c.drv.InsertHalf(ctx, half); err != nil {
		return res, fmt.Errorf("shardq: send in transaction: %w", err)
	}
	state, lerr := runLocal(ctx, local, toHalf(half))
	switch state {
	case TxCommit:
		m, err := p.c.drv.CommitHalf(ctx, half.Ref(), 0)
		if err != nil {
			return res, fmt.Errorf("shardq: send in transaction: %w", err)
		}
		p.committed.Add(1)
		res.State, res.Offset = TxCommit, m.Offset
	case TxRollback:
		if err := p.c.drv.RollbackHalf(ctx, half.Ref(), 0); err != nil {
			return res, fmt.Errorf("shardq: send in transaction: %w", err)
		}
		p.rolledBack.Add(1)
		res.State = TxRollback
	default:
		res.State = TxUnknown
	}
	if lerr != nil {
		return res, fmt.Errorf("shardq: local transaction: %w (left %s for the check-back)", lerr, res.State)
	}
	return res, nil
}

// runLocal runs a local transaction or checker; an error or a panic means
// unknown.
func runLocal(ctx context.Context, fn func(context.Context, *HalfMessage) (TxState, error), h *HalfMessage) (state TxState, err error) {
	defer func() {
		if r := recover(); r != nil {
			state, err = TxUnknown, fmt.Errorf("panicked: %v", r)
		}
	}()
	state, err = fn(ctx, h)
	if err != nil || (state != TxCommit && state != TxRollback) {
		return TxUnknown, err
	}
	return state, nil
}

func toHalf(h *driver.HalfMessage) *HalfMessage {
	return &HalfMessage{Tenant: h.Tenant, Topic: h.Topic, PartitionKey: h.PartitionKey, ID: h.ID, ProducerGroup: h.ProducerGroup,
		Payload: h.Payload, Headers: h.Headers, CreatedAt: h.CreatedAt, Checks: h.Checks}
}
