// SPDX-License-Identifier: Apache-2.0

package lifecycle

import (
	"context"
	"errors"
	"slices"
	"sync"
)

// ErrClosed is the refusal of a closed client (shardq.ErrClosed).
var ErrClosed = errors.New("shardq: client closed")

// Handles are the handles a client started and that are not stopped yet
// (subscribers, receivers, producers, cleaners), so that closing the
// client stops them, kind by kind. The zero value is ready.
type Handles struct {
	mu      sync.Mutex
	closed  bool
	running map[any]handle
}

type handle struct {
	order int                             // Close stops lower orders first
	stop  func(ctx context.Context) error // stops the handle; it calls Remove
}

// Add tracks h, stopped by stop in Close's round order; ErrClosed once
// Close has begun.
func (hs *Handles) Add(h any, order int, stop func(ctx context.Context) error) error {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	if hs.closed {
		return ErrClosed
	}
	if hs.running == nil {
		hs.running = map[any]handle{}
	}
	hs.running[h] = handle{order: order, stop: stop}
	return nil
}

// Remove forgets h (stopped).
func (hs *Handles) Remove(h any) {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	delete(hs.running, h)
}

// Close refuses new handles and stops the tracked ones: all of the lowest
// order together, and when they have returned the next order, sharing
// ctx. It joins their errors.
func (hs *Handles) Close(ctx context.Context) error {
	hs.mu.Lock()
	hs.closed = true
	var todo []handle
	for _, h := range hs.running {
		todo = append(todo, h)
	}
	// Stopping a handle calls Remove: the lock is not held past here.
	hs.mu.Unlock()
	slices.SortStableFunc(todo, func(a, b handle) int { return a.order - b.order })
	var errs []error
	for len(todo) > 0 {
		n := 1
		for n < len(todo) && todo[n].order == todo[0].order {
			n++
		}
		var wg sync.WaitGroup
		errc := make(chan error, n)
		for _, h := range todo[:n] {
			wg.Go(func() { errc <- h.stop(ctx) })
		}
		wg.Wait()
		close(errc)
		for err := range errc {
			if err != nil {
				errs = append(errs, err)
			}
		}
		todo = todo[n:]
	}
	return errors.Join(errs...)
}
