// SPDX-License-Identifier: Apache-2.0

package shardq_test

import (
	"context"
	"testing"
	"time"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
)

// A member whose host clock is an hour off stamps its heartbeat, its
// lease and what it publishes by the database's clock, so that the other
// members judge them rightly; with ClockSync off, the same member stamps
// them an hour off (and would take live leases or lose its own early).
func TestMembersKeepToTheDatabaseClock(t *testing.T) {
	eachDatabase(t, func(t *testing.T, _ string, drv driver.Driver, _ *shardq.Client) {
		for _, tc := range []struct {
			name string
			sync time.Duration
			off  time.Duration // how far the stamps are from the database's clock
		}{
			{"synced", time.Second, 0},
			{"unsynced", -1, time.Hour},
		} {
			t.Run(tc.name, func(t *testing.T) {
				ctx := context.Background()
				c, err := shardq.NewClient(drv, &shardq.Config{ClockSync: tc.sync,
					Clock: func() time.Time { return time.Now().Add(time.Hour) }})
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				topic := "clock-" + tc.name
				held := make(chan struct{})
				release := make(chan struct{})
				cfg := faultSubscriberConfig(func(ctx context.Context, d *shardq.Delivery) error {
					close(held)
					select {
					case <-release:
					case <-ctx.Done():
					}
					return nil
				})
				cfg.Topic = topic
				sub, err := c.Subscribe(ctx, cfg)
				if err != nil {
					t.Fatal(err)
				}
				defer sub.Stop(ctx)
				if _, err := c.Publish(ctx, shardq.Message{Tenant: "t", Topic: topic, PartitionKey: "k", ID: "m"}); err != nil {
					t.Fatal(err)
				}
				<-held
				defer close(release)

				db := drv.(driver.Clock)
				near := func(what string, stamp time.Time, want time.Duration, slack time.Duration) {
					t.Helper()
					now, err := db.DatabaseTime(ctx)
					if err != nil {
						t.Fatal(err)
					}
					if d := stamp.Sub(now) - want; d < -slack || d > slack {
						t.Errorf("%s %v is %v from the database's clock %v; want %v (±%v)", what, stamp, stamp.Sub(now), now, want, slack)
					}
				}
				scope := shardq.Scope{Tenants: []string{"t"}}
				members, err := c.Admin().Subscribers(ctx, scope)
				if err != nil {
					t.Fatal(err)
				}
				leases, err := c.Admin().Leases(ctx, scope)
				if err != nil {
					t.Fatal(err)
				}
				stored, _, err := c.Admin().Inspect(ctx, shardq.MessageRef{Tenant: "t", Topic: topic, PartitionKey: "k", ID: "m"})
				if err != nil {
					t.Fatal(err)
				}
				const slack = 5 * time.Second
				found := 0
				for _, m := range members {
					if m.Topic == topic {
						found++
						near("heartbeat", m.HeartbeatAt, tc.off, slack)
					}
				}
				for _, l := range leases {
					if l.Topic == topic {
						found++
						near("lease expiry", l.ExpiresAt, tc.off+cfg.LeaseTTL, slack)
					}
				}
				if found != 2 {
					t.Fatalf("found %d heartbeat and lease rows of the member, want 2: %+v %+v", found, members, leases)
				}
				near("created at", stored.CreatedAt, tc.off, slack)
			})
		}
	})
}

// A server that only receives and settles (shardq serve) keeps to the
// database's clock too: a receive through a client an hour off leases
// the group until the database's now plus the visibility, and a change
// of visibility through another such client (which received nothing)
// likewise.
func TestReceiptsKeepToTheDatabaseClock(t *testing.T) {
	eachDatabase(t, func(t *testing.T, _ string, drv driver.Driver, c *shardq.Client) {
		ctx := context.Background()
		skewed := func() *shardq.Receipts {
			sc, err := shardq.NewClient(drv, &shardq.Config{ClockSync: time.Second,
				Clock: func() time.Time { return time.Now().Add(time.Hour) }})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { sc.Close() })
			r, err := sc.Receipts(nil)
			if err != nil {
				t.Fatal(err)
			}
			return r
		}
		if _, err := c.Publish(ctx, shardq.Message{Tenant: "t", Topic: "rc", PartitionKey: "k", ID: "m"}); err != nil {
			t.Fatal(err)
		}
		g := shardq.GroupRef{Tenant: "t", Topic: "rc", ConsumerGroup: "g"}
		got, err := skewed().Receive(ctx, shardq.ReceiveRequest{Tenant: g.Tenant, Topic: g.Topic, ConsumerGroup: g.ConsumerGroup,
			PartitionKey: "k", Max: 1, Visibility: time.Minute})
		if err != nil || len(got.Messages) != 1 {
			t.Fatalf("receive: %v, %+v", err, got)
		}
		expiry := func(want time.Duration) {
			t.Helper()
			ls, err := c.Admin().Leases(ctx, shardq.Scope{Tenants: []string{"t"}})
			if err != nil {
				t.Fatal(err)
			}
			now, err := drv.(driver.Clock).DatabaseTime(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, l := range ls {
				if l.Topic == "rc" {
					if d := l.ExpiresAt.Sub(now) - want; d < -5*time.Second || d > 5*time.Second {
						t.Fatalf("the group's lease expires %v from the database's now, want %v", l.ExpiresAt.Sub(now), want)
					}
					return
				}
			}
			t.Fatalf("no lease of the group: %+v", ls)
		}
		expiry(time.Minute)
		if stale, err := skewed().ChangeVisibility(ctx, g, []string{got.Messages[0].Receipt}, 2*time.Minute); err != nil || len(stale) != 0 {
			t.Fatalf("change visibility: %v, stale %v", err, stale)
		}
		expiry(2 * time.Minute)
	})
}
