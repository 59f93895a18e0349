// SPDX-License-Identifier: Apache-2.0

package shardq

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/consumer"
)

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

func TestMaxAttemptsSetting(t *testing.T) {
	if _, err := maxAttempts(-2); err == nil || !strings.Contains(err.Error(), "MaxAttempts") {
		t.Fatalf("MaxAttempts -2: %v", err)
	}
	if n, err := maxAttempts(UnlimitedAttempts); err != nil || n != UnlimitedAttempts {
		t.Fatalf("UnlimitedAttempts: %d, %v", n, err)
	}
}

func TestLagCountLimit(t *testing.T) {
	if LagCountLimit != driver.LagCountLimit {
		t.Fatalf("LagCountLimit %d, the driver counts up to %d", LagCountLimit, driver.LagCountLimit)
	}
}

// The public Take values are the runtime's.
func TestTakeValues(t *testing.T) {
	if consumer.Take(TakeAll) != consumer.TakeAll || consumer.Take(TakeGrouped) != consumer.TakeGrouped || consumer.Take(TakeUngrouped) != consumer.TakeUngrouped {
		t.Fatal("shardq.Take and consumer.Take disagree")
	}
}
