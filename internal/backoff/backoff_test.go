// SPDX-License-Identifier: Apache-2.0

package backoff

import (
	"testing"
	"time"
)

func TestDelayGrowsWithinBounds(t *testing.T) {
	for attempt := 1; attempt <= 70; attempt++ {
		base := time.Second << min(attempt-1, 20)
		if base > time.Minute {
			base = time.Minute
		}
		for range 50 {
			d := Delay(attempt, time.Second, time.Minute)
			if d < base/2 || d > base {
				t.Fatalf("attempt %d: %v outside [%v, %v]", attempt, d, base/2, base)
			}
		}
	}
}

func TestDelayIsJittered(t *testing.T) {
	seen := map[time.Duration]bool{}
	for range 20 {
		seen[Delay(3, time.Second, time.Minute)] = true
	}
	if len(seen) < 5 {
		t.Fatalf("20 delays took %d values: no jitter", len(seen))
	}
}
