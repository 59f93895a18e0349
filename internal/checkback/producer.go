// SPDX-License-Identifier: Apache-2.0

package checkback

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/ident"
	"github.com/shardq/shardq/internal/lifecycle"
	"github.com/shardq/shardq/internal/publish"
	"github.com/shardq/shardq/internal/telemetry"
)

func (o Outcome) String() string {
	switch o {
	case Commit:
		return "commit"
	case Rollback:
		return "rollback"
	}
	return "unknown"
}

// Func is a local transaction or a checker: the application's answer for
// a half message. An error, a panic or an Outcome other than Commit and
// Rollback counts as Unknown.
type Func func(ctx context.Context, h *driver.HalfMessage) (Outcome, error)

// ProducerConfig configures a member of a producer group: the check-back
// service's settings (its Check and Timeout are the producer's own) and
// what a send needs.
type ProducerConfig struct {
	Config
	Checker Func
	// TransactionTimeout is how long after it is written a half message
	// is first checked.
	TransactionTimeout time.Duration
}

// Producer is the runtime of a transaction producer (the root package's
// TransactionProducer): transactional sends, and the group's check-back.
type Producer struct {
	drv    driver.Driver
	cfg    ProducerConfig
	tel    *telemetry.T
	pub    *publish.Publisher
	svc    *Service
	halves *telemetry.HalfSource // reports the group's pending half messages

	committed, rolledBack atomic.Int64
}

// ProducerStats counts how a producer resolved half messages
// (shardq.TxStats, field for field).
type ProducerStats struct {
	Committed, RolledBack, CheckedCommitted, CheckedRolledBack, Exhausted int64
}

// Result is a send's outcome.
type Result struct {
	State                           Outcome
	Tenant, Topic, PartitionKey, ID string
	Offset                          int64 // when committed
}

// StartProducer starts the check-back loop of cfg's group and reports the
// group's pending half messages to tel until Stop.
func StartProducer(ctx context.Context, drv driver.Driver, tel *telemetry.T, pub *publish.Publisher, cfg ProducerConfig) *Producer {
	p := &Producer{drv: drv, cfg: cfg, tel: tel, pub: pub}
	cfg.Timeout = lifecycle.CallTimeout
	cfg.Check = func(ctx context.Context, h driver.HalfMessage) (Outcome, error) {
		ctx, span := tel.StartCheck(ctx, cfg.Group, h.Tenant, h.Topic, h.Headers)
		state, err := run(ctx, cfg.Checker, &h)
		tel.EndCheck(span, cfg.Group, h.Tenant, state.String(), err)
		return state, err
	}
	p.svc = Start(ctx, drv, cfg.Config)
	p.halves = &telemetry.HalfSource{ProducerGroup: cfg.Group, Read: p.pendingHalves}
	tel.AddHalves(p.halves)
	return p
}

// Stop ends the check-back loop, letting a running check finish until ctx
// ends; it returns ctx's error when the check had to be cancelled.
func (p *Producer) Stop(ctx context.Context) error {
	p.tel.RemoveHalves(p.halves)
	return p.svc.Stop(ctx)
}

// Done is closed once the loop has stopped.
func (p *Producer) Done() <-chan struct{} { return p.svc.Done() }

// Stats reports how this producer resolved half messages so far.
func (p *Producer) Stats() ProducerStats {
	st := p.svc.Stats()
	return ProducerStats{Committed: p.committed.Load(), RolledBack: p.rolledBack.Load(), CheckedCommitted: st.Committed,
		CheckedRolledBack: st.RolledBack, Exhausted: st.Exhausted}
}

// maxHalvesCounted bounds the half messages one reading of the gauge
// lists: a few are normal, thousands mean a stuck producer group, which
// the gauge shows either way.
const maxHalvesCounted = 10_000

