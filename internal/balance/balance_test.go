// SPDX-License-Identifier: Apache-2.0

package balance

import (
	"fmt"
	"testing"
	"time"

	"github.com/shardq/shardq/driver"
)

var now = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func parts(tenant string, n int) []driver.PartitionRef {
	out := make([]driver.PartitionRef, n)
	for i := range out {
		out[i] = driver.PartitionRef{Tenant: tenant, ConsumerGroup: "g", Topic: "x", PartitionKey: fmt.Sprint(i)}
	}
	return out
}

// simulate runs ticks of every subscriber against a shared lease table, as
// the database would arbitrate them: an acquire succeeds only on a free or
// expired lease. It returns the ticks taken until no plan changes anything.
func simulate(t *testing.T, work []driver.PartitionRef, subs []string, leases map[driver.PartitionRef]string, maxTicks int) int {
	t.Helper()
	for tick := 1; tick <= maxTicks; tick++ {
		changed := false
		for _, me := range subs {
			var rows []driver.Lease
			for p, o := range leases {
				rows = append(rows, driver.Lease{PartitionRef: p, Owner: o, ExpiresAt: now.Add(time.Minute)})
			}
			plan := Compute(Input{Me: me, Live: map[string][]string{"t": subs}, Work: work, Leases: rows, Now: now})
			for _, p := range plan.Release {
				delete(leases, p)
				changed = true
			}
			for _, p := range plan.Acquire {
				if leases[p] == "" {
					leases[p] = me
					changed = true
				}
			}
		}
		if !changed {
			return tick
		}
	}
	t.Fatalf("no convergence within %d ticks", maxTicks)
	return 0
}

func counts(leases map[driver.PartitionRef]string) map[string]int {
	c := map[string]int{}
	for _, o := range leases {
		c[o]++
	}
	return c
}

func TestTenThousandPartitionsEightSubscribersConverge(t *testing.T) {
	work := parts("t", 10_000)
	subs := []string{"s0", "s1", "s2", "s3", "s4", "s5", "s6", "s7"}
	leases := map[driver.PartitionRef]string{}
	ticks := simulate(t, work, subs, leases, 10)
	quota := (10_000 + 7) / 8
	if len(leases) != 10_000 {
		t.Fatalf("%d of 10000 partitions leased", len(leases))
	}
	for s, n := range counts(leases) {
		if n > quota || n < quota-1 {
			t.Fatalf("%s holds %d, want within one of %d (ticks %d)", s, n, quota, ticks)
		}
	}
	t.Logf("converged in %d ticks", ticks)
}

func TestJoinHandsBackExcess(t *testing.T) {
	work := parts("t", 64)
	leases := map[driver.PartitionRef]string{}
	simulate(t, work, []string{"a"}, leases, 5)
	if counts(leases)["a"] != 64 {
		t.Fatalf("a alone holds %d of 64", counts(leases)["a"])
	}
	// Three more join: a hands back down to 16, the others take 16 each.
	simulate(t, work, []string{"a", "b", "c", "d"}, leases, 10)
	for s, n := range counts(leases) {
		if n != 16 {
			t.Fatalf("after joins %s holds %d, want 16 (%v)", s, n, counts(leases))
		}
	}
	// b leaves (its leases swept): the rest cover everything.
	for p, o := range leases {
		if o == "b" {
			delete(leases, p)
		}
	}
	simulate(t, work, []string{"a", "c", "d"}, leases, 10)
	if len(leases) != 64 {
		t.Fatalf("after b left %d of 64 leased", len(leases))
	}
	for s, n := range counts(leases) {
		if n < 21 || n > 22 {
			t.Fatalf("after b left %s holds %d, want 21 or 22", s, n)
		}
	}
}

func TestExpiredLeasesAreTakableAndTenantsSeparate(t *testing.T) {
	work := append(parts("t1", 4), parts("t2", 2)...)
	rows := []driver.Lease{
		{PartitionRef: work[0], Owner: "gone", ExpiresAt: now.Add(-time.Second)},
		{PartitionRef: work[1], Owner: "peer", ExpiresAt: now.Add(time.Minute)},
	}
	plan := Compute(Input{Me: "me", Live: map[string][]string{"t1": {"me", "peer"}, "t2": {"me"}}, Work: work, Leases: rows, Now: now})
	if plan.Quota["t1"] != 2 || plan.Quota["t2"] != 2 {
		t.Fatalf("quotas %v, want t1:2 t2:2", plan.Quota)
	}
	got := map[driver.PartitionRef]bool{}
	for _, p := range plan.Acquire {
		got[p] = true
	}
	if got[work[1]] || len(plan.Acquire) != 4 {
		t.Fatalf("acquire %v: want 2 of t1 (never peer's live lease) and both of t2", plan.Acquire)
	}
}

