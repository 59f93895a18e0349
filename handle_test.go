// SPDX-License-Identifier: Apache-2.0

package shardq_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
)

// Every handle stops the same way: Done stays open while it runs, is
// closed once Stop returns, and a second Stop is harmless.
func TestHandlesStopTheSameWay(t *testing.T) {
	eachDatabase(t, func(t *testing.T, _ string, _ driver.Driver, c *shardq.Client) {
		ctx := context.Background()
		sub, err := c.Subscribe(ctx, shardq.SubscriberConfig{ConsumerGroup: "g", Topic: "x", Tenants: []string{"t"},
			Handler: func(context.Context, *shardq.Delivery) error { return nil }})
		if err != nil {
			t.Fatal(err)
		}
		r, err := c.AcceptGroup(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "receivers"}, "k", nil)
		if err != nil {
			t.Fatal(err)
		}
		p, err := c.StartTransactionProducer(ctx, shardq.TransactionProducerConfig{ProducerGroup: "pg", Tenants: []string{"t"},
			Checker: func(context.Context, *shardq.HalfMessage) (shardq.TxState, error) { return shardq.TxCommit, nil }})
		if err != nil {
			t.Fatal(err)
		}
		cl, err := c.StartCleaner(ctx, []string{"t"}, time.Hour, shardq.RetentionConfig{})
		if err != nil {
			t.Fatal(err)
		}
		for name, h := range map[string]shardq.Handle{"subscriber": sub, "receiver": r, "producer": p, "cleaner": cl} {
			select {
			case <-h.Done():
				t.Fatalf("%s: Done closed while it runs", name)
			default:
			}
			if err := h.Stop(ctx); err != nil {
				t.Fatalf("%s: Stop: %v", name, err)
			}
			select {
			case <-h.Done():
			default:
				t.Fatalf("%s: Done still open after Stop returned", name)
			}
			if err := h.Stop(ctx); err != nil {
				t.Fatalf("%s: second Stop: %v", name, err)
			}
		}
	})
}

// A receiver that gives its group back on its own (idle) closes Done once
// the lease is released: the group can be accepted again at once.
func TestReceiverDoneAfterRelease(t *testing.T) {
	eachDatabase(t, func(t *testing.T, _ string, _ driver.Driver, c *shardq.Client) {
		ctx := context.Background()
		g := shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}
		r, err := c.AcceptGroup(ctx, g, "k", &shardq.ReceiverOptions{IdleTimeout: 50 * time.Millisecond, LeaseTTL: 300 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-r.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("an idle receiver's Done never closed")
		}
		if _, err := r.Receive(ctx); !errors.Is(err, shardq.ErrReceiverClosed) {
			t.Fatalf("Receive after the idle release: %v, want ErrReceiverClosed", err)
		}
		heir, err := c.AcceptGroup(ctx, g, "k", nil)
		if err != nil {
			t.Fatalf("accept right after Done: %v (the lease must be released by then)", err)
		}
		if err := heir.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		if err := r.Stop(ctx); err != nil {
			t.Fatal(err)
		}
	})
}
