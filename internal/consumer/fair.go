// SPDX-License-Identifier: Apache-2.0

package consumer

import (
	"cmp"
	"slices"

	"github.com/shardq/shardq/driver"
)

// A member's MaxPartitions slots are shared among its tenants by max-min
// fairness (fairCaps): a tenant that wants fewer partitions than an equal
// share keeps what it wants, and the rest is split among the others. A
// tenant whose backlog fills every slot therefore cannot keep another
// tenant's partitions waiting: when a tenant wants a slot within its cap
// and none is free, the member hands back, gracefully and only for a lease
// it acquired, idle partitions of tenants over their caps or of the
// tenant acquiring, then busy partitions of tenants over their caps (each
// finishes the message in hand), and other tenants' idle ones last;
// acquisitions take turns across tenants, the fewest busy first.
// docs/consumers.md states the rule.

// heldPartition is a partition this member delivers.
type heldPartition struct {
	ref  driver.PartitionRef
	idle bool // drained: waiting for a message after its cursor
}

// fairCaps splits capacity among tenants by max-min fairness over their
// demands: in order of demand, each takes the smaller of its demand and
// an equal share of what is left. The caps add up to at most capacity.
// Equal demands are ordered by name rotated by turn, so that when there
// are more tenants than slots, the ones left without a slot change from
// turn to turn instead of being the same ones by name.
func fairCaps(capacity int, demand map[string]int, turn uint64) map[string]int {
	ts := make([]string, 0, len(demand))
	for t := range demand {
		ts = append(ts, t)
	}
	slices.Sort(ts)
	order := make(map[string]int, len(ts))
	for i, t := range ts {
		order[t] = (i + len(ts) - int(turn%uint64(len(ts)))) % len(ts)
	}
	slices.SortStableFunc(ts, func(a, b string) int {
		return cmp.Or(cmp.Compare(demand[a], demand[b]), cmp.Compare(order[a], order[b]))
	})
	caps := make(map[string]int, len(ts))
	left := capacity
	for i, t := range ts {
		// An equal share of what is left: a remainder goes to the later,
		// larger demands.
		caps[t] = min(demand[t], left/(len(ts)-i))
		left -= caps[t]
	}
	return caps
}

// fairPlan decides, for a member with capacity slots, which of the held
// partitions to hand back and which of want (the partitions the balance
// plan offers, by tenant) to acquire, in order. Idle partitions are handed
// back first, of any tenant (they hold a slot for nothing), then busy
// ones of the tenants furthest over their caps; only as many as the
// acquisitions within the caps need.
func fairPlan(capacity int, held map[string][]heldPartition, want map[string][]driver.PartitionRef, turn uint64) (handBack, acquire []driver.PartitionRef) {
	demand := map[string]int{}
	total := 0
	for t, hs := range held {
		demand[t] += len(hs)
		total += len(hs)
	}
	for t, ws := range want {
		demand[t] += len(ws)
	}
	caps := fairCaps(capacity, demand, turn)
	// A tenant's idle partitions count in its demand (kept while within
	// its cap, so that its next message finds its worker) but may give
	// way to its own partitions with work: it acquires up to its cap
	// less its busy ones.
	count := map[string]int{}
	for t, hs := range held {
		for _, h := range hs {
			if !h.idle {
				count[t]++
			}
		}
	}
	// The acquisitions within the caps, a turn per tenant, the tenant
	// with the fewest busy first.
	queues := map[string][]driver.PartitionRef{}
	var tenants []string
	for t, ws := range want {
		if n := min(len(ws), caps[t]-count[t]); n > 0 {
			queues[t] = ws[:n]
			tenants = append(tenants, t)
		}
	}
	for len(tenants) > 0 {
		slices.SortFunc(tenants, func(a, b string) int { return cmp.Or(cmp.Compare(count[a], count[b]), cmp.Compare(a, b)) })
		t := tenants[0]
		acquire = append(acquire, queues[t][0])
		queues[t] = queues[t][1:]
		count[t]++
		if len(queues[t]) == 0 {
			tenants = tenants[1:]
		}
	}
	need := total + len(acquire) - capacity
	if need <= 0 {
		return nil, acquire
	}
	// Room for them, in this order: idle partitions of the tenants over
	// their caps and of the tenants acquiring (which swap their own idle
	// ones for work); busy partitions of the tenants over their caps (the
	// furthest over first); and last, should that not do, idle ones of
	// the others, which keep them while within their caps.
	acquiring := map[string]bool{}
	for _, p := range acquire {
		acquiring[p.Tenant] = true
	}
	over := make([]string, 0, len(held))
	for t := range held {
		over = append(over, t)
	}
	slices.SortFunc(over, func(a, b string) int {
		return cmp.Or(cmp.Compare(len(held[b])-caps[b], len(held[a])-caps[a]), cmp.Compare(a, b))
	})
	taken := map[driver.PartitionRef]bool{}
	excess := map[string]int{}
	for _, t := range over {
		excess[t] = len(held[t]) - caps[t]
	}
	give := func(t string, h heldPartition) {
		handBack = append(handBack, h.ref)
		taken[h.ref] = true
		excess[t]--
		need--
	}
	for _, t := range over {
		for _, h := range held[t] {
			if need > 0 && h.idle && (excess[t] > 0 || acquiring[t]) {
				give(t, h)
			}
		}
	}
	for _, t := range over {
		for _, h := range held[t] {
			if need > 0 && !h.idle && excess[t] > 0 {
				give(t, h)
			}
		}
	}
	for _, t := range over {
		for _, h := range held[t] {
			if need > 0 && h.idle && !taken[h.ref] {
				give(t, h)
			}
		}
	}
	// Whatever is still short waits for a slot: drop the acquisitions
	// that have none, the last in turn first.
	if need > 0 {
		acquire = acquire[:len(acquire)-need]
	}
	return handBack, acquire
}
