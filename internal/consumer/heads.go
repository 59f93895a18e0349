// SPDX-License-Identifier: Apache-2.0

package consumer

import (
	"context"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/backoff"
)

// idleFallback × PollInterval is how long an idle worker waits when
// neither the head watcher nor a wake-up wakes it.
const idleFallback = 5

// watchHeads wakes idle workers whose partition head moved: at once when
// the feed asks for a rescan, every FeedPollInterval while the change feed
// streams, and without it every PollInterval, polling faster (down to a
// twentieth of it) while heads move (backoff.Poll). One query reads the
// heads of all of this member's idle partitions, in all its tenants,
// instead of each idle partition polling on its own.
func (s *Member) watchHeads() {
	poll := backoff.NewPoll(s.cfg.PollInterval)
	seen := map[driver.HeadKey]int64{}
	t := time.NewTimer(s.pollEvery())
	defer t.Stop()
	for {
		select {
		case <-s.life.Context().Done():
			return
		case <-t.C:
		case <-s.rescan:
		}
		moved, polled, held := s.wakeMovedHeads(seen)
		switch {
		case s.feedUp():
			t.Reset(s.pollEvery())
		case !polled && held: // every held partition busy: no news either way, no statement
			t.Reset(poll.Wait())
		default: // none held counts as still
			t.Reset(poll.Next(moved))
		}
	}
}

// wakeMovedHeads is one round of the head watcher: one statement for all
// idle partitions of every tenant (up to 500 keys). It reports whether a
// head rose since the last round (seen: the idle partitions' heads then,
// kept up to date), whether it read heads at all (no idle partition: no),
// and whether the member holds any partition. A partition whose head stays past its cursor
// (its messages aged out before the group read them) wakes its worker at
// each round, but is not activity.
func (s *Member) wakeMovedHeads(seen map[driver.HeadKey]int64) (moved, polled, held bool) {
	idle := map[driver.HeadKey]*worker{}
	var tenants, keys []string
	seenTenant, seenKey := map[string]bool{}, map[string]bool{}
	s.mu.Lock()
	held = len(s.workers) > 0
	for ref, w := range s.workers {
		if w.idleAfter.Load() > 0 {
			idle[driver.HeadKey{Tenant: ref.Tenant, PartitionKey: ref.PartitionKey}] = w
			if !seenTenant[ref.Tenant] {
				seenTenant[ref.Tenant] = true
				tenants = append(tenants, ref.Tenant)
			}
			if !seenKey[ref.PartitionKey] {
				seenKey[ref.PartitionKey] = true
				keys = append(keys, ref.PartitionKey)
			}
		}
	}
	s.mu.Unlock()
	if len(idle) == 0 {
		clear(seen)
		return false, false, held
	}
	ctx, cancel := context.WithTimeout(s.life.Context(), dbTimeout)
	heads, err := s.drv.HeadsOf(ctx, s.cfg.Topic, tenants, keys)
	cancel()
	if err != nil {
		if s.life.Context().Err() == nil {
			s.log.Warn("shardq: reading partition heads failed; idle partitions fall back to polling", "tenants", tenants, "err", err)
		}
		return false, true, held // a failing database backs the polls off
	}
	for k, w := range idle {
		h := heads[k]
		if after := w.idleAfter.Load(); after > 0 && h >= after {
			signal(w.wake)
			if before, ok := seen[k]; !ok || h > before {
				moved = true
			}
		}
	}
	for k := range seen {
		if _, ok := idle[k]; !ok {
			delete(seen, k)
		}
	}
	for k := range idle {
		seen[k] = heads[k]
	}
	return moved, true, held
}
