// SPDX-License-Identifier: Apache-2.0

package conformance

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
	receiptform "github.com/shardq/shardq/internal/receipts"
)

// deferredIDs receives the deferred messages at offsets and returns them
// with their ids.
func receiveDeferred(t *testing.T, c *shardq.Client, group string, offsets ...int64) ([]*shardq.Delivery, []string) {
	t.Helper()
	ds, err := c.ReceiveDeferred(context.Background(), shardq.DeferredRequest{Tenant: "t", Topic: "x", ConsumerGroup: group, Offsets: offsets, Visibility: time.Minute})
	if err != nil {
		t.Fatalf("receive deferred %v: %v", offsets, err)
	}
	var ids []string
	for _, d := range ds {
		ids = append(ids, d.ID)
	}
	return ds, ids
}

// Deferral (Service Bus's Defer): a subscriber's handler sets a message
// aside, ordered or ungrouped, and the partition goes on; the message is
// listed, counted in the lag report, kept by retention, and delivered
// again only when asked for by its offset, under a claim of its own that
// fences its settlement; it stays deferred until it is acked or
// dead-lettered. A GroupReceiver defers too. On an injected clock.
func testDeferral(t *testing.T, open Open) {
	clock := newFakeClock(time.Now())
	d, c := setup(t, open, &shardq.Config{Clock: clock.Now})
	ctx := context.Background()
	old := clock.Now().Add(-2 * time.Hour) // past the default MinRetention
	var msgs []shardq.Message
	for _, id := range []string{"m1", "m2", "m3"} {
		msgs = append(msgs, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: id, CreatedAt: old})
	}
	msgs = append(msgs, shardq.Message{Tenant: "t", Topic: "x", ID: "u1", CreatedAt: old}, shardq.Message{Tenant: "t", Topic: "x", ID: "u2", CreatedAt: old})
	res := mustPublish(t, c, msgs...)
	offset := map[string]int64{}
	for i, m := range msgs {
		offset[m.ID] = res[i].Offset
	}

	var mu sync.Mutex
	var seen []string
	var kept *shardq.Delivery
	cfg := fastConfig("g", "x", []string{"t"}, func(ctx context.Context, m *shardq.Delivery) error {
		mu.Lock()
		seen = append(seen, m.ID)
		kept = m
		mu.Unlock()
		if m.ID == "m2" || m.ID == "u1" {
			return m.Defer(ctx)
		}
		return nil
	})
	cfg.Clock = time.Now // its ungrouped cursor advances by its clock
	sub, err := c.Subscribe(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "every message handled", 30*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		if len(seen) < 5 {
			return false
		}
		offs, err := c.Admin().Offsets(ctx, shardq.Scope{Tenants: []string{"t"}}, "g")
		return err == nil && len(offs) == 2 && offs[0].PartitionKey == "" && offs[0].Lag == 0 && !offs[0].NoCursor
	})
	if err := sub.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Since(clock.Now()) + time.Second) // past the subscriber's clock (time.Now), which stamped the deferrals
	slices.Sort(seen)
	if fmt.Sprint(seen) != "[m1 m2 m3 u1 u2]" {
		t.Fatalf("handled %v, want each message once: the partition goes on past a deferred one", seen)
	}
	if err := kept.Defer(ctx); !errors.Is(err, shardq.ErrNoTxSettle) {
		t.Fatalf("Defer after the handler returned = %v, want ErrNoTxSettle", err)
	}

	// Listed, and counted in the lag report.
	list, err := c.Admin().Deferred(ctx, gref, 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].ID != "m2" || list[0].PartitionKey != "k" || list[1].ID != "u1" || list[1].PartitionKey != "" || list[0].HeldBy != "" {
		t.Fatalf("deferred list %+v, want m2 and u1, held by nobody", list)
	}
	offs, err := c.Admin().Offsets(ctx, shardq.Scope{Tenants: []string{"t"}}, "g")
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range offs {
		if o.Lag != 0 || o.Deferred != 1 {
			t.Errorf("lag report of partition %q: lag %d, %d deferred; want 0 and 1", o.PartitionKey, o.Lag, o.Deferred)
		}
	}

	// Retention keeps a deferred message, and what comes after it.
	rep, err := c.Admin().RunRetention(ctx, shardq.Scope{Tenants: []string{"t"}}, shardq.RetentionConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if got := idsOf(fetchAll(t, d, "t", "x", "k")); fmt.Sprint(got) != "[m2 m3]" {
		t.Fatalf("retention (%+v) left %v of partition k, want m2 (deferred) and m3", rep, got)
	}

	// Received by offset; an offset not deferred gives nothing.
	ds, got := receiveDeferred(t, c, "g", offset["u1"], offset["m1"], offset["m2"], offset["m3"])
	if fmt.Sprint(got) != "[m2 u1]" || ds[0].Attempt != 1 || ds[0].PartitionKey != "k" || string(ds[0].Payload) != "" {
		t.Fatalf("receive deferred = %v, want m2 and u1 at attempt 1", got)
	}
	if _, again := receiveDeferred(t, c, "g", offset["m2"], offset["u1"]); len(again) != 0 {
		t.Fatalf("held deliveries received again: %v", again)
	}
	if _, other := receiveDeferred(t, c, "h", offset["m2"]); len(other) != 0 {
		t.Fatalf("group h received g's deferred message: %v", other)
	}
	if list, _ := c.Admin().Deferred(ctx, gref, 0, 10); len(list) != 2 || list[0].HeldBy == "" {
		t.Fatalf("held deferred messages listed as %+v", list)
	}
	// A nack gives it back, deferred still, after its delay.
	if err := c.NackDeferred(ctx, ds[1], shardq.NackOptions{RetryAfter: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if _, again := receiveDeferred(t, c, "g", offset["u1"]); len(again) != 0 {
		t.Fatal("a nacked deferred message came back before its delay")
	}
	clock.Advance(11 * time.Second)
	u1, _ := receiveDeferred(t, c, "g", offset["u1"])
	if len(u1) != 1 || u1[0].Attempt != 2 {
		t.Fatalf("after the nack's delay: %d deliveries, want u1's second attempt", len(u1))
	}
	// The visibility passes: another caller receives it, and the first
	// holder's settlement is fenced out.
	clock.Advance(2 * time.Minute)
	u1b, _ := receiveDeferred(t, c, "g", offset["u1"])
	if len(u1b) != 1 {
		t.Fatal("a deferred message whose visibility passed was not received again")
	}
	if err := c.AckDeferred(ctx, u1[0]); !errors.Is(err, shardq.ErrLeaseLost) {
		t.Fatalf("ack by the holder whose visibility passed = %v, want ErrLeaseLost", err)
	}
	if err := c.AckDeferred(ctx, ds[0], u1[0]); !errors.Is(err, shardq.ErrLeaseLost) {
		t.Fatalf("ack of a batch with a claim taken over (u1's) = %v, want ErrLeaseLost", err)
	}
	if list, _ := c.Admin().Deferred(ctx, gref, 0, 10); len(list) != 2 {
		t.Fatalf("a failed batch ack settled some: %d left", len(list))
	}
	if err := c.DeadLetterDeferred(ctx, u1b[0], errors.New("no use")); err != nil {
		t.Fatal(err)
	}
	if dl := fetchAll(t, d, "t", "x.dlq", ""); len(dl) != 1 || dl[0].ID != "u1" || dl[0].Headers[shardq.HeaderDLQLastError] != "no use" {
		t.Fatalf("dead letters %+v, want u1", dl)
	}
	m2, _ := receiveDeferred(t, c, "g", offset["m2"])
	if len(m2) != 1 {
		t.Fatal("m2 not received again")
	}
	if err := c.AckDeferred(ctx, m2[0]); err != nil {
		t.Fatal(err)
	}
	if list, _ := c.Admin().Deferred(ctx, gref, 0, 10); len(list) != 0 {
		t.Fatalf("settled deferred messages still listed: %+v", list)
	}
	if _, again := receiveDeferred(t, c, "g", offset["m2"], offset["u1"]); len(again) != 0 {
		t.Fatalf("settled deferred messages received again: %v", again)
	}
	if err := c.AckDeferred(ctx, ds[0]); !errors.Is(err, shardq.ErrLeaseLost) {
		t.Fatalf("ack of a settled deferred message = %v, want ErrLeaseLost", err)
	}
	// Settled, it no longer holds retention back.
	if _, err := c.Admin().RunRetention(ctx, shardq.Scope{Tenants: []string{"t"}}, shardq.RetentionConfig{}); err != nil {
		t.Fatal(err)
	}
	if got := fetchAll(t, d, "t", "x", "k"); len(got) != 0 {
		t.Fatalf("retention kept %v after the deferred message was settled", idsOf(got))
	}

	// A GroupReceiver defers, and goes on; past MaxRetention a deferred
	// message goes, and its row with it.
	mustPublish(t, c, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "r", ID: "r1", CreatedAt: clock.Now().Add(-8 * 24 * time.Hour)},
		shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "r", ID: "r2"})
	rv, err := c.AcceptGroup(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "rv"}, "r", receiverOpts("rv"))
	if err != nil {
		t.Fatal(err)
	}
	defer rv.Stop(ctx)
	r1, err := rv.Receive(ctx)
	if err != nil || r1.ID != "r1" {
		t.Fatalf("receive = %v, %v", r1, err)
	}
	if err := rv.Defer(ctx, r1); err != nil {
		t.Fatal(err)
	}
	if r2, err := rv.Receive(ctx); err != nil || r2.ID != "r2" {
		t.Fatalf("after the deferral, receive = %v, %v; want r2", r2, err)
	}
	if list, _ := c.Admin().Deferred(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "rv"}, 0, 10); len(list) != 1 || list[0].ID != "r1" {
		t.Fatalf("the receiver's deferred messages: %+v", list)
	}
	if _, err := c.Admin().RunRetention(ctx, shardq.Scope{Tenants: []string{"t"}}, shardq.RetentionConfig{}); err != nil {
		t.Fatal(err)
	}
	var rows int
	if err := d.DB().QueryRowContext(ctx, "SELECT COUNT(*) FROM queue_deferred WHERE tenant = 't'").Scan(&rows); err != nil || rows != 0 {
		t.Fatalf("after a deferred message passed MaxRetention: %d deferred rows (%v), want 0", rows, err)
	}

	// Bad requests are refused before any SQL.
	for _, bad := range []shardq.DeferredRequest{
		{Tenant: "t", Topic: "x", ConsumerGroup: "g"},
		{Tenant: "t", Topic: "x", ConsumerGroup: "g", Offsets: []int64{0}},
		{Tenant: "t", Topic: "x", ConsumerGroup: "g", Offsets: make([]int64, shardq.MaxDeferredOffsets+1)},
		{Tenant: "t", Topic: "x", ConsumerGroup: "g", Offsets: []int64{1}, Visibility: time.Millisecond},
		{Tenant: "", Topic: "x", ConsumerGroup: "g", Offsets: []int64{1}},
	} {
		if _, err := c.ReceiveDeferred(ctx, bad); !errors.Is(err, shardq.ErrInvalid) {
			t.Errorf("ReceiveDeferred(%+v) = %v, want ErrInvalid", bad, err)
		}
	}
	if err := c.AckDeferred(ctx, kept); !errors.Is(err, shardq.ErrNotDeferred) {
		t.Errorf("AckDeferred of a subscriber's delivery = %v, want ErrNotDeferred", err)
	}
	var _ driver.Deferrals = d
}

