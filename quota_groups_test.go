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

// A consumer group's bookkeeping (leases, cursors, registry rows) counts
// in what a tenant stores. In a tenant that stores what its MaxBytes
// allows, accepting a message group by a name nothing was published to
// is refused (its rows would hold nothing to consume); consuming what is
// stored goes on, by new groups too.
func TestFullTenantRefusesEmptyGroups(t *testing.T) {
	eachDatabase(t, func(t *testing.T, _ string, _ driver.Driver, c *shardq.Client) {
		ctx := context.Background()
		for _, id := range []string{"a", "b", "c"} {
			if _, err := c.Publish(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: id, Payload: []byte("p")}); err != nil {
				t.Fatal(err)
			}
		}
		info, err := c.Admin().Tenant(ctx, "t")
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Admin().SetTenantLimits(ctx, "t", shardq.TenantLimits{MaxBytes: info.Bytes}); err != nil {
			t.Fatal(err)
		}
		g := shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "fresh"}
		if _, err := c.AcceptGroup(ctx, g, "nothing-here", nil); !errors.Is(err, shardq.ErrQuotaExceeded) {
			t.Fatalf("accepting a group nothing was published to in a full tenant: %v, want ErrQuotaExceeded", err)
		}
		rc, err := c.Receipts(nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := rc.Receive(ctx, shardq.ReceiveRequest{Tenant: "t", Topic: "x", ConsumerGroup: "fresh", PartitionKey: "nor-here", Hold: true}); !errors.Is(err, shardq.ErrQuotaExceeded) {
			t.Fatalf("a receive holding a group nothing was published to in a full tenant: %v, want ErrQuotaExceeded", err)
		}
		r, err := c.AcceptGroup(ctx, g, "k", nil)
		if err != nil {
			t.Fatalf("accepting a group with messages in a full tenant: %v", err)
		}
		for _, want := range []string{"a", "b", "c"} {
			rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			d, err := r.Receive(rctx)
			cancel()
			if err != nil || d.ID != want {
				t.Fatalf("receive: %v, %v; want %s", d, err, want)
			}
			if err := r.Ack(ctx, d); err != nil {
				t.Fatal(err)
			}
		}
		if err := r.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		info, err = c.Admin().Tenant(ctx, "t")
		if err != nil || len(info.Topics) != 1 || info.Topics[0].GroupBytes <= 0 {
			t.Fatalf("usage %+v, %v; want the group's bookkeeping counted", info, err)
		}
	})
}
