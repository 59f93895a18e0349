// SPDX-License-Identifier: Apache-2.0

package conformance

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/testdb"
)

var tenantTests = []conformanceTest{
	{"SuspendTenant", testSuspendTenant},
	{"SuspendGivesBackClaims", testSuspendGivesBackClaims},
	{"SuspendStopsRetries", testSuspendStopsRetries},
	{"SuspendStopsConsumerWrites", testSuspendStopsConsumerWrites},
	{"ListTenants", testListTenants},
	{"ExportTenant", testExportTenant},
	{"TenantRateQuotas", testTenantRateQuotas},
	{"TenantStorageQuotas", testTenantStorageQuotas},
	{"TenantStoredBytes", testTenantStoredBytes},
	{"TenantRetention", testTenantRetention},
}

// A suspended tenant publishes and receives nothing (this client at once,
// another within its TenantSettingsTTL), its member releases its leases
// and delivers nothing more, another tenant of the same member goes on,
// and a resume delivers what was stored meanwhile.
func testSuspendTenant(t *testing.T, open Open) {
	d, c := setup(t, open, nil)
	ctx := context.Background()
	clock := testdb.NewClock(time.Now())
	other, err := shardq.NewClient(d, &shardq.Config{Clock: clock.Now, TenantSettingsTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	for _, tenant := range []string{"t", "u"} {
		publishSpread(t, c, tenant, "x", 4, 20)
	}
	mustPublish(t, other, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k0", ID: "cached"}) // other reads t as active
	rec := newRecorder()
	s, err := c.Subscribe(ctx, fastConfig("g", "x", []string{"t", "u"}, rec.handle))
	if err != nil {
		t.Fatal(err)
	}
	defer stopAll(t, s)
	waitFor(t, "both tenants consumed", 30*time.Second, func() bool { return rec.total.Load() == 41 })

	if err := c.Admin().SuspendTenant(ctx, "t"); err != nil {
		t.Fatal(err)
	}
	_, err = c.Publish(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k0", ID: "refused"})
	var susp *shardq.TenantSuspendedError
	if !errors.Is(err, shardq.ErrTenantSuspended) || !errors.As(err, &susp) || susp.Tenant != "t" || susp.Since.IsZero() {
		t.Fatalf("publish to a suspended tenant: %v, want a *TenantSuspendedError naming it", err)
	}
	tx, err := d.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.PublishTx(ctx, tx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k0", ID: "refused-tx"}); !errors.Is(err, shardq.ErrTenantSuspended) {
		t.Fatalf("PublishTx to a suspended tenant: %v", err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.AcceptGroup(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "r"}, "k0", receiverOpts("r")); !errors.Is(err, shardq.ErrTenantSuspended) {
		t.Fatalf("accept in a suspended tenant: %v", err)
	}
	rcpts, err := c.Receipts(nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rcpts.Receive(ctx, shardq.ReceiveRequest{Tenant: "t", Topic: "x", ConsumerGroup: "r", Ungrouped: true, Max: 1}); !errors.Is(err, shardq.ErrTenantSuspended) {
		t.Fatalf("receive in a suspended tenant: %v", err)
	}
	// The member lets t's partitions go (within a tick) and keeps
	// serving u.
	waitFor(t, "the suspended tenant's leases released", 30*time.Second, func() bool {
		_, leases, err := d.TenantLive(ctx, "t", time.Now(), time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return leases == 0
	})
	// Another client's cache holds t as active until its TTL passes: what
	// it stores meanwhile waits for the resume.
	mustPublish(t, other, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k0", ID: "held"})
	clock.Add(time.Minute)
	if _, err := other.Publish(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k0", ID: "refused-later"}); !errors.Is(err, shardq.ErrTenantSuspended) {
		t.Fatalf("another client's publish after its TTL: %v", err)
	}
	mustPublish(t, c, shardq.Message{Tenant: "u", Topic: "x", PartitionKey: "k0", ID: "u-during"})
	waitFor(t, "the other tenant served", 30*time.Second, func() bool { return rec.delivered("u-during") })
	if rec.delivered("held") {
		t.Fatal("a suspended tenant's message was delivered")
	}
	if err := c.Admin().ResumeTenant(ctx, "t"); err != nil {
		t.Fatal(err)
	}
	mustPublish(t, c, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k0", ID: "after"})
	waitFor(t, "the held messages after the resume", 30*time.Second, func() bool { return rec.delivered("held") && rec.delivered("after") })
	for _, id := range []string{"refused", "refused-tx", "refused-later"} {
		if m, _, err := d.GetMessage(ctx, driver.MessageRef{Tenant: "t", Topic: "x", PartitionKey: "k0", ID: id}); err != nil || m != nil {
			t.Fatalf("refused message %s: stored %v, %v", id, m, err)
		}
	}
	if err := c.Admin().SuspendTenant(ctx, "bad tenant "); err == nil || !strings.Contains(err.Error(), "tenant") {
		t.Fatalf("suspending a malformed tenant: %v", err)
	}
}

// A suspended tenant's consumers write nothing more: a message group's
// state, a deferral, a longer visibility, a receive of deferred messages
// are refused (ErrTenantSuspended) and change nothing, through a group
// receiver, receipts and a subscriber's handler alike. Settling what is
// in hand goes on: acks (a receive's too), nacks, a visibility of 0 and
// closing a session.
func testSuspendStopsConsumerWrites(t *testing.T, open Open) {
	_, c := setup(t, open, nil)
	ctx := context.Background()
	admin := c.Admin()
	publishGroup(t, c, "a", "a1", "a2")
	publishGroup(t, c, "b", "b1", "b2")
	mustPublish(t, c, shardq.Message{Tenant: "t", Topic: "x", ID: "u1"}, shardq.Message{Tenant: "t", Topic: "x", ID: "u2"})
	g := shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}
	gr, err := c.AcceptGroup(ctx, g, "a", receiverOpts("r"))
	if err != nil {
		t.Fatal(err)
	}
	defer gr.Stop(ctx)
	held, err := gr.Receive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := c.Receipts(nil)
	if err != nil {
		t.Fatal(err)
	}
	sess, err := rc.Receive(ctx, shardq.ReceiveRequest{Tenant: "t", Topic: "x", ConsumerGroup: "g", PartitionKey: "b", Hold: true, Max: 1})
	if err != nil || sess.Session == nil || len(sess.Messages) != 1 {
		t.Fatalf("session: %+v, %v", sess, err)
	}
	ung, err := rc.Receive(ctx, shardq.ReceiveRequest{Tenant: "t", Topic: "x", ConsumerGroup: "g", Ungrouped: true, Max: 2})
	if err != nil || len(ung.Messages) != 2 {
		t.Fatalf("ungrouped: %+v, %v", ung, err)
	}
	if err := admin.SuspendTenant(ctx, "t"); err != nil {
		t.Fatal(err)
	}
	suspended := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, shardq.ErrTenantSuspended) {
			t.Fatalf("%s in a suspended tenant: %v; want ErrTenantSuspended", what, err)
		}
	}
	suspended("GroupReceiver.SetState", gr.SetState(ctx, []byte("no")))
	suspended("GroupReceiver.Defer", gr.Defer(ctx, held))
	suspended("Receipts.SetGroupState", rc.SetGroupState(ctx, g, sess.Session.ID, []byte("no")))
	_, err = rc.Defer(ctx, g, []string{ung.Messages[0].Receipt})
	suspended("Receipts.Defer", err)
	_, err = rc.ChangeVisibility(ctx, g, []string{ung.Messages[0].Receipt, sess.Session.ID}, time.Minute)
	suspended("Receipts.ChangeVisibility", err)
	_, err = c.ReceiveDeferred(ctx, shardq.DeferredRequest{Tenant: "t", Topic: "x", ConsumerGroup: "g", Offsets: []int64{1}})
	suspended("ReceiveDeferred", err)
	_, err = rc.ReceiveDeferred(ctx, shardq.DeferredRequest{Tenant: "t", Topic: "x", ConsumerGroup: "g", Offsets: []int64{1}})
	suspended("Receipts.ReceiveDeferred", err)
	if st, err := gr.State(ctx); err != nil || st != nil {
		t.Fatalf("state after refused writes: %q, %v", st, err)
	}
	if ds, err := admin.Deferred(ctx, g, 0, 10); err != nil || len(ds) != 0 {
		t.Fatalf("deferred after refused deferrals: %+v, %v", ds, err)
	}
	// Settling goes on.
	if err := gr.Ack(ctx, held); err != nil {
		t.Fatalf("GroupReceiver.Ack while suspended: %v", err)
	}
	res, err := rc.Receive(ctx, shardq.ReceiveRequest{Tenant: "t", Topic: "x", ConsumerGroup: "g", Ungrouped: true, Ack: []string{ung.Messages[0].Receipt}})
	suspended("a receive that acks", err)
	if res.Acked != 1 || len(res.Stale) != 0 || len(res.Messages) != 0 {
		t.Fatalf("a receive that acks while suspended: %+v; want its ack settled and nothing received", res)
	}
	if err := rc.Nack(ctx, g, ung.Messages[1].Receipt, shardq.NackOptions{}); err != nil {
		t.Fatalf("Nack while suspended: %v", err)
	}
	if stale, err := rc.ChangeVisibility(ctx, g, []string{sess.Session.ID}, 0); err != nil || len(stale) != 0 {
		t.Fatalf("visibility 0 while suspended: %v %v", stale, err)
	}
	if err := admin.ResumeTenant(ctx, "t"); err != nil {
		t.Fatal(err)
	}
	// A subscriber's handler holds its message when the suspension comes:
	// its deferral is refused too (and the message comes again).
	deferred := make(chan error, 1)
	var once atomic.Bool
	s, err := c.Subscribe(ctx, fastConfig("h", "x", []string{"t"}, func(ctx context.Context, dv *shardq.Delivery) error {
		if dv.PartitionKey != "a" || !once.CompareAndSwap(false, true) {
			return nil
		}
		if err := admin.SuspendTenant(ctx, "t"); err != nil {
			deferred <- err
			return nil
		}
		deferred <- dv.Defer(ctx)
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer stopAll(t, s)
	select {
	case err := <-deferred:
		suspended("Delivery.Defer in a subscriber's handler", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the subscriber delivered nothing")
	}
	if ds, err := admin.Deferred(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "h"}, 0, 10); err != nil || len(ds) != 0 {
		t.Fatalf("deferred after a refused deferral: %+v, %v", ds, err)
	}
}

func cursor(raw string) string { return base64.RawURLEncoding.EncodeToString([]byte(raw)) }

// delivered reports whether a message of id reached the handler.
func (r *recorder) delivered(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seen[id]
}

// Admin.Tenants lists the tenants with partitions or a suspension, in
// pages, with what each stores per topic.
func testListTenants(t *testing.T, open Open) {
	_, c := setup(t, open, nil)
	ctx := context.Background()
	mustPublish(t, c, shardq.Message{Tenant: "a", Topic: "x", PartitionKey: "k1", ID: "1", Payload: []byte("12345")},
		shardq.Message{Tenant: "a", Topic: "x", PartitionKey: "k2", ID: "2", Payload: []byte("123")},
		shardq.Message{Tenant: "a", Topic: "x", ID: "3", Payload: []byte("1")})
	mustPublish(t, c, shardq.Message{Tenant: "a", Topic: "y", PartitionKey: "k1", ID: "4", Payload: []byte("12")})
	mustPublish(t, c, shardq.Message{Tenant: "c", Topic: "x", PartitionKey: "k1", ID: "5"})
	if err := c.Admin().SuspendTenant(ctx, "b"); err != nil { // no data, but a settings row
		t.Fatal(err)
	}
	all, err := c.Admin().Tenants(ctx, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	got := fmt.Sprint(slices.Collect(func(yield func(string) bool) {
		for _, ti := range all {
			yield(fmt.Sprintf("%s:%d/%d/suspended=%t:%v", ti.Tenant, ti.Messages, ti.Bytes, !ti.SuspendedAt.IsZero(), ti.Topics))
		}
	}))
	// A message's bytes: payload, headers as stored ({"queue_name":"a"}: 18),
	// key and id.
	want := "[a:4/93/suspended=false:[{x 3 3 70 0 0 0} {y 1 1 23 0 0 0}] b:0/0/suspended=true:[] c:1/21/suspended=false:[{x 1 1 21 0 0 0}]]"
	if got != want {
		t.Fatalf("tenants:\n got %s\nwant %s", got, want)
	}
	var paged []string
	for after := ""; ; {
		page, err := c.Admin().Tenants(ctx, after, 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		paged = append(paged, page[0].Tenant)
		after = page[0].Tenant
	}
	if fmt.Sprint(paged) != "[a b c]" {
		t.Fatalf("pages of one: %v", paged)
	}
	for _, bad := range []struct {
		after string
		limit int
		field string
	}{{"", -1, "limit"}, {"", shardq.MaxPageLimit + 1, "limit"}, {"a b ", 1, "tenant"}} {
		var ve *shardq.ValidationError
		if _, err := c.Admin().Tenants(ctx, bad.after, bad.limit); !errors.As(err, &ve) || ve.Field != bad.field {
			t.Fatalf("Tenants(%q, %d): %v, want a ValidationError on %s", bad.after, bad.limit, err, bad.field)
		}
	}
}

// An export writes a tenant's groups, cursors, states and messages as JSON
// lines, only that tenant's; one cut short resumes from a line's cursor.
func testExportTenant(t *testing.T, open Open) {
	_, c := setup(t, open, nil)
	ctx := context.Background()
	var want []string
	for i := range 23 {
		key := fmt.Sprintf("k%d", i%4)
		if i%5 == 0 {
			key = "" // ungrouped
		}
		m := shardq.Message{Tenant: "t", Topic: []string{"x", "y"}[i%2], PartitionKey: key, ID: fmt.Sprintf("m%02d", i),
			Payload: []byte{byte(i), 0, 0xff}, Headers: map[string]string{"h": fmt.Sprint(i)}}
		mustPublish(t, c, m)
		want = append(want, m.ID)
	}
	mustPublish(t, c, shardq.Message{Tenant: "u", Topic: "x", PartitionKey: "k0", ID: "other"})
	r, err := c.AcceptGroup(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, "k0", receiverOpts("r"))
	if err != nil {
		t.Fatal(err)
	}
	dl, err := r.Receive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Ack(ctx, dl); err != nil {
		t.Fatal(err)
	}
	if err := r.SetState(ctx, []byte("state-of-k0")); err != nil {
		t.Fatal(err)
	}
	closeReceiver(t, r)

	export := func(opts shardq.ExportOptions) ([]shardq.ExportLine, int64) {
		t.Helper()
		var buf bytes.Buffer
		n, err := c.Admin().ExportTenant(ctx, "t", &buf, opts)
		if err != nil {
			t.Fatal(err)
		}
		var lines []shardq.ExportLine
		sc := bufio.NewScanner(&buf)
		for sc.Scan() {
			var l shardq.ExportLine
			if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
				t.Fatalf("line %q: %v", sc.Text(), err)
			}
			lines = append(lines, l)
		}
		return lines, n
	}
	lines, n := export(shardq.ExportOptions{BatchSize: 4})
	order := []string{shardq.ExportKindTenant, shardq.ExportKindGroup, shardq.ExportKindCursor,
		shardq.ExportKindGroupState, shardq.ExportKindMessage, shardq.ExportKindEnd}
	kinds := map[string]int{}
	var ids []string
	for i, l := range lines {
		kinds[l.Kind]++
		if k := slices.Index(order, l.Kind); k < 0 || i > 0 && k < slices.Index(order, lines[i-1].Kind) {
			t.Fatalf("line %d: kind %q after %q", i, l.Kind, lines[i-1].Kind)
		}
		switch l.Kind {
		case shardq.ExportKindMessage:
			ids = append(ids, l.ID)
			var i int
			fmt.Sscanf(l.ID, "m%d", &i)
			if !bytes.Equal(l.Payload, []byte{byte(i), 0, 0xff}) || l.Headers["h"] != fmt.Sprint(i) || l.PartitionKey == nil || l.Cursor == "" {
				t.Fatalf("message line %+v: payload, headers, key or cursor differ from what was published", l)
			}
		case shardq.ExportKindGroupState:
			if string(l.State) != "state-of-k0" || *l.PartitionKey != "k0" || l.ConsumerGroup != "g" {
				t.Fatalf("group state line %+v", l)
			}
		case shardq.ExportKindCursor:
			if *l.PartitionKey == "k0" && (l.Committed == nil || *l.Committed == 0) {
				t.Fatalf("cursor line %+v: k0's cursor passed a message", l)
			}
		}
	}
	if lines[0].Kind != shardq.ExportKindTenant || lines[0].Tenant != "t" || lines[len(lines)-1].Kind != shardq.ExportKindEnd ||
		*lines[len(lines)-1].Messages != 23 || n != 23 || kinds[shardq.ExportKindGroup] != 1 || kinds[shardq.ExportKindCursor] == 0 {
		t.Fatalf("export: %d messages, kinds %v, first %+v, last %+v", n, kinds, lines[0], lines[len(lines)-1])
	}
	slices.Sort(ids)
	if !slices.Equal(ids, want) {
		t.Fatalf("exported messages %v, want %v (and no other tenant's)", ids, want)
	}
	// Cut after the 10th message, and resumed from its cursor.
	var msgs []shardq.ExportLine
	for _, l := range lines {
		if l.Kind == shardq.ExportKindMessage {
			msgs = append(msgs, l)
		}
	}
	rest, n := export(shardq.ExportOptions{After: msgs[9].Cursor, BatchSize: 3})
	var restIDs []string
	for _, l := range rest {
		if l.Kind == shardq.ExportKindMessage {
			restIDs = append(restIDs, l.ID)
		}
	}
	var wantRest []string
	for _, l := range msgs[10:] {
		wantRest = append(wantRest, l.ID)
	}
	if n != 13 || !slices.Equal(restIDs, wantRest) {
		t.Fatalf("resumed after %s: %d messages %v, want %v", msgs[9].ID, n, restIDs, wantRest)
	}
	for _, bad := range []string{"x", "A=", msgs[9].Cursor + "A", cursor("x\x00k\x00-1"), cursor("x\x00k\x0001"),
		cursor("x\x00k"), cursor("x \x00k\x001"), cursor("x\x00k\x001\x00")} {
		var ve *shardq.ValidationError
		if _, err := c.Admin().ExportTenant(ctx, "t", &bytes.Buffer{}, shardq.ExportOptions{After: bad}); !errors.As(err, &ve) || ve.Field != "after" {
			t.Fatalf("export after %q: %v, want a ValidationError on after", bad, err)
		}
	}
}

// stored is the tenant's message count, as Admin.Tenant counts it.
func stored(t *testing.T, c *shardq.Client, tenant string) int64 {
	t.Helper()
	info, err := c.Admin().Tenant(context.Background(), tenant)
	if err != nil {
		t.Fatal(err)
	}
	return info.Messages
}

// wantQuota fails unless err is a *QuotaExceededError of tenant and quota.
func wantQuota(t *testing.T, err error, tenant, quota string) *shardq.QuotaExceededError {
	t.Helper()
	var qe *shardq.QuotaExceededError
	if !errors.Is(err, shardq.ErrQuotaExceeded) || !errors.As(err, &qe) || qe.Tenant != tenant || qe.Quota != quota {
		t.Fatalf("got %v; want tenant %q's %s quota exceeded", err, tenant, quota)
	}
	if !strings.Contains(err.Error(), quota) || !strings.Contains(err.Error(), fmt.Sprintf("%q", tenant)) {
		t.Fatalf("%q does not name the tenant and the quota", err)
	}
	return qe
}

// Rate quotas refuse what is over a second's worth, with when to retry,
// store nothing of a refused call, leave other tenants alone, and wait
// instead for a large message's chunks.
func testTenantRateQuotas(t *testing.T, open Open) {
	clock := testdb.NewClock(t0)
	d, c := setup(t, open, &shardq.Config{Clock: clock.Now})
	ctx := context.Background()
	admin := c.Admin()
	if err := admin.SetTenantLimits(ctx, "t", shardq.TenantLimits{PublishRate: -1}); !errors.Is(err, shardq.ErrInvalid) || !strings.Contains(err.Error(), "publish rate") {
		t.Fatalf("a negative rate: %v", err)
	}
	if err := admin.SetTenantLimits(ctx, "t", shardq.TenantLimits{PublishRate: 4, PublishByteRate: 100}); err != nil {
		t.Fatal(err)
	}
	msg := func(id string, payload int) shardq.Message {
		return shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: id, Payload: make([]byte, payload)}
	}
	mustPublish(t, c, msg("a", 1), msg("b", 1), msg("c", 1))
	_, err := c.Publish(ctx, msg("d", 1), msg("e", 1))
	qe := wantQuota(t, err, "t", shardq.QuotaPublishRate)
	if qe.Limit != 4 || qe.Call != 2 || qe.RetryAfter <= 0 || qe.RetryAfter > 250*time.Millisecond {
		t.Fatalf("refusal %+v; want the limit 4, the call's 2 and a retry within 250 ms", qe)
	}
	if n := stored(t, c, "t"); n != 3 {
		t.Fatalf("%d messages stored; want the 3 before the refused call", n)
	}
	mustPublish(t, c, shardq.Message{Tenant: "u", Topic: "x", PartitionKey: "k", ID: "other"}) // no quota
	clock.Add(qe.RetryAfter)
	mustPublish(t, c, msg("d", 1), msg("e", 1))
	// More than a second's worth can never fit.
	clock.Add(time.Hour)
	_, err = c.Publish(ctx, msg("f", 1), msg("g", 1), msg("h", 1), msg("i", 1), msg("j", 1))
	if qe := wantQuota(t, err, "t", shardq.QuotaPublishRate); qe.RetryAfter != 0 || !strings.Contains(err.Error(), "second's worth") {
		t.Fatalf("a call over the burst: %v", err)
	}
	// Bytes: 100 per second.
	_, err = c.Publish(ctx, msg("big", 101))
	wantQuota(t, err, "t", shardq.QuotaPublishByteRate)
	mustPublish(t, c, msg("m1", 60))
	_, err = c.Publish(ctx, msg("m2", 60))
	if qe := wantQuota(t, err, "t", shardq.QuotaPublishByteRate); qe.RetryAfter <= 0 {
		t.Fatalf("byte rate refusal without a retry time: %+v", qe)
	}
	// The transaction's publish is held to the same quotas.
	tx, err := d.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.PublishTx(ctx, tx, msg("tx", 60))
	wantQuota(t, err, "t", shardq.QuotaPublishByteRate)
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	// Removing the limits lifts them at once in this client.
	if err := admin.SetTenantLimits(ctx, "t", shardq.TenantLimits{}); err != nil {
		t.Fatal(err)
	}
	mustPublish(t, c, msg("m2", 60), msg("m3", 1000))
	info, err := admin.Tenant(ctx, "t")
	if err != nil || info.Limits != (shardq.TenantLimits{}) {
		t.Fatalf("limits after removal: %+v, %v", info.Limits, err)
	}
}

// Storage quotas refuse a call that would take the tenant past what it
// may store, as measured, whole; a publish to an existing partition goes
// on at the partitions limit.
func testTenantStorageQuotas(t *testing.T, open Open) {
	_, c := setup(t, open, nil)
	ctx := context.Background()
	admin := c.Admin()
	for _, k := range []string{"a", "b"} {
		mustPublish(t, c, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: k, ID: k, Payload: []byte("12345")})
	}
	if err := admin.SetTenantLimits(ctx, "t", shardq.TenantLimits{MaxMessages: 3}); err != nil {
		t.Fatal(err)
	}
	_, err := c.Publish(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "a", ID: "c1"}, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "a", ID: "c2"})
	if qe := wantQuota(t, err, "t", shardq.QuotaMaxMessages); qe.Usage != 2 || qe.Call != 2 || qe.Limit != 3 {
		t.Fatalf("refusal %+v; want 2 stored, 2 added, limit 3", qe)
	}
	if n := stored(t, c, "t"); n != 2 {
		t.Fatalf("%d stored after a refused call; want 2", n)
	}
	// Each stored message is 25 bytes: payload 5, headers
	// {"queue_name":"t"} 18, key 1, id 1. "d" adds 2 + 18 + 1 + 1.
	if err := admin.SetTenantLimits(ctx, "t", shardq.TenantLimits{MaxBytes: 72}); err != nil {
		t.Fatal(err)
	}
	_, err = c.Publish(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "a", ID: "d", Payload: []byte("123")})
	if qe := wantQuota(t, err, "t", shardq.QuotaMaxBytes); qe.Usage != 50 || qe.Call != 23 {
		t.Fatalf("refusal %+v; want 50 bytes stored, 23 added", qe)
	}
	mustPublish(t, c, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "a", ID: "d", Payload: []byte("12")})
	if err := admin.SetTenantLimits(ctx, "t", shardq.TenantLimits{MaxPartitions: 2}); err != nil {
		t.Fatal(err)
	}
	mustPublish(t, c, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "b", ID: "e"})
	_, err = c.Publish(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "a", ID: "f"}, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "new", ID: "g"})
	if qe := wantQuota(t, err, "t", shardq.QuotaMaxPartitions); qe.Usage != 2 || qe.Call != 1 {
		t.Fatalf("refusal %+v; want 2 partitions, 1 new", qe)
	}
	_, err = c.Publish(ctx, shardq.Message{Tenant: "t", Topic: "y", PartitionKey: "a", ID: "h"}) // another topic's partition is new
	wantQuota(t, err, "t", shardq.QuotaMaxPartitions)
	if n := stored(t, c, "t"); n != 4 {
		t.Fatalf("%d stored; want 4", n)
	}
	mustPublish(t, c, shardq.Message{Tenant: "u", Topic: "x", PartitionKey: "new", ID: "g"})
	// Far below the limit no key is read, yet the keys published to since
	// the measure count: the fourth new one is refused.
	if err := admin.SetTenantLimits(ctx, "u", shardq.TenantLimits{MaxPartitions: 4}); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"k1", "k2", "k3", "k1"} {
		mustPublish(t, c, shardq.Message{Tenant: "u", Topic: "x", PartitionKey: k})
	}
	_, err = c.Publish(ctx, shardq.Message{Tenant: "u", Topic: "x", PartitionKey: "k4"})
	if qe := wantQuota(t, err, "u", shardq.QuotaMaxPartitions); qe.Usage != 4 || qe.Call != 1 {
		t.Fatalf("refusal %+v; want 4 partitions, 1 new", qe)
	}
	info, err := admin.Tenant(ctx, "t")
	if err != nil || info.Limits.MaxPartitions != 2 || info.Partitions != 2 {
		t.Fatalf("tenant %+v, %v", info, err)
	}
}

