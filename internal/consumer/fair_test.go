// SPDX-License-Identifier: Apache-2.0

package consumer

import (
	"fmt"
	"maps"
	"slices"
	"testing"

	"github.com/shardq/shardq/driver"
)

func TestFairCaps(t *testing.T) {
	for _, c := range []struct {
		capacity int
		demand   map[string]int
		want     map[string]int
	}{
		{64, map[string]int{"a": 200}, map[string]int{"a": 64}},
		{64, map[string]int{"a": 200, "b": 1}, map[string]int{"a": 63, "b": 1}},
		{64, map[string]int{"a": 200, "b": 16}, map[string]int{"a": 48, "b": 16}},
		{64, map[string]int{"a": 200, "b": 100}, map[string]int{"a": 32, "b": 32}},
		{10, map[string]int{"a": 9, "b": 9, "c": 9}, map[string]int{"a": 3, "b": 3, "c": 4}},
		{10, map[string]int{"a": 2, "b": 3}, map[string]int{"a": 2, "b": 3}},
		{4, map[string]int{"a": 0, "b": 7}, map[string]int{"a": 0, "b": 4}},
	} {
		got := fairCaps(c.capacity, c.demand, 0)
		if !maps.Equal(got, c.want) {
			t.Errorf("fairCaps(%d, %v) = %v, want %v", c.capacity, c.demand, got, c.want)
		}
		sum := 0
		for _, v := range got {
			sum += v
		}
		if sum > c.capacity {
			t.Errorf("fairCaps(%d, %v) gives %d slots", c.capacity, c.demand, sum)
		}
	}
}

func refs(tenant string, n int) []driver.PartitionRef {
	out := make([]driver.PartitionRef, n)
	for i := range out {
		out[i] = driver.PartitionRef{Tenant: tenant, ConsumerGroup: "g", Topic: "x", PartitionKey: fmt.Sprintf("k%03d", i)}
	}
	return out
}

func heldOf(ps []driver.PartitionRef, idle int) []heldPartition {
	out := make([]heldPartition, len(ps))
	for i, p := range ps {
		out[i] = heldPartition{ref: p, idle: i < idle}
	}
	return out
}

func tenantsOf(ps []driver.PartitionRef) map[string]int {
	n := map[string]int{}
	for _, p := range ps {
		n[p.Tenant]++
	}
	return n
}

// A tenant whose backlog holds every slot gives one back, busy, for
// another tenant's partition: the member's slots are shared, not taken
// first come.
func TestFairPlanHandsBackABusyPartitionForAWaitingTenant(t *testing.T) {
	a := refs("a", 200)
	back, acq := fairPlan(64, map[string][]heldPartition{"a": heldOf(a[:64], 0)},
		map[string][]driver.PartitionRef{"a": a[64:], "b": refs("b", 1)}, 0)
	if len(back) != 1 || back[0].Tenant != "a" {
		t.Fatalf("handed back %v, want one of a's", back)
	}
	if len(acq) != 1 || acq[0].Tenant != "b" {
		t.Fatalf("acquires %v, want b's one", acq)
	}
}

// Idle partitions make room before busy ones, whoever holds them.
func TestFairPlanHandsBackIdleFirst(t *testing.T) {
	a := refs("a", 10)
	back, acq := fairPlan(4, map[string][]heldPartition{"a": heldOf(a[:4], 1)},
		map[string][]driver.PartitionRef{"a": a[4:], "b": refs("b", 1)}, 0)
	if len(back) != 1 || back[0] != a[0] {
		t.Fatalf("handed back %v, want the idle %v", back, a[0])
	}
	if len(acq) != 1 || acq[0].Tenant != "b" {
		t.Fatalf("acquires %v, want b's one", acq)
	}
}

// Within its cap a tenant keeps its partitions, idle ones included: the
// other tenant's backlog does not take them.
func TestFairPlanKeepsWhatIsWithinTheCap(t *testing.T) {
	a, b := refs("a", 200), refs("b", 16)
	back, acq := fairPlan(64, map[string][]heldPartition{"a": heldOf(a[:48], 0), "b": heldOf(b, 16)},
		map[string][]driver.PartitionRef{"a": a[48:]}, 0)
	if len(back) != 0 || len(acq) != 0 {
		t.Fatalf("handed back %v and acquires %v; both at their caps, want nothing", back, acq)
	}
}

