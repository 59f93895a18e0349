// SPDX-License-Identifier: Apache-2.0

package shardq

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/publish"
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
	// The stale measure is renewed in the background: this publish is
	// judged by it, or by the new one if that lands first.
	var qe *QuotaExceededError
	if err := pub("d"); err != nil {
		if !errors.As(err, &qe) || qe.Usage != 3 {
			t.Fatalf("publish d on the stale measure: %v; want max_messages refused at 3, or stored", err)
		}
		c.tenants.bg.Wait()
		if err := pub("d"); err != nil {
			t.Fatalf("publish after the new measure of 1: %v", err)
		}
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

// A write admitted before a measure started and stored after it is
// counted until a measure that holds it lands: concurrent batches of one
// client never take a tenant past its quota, however large, and a write
// in the caller's transaction (ends unseen) is held for two measures.
func TestStorageQuotaHoldsWritesInFlightAcrossMeasures(t *testing.T) {
	clock := testdb.NewClock(time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC))
	drv := testdb.Migrated(t, testdb.SQLite(t))
	c, err := NewClient(drv, &Config{Clock: clock.Now, TenantUsageInterval: time.Minute, TenantSettingsTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	if err := c.Admin().SetTenantLimits(ctx, "t", TenantLimits{MaxMessages: 200}); err != nil {
		t.Fatal(err)
	}
	id := 0
	batch := func(n int) []*driver.InsertMessage {
		rows := make([]*driver.InsertMessage, n)
		for i := range rows {
			id++
			rows[i] = &driver.InsertMessage{Tenant: "t", Topic: "x", PartitionKey: "k", ID: fmt.Sprint(id),
				Headers: map[string]string{"queue_name": "t"}, CreatedAt: clock.Now()}
		}
		return rows
	}
	store := func(rows []*driver.InsertMessage) {
		t.Helper()
		tx, err := drv.BeginWrite(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := drv.InsertMessages(ctx, tx, rows); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	// measureNow lets the measure go stale and waits for the one the next
	// check starts in the background.
	measureNow := func() {
		t.Helper()
		clock.Add(time.Minute)
		end, err := c.tenants.admit(ctx, "t", nil, false)
		if err != nil {
			t.Fatal(err)
		}
		end(publish.Ended)
		c.tenants.bg.Wait()
	}
	refused := func(n int, usage int64) {
		t.Helper()
		var qe *QuotaExceededError
		if _, err := c.tenants.admit(ctx, "t", batch(n), false); !errors.As(err, &qe) || qe.Usage != usage {
			t.Fatalf("admit %d: %v; want max_messages refused at %d", n, err, usage)
		}
	}
	first := batch(150)
	end, err := c.tenants.admit(ctx, "t", first, false) // measured 0
	if err != nil {
		t.Fatal(err)
	}
	measureNow() // starts while the batch is in flight: 0
	store(first)
	end(publish.Ended)
	refused(100, 150) // the measure misses it; the client does not
	measureNow()      // holds the 150
	refused(100, 150)
	second := batch(30)
	end, err = c.tenants.admit(ctx, "t", second, false)
	if err != nil {
		t.Fatal(err)
	}
	end(publish.EndsUnseen) // in a caller's transaction, not yet committed
	measureNow()
	refused(100, 180)
	measureNow()
	store(second) // committed later than the two measures: no longer held
	refused(100, 150)
	measureNow()
	refused(100, 180)
	end, err = c.tenants.admit(ctx, "t", batch(20), false)
	if err != nil {
		t.Fatalf("admit up to the limit: %v", err)
	}
	end(publish.Ended)
	refused(1, 200)
}

// Near its partitions quota, a write to a new partition counts the new
// partitions of the client's writes in flight: two concurrent writes to
// new keys cannot both take the last one. A write to an existing
// partition still goes through.
func TestPartitionsQuotaCountsNewKeysInFlight(t *testing.T) {
	drv := testdb.Migrated(t, testdb.SQLite(t))
	c, err := NewClient(drv, &Config{TenantSettingsTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	row := func(key string) []*driver.InsertMessage {
		return []*driver.InsertMessage{{Tenant: "t", Topic: "x", PartitionKey: key, ID: key + "-1", Headers: map[string]string{}, CreatedAt: time.Now().UTC()}}
	}
	if _, err := c.Publish(ctx, Message{Tenant: "t", Topic: "x", PartitionKey: "a"}); err != nil {
		t.Fatal(err)
	}
	if err := c.Admin().SetTenantLimits(ctx, "t", TenantLimits{MaxPartitions: 2}); err != nil {
		t.Fatal(err)
	}
	endB, err := c.tenants.admit(ctx, "t", row("b"), false) // in flight
	if err != nil {
		t.Fatal(err)
	}
	var qe *QuotaExceededError
	if _, err := c.tenants.admit(ctx, "t", row("c"), false); !errors.As(err, &qe) || qe.Quota != QuotaMaxPartitions || qe.Usage != 2 {
		t.Fatalf("a new key while another is in flight: %v; want max_partitions refused at 2", err)
	}
	end, err := c.tenants.admit(ctx, "t", row("a"), false)
	if err != nil {
		t.Fatalf("an existing key: %v", err)
	}
	end(publish.Ended)
	endB(publish.Ended) // failed: nothing stored
	end, err = c.tenants.admit(ctx, "t", row("c"), false)
	if err != nil {
		t.Fatalf("a new key once the other write ended unstored: %v", err)
	}
	end(publish.Ended)
}

// A large write given up while it waits for the byte rate gives back
// all it reserved, not only its last second's worth: the next publish is
// not refused for the rate of chunks never written.
func TestLargeWriteGivenUpGivesTheRateBack(t *testing.T) {
	clock := testdb.NewClock(time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC))
	c, err := NewClient(testdb.Migrated(t, testdb.SQLite(t)), &Config{Clock: clock.Now, TenantSettingsTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const rate = 64 << 10
	if err := c.Admin().SetTenantLimits(ctx, "t", TenantLimits{PublishByteRate: rate}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Publish(ctx, Message{Tenant: "t", Topic: "x", PartitionKey: "k"}); err != nil { // reads the limits
		t.Fatal(err)
	}
	// Eight seconds' worth in one chunk transaction; the client goes away
	// once it has sent it, while the write waits for the rate.
	body := readerFunc(bytes.NewReader(make([]byte, 8*rate)), cancel)
	_, err = c.PublishLarge(ctx, Message{Tenant: "t", Topic: "files", PartitionKey: "f", ID: "big"}, body, &LargeOptions{ChunkSize: rate, ChunksPerTx: 16})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("large write given up: %v", err)
	}
	if _, err := c.Publish(context.Background(), Message{Tenant: "t", Topic: "x", PartitionKey: "k", Payload: make([]byte, rate/2)}); err != nil {
		t.Fatalf("a publish after the write was given up: %v; want the rate it reserved given back", err)
	}
}

// readerFunc reads r and calls atEOF when it is drained.
func readerFunc(r io.Reader, atEOF func()) io.Reader { return &eofReader{r: r, atEOF: atEOF} }

type eofReader struct {
	r     io.Reader
	atEOF func()
}

func (e *eofReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err == io.EOF {
		e.atEOF()
	}
	return n, err
}
