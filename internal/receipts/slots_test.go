// SPDX-License-Identifier: Apache-2.0

package receipts

import "testing"

// TestNextSlotsSpreadReceives: concurrent next-group receives of one
// consumer group take distinct slots, the lowest free first, and a slot
// freed is taken again; other consumer groups count apart, and nothing is
// left once all are done.
func TestNextSlotsSpreadReceives(t *testing.T) {
	r := &Receipts{nextSlots: map[[3]string][]bool{}}
	g := Request{Tenant: "t", Topic: "x", Group: "g"}
	s0, done0 := r.nextSlot(g)
	s1, done1 := r.nextSlot(g)
	s2, done2 := r.nextSlot(g)
	other, doneOther := r.nextSlot(Request{Tenant: "t", Topic: "x", Group: "h"})
	if s0 != 0 || s1 != 1 || s2 != 2 || other != 0 {
		t.Fatalf("slots %d, %d, %d and %d in another group; want 0, 1, 2 and 0", s0, s1, s2, other)
	}
	done1()
	if s, done := r.nextSlot(g); s != 1 {
		t.Fatalf("after slot 1 was freed the next receive took %d, want 1", s)
	} else {
		done()
	}
	done0()
	done2()
	doneOther()
	if len(r.nextSlots) != 0 {
		t.Fatalf("slots left after every receive ended: %v", r.nextSlots)
	}
}
