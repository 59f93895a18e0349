// SPDX-License-Identifier: Apache-2.0

package conformance

import (
	"bytes"
	"context"
	"errors"
	"io"
	"slices"
	"testing"
	"time"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
)

var largeTests = []conformanceTest{
	{"PublishDuringLargeWrite", testPublishDuringLargeWrite},
}

// interleaved is what testPublishDuringLargeWrite stores in key "shared":
// a large message whose write others publish into, then one message more.
type interleaved struct {
	body []byte
	want []string // ids in the order every reader gets them
}

// writeInterleaved stores a large message "big" of three chunks in key
// "shared" of tenant t, topic x, one chunk a transaction, and publishes
// "a", then "b" and "c" in one call, into the same key after its chunk 0
// and before its end marker; then "d" after it.
func writeInterleaved(t *testing.T, d driver.Driver, c *shardq.Client) interleaved {
	t.Helper()
	ctx := context.Background()
	body := bytes.Repeat([]byte("0123456789"), 300)
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		_, err := c.PublishLarge(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "shared", ID: "big"}, pr,
			&shardq.LargeOptions{ChunkSize: 1000, ChunksPerTx: 1})
		pr.CloseWithError(err)
		done <- err
	}()
	if _, err := pw.Write(body[:1500]); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); len(fetchAll(t, d, "t", "x", "shared")) == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("chunk 0 was never stored")
		}
	}
	mustPublish(t, c, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "shared", ID: "a", Payload: []byte("a")})
	mustPublish(t, c, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "shared", ID: "b", Payload: []byte("b")},
		shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "shared", ID: "c", Payload: []byte("c")})
	if _, err := pw.Write(body[1500:]); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	if err := <-done; err != nil {
		t.Fatalf("publish large: %v", err)
	}
	mustPublish(t, c, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "shared", ID: "d", Payload: []byte("d")})
	var order []string
	for _, m := range fetchAll(t, d, "t", "x", "shared") {
		order = append(order, m.ID)
	}
	if want := []string{"big#0", "a", "b", "c", "big#1", "big#2", "big", "d"}; !slices.Equal(order, want) {
		t.Fatalf("stored %v, want %v: the test needs the messages among the chunks", order, want)
	}
	return interleaved{body: body, want: []string{"big", "a", "b", "c", "d"}}
}

// A message published to a key while a large message is written there
// is never skipped: the large message takes its chunk 0's place, and
// what was published among its chunks comes after it, in offset order,
// once each, to every reader (subscriber, group receiver, receipts), and
// stays in place when the large message is dead-lettered.
func testPublishDuringLargeWrite(t *testing.T, open Open) {
	d, c := setup(t, open, nil)
	ctx := context.Background()
	w := writeInterleaved(t, d, c)
	check := func(reader string, got []string, bodies map[string][]byte) {
		t.Helper()
		if !slices.Equal(got, w.want) {
			t.Fatalf("%s got %v, want %v", reader, got, w.want)
		}
		if !bytes.Equal(bodies["big"], w.body) {
			t.Fatalf("%s read %d bytes of the large message, want %d", reader, len(bodies["big"]), len(w.body))
		}
	}

	// A subscriber.
	got, bodies := make(chan string, 20), map[string][]byte{}
	sub, err := c.Subscribe(ctx, shardq.SubscriberConfig{ConsumerGroup: "sub", Topic: "x", Tenants: []string{"t"},
		Handler: func(_ context.Context, dl *shardq.Delivery) error {
			b, err := io.ReadAll(dl.Body())
			if err != nil {
				return err
			}
			bodies[dl.ID] = b
			got <- dl.ID
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	var subGot []string
	for len(subGot) < len(w.want) {
		select {
		case id := <-got:
			subGot = append(subGot, id)
		case <-time.After(30 * time.Second):
			t.Fatalf("subscriber: got %v, want %v", subGot, w.want)
		}
	}
	if err := sub.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	check("subscriber", subGot, bodies)

	// A group receiver.
	g := shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "recv"}
	r, err := c.AcceptGroup(ctx, g, "shared", nil)
	if err != nil {
		t.Fatal(err)
	}
	var recvGot []string
	bodies = map[string][]byte{}
	for len(recvGot) < len(w.want) {
		rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		dl, err := r.Receive(rctx)
		cancel()
		if err != nil {
			t.Fatalf("receiver after %v: %v", recvGot, err)
		}
		if bodies[dl.ID], err = io.ReadAll(dl.Body()); err != nil {
			t.Fatal(err)
		}
		recvGot = append(recvGot, dl.ID)
		if err := r.Ack(ctx, dl); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	check("group receiver", recvGot, bodies)

	// Receipts, as shardq serve receives.
	rc, err := c.Receipts(nil)
	if err != nil {
		t.Fatal(err)
	}
	g.ConsumerGroup = "rcpt"
	var rcptGot []string
	bodies = map[string][]byte{}
	for round := 0; len(rcptGot) < len(w.want) && round < 20; round++ {
		res, err := rc.Receive(ctx, shardq.ReceiveRequest{Tenant: "t", Topic: "x", ConsumerGroup: "rcpt", PartitionKey: "shared", Max: 10, Wait: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		var receipts []string
		for _, m := range res.Messages {
			rcptGot = append(rcptGot, m.ID)
			receipts = append(receipts, m.Receipt)
			bodies[m.ID] = m.Payload
			if m.IsLarge() {
				lb, err := rc.Body(ctx, g, m.Receipt)
				if err != nil {
					t.Fatal(err)
				}
				if bodies[m.ID], err = io.ReadAll(lb); err != nil {
					t.Fatal(err)
				}
			}
		}
		if len(receipts) > 0 {
			if stale, err := rc.AckAll(ctx, g, receipts); err != nil || len(stale) > 0 {
				t.Fatalf("ack %v: stale %v, %v", receipts, stale, err)
			}
		}
	}
	check("receipts", rcptGot, bodies)
	if res, err := rc.Receive(ctx, shardq.ReceiveRequest{Tenant: "t", Topic: "x", ConsumerGroup: "rcpt", PartitionKey: "shared", Max: 10}); err != nil || len(res.Messages) != 0 {
		t.Fatalf("receipts after all: %d messages, %v", len(res.Messages), err)
	}

	// Dead-lettered, the large message moves whole and alone; what was
	// published among its chunks stays, and comes next.
	r, err = c.AcceptGroup(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "dl"}, "shared", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop(ctx)
	var dlGot []string
	for len(dlGot) < len(w.want) {
		rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		dl, err := r.Receive(rctx)
		cancel()
		if err != nil {
			t.Fatalf("receiver after %v: %v", dlGot, err)
		}
		dlGot = append(dlGot, dl.ID)
		if dl.ID == "big" {
			err = r.DeadLetter(ctx, dl, errors.New("poison"))
		} else {
			err = r.Ack(ctx, dl)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if !slices.Equal(dlGot, w.want) {
		t.Fatalf("dead-lettering receiver got %v, want %v", dlGot, w.want)
	}
	var dead []string
	for _, m := range fetchAll(t, d, "t", "x.dlq", "shared") {
		dead = append(dead, m.ID)
	}
	if want := []string{"big#0", "big#1", "big#2", "big"}; !slices.Equal(dead, want) {
		t.Fatalf("dead letters %v, want %v", dead, want)
	}
	if n := len(fetchAll(t, d, "t", "x", "shared")); n != 8 {
		t.Fatalf("%d messages left in the topic, want all 8", n)
	}
}
