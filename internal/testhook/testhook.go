// SPDX-License-Identifier: Apache-2.0

// Package testhook holds what tests reach through non-test code: the
// root package sets Record, so that shardqtest hands a handler a Delivery
// whose transactional settles (Defer, AckTx) are recorded instead of run
// (a hand-built Delivery has no lease or claim to settle against); each
// driver sets TrimMigrations, for the upgrade tests of another package.
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

// TrimMigrations, set by each driver package at init by its Name, makes
// a driver of that package embed every migration but its newest, as the
// previous release did: the upgrade tests run it as the older binary.
var TrimMigrations = map[string]func(d any){}