// Deferral through receipts (the HTTP API's): a receipt defers its
// message, ordered (the cursor passes it, cumulatively) or ungrouped;
// deferred messages are received by offset with receipts of their own,
// which ack, nack (given back, deferred still) and change visibility,
// fenced as any receipt.
func testDeferralReceipts(t *testing.T, open Open) {
	clock := newFakeClock(time.Now())
	_, c := setup(t, open, &shardq.Config{Clock: clock.Now})
	ctx := context.Background()
	publishGroup(t, c, "k", "m1", "m2", "m3")
	publishGroup(t, c, "s", "n1", "n2", "n3")
	mustPublish(t, c, shardq.Message{Tenant: "t", Topic: "x", ID: "u1"})
	r := receipts(t, c, clock, 0)

	got := mustReceive(t, r, shardq.ReceiveRequest{PartitionKey: "k", Max: 3}, "m1", "m2", "m3")
	if stale, err := r.Defer(ctx, gref, []string{got[1].Receipt}); err != nil || len(stale) != 0 {
		t.Fatalf("defer m2: stale %v, %v", stale, err)
	}
	if err := r.Ack(ctx, gref, got[2].Receipt); err != nil {
		t.Fatal(err)
	}
	mustReceive(t, r, shardq.ReceiveRequest{PartitionKey: "k"}) // m1 passed with m2, m3 acked: nothing
	u := mustReceive(t, r, shardq.ReceiveRequest{Ungrouped: true}, "u1")
	if stale, err := r.Defer(ctx, gref, []string{u[0].Receipt}); err != nil || len(stale) != 0 {
		t.Fatalf("defer u1: stale %v, %v", stale, err)
	}
	mustReceive(t, r, shardq.ReceiveRequest{Ungrouped: true})
	// A message that an ack of a later one settled is not deferred.
	s := mustReceive(t, r, shardq.ReceiveRequest{PartitionKey: "s", Max: 3}, "n1", "n2", "n3")
	if err := r.Ack(ctx, gref, s[1].Receipt); err != nil { // the receive still holds the group
		t.Fatal(err)
	}
	if stale, err := r.Defer(ctx, gref, []string{s[0].Receipt}); err != nil || !slices.Equal(stale, []int{0}) {
		t.Fatalf("defer of a message a later ack settled: stale %v, %v; want [0]", stale, err)
	}
	if err := r.Ack(ctx, gref, s[2].Receipt); err != nil {
		t.Fatal(err)
	}
	list, err := c.Admin().Deferred(ctx, gref, 0, 10)
	if err != nil || len(list) != 2 || list[0].ID != "m2" || list[1].ID != "u1" {
		t.Fatalf("deferred %+v, %v; want m2 and u1", list, err)
	}

	clock.Advance(time.Second)
	rq := shardq.DeferredRequest{Tenant: "t", Topic: "x", ConsumerGroup: "g", Offsets: []int64{list[0].Offset, list[1].Offset}}
	ds, err := r.ReceiveDeferred(ctx, rq)
	if err != nil || len(ds) != 2 || ds[0].ID != "m2" || ds[1].ID != "u1" {
		t.Fatalf("receive deferred = %d messages, %v", len(ds), err)
	}
	if again, err := r.ReceiveDeferred(ctx, rq); err != nil || len(again) != 0 {
		t.Fatalf("held deferred messages received again: %d, %v", len(again), err)
	}
	if stale, err := r.Defer(ctx, gref, []string{ds[0].Receipt}); !errors.Is(err, shardq.ErrInvalid) || stale != nil {
		t.Fatalf("defer of a deferred message's receipt = %v, want ErrInvalid", err)
	}
	if err := r.Nack(ctx, gref, ds[0].Receipt, shardq.NackOptions{}); err != nil {
		t.Fatal(err)
	}
	if stale, err := r.ChangeVisibility(ctx, gref, []string{ds[1].Receipt}, 0); err != nil || len(stale) != 0 {
		t.Fatalf("change visibility: %v, %v", stale, err)
	}
	again, err := r.ReceiveDeferred(ctx, rq)
	if err != nil || len(again) != 2 || again[0].Attempt != 2 || again[1].Attempt != 2 {
		t.Fatalf("after a nack and a visibility of 0: %d messages, %v; want both at attempt 2", len(again), err)
	}
	if err := r.Ack(ctx, gref, ds[1].Receipt); !errors.Is(err, shardq.ErrStaleReceipt) {
		t.Fatalf("ack by the receipt whose message was received again = %v, want ErrStaleReceipt", err)
	}
	if stale, err := r.AckAll(ctx, gref, []string{again[0].Receipt, again[1].Receipt}); err != nil || len(stale) != 0 {
		t.Fatalf("ack all: %v, %v", stale, err)
	}
	if list, err := c.Admin().Deferred(ctx, gref, 0, 10); err != nil || len(list) != 0 {
		t.Fatalf("after the acks, deferred %+v, %v", list, err)
	}
}