// What a tenant stores is counted whole, the same in the client's check
// and in Admin's measure: a message's payload, headers as stored, key and
// id; a message group's state, key and group; a deferred row's key and
// group. A message of empty payload and large headers is held to
// max_bytes and publish_byte_rate as any other.
func testTenantStoredBytes(t *testing.T, open Open) {
	d, c := setup(t, open, nil)
	ctx := context.Background()
	admin := c.Admin()
	// Multi-byte characters: the measure counts bytes, not characters.
	headers := map[string]string{"h1": strings.Repeat("é", 100), "h2": "<&>"}
	mustPublish(t, c, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "clé", ID: "ü1", Headers: headers},
		shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "clé", ID: "ü2", Payload: []byte("12345")})
	var msgBytes int64
	for _, m := range fetchAll(t, d, "t", "x", "clé") {
		n, err := driver.MessageBytes(&driver.InsertMessage{PartitionKey: m.PartitionKey, ID: m.ID, Headers: m.Headers, Payload: m.Payload})
		if err != nil {
			t.Fatal(err)
		}
		msgBytes += n
	}
	if len(`{"h1":"`+headers["h1"]+`","h2":"<&>","queue_name":"t"}`)+len("clé")+len("ü1") >= int(msgBytes) {
		t.Fatalf("message bytes %d; want the headers, key and id counted in bytes", msgBytes)
	}
	usage := func() shardq.TenantInfo {
		t.Helper()
		info, err := admin.Tenant(ctx, "t")
		if err != nil {
			t.Fatal(err)
		}
		return info
	}
	if info := usage(); info.Bytes != msgBytes || len(info.Topics) != 1 || info.Topics[0].Bytes != msgBytes {
		t.Fatalf("usage %+v; want %d bytes", info, msgBytes)
	}
	r, err := c.AcceptGroup(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, "clé", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop(ctx)
	state := []byte("state ü")
	if err := r.SetState(ctx, state); err != nil {
		t.Fatal(err)
	}
	dv, err := r.Receive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Defer(ctx, dv); err != nil {
		t.Fatal(err)
	}
	stateBytes, deferBytes := driver.GroupStateBytes("g", "clé", state), driver.DeferredBytes("g", "clé")
	// The group's bookkeeping: its registry row, its lease and its cursor
	// (the lease's owner besides).
	minGroup := driver.BookkeepingBytes("g", "", "") + 2*driver.BookkeepingBytes("g", "clé", "")
	info := usage()
	if u := info.Topics[0]; info.Bytes != msgBytes+stateBytes+deferBytes+u.GroupBytes || u.Bytes != info.Bytes || u.StateBytes != stateBytes ||
		u.DeferredBytes != deferBytes || u.GroupBytes <= minGroup {
		t.Fatalf("usage %+v; want %d of messages, %d of state, %d deferred, more than %d of bookkeeping", info, msgBytes, stateBytes, deferBytes, minGroup)
	}
	// Headers count against both byte quotas.
	empty := shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "e", Headers: map[string]string{"big": strings.Repeat("h", 500)}}
	if err := admin.SetTenantLimits(ctx, "t", shardq.TenantLimits{MaxBytes: info.Bytes + 100}); err != nil {
		t.Fatal(err)
	}
	_, err = c.Publish(ctx, empty)
	if qe := wantQuota(t, err, "t", shardq.QuotaMaxBytes); qe.Usage != info.Bytes || qe.Call < 500 {
		t.Fatalf("refusal %+v; want %d stored and the headers' bytes added", qe, info.Bytes)
	}
	if err := admin.SetTenantLimits(ctx, "t", shardq.TenantLimits{PublishByteRate: 400}); err != nil {
		t.Fatal(err)
	}
	_, err = c.Publish(ctx, empty)
	if qe := wantQuota(t, err, "t", shardq.QuotaPublishByteRate); qe.RetryAfter != 0 {
		t.Fatalf("refusal %+v; want more than a second's worth", qe)
	}
	// A state and a deferral are held to max_bytes, and store nothing when
	// refused.
	if err := admin.SetTenantLimits(ctx, "t", shardq.TenantLimits{MaxBytes: info.Bytes + 10}); err != nil {
		t.Fatal(err)
	}
	err = r.SetState(ctx, make([]byte, 100))
	if qe := wantQuota(t, err, "t", shardq.QuotaMaxBytes); qe.Usage != info.Bytes || qe.Call != 100+int64(len("g")+len("clé")) {
		t.Fatalf("state refusal %+v; want %d stored", qe, info.Bytes)
	}
	if st, err := r.State(ctx); err != nil || string(st) != string(state) {
		t.Fatalf("state after a refused write: %q, %v", st, err)
	}
	if err := admin.SetTenantLimits(ctx, "t", shardq.TenantLimits{MaxBytes: info.Bytes + 1}); err != nil {
		t.Fatal(err)
	}
	dv, err = r.Receive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wantQuota(t, r.Defer(ctx, dv), "t", shardq.QuotaMaxBytes)
	if got := usage(); got.Bytes != info.Bytes {
		t.Fatalf("usage after a refused deferral %+v; want %d bytes", got, info.Bytes)
	}
}

