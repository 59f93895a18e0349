// SPDX-License-Identifier: Apache-2.0

package shardq_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
)

// A handler stuck past HandlerTimeout has its context cancelled with
// ErrHandlerTimeout as the cause; the attempt counts as failed and is
// retried, and the partition goes on in order after it.
func TestHandlerTimeoutRetries(t *testing.T) {
	eachDatabase(t, func(t *testing.T, _ string, _ driver.Driver, c *shardq.Client) {
		ctx := context.Background()
		var mu sync.Mutex
		var seen []string
		var cause error
		done := make(chan struct{})
		cfg := faultSubscriberConfig(func(ctx context.Context, d *shardq.Delivery) error {
			if d.ID == "stuck" && d.Attempt == 1 {
				<-ctx.Done() // a handler waiting on something that never comes
				mu.Lock()
				cause = context.Cause(ctx)
				mu.Unlock()
				return nil // too late: the attempt failed already
			}
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, d.ID)
			if d.ID == "after" {
				close(done)
			}
			return nil
		})
		cfg.HandlerTimeout, cfg.BackoffMin, cfg.BackoffMax = 100*time.Millisecond, time.Millisecond, 2*time.Millisecond
		sub, err := c.Subscribe(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Stop(ctx)
		for _, id := range []string{"stuck", "after"} {
			if _, err := c.Publish(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: id}); err != nil {
				t.Fatal(err)
			}
		}
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatal("the partition never went on past the stuck handler")
		}
		mu.Lock()
		defer mu.Unlock()
		if !errors.Is(cause, shardq.ErrHandlerTimeout) {
			t.Fatalf("the stuck handler's context ended with %v; want ErrHandlerTimeout", cause)
		}
		if len(seen) != 2 || seen[0] != "stuck" || seen[1] != "after" {
			t.Fatalf("handled %v; want stuck (its second attempt), then after", seen)
		}
	})
}

func TestHandlerTimeoutIsChecked(t *testing.T) {
	eachDatabase(t, func(t *testing.T, _ string, _ driver.Driver, c *shardq.Client) {
		cfg := faultSubscriberConfig(func(context.Context, *shardq.Delivery) error { return nil })
		cfg.HandlerTimeout = -time.Second
		_, err := c.Subscribe(context.Background(), cfg)
		var ve *shardq.ValidationError
		if !errors.As(err, &ve) || ve.Field != "handler timeout" {
			t.Fatalf("Subscribe with a negative timeout: %v; want a validation error naming the handler timeout", err)
		}
	})
}

// The context given to Subscribe bounds the subscriber's life: when it
// ends, the subscriber stops as Stop does (its heartbeat row and leases
// gone), and Done says so.
func TestSubscribeContextStopsTheSubscriber(t *testing.T) {
	eachDatabase(t, func(t *testing.T, _ string, _ driver.Driver, c *shardq.Client) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		got := make(chan struct{}, 1)
		sub, err := c.Subscribe(ctx, faultSubscriberConfig(func(context.Context, *shardq.Delivery) error {
			got <- struct{}{}
			return nil
		}))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Publish(context.Background(), shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k"}); err != nil {
			t.Fatal(err)
		}
		<-got
		cancel()
		select {
		case <-sub.Done():
		case <-time.After(30 * time.Second):
			t.Fatal("the subscriber outlived its context")
		}
		admin, scope := c.Admin(), shardq.Scope{Tenants: []string{"t"}}
		members, err := admin.Subscribers(context.Background(), scope)
		if err != nil || len(members) != 0 {
			t.Fatalf("members after the context ended: %v, %v; want none", members, err)
		}
		leases, err := admin.Leases(context.Background(), scope)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range leases {
			if l.Owner != "" {
				t.Fatalf("lease %+v still held after the context ended", l)
			}
		}
		if err := sub.Stop(context.Background()); err != nil {
			t.Fatalf("Stop after the context stopped it: %v", err)
		}
	})
}

// A group receiver's message left unsettled past HandlerTimeout counts as
// a failed attempt and the receiver lets the group go: the next owner
// gets it again (attempt 2), and after the last attempt it is
// dead-lettered; the late Ack fails with ErrHandlerTimeout.
func TestReceiverHandlerTimeout(t *testing.T) {
	eachDatabase(t, func(t *testing.T, _ string, _ driver.Driver, c *shardq.Client) {
		ctx := context.Background()
		for _, id := range []string{"stuck", "next"} {
			if _, err := c.Publish(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: id}); err != nil {
				t.Fatal(err)
			}
		}
		opts := &shardq.ReceiverOptions{HandlerTimeout: 200 * time.Millisecond, MaxAttempts: 2, BackoffMin: time.Millisecond,
			BackoffMax: 2 * time.Millisecond, Wait: 10 * time.Second}
		for attempt := 1; attempt <= 2; attempt++ {
			r, err := c.AcceptGroup(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, "k", opts)
			if err != nil {
				t.Fatal(err)
			}
			d, err := r.Receive(ctx)
			if err != nil || d.ID != "stuck" || d.Attempt != attempt {
				t.Fatalf("attempt %d: %+v, %v", attempt, d, err)
			}
			waitFor(t, "the timeout to close the receiver", func() bool {
				_, err := r.State(ctx)
				return errors.Is(err, shardq.ErrReceiverClosed)
			})
			if err := r.Ack(ctx, d); !errors.Is(err, shardq.ErrHandlerTimeout) {
				t.Fatalf("a late Ack = %v; want ErrHandlerTimeout", err)
			}
			if err := r.Stop(ctx); err != nil {
				t.Fatal(err)
			}
		}
		// Two attempts timed out: dead-lettered; the group goes on.
		r, err := c.AcceptGroup(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, "k", opts)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Stop(ctx)
		d, err := r.Receive(ctx)
		if err != nil || d.ID != "next" {
			t.Fatalf("after the dead letter: %+v, %v", d, err)
		}
		if err := r.Ack(ctx, d); err != nil {
			t.Fatal(err)
		}
		dl, err := c.Admin().DeadLetters(ctx, shardq.DeadLetterRequest{Scope: shardq.Scope{Tenants: []string{"t"}}, Topic: "x", Suffix: ""})
		if err != nil || len(dl) != 1 || dl[0].ID != "stuck" {
			t.Fatalf("dead letters %+v, %v; want stuck", dl, err)
		}
	})
}
