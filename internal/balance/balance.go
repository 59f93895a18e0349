// SPDX-License-Identifier: Apache-2.0

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
	"github.com/shardq/shardq/internal/ident"
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
	// Spare holds, for the tenants where Me's own heartbeat was late, the
	// time after which another owner's expired lease still counts as
	// held: its owner may have been held up as long as Me.
	Spare map[string]time.Time
}

// Plan is what to do this tick.
type Plan struct {
	Acquire []driver.PartitionRef // try in this order, stop at the quota
	Release []driver.PartitionRef // held beyond the quota
	Quota   map[string]int        // per tenant
}

// Compute plans one tick for in.Me. It is linear in partitions and leases
// (plus sorting the candidates), and allocates no per-partition map: at
// 100,000 partitions it runs every tick.
func Compute(in Input) Plan {
	type tenantState struct {
		active  int // partitions with work, or held (by us, or unexpired)
		mine    []driver.PartitionRef
		takable []driver.PartitionRef
	}
	tenants := map[string]*tenantState{}
	state := func(t string) *tenantState {
		s := tenants[t]
		if s == nil {
			s = &tenantState{}
			tenants[t] = s
		}
		return s
	}
	type held struct {
		lease  driver.Lease
		inWork bool
	}
	leases := make(map[driver.PartitionRef]*held, len(in.Leases))
	for _, l := range in.Leases {
		if l.Owner != "" {
			leases[l.PartitionRef] = &held{lease: l}
		}
	}
	for _, p := range in.Work {
		s := state(p.Tenant)
		s.active++
		h := leases[p]
		if h != nil {
			h.inWork = true
		}
		if h == nil || (h.lease.Owner != in.Me && !h.lease.ExpiresAt.After(in.Now) && !spared(in.Spare, h.lease)) {
			if s.takable == nil {
				s.takable = make([]driver.PartitionRef, 0, len(in.Work))
			}
			s.takable = append(s.takable, p)
		}
	}
	for _, l := range in.Leases {
		h := leases[l.PartitionRef]
		if h == nil {
			continue
		}
		s := state(l.Tenant)
		mine := l.Owner == in.Me
		if mine {
			s.mine = append(s.mine, l.PartitionRef)
		}
		// Held without work: still part of the share until idle release;
		// so is an expired lease of a live member (a static member that
		// stopped keeps its place for its next process), or of another
		// incarnation of a live static member (one that took over the
		// leases after this tick read the live members): the peers'
		// quotas stay, and none of their partitions moves meanwhile.
		if !h.inWork && (mine || l.ExpiresAt.After(in.Now) || slices.ContainsFunc(in.Live[l.Tenant], func(m string) bool {
			return m == l.Owner || ident.SameInstance(m, l.Owner)
		})) {
			s.active++
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
		n := len(live)
		quota := s.active / n
		if slices.Index(live, in.Me) < s.active%n {
			quota++
		}
		plan.Quota[t] = quota
		byScore(in.Me, s.mine)
		if len(s.mine) > quota {
			// Hand back the ones we like least; keep the rest.
			plan.Release = append(plan.Release, s.mine[quota:]...)
			continue
		}
		want := min(quota-len(s.mine), len(s.takable))
		if want == 0 {
			continue
		}
		byScore(in.Me, s.takable)
		plan.Acquire = append(plan.Acquire, s.takable[:want]...)
	}
	return plan
}

// spared reports whether l's expiry falls after its tenant's mark in spare.
func spared(spare map[string]time.Time, l driver.Lease) bool {
	mark, ok := spare[l.Tenant]
	return ok && l.ExpiresAt.After(mark)
}

// byScore orders partitions by rendezvous score for me, highest first.
// Scores are computed once each, not once per comparison.
func byScore(me string, ps []driver.PartitionRef) {
	type scored struct {
		p driver.PartitionRef
		s uint64
	}
	xs := make([]scored, len(ps))
	for i, p := range ps {
		xs[i] = scored{p, score(me, p)}
	}
	slices.SortFunc(xs, func(a, b scored) int {
		return cmp.Or(cmp.Compare(b.s, a.s), cmp.Compare(a.p.PartitionKey, b.p.PartitionKey))
	})
	for i := range xs {
		ps[i] = xs[i].p
	}
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
