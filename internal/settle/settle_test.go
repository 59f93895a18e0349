// SPDX-License-Identifier: Apache-2.0

package settle

import (
	"errors"
	"testing"
	"time"
)

// The one settle policy, as partition workers, ungrouped claims and
// receivers apply it.
func TestDecide(t *testing.T) {
	p := Policy{MaxAttempts: 3, BackoffMin: time.Second, BackoffMax: time.Minute}
	boom := errors.New("boom")
	for _, tc := range []struct {
		name    string
		err     error
		attempt int
		want    Verdict
	}{
		{"nil acks", nil, 1, Verdict{Ack: true}},
		{"dead-letter at once, with the handler's reason", &DeadLetterError{boom}, 1, Verdict{DeadLetter: true, Cause: boom}},
		{"the last attempt dead-letters", boom, 3, Verdict{DeadLetter: true, Cause: boom}},
		{"RetryAfter chooses the delay", &RetryAfterError{7 * time.Second, boom}, 1, Verdict{Delay: 7 * time.Second}},
		{"RetryAfter on the last attempt still dead-letters", &RetryAfterError{7 * time.Second, boom}, 3, Verdict{DeadLetter: true}},
	} {
		got := p.Decide(tc.err, tc.attempt)
		if got.Ack != tc.want.Ack || got.DeadLetter != tc.want.DeadLetter || got.Delay != tc.want.Delay ||
			(tc.want.Cause != nil && !errors.Is(got.Cause, tc.want.Cause)) {
			t.Errorf("%s: Decide(%v, %d) = %+v, want %+v", tc.name, tc.err, tc.attempt, got, tc.want)
		}
	}
	for attempt := 1; attempt < 3; attempt++ {
		v := p.Decide(boom, attempt)
		if v.Ack || v.DeadLetter || v.Delay <= 0 || v.Delay > p.BackoffMax {
			t.Errorf("attempt %d: %+v", attempt, v)
		}
	}
	u := Policy{MaxAttempts: Unlimited, BackoffMin: time.Millisecond, BackoffMax: time.Second}
	if v := u.Decide(boom, 1_000_000); v.DeadLetter || v.Ack || v.Delay <= 0 {
		t.Fatalf("attempt 1e6 with Unlimited: %+v", v)
	}
	if v := u.Decide(&DeadLetterError{boom}, 1); !v.DeadLetter {
		t.Fatalf("DeadLetter with Unlimited: %+v", v)
	}
}
