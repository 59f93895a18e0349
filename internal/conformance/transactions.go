// SPDX-License-Identifier: Apache-2.0

package conformance

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
)

var transactionTests = []conformanceTest{
	{"TxCommitAndRollback", testTxCommitAndRollback},
	{"TxUnknownThenChecked", testTxUnknownThenChecked},
	{"TxChecksExhausted", testTxChecksExhausted},
	{"TxSelectorMatchesPublish", testTxSelectorMatchesPublish},
	{"TxConcurrentSendsInCommitOrder", testTxConcurrentSendsInCommitOrder},
}

func fastProducer(t *testing.T, c *shardq.Client, checker shardq.TransactionChecker, mod func(*shardq.TransactionProducerConfig)) *shardq.TransactionProducer {
	t.Helper()
	cfg := shardq.TransactionProducerConfig{ProducerGroup: "pg", Tenants: []string{"t"}, Checker: checker,
		TransactionTimeout: 50 * time.Millisecond, CheckInterval: 50 * time.Millisecond, PollInterval: 20 * time.Millisecond}
	if mod != nil {
		mod(&cfg)
	}
	p, err := c.StartTransactionProducer(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop(context.Background()) })
	return p
}

func never(context.Context, *shardq.HalfMessage) (shardq.TxState, error) {
	return shardq.TxUnknown, nil
}

func testTxCommitAndRollback(t *testing.T, open Open) {
	d, c := setup(t, open, nil)
	p := fastProducer(t, c, never, func(cfg *shardq.TransactionProducerConfig) { cfg.TransactionTimeout = time.Hour })
	ctx := context.Background()
	var sawHalf bool
	res, err := p.SendInTransaction(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "yes", Payload: []byte("p")}, nil, nil,
		func(_ context.Context, h *shardq.HalfMessage) (shardq.TxState, error) {
			// The half message is stored but invisible to consumers.
			sawHalf = pending(t, d) == 1 && len(fetchAll(t, d, "t", "x", "k")) == 0
			return shardq.TxCommit, nil
		})
	if err != nil || res.State != shardq.TxCommit || res.Offset <= 0 || !sawHalf {
		t.Fatalf("commit: %+v, %v (half invisible during the local transaction: %v)", res, err, sawHalf)
	}
	got := fetchAll(t, d, "t", "x", "k")
	if len(got) != 1 || got[0].ID != "yes" || got[0].Offset != res.Offset || string(got[0].Payload) != "p" {
		t.Fatalf("committed message: %+v", got)
	}
	res, err = p.SendInTransaction(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "no"}, nil, nil,
		func(context.Context, *shardq.HalfMessage) (shardq.TxState, error) { return shardq.TxRollback, nil })
	if err != nil || res.State != shardq.TxRollback {
		t.Fatalf("rollback: %+v, %v", res, err)
	}
	if got := fetchAll(t, d, "t", "x", "k"); len(got) != 1 || pending(t, d) != 0 {
		t.Fatalf("after rollback: %d messages, %d pending", len(got), pending(t, d))
	}
	if _, err := p.SendInTransaction(ctx, shardq.Message{Tenant: "other", Topic: "x"}, nil, nil, never); !errors.Is(err, shardq.ErrInvalid) {
		t.Fatalf("send to a tenant outside the producer group = %v, want ErrInvalid", err)
	}
	if s := p.Stats(); s.Committed != 1 || s.RolledBack != 1 {
		t.Fatalf("stats %+v", s)
	}
}

