// SPDX-License-Identifier: Apache-2.0

package ungrouped

import (
	"slices"
	"testing"
	"time"

	"github.com/shardq/shardq/driver"
)

func claimOf(tenant string, offset int64) driver.Claim {
	return driver.Claim{Message: driver.Message{Tenant: tenant, Offset: offset}}
}

// The tenants' claims are taken in turn, each tenant's in its order; a
// tenant that comes back after its claims ran out waits for its turn.
func TestClaimQueueTakesTenantsInTurn(t *testing.T) {
	q := newClaimQueue()
	for i := range 4 {
		q.push(claimOf("a", int64(i)))
	}
	q.push(claimOf("b", 0))
	q.push(claimOf("c", 0))
	q.push(claimOf("b", 1))
	var got []string
	for range 5 {
		c, ok := q.pop()
		if !ok {
			t.Fatal("closed")
		}
		got = append(got, c.Message.Tenant+string(rune('0'+c.Message.Offset)))
	}
	if want := []string{"a0", "b0", "c0", "a1", "b1"}; !slices.Equal(got, want) {
		t.Fatalf("taken %v, want %v", got, want)
	}
	q.push(claimOf("c", 1))
	if q.len() != 3 || q.queued("a") != 2 || q.queued("c") != 1 {
		t.Fatalf("len %d, a %d, c %d", q.len(), q.queued("a"), q.queued("c"))
	}
	left := q.close()
	if len(left) != 3 {
		t.Fatalf("close returned %d claims, want the 3 never taken", len(left))
	}
	if _, ok := q.pop(); ok {
		t.Fatal("pop after close returned a claim")
	}
}

// The claims that lapsed are taken out of the queue, the others kept in
// their turns.
func TestClaimQueueTakeLapsed(t *testing.T) {
	t0 := time.Unix(1000, 0)
	claim := func(tenant string, offset int64, lapse time.Duration) driver.Claim {
		c := claimOf(tenant, offset)
		c.VisibleUntil = t0.Add(lapse)
		return c
	}
	q := newClaimQueue()
	for _, c := range []driver.Claim{claim("a", 1, time.Second), claim("a", 2, 3*time.Second), claim("b", 3, time.Second), claim("c", 4, 5*time.Second)} {
		q.push(c)
	}
	lapseAt := func(c driver.Claim) time.Time { return c.VisibleUntil }
	got := map[int64]bool{}
	for _, c := range q.takeLapsed(t0.Add(time.Second), lapseAt) {
		got[c.Message.Offset] = true
	}
	if len(got) != 2 || !got[1] || !got[3] {
		t.Fatalf("lapsed = %v, want offsets 1 and 3", got)
	}
	if q.len() != 2 || q.queued("a") != 1 || q.queued("b") != 0 {
		t.Fatalf("left %d queued (a %d, b %d), want a's 2 and c's 4", q.len(), q.queued("a"), q.queued("b"))
	}
	var order []int64
	for range 2 {
		c, _ := q.pop()
		order = append(order, c.Message.Offset)
	}
	if order[0] != 2 || order[1] != 4 {
		t.Fatalf("popped %v, want [2 4]: the turns must skip an emptied tenant", order)
	}
}
