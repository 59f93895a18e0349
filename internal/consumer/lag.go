// SPDX-License-Identifier: Apache-2.0

package consumer

import (
	"context"
	"fmt"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/telemetry"
)

// maxLagPartitions bounds the partitions one lag reading counts: the
// metric then follows the active work, never the number of partitions.
const maxLagPartitions = 1000

// Lag counts, per tenant, the messages after the group's cursor in the
// partitions that had work at the last tick (one bounded read each, up to
// maxLagPartitions; driver.PartitionLag), and the oldest of them. Every
// tenant of the member is reported, with 0 when it has no work.
func (s *Member) Lag(ctx context.Context) ([]telemetry.Lag, error) {
	s.mu.Lock()
	work := s.work
	s.mu.Unlock()
	out := make([]telemetry.Lag, len(s.cfg.Tenants))
	at := make(map[string]int, len(s.cfg.Tenants))
	for i, t := range s.cfg.Tenants {
		out[i].Tenant, at[t] = t, i
	}
	for n, p := range work {
		if n == maxLagPartitions {
			s.log.Debug("shardq: lag counted in the first partitions with work only", "partitions", len(work), "counted", n)
			break
		}
		i, ok := at[p.Tenant]
		if !ok || p.HeadOffset <= p.CommittedOffset {
			continue
		}
		l, err := s.drv.PartitionLag(ctx, driver.TopicPartition{Tenant: p.Tenant, Topic: p.Topic, PartitionKey: p.PartitionKey}, p.CommittedOffset)
		if err != nil {
			return out, fmt.Errorf("lag of tenant %q topic %q group %q: %w", p.Tenant, p.Topic, s.cfg.ConsumerGroup, err)
		}
		out[i].Messages += l.Lag
		if !l.OldestUnconsumed.IsZero() && (out[i].Oldest.IsZero() || l.OldestUnconsumed.Before(out[i].Oldest)) {
			out[i].Oldest = l.OldestUnconsumed
		}
	}
	return out, nil
}
