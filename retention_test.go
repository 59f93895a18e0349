// SPDX-License-Identifier: Apache-2.0

package shardq_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
)

// TestRetentionKeepsPublishersMoving deletes 20,000 consumed messages in
// bounded batches while a publisher writes to the same partitions, and
// reports the publisher's latency during the pass against a baseline
// measured in the same run without one.
func TestRetentionKeepsPublishersMoving(t *testing.T) {
	eachDatabase(t, func(t *testing.T, _ string, drv driver.Driver, c *shardq.Client) {
		ctx := context.Background()
		const old, parts = 20_000, 16
		for i := 0; i < old; i += 500 {
			var batch []shardq.Message
			for j := i; j < i+500; j++ {
				batch = append(batch, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: fmt.Sprintf("p%02d", j%parts),
					CreatedAt: time.Now().Add(-2 * time.Hour)})
			}
			if _, err := c.Publish(ctx, batch...); err != nil {
				t.Fatal(err)
			}
		}
		for p := range parts {
			if err := drv.ResetOffset(ctx, driver.PartitionRef{Tenant: "t", Topic: "x", PartitionKey: fmt.Sprintf("p%02d", p), ConsumerGroup: "g"}, 1<<62); err != nil {
				t.Fatal(err)
			}
		}
		publish := func(n int, during func() bool) []time.Duration {
			var lat []time.Duration
			for i := 0; i < n || (during != nil && during()); i++ {
				start := time.Now()
				if _, err := c.Publish(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: fmt.Sprintf("p%02d", i%parts)}); err != nil {
					t.Fatal(err)
				}
				lat = append(lat, time.Since(start))
			}
			return lat
		}
		baseline := publish(200, nil)
		done := make(chan shardq.RetentionReport, 1)
		go func() {
			rep, err := c.Admin().RunRetention(ctx, shardq.Scope{Tenants: []string{"t"}}, shardq.RetentionConfig{})
			if err != nil {
				t.Error(err)
			}
			done <- rep
		}()
		var rep shardq.RetentionReport
		finished := false
		during := publish(0, func() bool {
			select {
			case rep = <-done:
				finished = true
			default:
			}
			return !finished
		})
		if rep.Deleted != old {
			t.Fatalf("retention deleted %d, want the %d consumed old messages", rep.Deleted, old)
		}
		left := 0
		for p := range parts {
			msgs, err := drv.FetchAfter(ctx, driver.TopicPartition{Tenant: "t", Topic: "x", PartitionKey: fmt.Sprintf("p%02d", p)}, 0, 100_000)
			if err != nil {
				t.Fatal(err)
			}
			left += len(msgs)
		}
		if left != len(baseline)+len(during) {
			t.Fatalf("%d messages left, want the %d published meanwhile", left, len(baseline)+len(during))
		}
		pct := func(l []time.Duration, p float64) time.Duration {
			s := slices.Clone(l)
			slices.Sort(s)
			return s[int(float64(len(s)-1)*p)]
		}
		t.Logf("publisher latency: baseline p50 %v p99 %v (n=%d); during retention of %d rows p50 %v p99 %v (n=%d): p99 ratio %.2f",
			pct(baseline, .5), pct(baseline, .99), len(baseline), old, pct(during, .5), pct(during, .99), len(during),
			float64(pct(during, .99))/float64(pct(baseline, .99)))
	})
}