// pendingHalves counts the group's pending half messages per tenant (the
// half-message gauge), reading at most maxHalvesCounted.
func (p *Producer) pendingHalves(ctx context.Context) (map[string]int64, error) {
	hs, err := p.drv.ListHalves(ctx, driver.Scope{Tenants: p.cfg.Tenants, Limit: maxHalvesCounted})
	if err != nil {
		return nil, fmt.Errorf("count half messages of producer group %q: %w", p.cfg.Group, err)
	}
	counts := make(map[string]int64, len(p.cfg.Tenants))
	for _, t := range p.cfg.Tenants {
		counts[t] = 0
	}
	for _, h := range hs {
		if h.ProducerGroup == p.cfg.Group {
			counts[h.Tenant]++
		}
	}
	return counts, nil
}

// Send stores msg as a half message, runs local, and then commits it (it
// enters its partition with a fresh offset), rolls it back, or leaves it
// unknown for the check-back. twoSelectors refuses a call given a
// selector both as an argument and in the message.
func (p *Producer) Send(ctx context.Context, msg publish.Message, twoSelectors bool, local Func) (_ Result, err error) {
	start := time.Now()
	ctx, span := p.tel.StartSend(ctx, true)
	var sent []*driver.InsertMessage
	defer func() { p.tel.EndSend(ctx, span, start, sent, err) }()
	if twoSelectors {
		return Result{}, fmt.Errorf("shardq: send in transaction: %w",
			&ident.Error{Field: "selector", Rule: "given both as an argument and in Message.Selector"})
	}
	if local == nil {
		return Result{}, fmt.Errorf("shardq: send in transaction: %w", &ident.Error{Field: "local transaction", Rule: "must not be nil"})
	}
	rows, err := p.pub.Prepare(ctx, []publish.Message{msg}, false)
	if err != nil {
		return Result{}, fmt.Errorf("shardq: send in transaction: %w", err)
	}
	row := rows[0]
	if !slices.Contains(p.cfg.Tenants, row.Tenant) {
		return Result{}, fmt.Errorf("shardq: send in transaction: %w", &ident.Error{Field: "tenant",
			Rule: fmt.Sprintf("%q is not among producer group %q's tenants, whose check-back would never see it", row.Tenant, p.cfg.Group)})
	}
	end, err := p.pub.Admit(ctx, rows, false)
	if err != nil {
		return Result{}, fmt.Errorf("shardq: send in transaction: %w", err)
	}
	// The message is held against the tenant's quotas until it is a
	// message or gone; one left to the check-back ends out of sight.
	outcome := publish.EndsUnseen
	defer func() { end(outcome) }()
	half := &driver.HalfMessage{InsertMessage: *row, ProducerGroup: p.cfg.Group, NextCheckAt: p.cfg.Clock().Add(p.cfg.TransactionTimeout)}
	res := Result{Tenant: row.Tenant, Topic: row.Topic, PartitionKey: row.PartitionKey, ID: row.ID}
	sent = rows
	if err := p.drv.InsertHalf(ctx, half); err != nil {
		outcome = publish.Ended
		return res, fmt.Errorf("shardq: send in transaction: %w", err)
	}
	state, lerr := run(ctx, local, half)
	switch state {
	case Commit:
		m, err := p.pub.CommitHalf(ctx, half.Ref())
		if err != nil {
			return res, fmt.Errorf("shardq: send in transaction: %w", err)
		}
		outcome = publish.Ended
		p.committed.Add(1)
		res.State, res.Offset = Commit, m.Offset
	case Rollback:
		if err := p.drv.RollbackHalf(ctx, half.Ref(), 0); err != nil {
			return res, fmt.Errorf("shardq: send in transaction: %w", err)
		}
		outcome = publish.Ended
		p.rolledBack.Add(1)
		res.State = Rollback
	default:
		res.State = Unknown
	}
	if lerr != nil {
		return res, fmt.Errorf("shardq: local transaction: %w (left %s for the check-back)", lerr, res.State)
	}
	return res, nil
}

// run runs a local transaction or checker; an error or a panic means
// unknown.
func run(ctx context.Context, fn Func, h *driver.HalfMessage) (state Outcome, err error) {
	defer func() {
		if r := recover(); r != nil {
			state, err = Unknown, fmt.Errorf("panicked: %v", r)
		}
	}()
	state, err = fn(ctx, h)
	if err != nil || (state != Commit && state != Rollback) {
		return Unknown, err
	}
	return state, nil
}
