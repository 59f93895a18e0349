// SPDX-License-Identifier: Apache-2.0

// Package checkback is the check-back of transactional messages: a
// producer group's members claim the half messages whose check is due
// (a fenced claim with a token, so two members never resolve one), ask the
// application's checker, and commit, roll back, reschedule, or, after the
// last check, resolve by policy. The root package's TransactionProducer
// is its handle.
package checkback

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/lifecycle"
)

// Outcome is a checker's answer.
type Outcome int

const (
	Unknown Outcome = iota
	Commit
	Rollback
)

// Config configures the service; every field is required.
type Config struct {
	Tenants       []string
	Group         string // the producer group
	Owner         string // this member's identity: the claims' owner
	Poll          time.Duration
	ClaimTTL      time.Duration
	CheckInterval time.Duration // between checks that answered Unknown
	MaxChecks     int
	// DeadLetterExhausted moves a half message still unknown after
	// MaxChecks to the dead table; otherwise it is rolled back.
	DeadLetterExhausted bool
	Timeout             time.Duration // bounds one check with its writes
	Clock               func() time.Time
	Log                 *slog.Logger
	// Check asks the application; an error counts as Unknown.
	Check func(ctx context.Context, h driver.HalfMessage) (Outcome, error)
}

// Stats counts how this service resolved half messages.
type Stats struct{ Committed, RolledBack, Exhausted int64 }

// Service runs the check-back loop.
type Service struct {
	drv                              driver.Driver
	cfg                              Config
	life                             *lifecycle.Group
	committed, rolledBack, exhausted atomic.Int64
}

// Start runs the loop until Stop: a claim of due half messages every Poll.
func Start(ctx context.Context, drv driver.Driver, cfg Config) *Service {
	s := &Service{drv: drv, cfg: cfg, life: lifecycle.New(ctx)}
	s.life.Go(s.loop)
	return s
}

// Stop ends the loop, letting a running check finish until ctx ends.
func (s *Service) Stop(ctx context.Context) error { return s.life.Stop(ctx) }

// Done is closed once the loop has stopped.
func (s *Service) Done() <-chan struct{} { return s.life.Done() }

// Stats reports the resolutions so far.
func (s *Service) Stats() Stats {
	return Stats{Committed: s.committed.Load(), RolledBack: s.rolledBack.Load(), Exhausted: s.exhausted.Load()}
}

func (s *Service) loop() { lifecycle.Every(s.life.Context(), s.cfg.Poll, true, s.checkDue) }

func (s *Service) checkDue() {
	ctx, cancel := context.WithTimeout(s.life.Context(), s.cfg.Timeout)
	defer cancel()
	due, err := s.drv.ClaimDueHalves(ctx, driver.HalfClaimRequest{Tenants: s.cfg.Tenants, ProducerGroup: s.cfg.Group, Owner: s.cfg.Owner, Now: s.cfg.Clock(), ClaimTTL: s.cfg.ClaimTTL, Limit: 100})
	if err != nil {
		if s.life.Context().Err() == nil {
			s.cfg.Log.Warn("shardq: claiming half messages to check failed; retrying", "tenants", s.cfg.Tenants, "err", err)
		}
		return
	}
	for _, h := range due {
		if s.life.Context().Err() != nil {
			return // the claims expire; another producer checks them
		}
		s.check(h)
	}
}

func (s *Service) check(h driver.HalfMessage) {
	ctx, cancel := context.WithTimeout(s.life.HardContext(), s.cfg.Timeout)
	defer cancel()
	args := []any{"tenant", h.Tenant, "topic", h.Topic, "partition_key", h.PartitionKey, "id", h.ID, "checks", h.Checks + 1}
	outcome, err := s.cfg.Check(ctx, h)
	if err != nil {
		s.cfg.Log.Warn("shardq: transaction check failed; counted as unknown", append(args, "err", err)...)
		outcome = Unknown
	}
	now := s.cfg.Clock()
	switch {
	case outcome == Commit:
		err = s.drv.CommitHalves(ctx, []*driver.HalfCommit{{Ref: h.Ref(), ClaimToken: h.ClaimToken}})
		if err == nil {
			s.committed.Add(1)
			s.cfg.Log.Info("shardq: half message committed by check-back", args...)
		}
	case outcome == Rollback:
		err = s.drv.RollbackHalf(ctx, h.Ref(), h.ClaimToken)
		if err == nil {
			s.rolledBack.Add(1)
			s.cfg.Log.Info("shardq: half message rolled back by check-back", args...)
		}
	case h.Checks+1 >= s.cfg.MaxChecks:
		policy := "rollback"
		if s.cfg.DeadLetterExhausted {
			policy = "dead-letter"
			err = s.drv.DeadLetterHalf(ctx, h, now)
		} else {
			err = s.drv.RollbackHalf(ctx, h.Ref(), h.ClaimToken)
		}
		if err == nil {
			s.exhausted.Add(1)
			s.cfg.Log.Warn("shardq: half message still unknown after the last check; resolved by policy", append(args, "policy", policy)...)
		}
	default:
		err = s.drv.RescheduleHalf(ctx, h, now.Add(s.cfg.CheckInterval))
	}
	if err != nil && !errors.Is(err, driver.ErrHalfResolved) {
		s.cfg.Log.Warn("shardq: resolving a checked half message failed; it is checked again", append(args, "err", err)...)
	}
}
