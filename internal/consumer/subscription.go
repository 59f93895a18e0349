// SPDX-License-Identifier: Apache-2.0

package consumer

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/telemetry"
	"github.com/shardq/shardq/internal/wakeup"
)

// Subscription is a member as a client runs it (the runtime of
// shardq.Subscriber): woken by the client's publishes and change feed,
// reporting its lag, and stopped once, by Stop or by the end of the
// context it watches.
type Subscription struct {
	*Member
	tel     *telemetry.T
	local   *wakeup.Registry
	lag     *telemetry.LagSource // nil when taking ungrouped messages only
	stopped func()               // called once stopped

	mu      sync.Mutex
	unwatch func() bool // stops watching the context (nil: none)
	done    chan struct{}
	once    sync.Once
	err     error
}

// Subscribe starts a member (Start) and registers it for local's
// wake-ups and tel's lag gauge; stopped is called once it has stopped.
func Subscribe(ctx context.Context, drv driver.Driver, cfg Config, tel *telemetry.T, local *wakeup.Registry, stopped func()) (*Subscription, error) {
	m, err := Start(ctx, drv, cfg)
	if err != nil {
		return nil, err
	}
	s := &Subscription{Member: m, tel: tel, local: local, stopped: stopped, done: make(chan struct{})}
	if cfg.Take != TakeUngrouped { // a member without leases runs no ticks to learn the lag from
		s.lag = &telemetry.LagSource{Topic: cfg.Topic, Group: cfg.ConsumerGroup, Read: m.Lag}
		tel.AddLag(s.lag)
	}
	local.Add(cfg.Topic, cfg.Tenants, s, m)
	if cfg.Instance != "" {
		go s.stopWhenFenced() // ends at the stop, whichever comes first
	}
	return s, nil
}

// stopWhenFenced stops a static member that a later incarnation took
// over, at once: its handlers are cancelled, as when a lease is lost
// (another process holds its partitions now). Its Stop then reports
// ErrInstanceFenced.
func (s *Subscription) stopWhenFenced() {
	select {
	case <-s.Fenced():
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // a hard stop
		s.stopWith(ctx, ErrInstanceFenced)
	case <-s.done:
	}
}

// Watch stops s when ctx ends, giving the handlers in flight
// stopTimeout.
func (s *Subscription) Watch(ctx context.Context, stopTimeout time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.done:
		return // stopped already: nothing to watch for
	default:
	}
	s.unwatch = context.AfterFunc(ctx, func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), stopTimeout)
		defer cancel()
		if err := s.stop(stopCtx); err != nil {
			s.log.Warn("shardq: stopping the subscriber when its context ended failed", "err", err)
		}
	})
}

// Stop stops the member (Member.Stop) unless it is stopped already, and
// returns the first stop's result.
func (s *Subscription) Stop(ctx context.Context) error {
	s.mu.Lock()
	unwatch := s.unwatch
	s.mu.Unlock()
	if unwatch != nil {
		unwatch()
	}
	return s.stop(ctx)
}

// Done is closed once the subscription has stopped.
func (s *Subscription) Done() <-chan struct{} { return s.done }

func (s *Subscription) stop(ctx context.Context) error { return s.stopWith(ctx, nil) }

// stopWith stops s once; cause, when not nil, is why it stopped by
// itself, and joins the stop's result.
func (s *Subscription) stopWith(ctx context.Context, cause error) error {
	s.once.Do(func() {
		defer close(s.done)
		defer s.stopped()
		s.local.Remove(s.cfg.Topic, s)
		if s.lag != nil {
			s.tel.RemoveLag(s.lag)
		}
		s.err = errors.Join(cause, s.Member.Stop(ctx))
	})
	return s.err
}