func testTxUnknownThenChecked(t *testing.T, open Open) {
	d, c := setup(t, open, nil)
	var mu sync.Mutex
	answers := map[string]shardq.TxState{"commit-me": shardq.TxCommit, "drop-me": shardq.TxRollback}
	checks := map[string]int{}
	p := fastProducer(t, c, func(_ context.Context, h *shardq.HalfMessage) (shardq.TxState, error) {
		mu.Lock()
		defer mu.Unlock()
		checks[h.ID]++
		if checks[h.ID] < 2 {
			return shardq.TxUnknown, nil // the first check cannot tell yet
		}
		return answers[h.ID], nil
	}, nil)
	for _, id := range []string{"commit-me", "drop-me"} {
		res, err := p.SendInTransaction(context.Background(), shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: id}, nil, nil,
			func(context.Context, *shardq.HalfMessage) (shardq.TxState, error) {
				return shardq.TxUnknown, errors.New("crashed mid-way")
			})
		if err == nil || res.State != shardq.TxUnknown {
			t.Fatalf("unknown local transaction: %+v, %v", res, err)
		}
	}
	// The counters move just after each resolution commits: wait for both.
	waitFor(t, "the check-back to resolve both", 30*time.Second, func() bool {
		s := p.Stats()
		return pending(t, d) == 0 && s.CheckedCommitted == 1 && s.CheckedRolledBack == 1
	})
	got := fetchAll(t, d, "t", "x", "k")
	if len(got) != 1 || got[0].ID != "commit-me" {
		t.Fatalf("after check-back: %+v, want commit-me only", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if checks["commit-me"] != 2 || checks["drop-me"] != 2 {
		t.Fatalf("checks %v, want 2 each", checks)
	}
	if s := p.Stats(); s.CheckedCommitted != 1 || s.CheckedRolledBack != 1 {
		t.Fatalf("stats %+v", s)
	}
}

func testTxChecksExhausted(t *testing.T, open Open) {
	for _, policy := range []shardq.ExhaustedPolicy{shardq.RollbackWhenExhausted, shardq.DeadLetterWhenExhausted} {
		t.Run(policy.String(), func(t *testing.T) {
			d, c := setup(t, open, nil)
			var checks sync.Map
			p := fastProducer(t, c, func(_ context.Context, h *shardq.HalfMessage) (shardq.TxState, error) {
				n, _ := checks.LoadOrStore(h.ID, new(int))
				*n.(*int)++
				return shardq.TxUnknown, errors.New("the order service is down")
			}, func(cfg *shardq.TransactionProducerConfig) { cfg.MaxChecks = 3; cfg.WhenExhausted = policy })
			if _, err := p.SendInTransaction(context.Background(), shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "lost"}, nil, nil, never); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "checks to run out", 30*time.Second, func() bool { return pending(t, d) == 0 && p.Stats().Exhausted == 1 })
			if n, _ := checks.Load("lost"); *n.(*int) != 3 {
				t.Fatalf("%d checks, want 3", *n.(*int))
			}
			if got := fetchAll(t, d, "t", "x", "k"); len(got) != 0 {
				t.Fatalf("an exhausted half message was delivered: %+v", got)
			}
			var dead int
			if err := d.DB().QueryRowContext(context.Background(), "SELECT COUNT(*) FROM queue_half_messages_dead WHERE tenant = ?", "t").Scan(&dead); err != nil {
				t.Fatal(err)
			}
			if want := map[shardq.ExhaustedPolicy]int{shardq.RollbackWhenExhausted: 0, shardq.DeadLetterWhenExhausted: 1}[policy]; dead != want {
				t.Fatalf("%d dead half messages, want %d", dead, want)
			}
			if p.Stats().Exhausted != 1 {
				t.Fatalf("stats %+v", p.Stats())
			}
		})
	}
}

func testTxSelectorMatchesPublish(t *testing.T, open Open) {
	_, c := setup(t, open, nil)
	p := fastProducer(t, c, never, nil)
	sel := shardq.HashSelector(8)
	for _, arg := range []string{"customer-7", "customer-8", "customer-9"} {
		pub := mustPublish(t, c, shardq.Message{Tenant: "t", Topic: "x", Selector: sel, SelectorArg: arg})[0]
		tx, err := p.SendInTransaction(context.Background(), shardq.Message{Tenant: "t", Topic: "x"}, sel, arg,
			func(context.Context, *shardq.HalfMessage) (shardq.TxState, error) { return shardq.TxCommit, nil })
		if err != nil || tx.PartitionKey != pub.PartitionKey || tx.Offset <= pub.Offset {
			t.Fatalf("selector arg %s: transactional %+v (%v), ordinary %+v; want the same partition, later offset", arg, tx, err, pub)
		}
	}
}

