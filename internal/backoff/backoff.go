// SPDX-License-Identifier: Apache-2.0

// Package backoff computes retry delays: exponential in the attempt number,
// between a minimum and a maximum, with jitter so that messages failing
// together do not retry together.
package backoff

import (
	"math/rand/v2"
	"time"
)

// Delay returns the wait before the next attempt after `attempt` failed
// attempts (attempt >= 1): min·2^(attempt-1), capped at max, then scaled
// by a random factor in [0.5, 1.0].
func Delay(attempt int, min, max time.Duration) time.Duration {
	d := min
	for i := 1; i < attempt && d < max; i++ {
		d *= 2
	}
	if d > max || d <= 0 {
		d = max
	}
	return time.Duration(float64(d) * (0.5 + rand.Float64()/2))
}