// A tenant's retention stands between the default and a topic's own.
func testTenantRetention(t *testing.T, open Open) {
	_, c := setup(t, open, &shardq.Config{Clock: func() time.Time { return t0 }})
	ctx := context.Background()
	admin := c.Admin()
	old := t0.Add(-2 * time.Hour)
	for _, tenant := range []string{"t", "u"} {
		for _, topic := range []string{"x", "kept"} {
			mustPublish(t, c, shardq.Message{Tenant: tenant, Topic: topic, PartitionKey: "k", ID: "old", CreatedAt: old})
		}
	}
	if err := admin.SetTenantLimits(ctx, "t", shardq.TenantLimits{Retention: shardq.RetentionPolicy{MinRetention: 2 * time.Hour, MaxRetention: time.Hour}}); !errors.Is(err, shardq.ErrInvalid) {
		t.Fatalf("a minimum over the maximum: %v", err)
	}
	if err := admin.SetTenantLimits(ctx, "t", shardq.TenantLimits{Retention: shardq.RetentionPolicy{MaxRetention: time.Hour}}); err != nil {
		t.Fatal(err)
	}
	cfg := shardq.RetentionConfig{Topics: map[string]shardq.RetentionPolicy{"kept": {MaxRetention: 24 * time.Hour}}}
	rep, err := admin.RunRetention(ctx, shardq.Scope{Tenants: []string{"t", "u"}}, cfg)
	if err != nil || rep.Deleted != 1 {
		t.Fatalf("retention: %+v, %v; want t's message of x deleted, nothing else", rep, err)
	}
	for _, w := range []struct {
		tenant, topic string
		n             int64
	}{{"t", "x", 0}, {"t", "kept", 1}, {"u", "x", 1}, {"u", "kept", 1}} {
		info, err := admin.Tenant(ctx, w.tenant)
		if err != nil {
			t.Fatal(err)
		}
		var n int64
		for _, u := range info.Topics {
			if u.Topic == w.topic {
				n = u.Messages
			}
		}
		if n != w.n {
			t.Fatalf("tenant %s topic %s keeps %d; want %d", w.tenant, w.topic, n, w.n)
		}
	}
}

