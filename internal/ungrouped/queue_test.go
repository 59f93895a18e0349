// SPDX-License-Identifier: Apache-2.0

package ungrouped

import (
	"slices"
	"testing"

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
