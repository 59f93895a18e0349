// SPDX-License-Identifier: Apache-2.0

package chaos

import (
	"testing"

	"github.com/shardq/shardq/cmd/shardq/internal/chaoscheck"
)

// Each tenant's latency is its own messages' alone: a fault on one
// Vitess shard shows in the tenants there.
func TestTimelineLatencyByTenant(t *testing.T) {
	const ms = int64(1e6)
	var evs []chaoscheck.Event
	add := func(tenant, id string, acked, delivered int64) {
		evs = append(evs,
			chaoscheck.Event{Op: chaoscheck.OpPublish, Tenant: tenant, Topic: TopicOrdered, ID: id, End: acked},
			chaoscheck.Event{Op: chaoscheck.OpHandle, Group: GroupSub, Tenant: tenant, Topic: TopicOrdered, ID: id,
				Start: delivered, End: delivered + ms, Result: chaoscheck.ResultOK})
	}
	for i := range int64(10) {
		add("fast", "f"+string(rune('0'+i)), i*100*ms, i*100*ms+2*ms)
		add("slow", "s"+string(rune('0'+i)), i*100*ms, i*100*ms+(50+i)*ms)
	}
	tl := BuildTimeline(evs)
	if got := tl.ByTenant["fast"]; got != (Latency{P50: 2, P99: 2, Max: 2}) {
		t.Errorf("fast: %+v, want 2 ms throughout", got)
	}
	if got := tl.ByTenant["slow"]; got != (Latency{P50: 55, P99: 59, Max: 59}) {
		t.Errorf("slow: %+v, want p50 55, p99 59, max 59", got)
	}
	if tl.AllMax != 59 {
		t.Errorf("whole run's max %v, want 59", tl.AllMax)
	}
}
