// SPDX-License-Identifier: Apache-2.0

package conformance

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
)

var adminTests = []conformanceTest{
	{"AdminListingsAreScoped", testAdminListingsAreScoped},
	{"AdminOffsetsShowLag", testAdminOffsetsShowLag},
	{"AdminOffsetsCountScheduled", testAdminOffsetsCountScheduled},
	{"AdminInspectAndDeleteOneRow", testAdminInspectAndDeleteOneRow},
	{"AdminRequeueDeadLetter", testAdminRequeueDeadLetter},
	{"AdminResetOffsets", testAdminResetOffsets},
	{"AdminForcedResetFencesHolder", testAdminForcedResetFencesHolder},
	{"AdminListingsArePaged", testAdminListingsArePaged},
	{"Retention", testRetention},
}

func testAdminListingsAreScoped(t *testing.T, open Open) {
	d, c := setup(t, open, nil)
	ctx := context.Background()
	admin := c.Admin()
	for _, tenant := range []string{"a", "b"} {
		mustPublish(t, c, shardq.Message{Tenant: tenant, Topic: "x", PartitionKey: "k"})
		if _, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: driver.PartitionRef{Tenant: tenant, ConsumerGroup: "g", Topic: "x", PartitionKey: "k"}, Owner: "s-" + tenant, Now: time.Now(), TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
		if err := d.Heartbeat(ctx, driver.GroupScope{Tenants: []string{tenant}, Topic: "x", ConsumerGroup: "g"}, "s-"+tenant, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	for _, bad := range []shardq.Scope{{}, {Tenants: []string{"a"}, AllTenants: true}, {Tenants: []string{""}}} {
		if _, err := admin.Topics(ctx, bad); !errors.Is(err, shardq.ErrInvalid) {
			t.Fatalf("Topics(%+v) = %v, want ErrInvalid: never an implied all-tenants read", bad, err)
		}
		if _, err := admin.Leases(ctx, bad); !errors.Is(err, shardq.ErrInvalid) {
			t.Fatalf("Leases(%+v) = %v, want ErrInvalid", bad, err)
		}
	}
	onlyA := shardq.Scope{Tenants: []string{"a"}}
	topics, err := admin.Topics(ctx, onlyA)
	if err != nil || len(topics) != 1 || topics[0].Tenant != "a" || topics[0].Partitions != 1 {
		t.Fatalf("topics of a: %+v, %v", topics, err)
	}
	leases, _ := admin.Leases(ctx, onlyA)
	subs, _ := admin.Subscribers(ctx, onlyA)
	if len(leases) != 1 || leases[0].Tenant != "a" || len(subs) != 1 || subs[0].Tenant != "a" {
		t.Fatalf("scoped to a: leases %d, subscribers %d", len(leases), len(subs))
	}
	all, err := admin.Topics(ctx, shardq.Scope{AllTenants: true})
	if err != nil || len(all) != 2 {
		t.Fatalf("all tenants: %+v, %v", all, err)
	}
	// b's holder stops heartbeating: its lease is stale; a's is not.
	if err := d.Heartbeat(ctx, driver.GroupScope{Tenants: []string{"b"}, Topic: "x", ConsumerGroup: "g"}, "s-b", time.Now().Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	stale, err := admin.StaleLeases(ctx, shardq.Scope{AllTenants: true}, time.Minute)
	if err != nil || len(stale) != 1 || stale[0].Owner != "s-b" {
		t.Fatalf("stale leases: %+v, %v", stale, err)
	}
}

func testAdminOffsetsShowLag(t *testing.T, open Open) {
	d, c := setup(t, open, &shardq.Config{Clock: func() time.Time { return t0 }})
	ctx := context.Background()
	res := mustPublish(t, c, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k"}, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k"},
		shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", CreatedAt: t0.Add(time.Minute)})
	if err := d.ResetOffset(ctx, driver.PartitionRef{Tenant: "t", Topic: "x", PartitionKey: "k", ConsumerGroup: "g"}, res[0].Offset); err != nil {
		t.Fatal(err)
	}
	rows, err := c.Admin().Offsets(ctx, shardq.Scope{Tenants: []string{"t"}}, "g")
	if err != nil || len(rows) != 1 {
		t.Fatalf("offsets: %+v, %v", rows, err)
	}
	r := rows[0]
	if r.HeadOffset != res[2].Offset || r.CommittedOffset != res[0].Offset || r.Lag != 2 || !r.OldestUnconsumed.Equal(t0) {
		t.Fatalf("offset row %+v: want head %d, cursor %d, lag 2, oldest unconsumed at %v", r, res[2].Offset, res[0].Offset, t0)
	}
	if other, _ := c.Admin().Offsets(ctx, shardq.Scope{Tenants: []string{"t"}}, "other"); len(other) != 0 {
		t.Fatalf("group filter ignored: %+v", other)
	}
}

func testAdminInspectAndDeleteOneRow(t *testing.T, open Open) {
	d, c := setup(t, open, nil)
	ctx := context.Background()
	res := mustPublish(t, c, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "target", Payload: []byte("p")},
		shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "neighbour"},
		shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k2", ID: "target"})
	l, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: driver.PartitionRef{Tenant: "t", ConsumerGroup: "g", Topic: "x", PartitionKey: "k"}, Owner: "s", Now: time.Now(), TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.RecordAttempt(ctx, driver.RecordAttemptParams{Lease: l, Offset: res[0].Offset, State: driver.DeliveryState{Attempts: 2, LastError: "boom", NextAttemptAt: t0}, Now: time.Now()}); err != nil {
		t.Fatal(err)
	}
	ref := shardq.MessageRef{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "target"}
	m, states, err := c.Admin().Inspect(ctx, ref)
	if err != nil || m.Offset != res[0].Offset || string(m.Payload) != "p" || states["g"].Attempts != 2 || states["g"].LastError != "boom" {
		t.Fatalf("inspect: %+v %+v %v", m, states, err)
	}
	if _, err := c.Admin().Delete(ctx, shardq.MessageRef{Tenant: "t", Topic: "x", ID: "target"}); err != nil {
		t.Fatalf("delete with an empty (ungrouped) key is a full identity too: %v", err)
	}
	if _, err := c.Admin().Delete(ctx, shardq.MessageRef{Tenant: "t", Topic: "x", PartitionKey: "k"}); !errors.Is(err, shardq.ErrInvalid) {
		t.Fatalf("delete without an id = %v, want ErrInvalid", err)
	}
	deleted, err := c.Admin().Delete(ctx, ref)
	if err != nil || !deleted {
		t.Fatalf("delete: %v %v", deleted, err)
	}
	if again, _ := c.Admin().Delete(ctx, ref); again {
		t.Fatal("deleted twice")
	}
	if got := fetchAll(t, d, "t", "x", "k"); len(got) != 1 || got[0].ID != "neighbour" {
		t.Fatalf("partition k after delete: %+v", got)
	}
	if got := fetchAll(t, d, "t", "x", "k2"); len(got) != 1 {
		t.Fatal("delete touched another partition's row with the same id")
	}
	if _, _, err := c.Admin().Inspect(ctx, ref); !errors.Is(err, shardq.ErrNoMessage) {
		t.Fatalf("inspect after delete = %v, want ErrNoMessage", err)
	}
}

func testAdminRequeueDeadLetter(t *testing.T, open Open) {
	d, c := setup(t, open, nil)
	ctx := context.Background()
	for i := range 3 {
		mustPublish(t, c, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: fmt.Sprintf("m%d", i), Payload: []byte(fmt.Sprint(i))})
	}
	// m1 fails for good and is dead-lettered; the others are consumed.
	var requeued atomic.Bool // until requeued, m1 is poison
	cfg := fastConfig("g", "x", []string{"t"}, func(ctx context.Context, dl *shardq.Delivery) error {
		if dl.ID == "m1" && !requeued.Load() {
			return shardq.DeadLetter(errors.New("bad"))
		}
		return nil
	})
	s, err := c.Subscribe(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the group to pass everything", 30*time.Second, func() bool {
		ps, _ := d.PartitionsWithWork(ctx, driver.GroupScope{Tenants: []string{"t"}, Topic: "x", ConsumerGroup: "g"})
		return len(ps) == 0 && len(fetchAll(t, d, "t", "x.dlq", "k")) == 1
	})
	stopAll(t, s)
	mustPublish(t, c, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "m3"})
	dls, err := c.Admin().DeadLetters(ctx, shardq.DeadLetterRequest{Scope: shardq.Scope{Tenants: []string{"t"}, Limit: 10}, Topic: "x", Suffix: ""})
	if err != nil || len(dls) != 1 || dls[0].ID != "m1" {
		t.Fatalf("dead letters: %+v, %v", dls, err)
	}
	requeued.Store(true)
	res, err := c.Admin().Requeue(ctx, shardq.MessageRef{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "m1"}, "")
	if err != nil {
		t.Fatal(err)
	}
	got := fetchAll(t, d, "t", "x", "k")
	if ids := fmt.Sprint(idsOf(got)); ids != "[m0 m2 m3 m1]" || got[3].Offset != res.Offset {
		t.Fatalf("partition after requeue: %s; want m1 again after everything already there", ids)
	}
	if _, ok := got[3].Headers[shardq.HeaderDLQLastError]; ok || string(got[3].Payload) != "1" {
		t.Fatalf("requeued message: %+v", got[3])
	}
	if left := fetchAll(t, d, "t", "x.dlq", "k"); len(left) != 0 {
		t.Fatalf("dead letter not removed: %+v", left)
	}
	// The group that had passed it consumes it again.
	work, _ := d.PartitionsWithWork(ctx, driver.GroupScope{Tenants: []string{"t"}, Topic: "x", ConsumerGroup: "g"})
	if len(work) != 1 || work[0].HeadOffset != res.Offset {
		t.Fatalf("requeued message is not work for the group: %+v", work)
	}
	if _, err := c.Admin().Requeue(ctx, shardq.MessageRef{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "m1"}, ""); !errors.Is(err, shardq.ErrNoMessage) {
		t.Fatalf("second requeue = %v, want ErrNoMessage", err)
	}
	if n, err := c.Admin().RequeueAll(ctx, shardq.TopicRef{Tenant: "t", Topic: "x"}, ""); err != nil || n != 0 {
		t.Fatalf("requeue all of an empty DLQ = %d, %v", n, err)
	}
}