// With free slots, acquisitions take turns, the tenant holding fewest
// first, and stop at the caps.
func TestFairPlanAcquiresInTurns(t *testing.T) {
	back, acq := fairPlan(6, map[string][]heldPartition{"a": heldOf(refs("a", 1), 0)},
		map[string][]driver.PartitionRef{"a": refs("a", 10)[1:], "b": refs("b", 10), "c": refs("c", 1)}, 0)
	if len(back) != 0 {
		t.Fatalf("handed back %v with free slots", back)
	}
	// Caps: c 1, then a and b 2 and 3 (the remainder to one of them).
	if got := tenantsOf(acq); got["c"] != 1 || got["a"]+got["b"] != 4 || got["a"] < 1 || got["b"] < 2 {
		t.Fatalf("acquires %v (%v), want c 1 and a 1 or 2, b the rest of 4", got, acq)
	}
	if first := []string{acq[0].Tenant, acq[1].Tenant}; !slices.Contains(first, "b") || !slices.Contains(first, "c") {
		t.Fatalf("first turns went to %v; b and c hold nothing and go first", first)
	}
}

// Many waiting tenants against one that holds everything: each gets its
// equal share, and the holder hands back exactly what they take.
func TestFairPlanSharesAmongMany(t *testing.T) {
	want := map[string][]driver.PartitionRef{"a": refs("a", 100)[8:]}
	for _, tn := range []string{"b", "c", "d"} {
		want[tn] = refs(tn, 5)
	}
	back, acq := fairPlan(8, map[string][]heldPartition{"a": heldOf(refs("a", 8), 0)}, want, 0)
	if got := tenantsOf(acq); !maps.Equal(got, map[string]int{"b": 2, "c": 2, "d": 2}) {
		t.Fatalf("acquires %v, want 2 each of b, c, d", got)
	}
	if len(back) != 6 {
		t.Fatalf("handed back %d, want 6 (a keeps its cap of 2)", len(back))
	}
}

// A tenant alone, at capacity with drained partitions, swaps them for its
// partitions with work.
func TestFairPlanSwapsIdleForWork(t *testing.T) {
	a := refs("a", 8)
	back, acq := fairPlan(2, map[string][]heldPartition{"a": heldOf(a[:2], 2)}, map[string][]driver.PartitionRef{"a": a[2:]}, 0)
	if len(back) != 2 || len(acq) != 2 {
		t.Fatalf("handed back %v and acquires %v; want both idle ones swapped for two with work", back, acq)
	}
}

// With more tenants wanting slots than there are, the ones left out
// change from turn to turn.
func TestFairCapsRotatesTheLeftOut(t *testing.T) {
	demand := map[string]int{"a": 5, "b": 5, "c": 5, "d": 5}
	got := map[string]bool{}
	for turn := range uint64(50) {
		caps := fairCaps(3, demand, turn)
		sum := 0
		for tn, c := range caps {
			sum += c
			if c > 0 {
				got[tn] = true
			}
		}
		if sum != 3 {
			t.Fatalf("turn %d: caps %v give %d slots, want 3", turn, caps, sum)
		}
	}
	if len(got) != 4 {
		t.Fatalf("over 50 turns only %v had a slot", got)
	}
}

// Room is made from the tenant over its cap, not from a quiet tenant's
// idle partition within its own.
func TestFairPlanKeepsAQuietTenantsIdlePartition(t *testing.T) {
	b, z := refs("b", 1), refs("z", 3)
	back, acq := fairPlan(4, map[string][]heldPartition{"b": heldOf(b, 1), "z": heldOf(z, 0)},
		map[string][]driver.PartitionRef{"c": refs("c", 1)}, 0)
	if len(back) != 1 || back[0].Tenant != "z" || len(acq) != 1 || acq[0].Tenant != "c" {
		t.Fatalf("handed back %v, acquires %v; want one of z's for c's", back, acq)
	}
	// A tenant acquiring swaps its own idle partition, not another's.
	z = refs("z", 10)
	back, acq = fairPlan(4, map[string][]heldPartition{"b": heldOf(b, 1), "z": heldOf(z[:3], 1)},
		map[string][]driver.PartitionRef{"z": z[3:]}, 0)
	if len(back) != 1 || back[0] != z[0] || len(acq) != 1 || acq[0].Tenant != "z" {
		t.Fatalf("handed back %v, acquires %v; want z's idle %v swapped for one of z's with work", back, acq, z[0])
	}
}
