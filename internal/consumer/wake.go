// SPDX-License-Identifier: Apache-2.0

package consumer

import (
	"github.com/shardq/shardq/driver"
)

// Wake is the member's side of local wake-ups (internal/wakeup): it
// nudges the idle workers of the rows' partitions.
func (s *Member) Wake(rows []*driver.InsertMessage) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, r := range rows {
		prev := rows[max(i-1, 0)]
		if r.Topic != s.cfg.Topic || (i > 0 && r.Tenant == prev.Tenant && r.Topic == prev.Topic && r.PartitionKey == prev.PartitionKey) {
			continue
		}
		if r.PartitionKey == "" && s.ungrouped != nil {
			s.ungrouped.Wake()
			continue
		}
		ref := driver.PartitionRef{Tenant: r.Tenant, ConsumerGroup: s.cfg.ConsumerGroup, Topic: r.Topic, PartitionKey: r.PartitionKey}
		if w := s.workers[ref]; w != nil {
			select {
			case w.wake <- struct{}{}:
			default: // a wake-up is pending already
			}
		}
	}
}
