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
	{"TxCommitHalvesAllOrNone", testTxCommitHalvesAllOrNone},
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
					err = d.CommitHalves(ctx, []*driver.HalfCommit{{Ref: ref}})
				case "rollback":
					err = d.RollbackHalf(ctx, ref, 0)
				case "checked-commit":
					err = d.CommitHalves(ctx, []*driver.HalfCommit{{Ref: ref, ClaimToken: claimed[0].ClaimToken}})
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

// testTxCommitHalvesAllOrNone: a batch of half messages enters its
// partitions in the batch's order, each with its message; a batch with
// one half message resolved already, or of two tenants, commits none.
func testTxCommitHalvesAllOrNone(t *testing.T, open Open) {
	d := setup(t, open)
	ctx := context.Background()
	t0 := time.Now().UTC().Truncate(time.Millisecond)
	half := func(tenant, key, id string) *driver.HalfCommit {
		t.Helper()
		h := &driver.HalfMessage{InsertMessage: driver.InsertMessage{Tenant: tenant, Topic: "x", PartitionKey: key, ID: id,
			Headers: map[string]string{}, Payload: []byte(id), CreatedAt: t0}, ProducerGroup: "pg", NextCheckAt: t0.Add(time.Hour)}
		if err := d.InsertHalf(ctx, h); err != nil {
			t.Fatal(err)
		}
		return &driver.HalfCommit{Ref: h.Ref()}
	}
	// Sorted by key, the batch would be a1, a3, a2: it must go in as given.
	a3, a1, a2 := half("t", "k1", "a3"), half("t", "k1", "a1"), half("t", "k2", "a2")
	if err := d.CommitHalves(ctx, []*driver.HalfCommit{a3, a1, a2}); err != nil {
		t.Fatal(err)
	}
	for _, hc := range []*driver.HalfCommit{a3, a1, a2} {
		if hc.Message == nil || hc.Message.ID != hc.Ref.ID || hc.Message.PartitionKey != hc.Ref.PartitionKey || hc.Message.Offset <= 0 {
			t.Fatalf("%s: committed message %+v", hc.Ref.ID, hc.Message)
		}
	}
	var ids []string
	for _, m := range fetchAll(t, d, "t", "x", "k1") {
		ids = append(ids, m.ID)
	}
	if fmt.Sprint(ids) != "[a3 a1]" || a3.Message.Offset >= a1.Message.Offset {
		t.Fatalf("partition k1 holds %v (offsets a3 %d, a1 %d); want [a3 a1] in the batch's order", ids, a3.Message.Offset, a1.Message.Offset)
	}

	// z9 sorts after b1: b1's half row is locked and deleted before z9 is
	// found resolved, and all of it is rolled back.
	z9 := half("t", "k2", "z9")
	if err := d.CommitHalves(ctx, []*driver.HalfCommit{z9}); err != nil {
		t.Fatal(err)
	}
	b1 := half("t", "k1", "b1")
	again := &driver.HalfCommit{Ref: z9.Ref}
	if err := d.CommitHalves(ctx, []*driver.HalfCommit{b1, again}); !errors.Is(err, driver.ErrHalfResolved) {
		t.Fatalf("a batch with a resolved half message: %v; want ErrHalfResolved", err)
	}
	other := half("u", "k1", "c1")
	if err := d.CommitHalves(ctx, []*driver.HalfCommit{b1, other}); err == nil {
		t.Fatal("a batch of two tenants committed")
	}
	if b1.Message != nil || again.Message != nil || other.Message != nil {
		t.Fatal("a failed batch set a message")
	}
	if got := len(fetchAll(t, d, "t", "x", "k1")); got != 2 || pending(t, d) != 1 {
		t.Fatalf("after the failed batches: %d messages on k1, %d half messages pending; want 2 and b1", got, pending(t, d))
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
