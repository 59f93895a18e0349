// SPDX-License-Identifier: Apache-2.0

package backoff

import (
	"math"
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

func TestPollSpeedsUpWhileFindingAndBacksOff(t *testing.T) {
	p := NewPoll(200 * time.Millisecond)
	want := func(found bool, d time.Duration) {
		t.Helper()
		if got := p.Next(found); got != d {
			t.Fatalf("Next(%v) = %v, want %v", found, got, d)
		}
	}
	want(false, 200*time.Millisecond) // starts at the ceiling
	want(true, 10*time.Millisecond)
	want(true, 10*time.Millisecond)
	for range 4 { // held at the floor through short gaps
		want(false, 10*time.Millisecond)
	}
	want(false, 20*time.Millisecond)
	want(false, 40*time.Millisecond)
	want(false, 80*time.Millisecond)
	want(false, 160*time.Millisecond)
	want(false, 200*time.Millisecond)
	want(false, 200*time.Millisecond)
	want(true, 10*time.Millisecond)
	want(false, 10*time.Millisecond)
	want(true, 10*time.Millisecond) // a find restarts the hold
	for range 4 {
		want(false, 10*time.Millisecond)
	}
	want(false, 20*time.Millisecond)
}

func TestPollNeverOverflows(t *testing.T) {
	p := NewPoll(math.MaxInt64)
	p.Next(true)
	for range 100 {
		if d := p.Next(false); d <= 0 {
			t.Fatalf("Next = %v", d)
		}
	}
	if d := p.Next(false); d != math.MaxInt64 {
		t.Fatalf("Next = %v, want the ceiling", d)
	}
}

func TestPollFloor(t *testing.T) {
	for _, c := range []struct{ ceiling, floor time.Duration }{
		{200 * time.Millisecond, 10 * time.Millisecond},
		{2 * time.Second, 100 * time.Millisecond},
		{50 * time.Millisecond, 5 * time.Millisecond},
		{3 * time.Millisecond, 3 * time.Millisecond},
	} {
		if got := PollFloor(c.ceiling); got != c.floor {
			t.Errorf("PollFloor(%v) = %v, want %v", c.ceiling, got, c.floor)
		}
	}
}