// testTxConcurrentSendsInCommitOrder: 16 transactional senders with random
// local-transaction durations, some rolling back, and ordinary publishers,
// all on one partition, while a subscriber consumes. Every committed
// message arrives once, in offset order; no rolled-back one ever does.
func testTxConcurrentSendsInCommitOrder(t *testing.T, open Open) {
	d, c := setup(t, open, nil)
	p := fastProducer(t, c, never, func(cfg *shardq.TransactionProducerConfig) { cfg.TransactionTimeout = time.Hour })
	rec := newRecorder()
	var rolledBack sync.Map
	handler := func(ctx context.Context, dl *shardq.Delivery) error {
		if _, ok := rolledBack.Load(dl.ID); ok {
			rec.fail("rolled-back message %s delivered", dl.ID)
		}
		return rec.handle(ctx, dl)
	}
	sub, err := c.Subscribe(context.Background(), fastConfig("g", "x", []string{"t"}, handler))
	if err != nil {
		t.Fatal(err)
	}
	defer stopAll(t, sub)
	const senders, each = 16, 8
	var wg sync.WaitGroup
	var committed sync.Map
	errs := make(chan error, senders+1)
	for s := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				id := fmt.Sprintf("tx-%d-%d", s, i)
				decision := shardq.TxCommit
				if i%4 == 3 {
					decision = shardq.TxRollback
					rolledBack.Store(id, true)
				}
				res, err := p.SendInTransaction(context.Background(), shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "hot", ID: id}, nil, nil,
					func(context.Context, *shardq.HalfMessage) (shardq.TxState, error) {
						time.Sleep(time.Duration(rand.IntN(21)) * time.Millisecond)
						return decision, nil
					})
				if err != nil {
					errs <- err
					return
				}
				if res.State == shardq.TxCommit {
					committed.Store(id, res.Offset)
				}
			}
		}()
	}
	wg.Add(1)
	go func() { // an ordinary publisher on the same partition
		defer wg.Done()
		for i := range 40 {
			id := fmt.Sprintf("plain-%d", i)
			res, err := c.Publish(context.Background(), shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "hot", ID: id})
			if err != nil {
				errs <- err
				return
			}
			committed.Store(id, res[0].Offset)
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	want := 40 + senders*each*3/4
	deadline := time.Now().Add(time.Minute)
	for rec.total.Load() < int64(want) {
		if time.Now().After(deadline) {
			// Say whether this is a loss (the cursor passed a missing
			// offset) or a stall (the head is past the cursor).
			var missing []string
			rec.mu.Lock()
			committed.Range(func(id, off any) bool {
				if !rec.seen[id.(string)] {
					missing = append(missing, fmt.Sprintf("%s@%d", id, off))
				}
				return true
			})
			rec.mu.Unlock()
			ps, perr := d.PartitionsWithWork(context.Background(), driver.GroupScope{Tenants: []string{"t"}, Topic: "x", ConsumerGroup: "g"})
			ls, lerr := d.HeldLeases(context.Background(), driver.GroupScope{Tenants: []string{"t"}, Topic: "x", ConsumerGroup: "g"})
			t.Fatalf("after a minute %d of %d delivered; committed and missing: %v; partitions with work %+v (%v); leases %+v (%v)",
				rec.total.Load(), want, missing, ps, perr, ls, lerr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	waitFor(t, "the cursor at the head", 30*time.Second, func() bool {
		ps, err := d.PartitionsWithWork(context.Background(), driver.GroupScope{Tenants: []string{"t"}, Topic: "x", ConsumerGroup: "g"})
		return err == nil && len(ps) == 0
	})
	rec.check(t)
	if rec.total.Load() != int64(want) {
		t.Fatalf("delivered %d, want %d", rec.total.Load(), want)
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
