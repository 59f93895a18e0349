// SPDX-License-Identifier: Apache-2.0

package consumer

import (
	"context"

	"github.com/shardq/shardq/internal/lifecycle"
)

// idleFallback × PollInterval is how long an idle worker waits when
// neither the head watcher nor a local publish wakes it.
const idleFallback = 5

// watchHeads wakes idle workers whose partition head moved: every
// PollInterval, one query per tenant reads the heads of all of this
// member's idle partitions, instead of each idle partition polling on its
// own.
func (s *Member) watchHeads() {
	lifecycle.Every(s.life.Context(), s.cfg.PollInterval, false, s.wakeMovedHeads)
}

// wakeMovedHeads is one round of the head watcher.
func (s *Member) wakeMovedHeads() {
	idle := map[string]map[string]*worker{} // tenant → key → worker
	s.mu.Lock()
	for ref, w := range s.workers {
		if w.idleAfter.Load() > 0 {
			if idle[ref.Tenant] == nil {
				idle[ref.Tenant] = map[string]*worker{}
			}
			idle[ref.Tenant][ref.PartitionKey] = w
		}
	}
	s.mu.Unlock()
	for tenant, ws := range idle {
		keys := make([]string, 0, len(ws))
		for k := range ws {
			keys = append(keys, k)
		}
		ctx, cancel := context.WithTimeout(s.life.Context(), dbTimeout)
		heads, err := s.drv.HeadsOf(ctx, tenant, s.cfg.Topic, keys)
		cancel()
		if err != nil {
			if s.life.Context().Err() == nil {
				s.log.Warn("shardq: reading partition heads failed; idle partitions fall back to polling", "tenant", tenant, "err", err)
			}
			continue
		}
		for k, w := range ws {
			if after := w.idleAfter.Load(); after > 0 && heads[k] >= after {
				select {
				case w.wake <- struct{}{}:
				default:
				}
			}
		}
	}
}
