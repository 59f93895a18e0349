// SPDX-License-Identifier: Apache-2.0

package shardq_test

// The other quota tests are internal/tenants' own (quotas_test.go): these
// need a Client, to publish large messages.

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/internal/testdb"
)

// A large message's chunk transactions wait for the byte rate, in pieces
// of a second's worth, rather than fail: a transaction larger than the
// rate allows at once still goes through. An ordinary publish over a
// second's worth is refused for good.
func TestLargeMessageWaitsForTheByteRate(t *testing.T) {
	c, err := shardq.NewClient(testdb.Migrated(t, testdb.SQLite(t)), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	const rate = 256 << 10
	if err := c.Admin().SetTenantLimits(ctx, "t", shardq.TenantLimits{PublishByteRate: rate}); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, rate+rate/2) // two transactions of 4 chunks of 96 KiB, each over a second's worth at once
	res, err := c.PublishLarge(ctx, shardq.Message{Tenant: "t", Topic: "files", PartitionKey: "f", ID: "big"}, bytes.NewReader(body),
		&shardq.LargeOptions{ChunkSize: 96 << 10, ChunksPerTx: 4})
	if err != nil || res.Bytes != int64(len(body)) {
		t.Fatalf("large message under a byte rate: %+v, %v", res, err)
	}
	_, err = c.Publish(ctx, shardq.Message{Tenant: "t", Topic: "files", PartitionKey: "g", Payload: make([]byte, rate+1)})
	var qe *shardq.QuotaExceededError
	if !errors.As(err, &qe) || qe.Quota != shardq.QuotaPublishByteRate || qe.RetryAfter != 0 {
		t.Fatalf("an ordinary publish over a second's worth: %v", err)
	}
}

// A large write given up while it waits for the byte rate gives back
// all it reserved, not only its last second's worth: the next publish is
// not refused for the rate of chunks never written.
func TestLargeWriteGivenUpGivesTheRateBack(t *testing.T) {
	clock := testdb.NewClock(time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC))
	c, err := shardq.NewClient(testdb.Migrated(t, testdb.SQLite(t)), &shardq.Config{Clock: clock.Now, TenantSettingsTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const rate = 64 << 10
	if err := c.Admin().SetTenantLimits(ctx, "t", shardq.TenantLimits{PublishByteRate: rate}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Publish(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k"}); err != nil { // reads the limits
		t.Fatal(err)
	}
	// Eight seconds' worth in one chunk transaction; the client goes away
	// once it has sent it, while the write waits for the rate.
	body := atEOF(bytes.NewReader(make([]byte, 8*rate)), cancel)
	_, err = c.PublishLarge(ctx, shardq.Message{Tenant: "t", Topic: "files", PartitionKey: "f", ID: "big"}, body, &shardq.LargeOptions{ChunkSize: rate, ChunksPerTx: 16})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("large write given up: %v", err)
	}
	if _, err := c.Publish(context.Background(), shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", Payload: make([]byte, rate/2)}); err != nil {
		t.Fatalf("a publish after the write was given up: %v; want the rate it reserved given back", err)
	}
}

// atEOF reads r and calls fn when it is drained.
func atEOF(r io.Reader, fn func()) io.Reader { return &eofReader{r: r, atEOF: fn} }

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
