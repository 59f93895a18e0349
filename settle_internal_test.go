// SPDX-License-Identifier: Apache-2.0

package shardq

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/shardq/shardq/driver"
)

// The one settle policy, as partition workers, ungrouped claims and
// receivers apply it.
func TestRetryPolicyDecide(t *testing.T) {
	p := retryPolicy{MaxAttempts: 3, BackoffMin: time.Second, BackoffMax: time.Minute}
	boom := errors.New("boom")
	for _, tc := range []struct {
		name    string
		err     error
		attempt int
		want    verdict
	}{
		{"nil acks", nil, 1, verdict{ack: true}},
		{"dead-letter at once, with the handler's reason", DeadLetter(boom), 1, verdict{deadLetter: true, cause: boom}},
		{"the last attempt dead-letters", boom, 3, verdict{deadLetter: true, cause: boom}},
		{"RetryAfter chooses the delay", RetryAfter(7*time.Second, boom), 1, verdict{delay: 7 * time.Second}},
		{"RetryAfter on the last attempt still dead-letters", RetryAfter(7*time.Second, boom), 3, verdict{deadLetter: true, cause: RetryAfter(7*time.Second, boom)}},
	} {
		got := p.decide(tc.err, tc.attempt)
		if got.ack != tc.want.ack || got.deadLetter != tc.want.deadLetter || got.delay != tc.want.delay ||
			(tc.want.cause != nil && (got.cause == nil || got.cause.Error() != tc.want.cause.Error())) {
			t.Errorf("%s: decide(%v, %d) = %+v, want %+v", tc.name, tc.err, tc.attempt, got, tc.want)
		}
	}
	// Any other error backs off, within [BackoffMin/2, BackoffMax].
	for attempt := 1; attempt < 3; attempt++ {
		v := p.decide(boom, attempt)
		if v.ack || v.deadLetter || v.delay <= 0 || v.delay > p.BackoffMax {
			t.Errorf("attempt %d: %+v", attempt, v)
		}
	}
}

func TestUnlimitedAttemptsNeverDeadLetterByCount(t *testing.T) {
	p := retryPolicy{MaxAttempts: UnlimitedAttempts, BackoffMin: time.Millisecond, BackoffMax: time.Second}
	if v := p.decide(errors.New("boom"), 1_000_000); v.deadLetter || v.ack || v.delay <= 0 {
		t.Fatalf("attempt 1e6 with UnlimitedAttempts: %+v", v)
	}
	if v := p.decide(DeadLetter(errors.New("bad")), 1); !v.deadLetter {
		t.Fatalf("DeadLetter with UnlimitedAttempts: %+v", v)
	}
	if _, err := maxAttempts(-2); err == nil || !strings.Contains(err.Error(), "MaxAttempts") {
		t.Fatalf("MaxAttempts -2: %v", err)
	}
}

// Timing settings that cannot work together are refused with the field
// and the rule, before anything runs.
func TestLivenessRules(t *testing.T) {
	for _, tc := range []struct {
		ttl, hb, stale time.Duration
		field          string
	}{
		{time.Second, time.Second, 3 * time.Second, "LeaseTTL"},
		{30 * time.Second, 3 * time.Second, 5 * time.Second, "StaleAfter"},
	} {
		err := checkLiveness(tc.ttl, tc.hb, tc.stale)
		if !errors.Is(err, ErrInvalid) || !strings.HasPrefix(err.Error(), tc.field+":") {
			t.Errorf("ttl %s heartbeat %s stale %s: %v; want %s named", tc.ttl, tc.hb, tc.stale, err, tc.field)
		}
	}
	if err := checkLiveness(DefaultLeaseTTL, DefaultHeartbeatInterval, 3*DefaultHeartbeatInterval); err != nil {
		t.Fatalf("the defaults: %v", err)
	}
}

func TestLagCountLimit(t *testing.T) {
	if LagCountLimit != driver.LagCountLimit {
		t.Fatalf("LagCountLimit %d, the driver counts up to %d", LagCountLimit, driver.LagCountLimit)
	}
}
