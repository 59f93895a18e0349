// SPDX-License-Identifier: Apache-2.0

package drivertest

import (
	"sync/atomic"
	"time"
)

// fakeClock is an injected clock that a test moves by hand, so that lease
// and visibility tests do not sleep.
type fakeClock struct{ now atomic.Int64 }

func newFakeClock(at time.Time) *fakeClock {
	c := &fakeClock{}
	c.now.Store(at.UnixMicro())
	return c
}

func (c *fakeClock) Now() time.Time { return time.UnixMicro(c.now.Load()).UTC() }