// In a tenant where this member's own heartbeat was late, another
// owner's lease that expired after the mark (Spare) is not takable: that
// owner may have been held up as long. One that expired before the mark,
// or in another tenant, is.
func TestSparedLeasesAreNotTakable(t *testing.T) {
	work := append(parts("t1", 3), parts("t2", 2)...)
	rows := []driver.Lease{
		{PartitionRef: work[0], Owner: "late", ExpiresAt: now.Add(-time.Second)},
		{PartitionRef: work[1], Owner: "dead", ExpiresAt: now.Add(-time.Minute)},
		{PartitionRef: work[3], Owner: "late", ExpiresAt: now.Add(-time.Second)},
	}
	plan := Compute(Input{Me: "me", Live: map[string][]string{"t1": {"me"}, "t2": {"me"}}, Work: work, Leases: rows, Now: now,
		Spare: map[string]time.Time{"t1": now.Add(-10 * time.Second)}})
	got := map[driver.PartitionRef]bool{}
	for _, p := range plan.Acquire {
		got[p] = true
	}
	if got[work[0]] || !got[work[1]] || !got[work[2]] || !got[work[3]] || !got[work[4]] {
		t.Fatalf("acquire %v: want all but t1's lease that expired after the mark", plan.Acquire)
	}
}

// A static member that stopped gracefully keeps its place: its heartbeat
// row stays live and its leases end in its name, with no work left. Its
// partitions still count in the share, so that its peer hands back none
// of its own, idle as they are, before the next process takes over.
func TestStoppedStaticMemberKeepsItsShare(t *testing.T) {
	ps := parts("t", 8)
	var rows []driver.Lease
	for i, p := range ps {
		if i < 4 {
			rows = append(rows, driver.Lease{PartitionRef: p, Owner: "b", ExpiresAt: now.Add(time.Minute)})
		} else {
			rows = append(rows, driver.Lease{PartitionRef: p, Owner: "a@1", ExpiresAt: now})
		}
	}
	plan := Compute(Input{Me: "b", Live: map[string][]string{"t": {"a@1", "b"}}, Leases: rows, Now: now})
	if plan.Quota["t"] != 4 || len(plan.Release) != 0 || len(plan.Acquire) != 0 {
		t.Fatalf("plan %+v: want b to keep its 4 and take none", plan)
	}
	// Once the stopped member's row is stale (not live), its partitions
	// leave the share: b's idle ones are its share alone.
	plan = Compute(Input{Me: "b", Live: map[string][]string{"t": {"b"}}, Leases: rows, Now: now})
	if plan.Quota["t"] != 4 || len(plan.Release) != 0 {
		t.Fatalf("plan %+v with the stopped member gone", plan)
	}
}

// A static member's new incarnation took its earlier one's leases over
// between a peer's reads of the live members and of the leases: the tick
// sees the earlier incarnation live and the leases held, expired by then
// (the takeover's write was slow), by an owner it does not know. They
// are the live instance's, and b keeps its four.
func TestTakenOverLeasesOfALiveInstanceCount(t *testing.T) {
	ps := parts("t", 8)
	var rows []driver.Lease
	for i, p := range ps {
		if i < 4 {
			rows = append(rows, driver.Lease{PartitionRef: p, Owner: "b#00000000", ExpiresAt: now.Add(time.Minute)})
		} else {
			rows = append(rows, driver.Lease{PartitionRef: p, Owner: "a@00000002", ExpiresAt: now.Add(-time.Second)})
		}
	}
	plan := Compute(Input{Me: "b#00000000", Live: map[string][]string{"t": {"a@00000001", "b#00000000"}}, Leases: rows, Now: now})
	if plan.Quota["t"] != 4 || len(plan.Release) != 0 {
		t.Fatalf("plan %+v: want b to keep its 4", plan)
	}
	// Another member's expired leases are not the live instance's.
	for i := 4; i < 8; i++ {
		rows[i].Owner = "c@00000002"
	}
	plan = Compute(Input{Me: "b#00000000", Live: map[string][]string{"t": {"a@00000001", "b#00000000"}}, Leases: rows, Now: now})
	if plan.Quota["t"] != 2 {
		t.Fatalf("plan %+v: want a quota of 2 (c's expired leases are nobody's share)", plan)
	}
}

// go test -bench . -run '^$' ./internal/balance/
// One subscriber's plan at 10,000 and 100,000 partitions with work, 8 live
// members, a tenth of the partitions leased.
func BenchmarkCompute(b *testing.B) {
	now := time.Now()
	for _, parts := range []int{10_000, 100_000} {
		live := map[string][]string{"t": {"s0", "s1", "s2", "s3", "s4", "s5", "s6", "s7"}}
		work := make([]driver.PartitionRef, parts)
		var leases []driver.Lease
		for i := range work {
			work[i] = driver.PartitionRef{Tenant: "t", ConsumerGroup: "g", Topic: "x", PartitionKey: fmt.Sprintf("p%06d", i)}
			if i%10 == 0 {
				leases = append(leases, driver.Lease{PartitionRef: work[i], Owner: fmt.Sprintf("s%d", i%8), ExpiresAt: now.Add(time.Minute)})
			}
		}
		b.Run(fmt.Sprintf("partitions=%d", parts), func(b *testing.B) {
			for b.Loop() {
				if p := Compute(Input{Me: "s0", Live: live, Work: work, Leases: leases, Now: now}); p.Quota["t"] == 0 {
					b.Fatal("empty plan")
				}
			}
		})
	}
}