func idsOf(ms []driver.Message) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.ID)
	}
	return out
}

func testAdminResetOffsets(t *testing.T, open Open) {
	d, c := setup(t, open, nil)
	ctx := context.Background()
	res := mustPublish(t, c,
		shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "a", CreatedAt: t0},
		shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "a", CreatedAt: t0.Add(time.Hour)},
		shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "b", CreatedAt: t0.Add(2 * time.Hour)})
	admin := c.Admin()
	req := shardq.ResetRequest{Tenant: "t", Topic: "x", ConsumerGroup: "g", To: shardq.ResetToLatest}
	// A group that never read the topic is likely a typo: refused, unless
	// Create.
	if _, err := admin.ResetOffsets(ctx, req); !errors.Is(err, shardq.ErrInvalid) || !strings.Contains(err.Error(), "never read") {
		t.Fatalf("reset of an unknown group = %v; want it refused", err)
	}
	// A dry run reports the changes, with what they skip, and moves nothing.
	req.Create, req.DryRun = true, true
	changes, err := admin.ResetOffsets(ctx, req)
	if err != nil || len(changes) != 2 || changes[0].To != res[1].Offset || changes[0].Skip != 2 || changes[1].Skip != 1 {
		t.Fatalf("dry run to latest: %+v, %v; want a and b to their heads, skipping 2 and 1", changes, err)
	}
	if work, _ := d.PartitionsWithWork(ctx, driver.GroupScope{Tenants: []string{"t"}, Topic: "x", ConsumerGroup: "g"}); len(work) != 2 {
		t.Fatalf("a dry run moved cursors: work %+v", work)
	}
	req.DryRun = false
	changes, err = admin.ResetOffsets(ctx, req)
	if err != nil || len(changes) != 2 || changes[0].To != res[1].Offset || changes[1].To != res[2].Offset {
		t.Fatalf("to latest: %+v, %v", changes, err)
	}
	req.Create = false // the group exists now
	// A live subscriber's lease on an affected partition refuses it.
	if _, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: driver.PartitionRef{Tenant: "t", ConsumerGroup: "g", Topic: "x", PartitionKey: "a"}, Owner: "live", Now: time.Now(), TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	req.To = shardq.ResetToEarliest
	if _, err := admin.ResetOffsets(ctx, req); !errors.Is(err, shardq.ErrPartitionLeased) {
		t.Fatalf("reset under a live lease = %v, want ErrPartitionLeased", err)
	}
	if work, _ := d.PartitionsWithWork(ctx, driver.GroupScope{Tenants: []string{"t"}, Topic: "x", ConsumerGroup: "g"}); len(work) != 0 {
		t.Fatal("a refused reset moved cursors")
	}
	// Only partition b, which nobody holds: allowed.
	changes, err = admin.ResetOffsets(ctx, shardq.ResetRequest{Tenant: "t", Topic: "x", ConsumerGroup: "g", To: shardq.ResetToOffset, Key: "b", Offset: 0})
	if err != nil || len(changes) != 1 || changes[0].From != res[2].Offset || changes[0].To != 0 || changes[0].Replay != 1 {
		t.Fatalf("to offset 0 in b: %+v, %v; want b's one message replayed", changes, err)
	}
	req.Force = true
	req.To = shardq.ResetToTime
	req.Time = t0.Add(30 * time.Minute) // after a's first message, before the others
	changes, err = admin.ResetOffsets(ctx, req)
	if err != nil || len(changes) != 2 || changes[0].To != res[0].Offset || changes[1].To != 0 {
		t.Fatalf("forced to time: %+v, %v", changes, err)
	}
	if _, err := admin.ResetOffsets(ctx, shardq.ResetRequest{Tenant: "t", Topic: "x", ConsumerGroup: "g"}); !errors.Is(err, shardq.ErrInvalid) {
		t.Fatalf("reset without a target = %v, want ErrInvalid", err)
	}
}

