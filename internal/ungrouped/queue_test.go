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
	q := newClaimQueue(time.Now, func(driver.Claim) time.Time { return time.Now().Add(time.Hour) }) // nothing lapses
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

// A claim that lapsed in the queue is never popped: pop sets it aside,
// and takeLapsed returns it with the tenant's queued claims that lapsed
// by then (in any order: a clock may step back), keeping the others in
// their turns.
func TestClaimQueueSetsLapsedAside(t *testing.T) {
	t0 := time.Unix(1000, 0)
	now := t0
	claim := func(tenant string, offset int64, lapse time.Duration) driver.Claim {
		c := claimOf(tenant, offset)
		c.VisibleUntil = t0.Add(lapse)
		return c
	}
	q := newClaimQueue(func() time.Time { return now }, func(c driver.Claim) time.Time { return c.VisibleUntil })
	for _, c := range []driver.Claim{claim("a", 1, time.Second), claim("a", 2, 3*time.Second), claim("a", 3, time.Second),
		claim("b", 4, time.Second), claim("c", 5, 5*time.Second)} {
		q.push(c)
	}
	now = t0.Add(time.Second)
	if c, _ := q.pop(); c.Message.Offset != 5 {
		// a's 1 and b's 4 lapsed, set aside in their turns; then c's 5.
		t.Fatalf("popped offset %d, want 5, past the lapsed 1 and 4", c.Message.Offset)
	}
	select {
	case <-q.setAside:
	default:
		t.Fatal("pop set a claim aside without a signal")
	}
	offsets := func(cs []driver.Claim) []int64 {
		var out []int64
		for _, c := range cs {
			out = append(out, c.Message.Offset)
		}
		slices.Sort(out)
		return out
	}
	if got := offsets(q.takeLapsed("a", now)); !slices.Equal(got, []int64{1, 3}) {
		t.Fatalf("a's lapsed = %v, want [1 3] (the one set aside and the one behind a live claim)", got)
	}
	if got := offsets(q.takeLapsed("", t0)); !slices.Equal(got, []int64{4}) {
		t.Fatalf("every tenant's lapsed = %v, want b's 4 (set aside; c's 5 was popped)", got)
	}
	if q.len() != 1 || q.queued("a") != 1 || q.queued("b") != 0 {
		t.Fatalf("left %d queued (a %d, b %d), want a's 2", q.len(), q.queued("a"), q.queued("b"))
	}
	if c, _ := q.pop(); c.Message.Offset != 2 {
		t.Fatalf("popped %d, want 2", c.Message.Offset)
	}
	q.push(claim("d", 6, 0))
	q.push(claim("d", 7, 9*time.Second))
	if c, _ := q.pop(); c.Message.Offset != 7 {
		t.Fatalf("popped %d, want 7 past the lapsed 6", c.Message.Offset)
	}
	if left := offsets(q.close()); !slices.Equal(left, []int64{6}) {
		t.Fatalf("close returned %v, want the set-aside 6", left)
	}
}
