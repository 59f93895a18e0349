// SPDX-License-Identifier: Apache-2.0

package consumer

import (
	"context"
	"errors"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/ident"
)

// ErrInstanceFenced ends a static member that a later process with the
// same InstanceID took over.
var ErrInstanceFenced = errors.New("another process took over this static member (same InstanceID); this one stopped")

// A static member (Config.Instance) keeps its partitions across a
// restart, as Kafka's static membership does:
//
//	start ──► takeOver: the leases of earlier incarnations of the
//	          instance move to this one (next token: their writes fail)
//	          and their heartbeat rows are replaced by its own, in one
//	          transaction per tenant; the peers see the same number of
//	          members, so their quotas, and their partitions, stay.
//	beat  ──► RefreshHeartbeat: a static member refreshes its rows and
//	          never adds one back unchecked. One missing, and a row of an
//	          incarnation it did not take over (takenOver): a later
//	          process took this one over (in the transaction that deleted
//	          the row), and it stops (ErrInstanceFenced) without beating
//	          again. A row of one it took over is deleted again.
//
// The tick leaves the incarnations it took over out of the live members.

func (s *Member) scope() driver.GroupScope {
	return driver.GroupScope{Tenants: s.cfg.Tenants, Topic: s.cfg.Topic, ConsumerGroup: s.cfg.ConsumerGroup}
}

// incarnations lists the heartbeat rows of the instance's other
// incarnations, by name, with their tenants.
func (s *Member) incarnations(ctx context.Context) (map[string][]string, error) {
	subs, err := s.drv.Subscribers(ctx, s.scope())
	if err != nil {
		return nil, err
	}
	out := map[string][]string{}
	for _, sub := range subs {
		if sub.Name != s.cfg.ID && ident.IsIncarnation(s.cfg.Instance, sub.Name) {
			out[sub.Name] = append(out[sub.Name], sub.Tenant)
		}
	}
	return out, nil
}

// takeOver takes over the earlier incarnations of a static member.
func (s *Member) takeOver(ctx context.Context) error {
	if s.cfg.Instance == "" {
		return nil
	}
	others, err := s.incarnations(ctx)
	if err != nil || len(others) == 0 {
		return err
	}
	previous := map[string]bool{}
	var names []string
	for name := range others {
		previous[name] = true
		names = append(names, name)
	}
	s.mu.Lock()
	s.previous = previous
	s.mu.Unlock()
	n, err := s.drv.TakeOverMember(ctx, s.scope(), names, s.cfg.ID, s.cfg.Clock(), s.cfg.LeaseTTL)
	if err != nil {
		return err
	}
	s.log.Info("shardq: static member took over its earlier incarnations", "instance", s.cfg.Instance, "previous", names, "leases", n)
	return nil
}

// takenOver reports whether a later incarnation took this static member
// over (and then fences it); it deletes the rows of earlier ones that
// beat again.
func (s *Member) takenOver(ctx context.Context) bool {
	if s.cfg.Instance == "" {
		return false
	}
	others, err := s.incarnations(ctx)
	if err != nil {
		return false // the heartbeat reports the database's trouble
	}
	s.mu.Lock()
	previous := s.previous
	s.mu.Unlock()
	for name, tenants := range others {
		if !previous[name] {
			s.fenceOnce.Do(func() {
				s.log.Error("shardq: another process took over this static member; stopping", "instance", s.cfg.Instance, "by", name)
				close(s.fenced)
			})
			return true
		}
		g := s.scope()
		g.Tenants = tenants
		if err := s.drv.RemoveHeartbeat(ctx, g, name); err != nil {
			s.log.Warn("shardq: removing an earlier incarnation's heartbeat failed; retrying", "previous", name, "err", err)
		}
	}
	return false
}

// Fenced is closed when a later incarnation of this static member took
// it over.
func (s *Member) Fenced() <-chan struct{} { return s.fenced }