// A member that sees its tenant suspended delivers none of the ungrouped
// messages it already claimed: they go back, uncounted, for after the
// resume.
func testSuspendGivesBackClaims(t *testing.T, open Open) {
	lines := &testdb.LogLines{}
	d, c := setup(t, open, &shardq.Config{Logger: slog.New(lines)})
	ctx := context.Background()
	var batch []shardq.Message
	for i := range 10 {
		batch = append(batch, shardq.Message{Tenant: "t", Topic: "x", ID: fmt.Sprintf("m%d", i)})
	}
	mustPublish(t, c, batch...)
	gate, first := make(chan struct{}), make(chan struct{})
	var delivered atomic.Int64
	cfg := fastConfig("g", "x", []string{"t"}, func(ctx context.Context, _ *shardq.Delivery) error {
		if delivered.Add(1) == 1 {
			close(first)
			<-gate
		}
		return nil
	})
	cfg.UngroupedConcurrency = 1
	s, err := c.Subscribe(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer stopAll(t, s)
	<-first // the member holds the others claimed in its queue
	if err := c.Admin().SuspendTenant(ctx, "t"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the member sees the suspension", 30*time.Second, func() bool { return lines.Count("tenant suspended") > 0 })
	close(gate)
	unsettled := func() int {
		var n int
		if err := d.DB().QueryRowContext(ctx, "SELECT COUNT(*) FROM queue_message_claims WHERE tenant = 't' AND done = 0 AND attempts > 0").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	waitFor(t, "the claims settled or given back", 30*time.Second, func() bool { return unsettled() == 0 })
	if n := delivered.Load(); n != 1 {
		t.Fatalf("%d deliveries; want only the one in hand when the tenant was suspended", n)
	}
	if err := c.Admin().ResumeTenant(ctx, "t"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the rest after the resume", 30*time.Second, func() bool { return delivered.Load() == 10 })
}

// A message whose handler failed is not tried again while its tenant is
// suspended (nor dead-lettered for the attempts a suspension would burn):
// the member releases the partition, and the retry comes after the
// resume.
func testSuspendStopsRetries(t *testing.T, open Open) {
	lines := &testdb.LogLines{}
	d, c := setup(t, open, &shardq.Config{Logger: slog.New(lines)})
	ctx := context.Background()
	mustPublish(t, c, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "m"})
	gate, first := make(chan struct{}), make(chan struct{})
	var calls atomic.Int64
	var failing atomic.Bool
	failing.Store(true)
	cfg := fastConfig("g", "x", []string{"t"}, func(ctx context.Context, _ *shardq.Delivery) error {
		if calls.Add(1) == 1 {
			close(first)
			<-gate
		}
		if failing.Load() {
			return errors.New("the handler fails")
		}
		return nil
	})
	cfg.MaxAttempts = 5
	s, err := c.Subscribe(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer stopAll(t, s)
	<-first
	if err := c.Admin().SuspendTenant(ctx, "t"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the member sees the suspension", 30*time.Second, func() bool { return lines.Count("tenant suspended") > 0 })
	close(gate)
	waitFor(t, "the suspended tenant's lease released", 30*time.Second, func() bool {
		_, leases, err := d.TenantLive(ctx, "t", time.Now(), time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return leases == 0
	})
	if n := calls.Load(); n != 1 {
		t.Fatalf("%d handler calls while suspended; want the one in hand", n)
	}
	failing.Store(false)
	if err := c.Admin().ResumeTenant(ctx, "t"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the retry after the resume", 30*time.Second, func() bool { return calls.Load() == 2 })
}
