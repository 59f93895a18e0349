// SPDX-License-Identifier: Apache-2.0

// Package testhook lets shardqtest hand a handler a Delivery whose
// transactional settles (Defer, AckTx) are recorded instead of run: a
// hand-built Delivery has no lease or claim to settle against. The root
// package sets Record; nothing else uses it.
package testhook

import "sync"

// Recorder is what a handler asked of its Delivery.
type Recorder struct {
	mu       sync.Mutex
	deferred bool
	ackedTx  bool
}

// Defer records a Defer.
func (r *Recorder) Defer() { r.mu.Lock(); r.deferred = true; r.mu.Unlock() }

// AckTx records an AckTx.
func (r *Recorder) AckTx() { r.mu.Lock(); r.ackedTx = true; r.mu.Unlock() }

// Calls reports what was recorded.
func (r *Recorder) Calls() (deferred, ackedTx bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.deferred, r.ackedTx
}

// Record returns a copy of d (a *shardq.Delivery) that reports its
// Defer and AckTx to rec. Set by the root package's init.
var Record func(d any, rec *Recorder) any
