// SPDX-License-Identifier: Apache-2.0

package shardq

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/shardq/shardq/internal/telemetry"
	"github.com/shardq/shardq/internal/testdb"
)

// What a tenant stores is measured in the call the first time, then again
// in the background once TenantUsageInterval old; between measures the
// client adds what it admits itself. A deletion elsewhere frees room only
// at the next measure. The quota metrics report the limit and the usage.
func TestStorageQuotaMeasuredInTheBackground(t *testing.T) {
	clock := testdb.NewClock(time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC))
	c, err := NewClient(testdb.Migrated(t, testdb.SQLite(t)), &Config{Clock: clock.Now, TenantUsageInterval: time.Minute, TenantSettingsTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	pub := func(id string) error {
		_, err := c.Publish(ctx, Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: id})
		return err
	}
	refused := func(id string, usage int64) {
		t.Helper()
		var qe *QuotaExceededError
		if err := pub(id); !errors.As(err, &qe) || qe.Quota != QuotaMaxMessages || qe.Usage != usage {
			t.Fatalf("publish %s: %v; want max_messages refused at %d", id, err, usage)
		}
	}
	for _, id := range []string{"a", "b"} {
		if err := pub(id); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Admin().SetTenantLimits(ctx, "t", TenantLimits{MaxMessages: 3}); err != nil {
		t.Fatal(err)
	}
	if err := pub("c"); err != nil { // measured 2
		t.Fatal(err)
	}
	refused("d", 3) // 2 measured, 1 added
	for _, id := range []string{"a", "b"} {
		if ok, err := c.Admin().Delete(ctx, MessageRef{Tenant: "t", Topic: "x", PartitionKey: "k", ID: id}); !ok || err != nil {
			t.Fatalf("delete %s: %v %v", id, ok, err)
		}
	}
	refused("d", 3) // the measure stands
	clock.Add(time.Minute)
	refused("d", 3) // judged by the stale measure, which it renews
	c.tenants.bg.Wait()
	if err := pub("d"); err != nil {
		t.Fatalf("publish after the new measure of 1: %v", err)
	}
	uses := c.tenants.quotaUses()
	if len(uses) != 1 || uses[0] != (telemetry.QuotaUse{Tenant: "t", Quota: QuotaMaxMessages, Limit: 3, Usage: 2, Measured: true}) {
		t.Fatalf("quota metrics %+v", uses)
	}
}

// A large message's chunk transactions wait for the byte rate, in pieces
// of a second's worth, rather than fail: a transaction larger than the
// rate allows at once still goes through. An ordinary publish over a
// second's worth is refused for good.
func TestLargeMessageWaitsForTheByteRate(t *testing.T) {
	c, err := NewClient(testdb.Migrated(t, testdb.SQLite(t)), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	const rate = 256 << 10
	if err := c.Admin().SetTenantLimits(ctx, "t", TenantLimits{PublishByteRate: rate}); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, rate+rate/2) // two transactions of 4 chunks of 96 KiB, each over a second's worth at once
	res, err := c.PublishLarge(ctx, Message{Tenant: "t", Topic: "files", PartitionKey: "f", ID: "big"}, bytes.NewReader(body),
		&LargeOptions{ChunkSize: 96 << 10, ChunksPerTx: 4})
	if err != nil || res.Bytes != int64(len(body)) {
		t.Fatalf("large message under a byte rate: %+v, %v", res, err)
	}
	_, err = c.Publish(ctx, Message{Tenant: "t", Topic: "files", PartitionKey: "g", Payload: make([]byte, rate+1)})
	var qe *QuotaExceededError
	if !errors.As(err, &qe) || qe.Quota != QuotaPublishByteRate || qe.RetryAfter != 0 {
		t.Fatalf("an ordinary publish over a second's worth: %v", err)
	}
}