// resign edits a receipt's fields and signs it again with the database's
// key: a receipt that is signed but wrong (a bug, a leaked key).
func resign(t *testing.T, d driver.Driver, rcpt string, edit func(*receiptform.Receipt)) string {
	t.Helper()
	parts := strings.Split(strings.TrimPrefix(rcpt, receiptform.Prefix), ".")
	body, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	rc, ok := receiptform.ReadBinary(body)
	if !ok {
		t.Fatalf("receipt %s: body is not binary", rcpt)
	}
	edit(&rc)
	var secret []byte
	if err := d.DB().QueryRow("SELECT secret FROM shardq_receipt_keys WHERE key_id = ?", parts[0]).Scan(&secret); err != nil {
		t.Fatal(err)
	}
	signed := receiptform.Prefix + parts[0] + "." + base64.RawURLEncoding.EncodeToString(rc.AppendBinary(nil))
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(signed))
	return signed + "." + base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

// A receipt's deferral keeps the receive's lease as long as its
// visibility (another receive does not get the group meanwhile); a
// receipt signed with an offset past the partition's head defers nothing
// and moves no cursor; an expired deferred message is dead-lettered when
// the receipts' options ask for it.
func testDeferralReceiptsFence(t *testing.T, open Open) {
	clock := newFakeClock(time.Now())
	d, c := setup(t, open, &shardq.Config{Clock: clock.Now})
	ctx := context.Background()
	publishGroup(t, c, "k", "m1", "m2", "m3")
	a, b := receipts(t, c, clock, 0), receipts(t, c, clock, 0)
	got := mustReceive(t, a, shardq.ReceiveRequest{PartitionKey: "k", Max: 3, Visibility: 10 * time.Minute}, "m1", "m2", "m3")
	if stale, err := a.Defer(ctx, gref, []string{got[0].Receipt}); err != nil || len(stale) != 0 {
		t.Fatalf("defer m1: %v, %v", stale, err)
	}
	clock.Advance(time.Minute)
	mustReceive(t, b, shardq.ReceiveRequest{PartitionKey: "k", Max: 3}) // held for 10 minutes: nothing
	if err := a.Ack(ctx, gref, got[2].Receipt); err != nil {
		t.Fatalf("the holder's ack of m3 a minute into its 10: %v", err)
	}

	publishGroup(t, c, "h", "h1")
	h := mustReceive(t, a, shardq.ReceiveRequest{PartitionKey: "h"}, "h1")
	past := resign(t, d, h[0].Receipt, func(rc *receiptform.Receipt) { rc.Offset, rc.Last = 1_000_000, 1_000_000 })
	if _, err := a.Defer(ctx, gref, []string{past}); !errors.Is(err, shardq.ErrInvalid) {
		t.Fatalf("defer of a receipt past the head = %v, want ErrInvalid", err)
	}
	publishGroup(t, c, "h", "h2")
	if err := a.Ack(ctx, gref, h[0].Receipt); err != nil {
		t.Fatal(err)
	}
	mustReceive(t, b, shardq.ReceiveRequest{PartitionKey: "h"}, "h2") // not skipped

	mustPublish(t, c, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "e", ID: "e1", TTL: time.Minute})
	o := &shardq.ReceiptOptions{Name: "api", Clock: clock.Now, DeadLetterExpired: true}
	dle, err := c.Receipts(o)
	if err != nil {
		t.Fatal(err)
	}
	e := mustReceive(t, dle, shardq.ReceiveRequest{PartitionKey: "e"}, "e1")
	if _, err := dle.Defer(ctx, gref, []string{e[0].Receipt}); err != nil {
		t.Fatal(err)
	}
	clock.Advance(2 * time.Minute)
	if ds, err := dle.ReceiveDeferred(ctx, shardq.DeferredRequest{Tenant: "t", Topic: "x", ConsumerGroup: "g", Offsets: []int64{e[0].Offset}}); err != nil || len(ds) != 0 {
		t.Fatalf("an expired deferred message was handed out: %d, %v", len(ds), err)
	}
	if dl := fetchAll(t, d, "t", "x.dlq", "e"); len(dl) != 1 || dl[0].ID != "e1" {
		t.Fatalf("dead letters %v, want the expired deferred e1", idsOf(dl))
	}
	if list, _ := c.Admin().Deferred(ctx, gref, 0, 10); len(list) != 1 || list[0].ID != "m1" {
		t.Fatalf("deferred %+v, want m1 only", list)
	}
}
