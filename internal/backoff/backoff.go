// SPDX-License-Identifier: Apache-2.0

// Package backoff computes retry delays: exponential in the attempt number,
// between a minimum and a maximum, with jitter so that messages failing
// together do not retry together; and poll intervals that shorten while
// polls find work and lengthen while they do not.
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

// Poll is the interval of a poll without a change feed: its floor after
// a poll that found something and for pollHold polls that found nothing
// after it, then doubled after each poll that found nothing, up to its
// ceiling (where it starts). So a poller whose data moves reads again
// within the floor, through the short gaps of a steady stream, and one
// whose data is still costs what a fixed poll at the ceiling does, after
// a few shorter polls once it went still. Not safe for concurrent use.
type Poll struct {
	floor, ceiling, cur time.Duration
	misses              int // polls that found nothing since one that did
}

// pollHold is how many polls that find nothing stay at the floor: at
// 10 ms, a stream of 100 messages a second seldom leaves 50 ms empty.
const pollHold = 4

// NewPoll is a Poll between PollFloor(ceiling) and ceiling.
func NewPoll(ceiling time.Duration) *Poll {
	return &Poll{floor: PollFloor(ceiling), ceiling: ceiling, cur: ceiling, misses: pollHold}
}

// PollFloor is the shortest interval of a Poll with this ceiling: a
// twentieth of it (10 ms at 200 ms), but not under 5 ms unless the
// ceiling is, since below that the polls of a few members cost more than
// the latency they save on a small server.
func PollFloor(ceiling time.Duration) time.Duration {
	return max(ceiling/20, min(ceiling, 5*time.Millisecond))
}

// Wait is the current interval, for a round that polled nothing.
func (p *Poll) Wait() time.Duration { return p.cur }

// Next is the wait before the next poll, given whether the last one found
// something.
func (p *Poll) Next(found bool) time.Duration {
	switch {
	case found:
		p.cur, p.misses = p.floor, 0
	case p.misses < pollHold:
		p.misses++
	case p.cur > p.ceiling/2: // doubling would pass it, or overflow
		p.cur = p.ceiling
	default:
		p.cur *= 2
	}
	return p.cur
}
