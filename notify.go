// SPDX-License-Identifier: Apache-2.0

package shardq

import (
	"sync"

	"github.com/shardq/shardq/driver"
)

// localSubscribers lets a publish wake this process's own subscribers: after
// a Publish commits, the workers delivering its partitions fetch at once
// instead of at their next poll. Subscribers in other processes still poll
// (PollInterval); so do messages written by PublishTx or the transaction
// producer, whose commit the client does not see.
type localSubscribers struct {
	mu      sync.Mutex
	byTopic map[string]map[*Subscriber]struct{}
}

func (l *localSubscribers) add(s *Subscriber) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.byTopic == nil {
		l.byTopic = map[string]map[*Subscriber]struct{}{}
	}
	if l.byTopic[s.cfg.Topic] == nil {
		l.byTopic[s.cfg.Topic] = map[*Subscriber]struct{}{}
	}
	l.byTopic[s.cfg.Topic][s] = struct{}{}
}

func (l *localSubscribers) remove(s *Subscriber) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.byTopic[s.cfg.Topic], s)
}

// committed wakes the local workers of the partitions rows were stored in,
// in every topic the rows name (one call, or one shared transaction, may
// span several).
func (l *localSubscribers) committed(rows []*driver.InsertMessage) {
	l.mu.Lock()
	if len(l.byTopic) == 0 {
		l.mu.Unlock()
		return
	}
	var subs []*Subscriber
	seen := map[string]bool{}
	for _, r := range rows {
		if seen[r.Topic] {
			continue
		}
		seen[r.Topic] = true
		for s := range l.byTopic[r.Topic] {
			subs = append(subs, s)
		}
	}
	l.mu.Unlock()
	for _, s := range subs {
		s.wake(rows)
	}
}

// wake nudges the idle workers of the rows' partitions.
func (s *Subscriber) wake(rows []*driver.InsertMessage) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, r := range rows {
		prev := rows[max(i-1, 0)]
		if r.Topic != s.cfg.Topic || (i > 0 && r.Tenant == prev.Tenant && r.Topic == prev.Topic && r.PartitionKey == prev.PartitionKey) {
			continue
		}
		if r.PartitionKey == "" && s.ungroupedWake != nil {
			select {
			case s.ungroupedWake <- struct{}{}:
			default:
			}
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
