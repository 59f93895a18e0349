// SPDX-License-Identifier: Apache-2.0

package conformance

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/shardq/shardq"
)

// A message past its expiry (Message.TTL, ExpiresAt) is never handed out
// by any reader: receipts, subscribers (batches too) and group receivers
// pass over it, the messages after it coming in order, or dead-letter it
// when asked; publishing refuses an expiry that could never be met. On an
// injected clock.
func testMessagesExpire(t *testing.T, open Open) {
	clock := newFakeClock(time.Now())
	d, c := setup(t, open, &shardq.Config{Clock: clock.Now})
	ctx := context.Background()

	for _, bad := range []shardq.Message{
		{TTL: -time.Second},
		{TTL: time.Minute, ExpiresAt: clock.Now().Add(time.Hour)},
		{ExpiresAt: clock.Now().Add(-time.Second)},
		{ExpiresAt: clock.Now().Add(time.Minute), NotBefore: clock.Now().Add(time.Hour)},
		{Headers: map[string]string{"shardq-expires-at": "tomorrow"}},
		{Headers: map[string]string{"shardq-expires-at": clock.Now().Add(time.Hour).Format(time.RFC3339)}, TTL: time.Minute},
	} {
		bad.Tenant, bad.Topic, bad.PartitionKey, bad.ID = "t", "x", "k", "bad"
		if _, err := c.Publish(ctx, bad); !errors.Is(err, shardq.ErrInvalid) {
			t.Errorf("publish with expiry %v/%v/%v = %v, want ErrInvalid", bad.TTL, bad.ExpiresAt, bad.Headers, err)
		}
	}
	if _, err := c.PublishLarge(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "big", TTL: time.Minute}, bytes.NewReader([]byte("x")), nil); !errors.Is(err, shardq.ErrInvalid) {
		t.Errorf("a large message with a TTL = %v, want ErrInvalid", err)
	}
	if got := fetchAll(t, d, "t", "x", "k"); len(got) != 0 {
		t.Fatalf("refused publishes stored %d messages", len(got))
	}

	msg := func(topic, key, id string, ttl time.Duration) shardq.Message {
		return shardq.Message{Tenant: "t", Topic: topic, PartitionKey: key, ID: id, TTL: ttl}
	}
	published := clock.Now()
	mustPublish(t, c, msg("x", "k", "e1", time.Minute), msg("x", "k", "k2", 0), msg("x", "k", "e3", time.Minute), msg("x", "k", "k4", 0),
		msg("x", "", "u1", time.Minute), msg("x", "", "u2", 0), msg("x", "k", "k5", time.Hour))
	clock.Advance(2 * time.Minute) // e1, e3 and u1 have expired; k5 has not

	// Receipts pass over them.
	r := receipts(t, c, clock, 0)
	first := mustReceive(t, r, shardq.ReceiveRequest{PartitionKey: "k", Max: 10}, "k2") // e3 goes first in the next receive
	if err := r.Ack(ctx, gref, first[0].Receipt); err != nil {
		t.Fatal(err)
	}
	rest := mustReceive(t, r, shardq.ReceiveRequest{PartitionKey: "k", Max: 10}, "k4", "k5")
	if want := published.Add(time.Hour).Truncate(time.Millisecond); !rest[1].ExpiresAt.Equal(want) || !rest[0].ExpiresAt.IsZero() {
		t.Fatalf("ExpiresAt %v and %v, want zero and %v", rest[0].ExpiresAt, rest[1].ExpiresAt, want)
	}
	mustReceive(t, r, shardq.ReceiveRequest{Ungrouped: true, Max: 10}, "u2")
	if dlq := append(fetchAll(t, d, "t", "x.dlq", "k"), fetchAll(t, d, "t", "x.dlq", "")...); len(dlq) != 0 {
		t.Fatalf("dead letters %v, want none (not asked for)", dlq)
	}

	// A long run of expired messages: no receive hands one out.
	var run []shardq.Message
	for i := range 9 {
		run = append(run, msg("w", "k", fmt.Sprintf("e%d", i), time.Minute))
	}
	mustPublish(t, c, append(run, msg("w", "k", "live", 0))...)
	clock.Advance(2 * time.Minute)
	for i := 0; ; i++ {
		res, err := r.Receive(ctx, shardq.ReceiveRequest{Tenant: "t", Topic: "w", ConsumerGroup: "g", PartitionKey: "k"})
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Messages) > 0 {
			if res.Messages[0].ID != "live" {
				t.Fatalf("receive %d handed out %s, expired", i, res.Messages[0].ID)
			}
			break
		}
		if i == 5 {
			t.Fatal("the live message after the expired run never came")
		}
	}

	// A message that expires while it waits for its retry is not retried.
	mustPublish(t, c, msg("v", "k", "v1", 10*time.Second), msg("v", "k", "v2", 0))
	var vmu sync.Mutex
	vseen := map[string]int{}
	vsub, err := c.Subscribe(ctx, shardq.SubscriberConfig{ConsumerGroup: "s", Topic: "v", Tenants: []string{"t"}, Clock: clock.Now,
		Handler: func(_ context.Context, d *shardq.Delivery) error {
			vmu.Lock()
			defer vmu.Unlock()
			vseen[d.ID]++
			if d.ID == "v1" {
				clock.Advance(11 * time.Second) // past its expiry before its retry
				return errors.New("fails")
			}
			return nil
		}, LeaseTTL: 30 * time.Second, HeartbeatInterval: 100 * time.Millisecond, StaleAfter: 20 * time.Second,
		DiscoveryInterval: 50 * time.Millisecond, PollInterval: 10 * time.Millisecond, BackoffMin: time.Millisecond, BackoffMax: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "v2", 10*time.Second, func() bool { vmu.Lock(); defer vmu.Unlock(); return vseen["v2"] > 0 })
	if err := vsub.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if vseen["v1"] != 1 {
		t.Fatalf("v1 handed out %d times, want once (expired before its retry)", vseen["v1"])
	}

	// A subscriber's batches stop before an expired message.
	var mu sync.Mutex
	var batches [][]string
	sub, err := c.Subscribe(ctx, shardq.SubscriberConfig{ConsumerGroup: "s", Topic: "x", Tenants: []string{"t"}, Clock: clock.Now,
		BatchHandler: func(_ context.Context, ds []*shardq.Delivery) error {
			mu.Lock()
			defer mu.Unlock()
			var ids []string
			for _, d := range ds {
				ids = append(ids, d.ID)
			}
			batches = append(batches, ids)
			return nil
		}, LeaseTTL: 30 * time.Second, HeartbeatInterval: 100 * time.Millisecond, StaleAfter: 20 * time.Second,
		DiscoveryInterval: 50 * time.Millisecond, PollInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	flat := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Sorted(slices.Values(slices.Concat(batches...)))
	}
	waitFor(t, "the subscriber's deliveries", 10*time.Second, func() bool { return len(flat()) >= 4 })
	if err := sub.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if got := flat(); !slices.Equal(got, []string{"k2", "k4", "k5", "u2"}) {
		t.Fatalf("subscriber got %v (batches %v), want k2, k4, k5, u2", got, batches)
	}
	for _, b := range batches {
		if slices.Contains(b, "k2") && len(b) > 1 {
			t.Fatalf("batch %v ran past the expired e3", b)
		}
	}

	// A group receiver passes over them too.
	o := receiverOpts("rv")
	o.Clock = clock.Now
	rv, err := c.AcceptGroup(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "rv"}, "k", o)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"k2", "k4"} {
		got, err := rv.Receive(ctx)
		if err != nil || got.ID != want {
			t.Fatalf("receiver got %v, %v; want %s", got, err, want)
		}
		if err := rv.Ack(ctx, got); err != nil {
			t.Fatal(err)
		}
	}
	if err := rv.Stop(ctx); err != nil {
		t.Fatal(err)
	}

	// Asked for, expired messages are dead-lettered, without their expiry.
	mustPublish(t, c, msg("y", "k", "e1", time.Minute), msg("y", "k", "k2", 0), msg("y", "", "u1", time.Minute), msg("y", "", "u2", 0))
	clock.Advance(2 * time.Minute)
	var handled []string
	sub, err = c.Subscribe(ctx, shardq.SubscriberConfig{ConsumerGroup: "s", Topic: "y", Tenants: []string{"t"}, Clock: clock.Now, DeadLetterExpired: true,
		Handler: func(_ context.Context, d *shardq.Delivery) error {
			mu.Lock()
			defer mu.Unlock()
			handled = append(handled, d.ID)
			return nil
		}, LeaseTTL: 30 * time.Second, HeartbeatInterval: 100 * time.Millisecond, StaleAfter: 20 * time.Second,
		DiscoveryInterval: 50 * time.Millisecond, PollInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	dead := func() []string {
		var ids []string
		for _, key := range []string{"k", ""} {
			for _, m := range fetchAll(t, d, "t", "y.dlq", key) {
				if _, ok := m.Headers["shardq-expires-at"]; ok {
					t.Fatalf("dead letter %s keeps its expiry", m.ID)
				}
				ids = append(ids, m.ID)
			}
		}
		return ids
	}
	waitFor(t, "the dead letters", 10*time.Second, func() bool { return len(dead()) == 2 })
	waitFor(t, "the deliveries", 10*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(handled) == 2 })
	if err := sub.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if got := slices.Sorted(slices.Values(handled)); !slices.Equal(got, []string{"k2", "u2"}) || !slices.Equal(dead(), []string{"e1", "u1"}) {
		t.Fatalf("handled %v, dead letters %v; want k2, u2 and e1, u1", got, dead())
	}

	// Receipts asked for dead letters: topic z, a message group and an ungrouped one.
	mustPublish(t, c, msg("z", "k", "e1", time.Minute), msg("z", "k", "k2", 0), msg("z", "", "u1", time.Minute))
	clock.Advance(2 * time.Minute)
	rd, err := c.Receipts(&shardq.ReceiptOptions{Name: "dl", DeadLetterExpired: true, Clock: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	for _, rq := range []shardq.ReceiveRequest{{PartitionKey: "k", Max: 10}, {Ungrouped: true, Max: 10}} {
		rq.Tenant, rq.Topic, rq.ConsumerGroup = "t", "z", "g"
		res, err := rd.Receive(ctx, rq)
		if err != nil || len(res.Messages) > 1 || rq.PartitionKey == "k" && (len(res.Messages) != 1 || res.Messages[0].ID != "k2") {
			t.Fatalf("receive %+v = %+v, %v", rq, res, err)
		}
	}
	if a, b := fetchAll(t, d, "t", "z.dlq", "k"), fetchAll(t, d, "t", "z.dlq", ""); len(a) != 1 || a[0].ID != "e1" || len(b) != 1 || b[0].ID != "u1" {
		t.Fatalf("dead letters %v and %v, want e1 and u1", a, b)
	}
}
