// SPDX-License-Identifier: Apache-2.0

package consumer

import (
	"time"

	"github.com/shardq/shardq/driver"
)

// Moved is the member's side of wake-ups (internal/wakeup): a local
// publish or the change feed saw the heads of these partitions move. It
// nudges their idle workers, or the ungrouped claimers; a partition that
// nobody holds runs the control loop's next tick early, so that a new key
// is leased within JoinWindow rather than DiscoveryInterval.
func (s *Member) Moved(heads []driver.HeadChange) {
	kick := false
	s.mu.Lock()
	for _, h := range heads {
		if h.Topic != s.cfg.Topic {
			continue
		}
		if h.PartitionKey == "" {
			if s.ungrouped != nil {
				s.ungrouped.Wake(h.Tenant)
			}
			continue
		}
		if s.cfg.Take == TakeUngrouped {
			continue
		}
		ref := driver.PartitionRef{Tenant: h.Tenant, ConsumerGroup: s.cfg.ConsumerGroup, Topic: h.Topic, PartitionKey: h.PartitionKey}
		w := s.workers[ref]
		if w == nil {
			k := [2]string{h.Tenant, h.PartitionKey}
			if !s.heldElsewhere[k] {
				kick = true
				if _, ok := s.unseen[k]; !ok && len(s.unseen) < maxUnseen {
					s.unseen[k] = time.Now()
				}
			}
			continue
		}
		if h.Head > w.expect.Load() { // s.mu serializes the writers
			w.expect.Store(h.Head)
		}
		select {
		case w.wake <- struct{}{}:
		default: // a wake-up is pending already
		}
	}
	s.mu.Unlock()
	if kick {
		signal(s.kick)
	}
}

// maxUnseen bounds Member.unseen: keys come from publishers.
const maxUnseen = 1000

// Rescan is the feed's "anything may have moved": the head watcher reads
// the heads of every idle partition now, the ungrouped claimers look, and
// the control loop ticks early (at most once per JoinWindow), since a new
// key may be among what moved.
func (s *Member) Rescan() {
	signal(s.rescan)
	if s.cfg.Take != TakeUngrouped {
		signal(s.kick)
	}
	if s.ungrouped != nil {
		s.ungrouped.Rescan()
	}
}

// signal sends on a one-slot channel unless a signal is pending already.
func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}
