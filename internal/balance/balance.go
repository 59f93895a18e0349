// Package balance plans one subscriber's share of a consumer group's
// partitions. Every subscriber runs the same plan on the same inputs (live
// subscribers, partitions with work, current leases) and converges on a fair
// share without a coordinator: per tenant, with N live subscribers and P
// active partitions (with work, or held), each aims at floor(P/N) or
// ceil(P/N) partitions (the first P mod N subscribers by name take the
// ceiling, so the quotas add up to P). It takes free or expired partitions
// up to its quota and hands back what it holds beyond it.
//
// Candidates are tried in rendezvous-hash order of (subscriber, partition),
// so peers reach for different partitions first and rarely collide.
package balance

import (
	"cmp"
	"hash/fnv"
	"slices"
	"time"

	"github.com/shardq/shardq/driver"
)

// Input is what one subscriber knows at one tick.
type Input struct {
	Me string
	// Live lists the live subscribers (fresh heartbeat) of each tenant,
	// Me included where it has heartbeated.
	Live map[string][]string
	// Work lists the partitions with work for the group.
	Work []driver.PartitionRef
	// Leases are the group's lease rows (free ones included).
	Leases []driver.Lease
	Now    time.Time
}

// Plan is what to do this tick.
type Plan struct {
	Acquire []driver.PartitionRef // try in this order, stop at the quota
	Release []driver.PartitionRef // held beyond the quota
	Quota   map[string]int        // per tenant
}

// Compute plans one tick for in.Me.
func Compute(in Input) Plan {
	type tenantState struct {
		active  map[driver.PartitionRef]bool
		mine    []driver.PartitionRef
		takable []driver.PartitionRef
	}
	tenants := map[string]*tenantState{}
	state := func(t string) *tenantState {
		s := tenants[t]
		if s == nil {
			s = &tenantState{active: map[driver.PartitionRef]bool{}}
			tenants[t] = s
		}
		return s
	}
	held := map[driver.PartitionRef]driver.Lease{}
	for _, l := range in.Leases {
		if l.Owner == "" {
			continue
		}
		held[l.PartitionRef] = l
		s := state(l.Tenant)
		if l.Owner == in.Me {
			s.mine = append(s.mine, l.PartitionRef)
			s.active[l.PartitionRef] = true
		} else if l.ExpiresAt.After(in.Now) {
			s.active[l.PartitionRef] = true
		}
	}
	for _, p := range in.Work {
		s := state(p.Tenant)
		s.active[p] = true
		l, ok := held[p]
		if !ok || (l.Owner != in.Me && !l.ExpiresAt.After(in.Now)) {
			s.takable = append(s.takable, p)
		}
	}
	plan := Plan{Quota: map[string]int{}}
	names := make([]string, 0, len(tenants))
	for t := range tenants {
		names = append(names, t)
	}
	slices.Sort(names)
	for _, t := range names {
		s := tenants[t]
		live := slices.Clone(in.Live[t])
		if !slices.Contains(live, in.Me) {
			live = append(live, in.Me) // count ourselves before our first heartbeat lands
		}
		slices.Sort(live)
		// An exact split: the first P mod N subscribers by name take one
		// more, so the quotas add up to P and nobody ends two short.
		n, active := len(live), len(s.active)
		quota := active / n
		if slices.Index(live, in.Me) < active%n {
			quota++
		}
		plan.Quota[t] = quota
		byScore(in.Me, s.mine)
		if len(s.mine) > quota {
			// Hand back the ones we like least; keep the rest.
			plan.Release = append(plan.Release, s.mine[quota:]...)
			continue
		}
		byScore(in.Me, s.takable)
		want := min(quota-len(s.mine), len(s.takable))
		plan.Acquire = append(plan.Acquire, s.takable[:want]...)
	}
	return plan
}

// byScore orders partitions by rendezvous score for me, highest first.
func byScore(me string, ps []driver.PartitionRef) {
	slices.SortFunc(ps, func(a, b driver.PartitionRef) int {
		return cmp.Or(cmp.Compare(score(me, b), score(me, a)), cmp.Compare(a.PartitionKey, b.PartitionKey))
	})
}

func score(me string, p driver.PartitionRef) uint64 {
	h := fnv.New64a()
	h.Write([]byte(me))
	h.Write([]byte{0})
	h.Write([]byte(p.Tenant))
	h.Write([]byte{0})
	h.Write([]byte(p.PartitionKey))
	return h.Sum64()
}
