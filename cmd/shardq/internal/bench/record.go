// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"slices"
	"sync"
	"time"
)

// event is one delivery of a bench message: its partition, its sequence in
// the partition, when it was delivered and when it was meant to be
// published.
type event struct {
	tenant, key string
	seq         uint64
	at          time.Time
	published   time.Time
}

// recorder counts deliveries as they arrive and checks them at the end.
//
// A partition's delivery of sequence s is in order when every s' < s of
// the partition was delivered before it (at least once): a replay after a
// lease moved starts at or below the committed cursor and is only
// duplicates; a skip is out of order.
type recorder struct {
	want int64
	// unordered: deliveries have no order to check (ungrouped messages).
	unordered bool

	mu         sync.Mutex
	seen       map[[2]string][]bool
	distinct   int64
	events     []event
	done       chan struct{}
	progressed chan struct{}
}

func newRecorder(want, partitions int) *recorder {
	return &recorder{want: int64(want), seen: make(map[[2]string][]bool, partitions),
		done: make(chan struct{}), progressed: make(chan struct{}, 1)}
}

func (r *recorder) record(ev event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, ev)
	p := [2]string{ev.tenant, ev.key}
	s := r.seen[p]
	if uint64(len(s)) <= ev.seq {
		s = append(s, make([]bool, int(ev.seq)+1-len(s))...)
		r.seen[p] = s
	}
	if s[ev.seq] {
		return
	}
	s[ev.seq] = true
	r.distinct++
	if r.distinct == r.want {
		close(r.done)
	}
	select {
	case r.progressed <- struct{}{}:
	default:
	}
}

func (r *recorder) count() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.distinct
}

// rep checks the deliveries in time order and reports them.
func (r *recorder) rep(elapsed time.Duration) rep {
	r.mu.Lock()
	defer r.mu.Unlock()
	evs := slices.Clone(r.events)
	slices.SortStableFunc(evs, func(a, b event) int { return a.at.Compare(b.at) })
	prefix := map[[2]string]uint64{} // every seq below it delivered
	seen := map[[2]string]map[uint64]bool{}
	var ooo int64
	var lat []time.Duration
	for _, ev := range evs {
		p := [2]string{ev.tenant, ev.key}
		if seen[p] == nil {
			seen[p] = map[uint64]bool{}
		}
		if !r.unordered && ev.seq > prefix[p] && !seen[p][ev.seq] {
			ooo++
		}
		if !seen[p][ev.seq] && !ev.published.IsZero() {
			lat = append(lat, ev.at.Sub(ev.published))
		}
		seen[p][ev.seq] = true
		for seen[p][prefix[p]] {
			prefix[p]++
		}
	}
	return rep{msgs: r.want, elapsed: elapsed, latencies: lat, lost: r.want - r.distinct,
		dups: int64(len(r.events)) - r.distinct, outOfOrder: ooo}
}