func testRetention(t *testing.T, open Open) {
	d, c := setup(t, open, &shardq.Config{Clock: func() time.Time { return t0 }})
	ctx := context.Background()
	old := t0.Add(-2 * time.Hour)
	var batch []shardq.Message
	for i := range 10 {
		for _, k := range []string{"a", "b"} {
			batch = append(batch, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: k, ID: fmt.Sprintf("%s%d", k, i), CreatedAt: old})
		}
	}
	res := mustPublish(t, c, batch...)
	fresh := mustPublish(t, c, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "a", ID: "fresh"})[0] // created at t0
	ancient := mustPublish(t, c, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "c", ID: "ancient", CreatedAt: t0.Add(-8 * 24 * time.Hour)})[0]
	mustPublish(t, c, shardq.Message{Tenant: "u", Topic: "x", PartitionKey: "a", CreatedAt: old})
	// Group g passed a5 and everything of a up to fresh; group h passed a2.
	// Nobody has a cursor in b.
	if err := d.ResetOffset(ctx, driver.PartitionRef{Tenant: "t", Topic: "x", PartitionKey: "a", ConsumerGroup: "g"}, fresh.Offset); err != nil {
		t.Fatal(err)
	}
	if err := d.ResetOffset(ctx, driver.PartitionRef{Tenant: "t", Topic: "x", PartitionKey: "a", ConsumerGroup: "h"}, res[4].Offset); err != nil { // res[4] is a2
		t.Fatal(err)
	}
	admin := c.Admin()
	// A claim held by another cleaner: this pass skips the topic.
	claim, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: driver.PartitionRef{Tenant: "t", ConsumerGroup: shardq.RetentionGroup, Topic: "x"}, Owner: "other-cleaner", Now: t0, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := admin.RunRetention(ctx, shardq.Scope{Tenants: []string{"t"}}, shardq.RetentionConfig{BatchSize: 2})
	if err != nil || rep.Skipped != 1 || rep.Deleted != 0 {
		t.Fatalf("pass under another cleaner's claim: %+v, %v", rep, err)
	}
	if err := d.ReleaseLease(ctx, claim, t0); err != nil {
		t.Fatal(err)
	}
	rep, err = admin.RunRetention(ctx, shardq.Scope{Tenants: []string{"t"}}, shardq.RetentionConfig{BatchSize: 2})
	if err != nil || rep.Topics != 1 {
		t.Fatalf("pass: %+v, %v", rep, err)
	}
	a := idsOf(fetchAll(t, d, "t", "x", "a"))
	if fmt.Sprint(a) != "[a3 a4 a5 a6 a7 a8 a9 fresh]" {
		t.Fatalf("partition a keeps %v: want what group h has not passed, and the fresh message", a)
	}
	if b := fetchAll(t, d, "t", "x", "b"); len(b) != 10 {
		t.Fatalf("partition b, which no group has passed, lost messages: %d left", len(b))
	}
	if cc := fetchAll(t, d, "t", "x", "c"); len(cc) != 0 {
		t.Fatalf("a message past the maximum retention (offset %d) was kept", ancient.Offset)
	}
	if rep.Deleted != 4 {
		t.Fatalf("deleted %d, want a0 a1 a2 and the ancient one", rep.Deleted)
	}
	if u := fetchAll(t, d, "u", "x", "a"); len(u) != 1 {
		t.Fatal("a pass scoped to tenant t touched tenant u")
	}
	if _, err := admin.RunRetention(ctx, shardq.Scope{}, shardq.RetentionConfig{}); !errors.Is(err, shardq.ErrInvalid) {
		t.Fatalf("unscoped retention = %v, want ErrInvalid", err)
	}
}

