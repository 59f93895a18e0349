// SPDX-License-Identifier: Apache-2.0

package drivertest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/shardq/shardq/driver"
)

var transactionTests = []struct {
	name string
	fn   func(*testing.T, Open)
}{
	{"TxExactlyOneOutcome", testTxExactlyOneOutcome},
}

// testTxExactlyOneOutcome races every pair of resolutions of one half
// message: at most one message appears, and never after a rollback won.
func testTxExactlyOneOutcome(t *testing.T, open Open) {
	d := setup(t, open)
	ctx := context.Background()
	for round := range 20 {
		ref := driver.MessageRef{Tenant: "t", Topic: "x", PartitionKey: "k", ID: fmt.Sprintf("race-%d", round)}
		h := &driver.HalfMessage{InsertMessage: driver.InsertMessage{Tenant: ref.Tenant, Topic: ref.Topic, PartitionKey: ref.PartitionKey,
			ID: ref.ID, Headers: map[string]string{}, CreatedAt: t0}, ProducerGroup: "pg", NextCheckAt: t0}
		if err := d.InsertHalf(ctx, h); err != nil {
			t.Fatal(err)
		}
		// One contender resolves through a check-back claim.
		claimed, err := d.ClaimDueHalves(ctx, driver.HalfClaimRequest{Tenants: []string{"t"}, ProducerGroup: "pg", Owner: "checker", Now: t0, ClaimTTL: time.Minute, Limit: 10})
		if err != nil || len(claimed) != 1 {
			t.Fatalf("claim: %d, %v", len(claimed), err)
		}
		type outcome struct {
			what string
			err  error
		}
		results := make(chan outcome, 4)
		var wg sync.WaitGroup
		for _, what := range []string{"commit", "commit", "rollback", "checked-commit"} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var err error
				switch what {
				case "commit":
					_, err = d.CommitHalf(ctx, ref, 0)
				case "rollback":
					err = d.RollbackHalf(ctx, ref, 0)
				case "checked-commit":
					_, err = d.CommitHalf(ctx, ref, claimed[0].ClaimToken)
				}
				results <- outcome{what, err}
			}()
		}
		wg.Wait()
		close(results)
		var won []string
		for r := range results {
			switch {
			case r.err == nil:
				won = append(won, r.what)
			case errors.Is(r.err, driver.ErrHalfResolved):
			case d.Retryable(r.err):
			default:
				t.Fatalf("%s: %v", r.what, r.err)
			}
		}
		msgs := 0
		for _, m := range fetchAll(t, d, "t", "x", "k") {
			if m.ID == ref.ID {
				msgs++
			}
		}
		if len(won) != 1 || (won[0] == "rollback") != (msgs == 0) || msgs > 1 {
			t.Fatalf("round %d: winners %v, %d messages; want one winner and a message only if it committed", round, won, msgs)
		}
	}
	if pending(t, d) != 0 {
		t.Fatal("half messages left after the races")
	}
}

func pending(t *testing.T, d driver.Driver) int {
	t.Helper()
	hs, err := d.ListHalves(context.Background(), driver.Scope{Tenants: []string{"t"}})
	if err != nil {
		t.Fatal(err)
	}
	return len(hs)
}
