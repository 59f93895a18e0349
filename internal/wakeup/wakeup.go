// SPDX-License-Identifier: Apache-2.0

// Package wakeup lets a publish wake the consumers of its own process:
// after a Publish commits, each consumer registered for a topic it wrote
// hears of the rows at once, instead of at its next poll. Consumers in
// other processes still poll; so do rows written by PublishTx or the
// transaction producer, whose commit the client does not see.
package wakeup

import (
	"sync"

	"github.com/shardq/shardq/driver"
)

// Registry holds the local consumers by topic. The zero value is ready.
type Registry struct {
	mu      sync.Mutex
	byTopic map[string]map[any]func([]*driver.InsertMessage)
}

// Add registers wake under key for topic's rows.
func (r *Registry) Add(topic string, key any, wake func(rows []*driver.InsertMessage)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byTopic == nil {
		r.byTopic = map[string]map[any]func([]*driver.InsertMessage){}
	}
	if r.byTopic[topic] == nil {
		r.byTopic[topic] = map[any]func([]*driver.InsertMessage){}
	}
	r.byTopic[topic][key] = wake
}

// Remove unregisters key.
func (r *Registry) Remove(topic string, key any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.byTopic[topic], key)
}

// Committed hands rows to the consumers of every topic the rows name (one
// call, or one shared transaction, may span several), outside the lock.
func (r *Registry) Committed(rows []*driver.InsertMessage) {
	r.mu.Lock()
	if len(r.byTopic) == 0 {
		r.mu.Unlock()
		return
	}
	var wakes []func([]*driver.InsertMessage)
	seen := map[string]bool{}
	for _, row := range rows {
		if seen[row.Topic] {
			continue
		}
		seen[row.Topic] = true
		for _, w := range r.byTopic[row.Topic] {
			wakes = append(wakes, w)
		}
	}
	r.mu.Unlock()
	for _, w := range wakes {
		w(rows)
	}
}