// A forced reset under a live subscriber fences it: the holder, in the
// middle of a batch, would otherwise commit its own cursor over the reset
// (commits keep the maximum). Its next write fails with ErrLeaseLost
// instead, and every message after the new position is delivered again.
func testAdminForcedResetFencesHolder(t *testing.T, open Open) {
	d, c := setup(t, open, nil)
	ctx := context.Background()
	var msgs []shardq.Message
	for i := range 20 {
		msgs = append(msgs, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: fmt.Sprintf("m%02d", i)})
	}
	res := mustPublish(t, c, msgs...)
	var mu sync.Mutex
	count := map[string]int{}
	g := newGate()
	defer g.open()
	cfg := fastConfig("g", "x", []string{"t"}, func(ctx context.Context, dl *shardq.Delivery) error {
		mu.Lock()
		count[dl.ID]++
		first := dl.ID == "m05" && count[dl.ID] == 1
		mu.Unlock()
		if first { // hold the batch here while the operator resets
			return g.hold(ctx)
		}
		return nil
	})
	cfg.IdleRelease = time.Hour
	s, err := c.Subscribe(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer stopAll(t, s)
	g.waitHeld(t, "m05")
	ls, err := d.ListLeases(ctx, driver.GroupScope{Tenants: []string{"t"}, Topic: "x", ConsumerGroup: "g"})
	if err != nil || len(ls) != 1 || ls[0].Owner != s.ID() {
		t.Fatalf("leases = %+v, %v; want the subscriber's", ls, err)
	}
	held := ls[0]
	if _, err := c.Admin().ResetOffsets(ctx, shardq.ResetRequest{Tenant: "t", Topic: "x", ConsumerGroup: "g",
		To: shardq.ResetToOffset, Key: "k", Offset: res[2].Offset, Force: true}); err != nil {
		t.Fatal(err)
	}
	g.open()
	// The pre-reset handle is fenced at once.
	if err := d.CommitOffset(ctx, held, res[19].Offset, time.Now()); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("commit under the pre-reset lease = %v, want ErrLeaseLost", err)
	}
	waitFor(t, "every message after the new position delivered again", 20*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for i := 3; i < 20; i++ {
			if count[msgs[i].ID] < 2 {
				return false
			}
		}
		return true
	})
	mu.Lock()
	defer mu.Unlock()
	for i := range 3 {
		if count[msgs[i].ID] != 1 {
			t.Fatalf("%s, before the new position, delivered %d times", msgs[i].ID, count[msgs[i].ID])
		}
	}
}

