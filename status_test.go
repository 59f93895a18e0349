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

// MessageStatus says, per consumer group, whether it consumed a message,
// is retrying it, or has not reached it.
func TestMessageStatusPerGroup(t *testing.T) {
	eachDatabase(t, func(t *testing.T, _ string, _ driver.Driver, c *shardq.Client) {
		ctx := context.Background()
		for _, id := range []string{"m1", "m2", "m3"} {
			if _, err := c.Publish(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: id}); err != nil {
				t.Fatal(err)
			}
		}
		failed := make(chan struct{}, 1)
		cfg := faultSubscriberConfig(func(_ context.Context, d *shardq.Delivery) error {
			if d.ID == "m2" {
				select {
				case failed <- struct{}{}:
				default:
				}
				return shardq.RetryAfter(time.Hour, errors.New("downstream is down"))
			}
			return nil
		})
		sub, err := c.Subscribe(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Stop(ctx)
		<-failed
		status := func(id string) shardq.GroupStatus {
			t.Helper()
			_, gs, err := c.Admin().MessageStatus(ctx, shardq.MessageRef{Tenant: "t", Topic: "x", PartitionKey: "k", ID: id})
			if err != nil || len(gs) != 1 || gs[0].ConsumerGroup != "g" {
				t.Fatalf("status of %s: %+v, %v", id, gs, err)
			}
			return gs[0]
		}
		waitFor(t, "m1 committed", func() bool { return status("m1").Status == shardq.StatusConsumed })
		// The handler's failure is recorded after it returns.
		waitFor(t, "m2's failure recorded", func() bool { return status("m2").Status == shardq.StatusRetrying })
		if s := status("m2"); s.Status != shardq.StatusRetrying || s.State.Attempts != 1 || s.State.LastError != "retry after 1h0m0s: downstream is down" {
			t.Fatalf("m2: %+v; want retrying after one attempt", s)
		}
		if s := status("m3"); s.Status != shardq.StatusPending {
			t.Fatalf("m3: %+v; want not reached", s)
		}
	})
}
