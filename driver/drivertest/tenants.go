// SPDX-License-Identifier: Apache-2.0

package drivertest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
)

var tenantTests = []struct {
	name string
	fn   func(*testing.T, Open)
}{
	{"SuspendTenant", testSuspendTenant},
	{"ListTenants", testListTenants},
	{"ExportTenant", testExportTenant},
}

// manualClock is a clock a test moves.
type manualClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *manualClock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// A suspended tenant publishes and receives nothing (this client at once,
// another within its TenantSettingsTTL), its member releases its leases
// and delivers nothing more, another tenant of the same member goes on,
// and a resume delivers what was stored meanwhile.
func testSuspendTenant(t *testing.T, open Open) {
	d, c := setup(t, open, nil)
	ctx := context.Background()
	clock := &manualClock{now: time.Now()}
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
	want := "[a:4/11/suspended=false:[{x 3 3 9} {y 1 1 2}] b:0/0/suspended=true:[] c:1/0/suspended=false:[{x 1 1 0}]]"
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