// Operator listings are pages: reading page after page (a small Limit,
// After = the last row's sort key) gives exactly the one-page listing, in
// order; the lag of an offset report is counted up to LagCountLimit.
func testAdminListingsArePaged(t *testing.T, open Open) {
	d, c := setup(t, open, nil)
	ctx := context.Background()
	for _, tenant := range []string{"a", "b"} { // one Publish call writes one tenant
		var msgs []shardq.Message
		for _, topic := range []string{"x", "y", "z"} {
			for _, key := range []string{"k1", "k2"} {
				msgs = append(msgs, shardq.Message{Tenant: tenant, Topic: topic, PartitionKey: key})
			}
		}
		mustPublish(t, c, msgs...)
	}
	for _, tenant := range []string{"a", "b"} {
		for _, key := range []string{"k1", "k2"} {
			for _, g := range []string{"g1", "g2"} {
				if err := d.ResetOffset(ctx, driver.PartitionRef{Tenant: tenant, Topic: "x", PartitionKey: key, ConsumerGroup: g}, 0); err != nil {
					t.Fatal(err)
				}
				if _, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: driver.PartitionRef{Tenant: tenant, ConsumerGroup: g, Topic: "x", PartitionKey: key}, Owner: "o", Now: time.Now(), TTL: time.Hour}); err != nil {
					t.Fatal(err)
				}
			}
		}
		for _, name := range []string{"s1", "s2", "s3"} {
			if err := d.Heartbeat(ctx, driver.GroupScope{Tenants: []string{tenant}, Topic: "x", ConsumerGroup: "g"}, name, time.Now()); err != nil {
				t.Fatal(err)
			}
		}
	}
	admin := c.Admin()
	all := shardq.Scope{AllTenants: true}
	// pages lists with Limit 2, page after page, and checks the result
	// against one page of everything.
	pages := func(what string, list func(s shardq.Scope) ([]string, []string, error)) {
		t.Helper()
		whole, _, err := list(all)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		var got []string
		s := shardq.Scope{AllTenants: true, Limit: 2}
		for range 100 {
			rows, last, err := list(s)
			if err != nil {
				t.Fatalf("%s page after %q: %v", what, s.After, err)
			}
			got = append(got, rows...)
			if len(rows) < s.Limit {
				break
			}
			s.After = last
		}
		if fmt.Sprint(got) != fmt.Sprint(whole) || len(whole) < 5 {
			t.Fatalf("%s: pages %v, one listing %v", what, got, whole)
		}
	}
	pages("topics", func(s shardq.Scope) ([]string, []string, error) {
		ts, err := admin.Topics(ctx, s)
		var rows []string
		for _, x := range ts {
			rows = append(rows, x.Tenant+"/"+x.Topic)
		}
		if len(ts) == 0 {
			return rows, nil, err
		}
		l := ts[len(ts)-1]
		return rows, []string{l.Tenant, l.Topic}, err
	})
	pages("offsets", func(s shardq.Scope) ([]string, []string, error) {
		os, err := admin.Offsets(ctx, s, "")
		var rows []string
		for _, o := range os {
			rows = append(rows, fmt.Sprintf("%s/%s/%s/%s lag %d", o.Tenant, o.Topic, o.ConsumerGroup, o.PartitionKey, o.Lag))
		}
		if len(os) == 0 {
			return rows, nil, err
		}
		l := os[len(os)-1]
		return rows, []string{l.Tenant, l.Topic, l.ConsumerGroup, l.PartitionKey}, err
	})
	pages("leases", func(s shardq.Scope) ([]string, []string, error) {
		ls, err := admin.Leases(ctx, s)
		var rows []string
		for _, l := range ls {
			rows = append(rows, fmt.Sprintf("%s/%s/%s/%s", l.Tenant, l.ConsumerGroup, l.Topic, l.PartitionKey))
		}
		if len(ls) == 0 {
			return rows, nil, err
		}
		l := ls[len(ls)-1]
		return rows, []string{l.Tenant, l.ConsumerGroup, l.Topic, l.PartitionKey}, err
	})
	pages("subscribers", func(s shardq.Scope) ([]string, []string, error) {
		ss, err := admin.Subscribers(ctx, s)
		var rows []string
		for _, x := range ss {
			rows = append(rows, x.Tenant+"/"+x.ID)
		}
		if len(ss) == 0 {
			return rows, nil, err
		}
		l := ss[len(ss)-1]
		return rows, []string{l.Tenant, l.ConsumerGroup, l.Topic, l.ID}, err
	})
	if _, err := admin.Topics(ctx, shardq.Scope{AllTenants: true, Limit: shardq.MaxPageLimit + 1}); !errors.Is(err, shardq.ErrInvalid) {
		t.Fatalf("a page over the limit: %v", err)
	}
	if _, err := admin.Topics(ctx, shardq.Scope{AllTenants: true, After: []string{"only one of two"}}); err == nil {
		t.Fatal("a sort key of the wrong length was accepted")
	}

	// Lag is counted up to LagCountLimit.
	big := make([]shardq.Message, driver.LagCountLimit+5)
	for i := range big {
		big[i] = shardq.Message{Tenant: "a", Topic: "lag", PartitionKey: "k"}
	}
	mustPublish(t, c, big...)
	if err := d.ResetOffset(ctx, driver.PartitionRef{Tenant: "a", Topic: "lag", PartitionKey: "k", ConsumerGroup: "g"}, 0); err != nil {
		t.Fatal(err)
	}
	rows, err := admin.Offsets(ctx, shardq.Scope{Tenants: []string{"a"}}, "g")
	// The cursor, then the partitions of x that g has no cursor for.
	if err != nil || len(rows) == 0 || rows[0].Topic != "lag" || rows[0].Lag != driver.LagCountLimit || !rows[0].LagCapped || rows[0].OldestUnconsumed.IsZero() {
		t.Fatalf("capped lag: %+v, %v", rows, err)
	}
	for _, r := range rows[1:] {
		if !r.NoCursor || r.Topic != "x" || r.Lag != 1 {
			t.Fatalf("after the cursors, %+v: want partitions of x without a cursor of g", r)
		}
	}
}

// testAdminOffsetsCountScheduled: the offset report says how many of the
// messages after a cursor are delayed past now.
func testAdminOffsetsCountScheduled(t *testing.T, open Open) {
	d, c := setup(t, open, nil)
	ctx := context.Background()
	mustPublish(t, c, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "s", Delay: time.Hour},
		shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "s"},
		shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "s", NotBefore: time.Now().Add(2 * time.Hour)})
	if err := d.ResetOffset(ctx, driver.PartitionRef{Tenant: "t", Topic: "x", PartitionKey: "s", ConsumerGroup: "g"}, 0); err != nil {
		t.Fatal(err)
	}
	offsets, err := c.Admin().Offsets(ctx, shardq.Scope{Tenants: []string{"t"}}, "g")
	if err != nil || len(offsets) != 1 || offsets[0].Lag != 3 || offsets[0].Scheduled != 2 {
		t.Fatalf("offsets %+v, %v; want a lag of 3, 2 of them scheduled", offsets, err)
	}
}
