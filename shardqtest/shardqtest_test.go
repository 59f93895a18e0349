// SPDX-License-Identifier: Apache-2.0

package shardqtest_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/testdb"
	"github.com/shardq/shardq/shardqtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"))
}

// failing is a testing.TB whose Fatalf ends the call it is in, so that a
// test can see an assertion fail.
type failing struct {
	testing.TB
	msg string
}

type fatal struct{}

func (f *failing) Helper() {}
func (f *failing) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	panic(fatal{})
}

// fails runs fn with a failing TB and returns what it failed with ("":
// it passed).
func fails(t *testing.T, fn func(tb testing.TB)) (msg string) {
	t.Helper()
	f := &failing{TB: t}
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(fatal); !ok {
				panic(r)
			}
			msg = f.msg
		}
	}()
	fn(f)
	return ""
}

func TestNewClientIsMigratedAndOwnsItsFile(t *testing.T) {
	c := shardqtest.NewClient(t, nil)
	if _, err := c.Publish(context.Background(), shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "1", Payload: []byte("a")}); err != nil {
		t.Fatalf("publish on a fresh client: %v", err)
	}
	if other := shardqtest.NewClient(t, nil); len(shardqtest.RequirePublished(t, c, shardqtest.Want{Tenant: "t", Topic: "x", PartitionKey: "k"})) != 1 ||
		fails(t, func(tb testing.TB) {
			shardqtest.RequirePublished(tb, other, shardqtest.Want{Tenant: "t", Topic: "x", PartitionKey: "k"})
		}) == "" {
		t.Fatal("two clients share a database")
	}
}

func TestRequirePublished(t *testing.T) {
	ctx := context.Background()
	c := shardqtest.NewClient(t, nil)
	if _, err := c.Publish(ctx,
		shardq.Message{Tenant: "t", Topic: "orders", PartitionKey: "o1", ID: "a", Payload: []byte("created")},
		shardq.Message{Tenant: "t", Topic: "orders", PartitionKey: "o1", ID: "b", Payload: []byte("paid")},
	); err != nil {
		t.Fatal(err)
	}
	got := shardqtest.RequirePublished(t, c,
		shardqtest.Want{Tenant: "t", Topic: "orders", PartitionKey: "o1", Payload: []byte("created")},
		shardqtest.Want{Tenant: "t", Topic: "orders", PartitionKey: "o1", ID: "b"})
	if len(got) != 2 || got[0].ID != "a" || got[1].ID != "b" {
		t.Fatalf("matched %+v", got)
	}
	for name, w := range map[string][]shardqtest.Want{
		"payload":   {{Tenant: "t", Topic: "orders", PartitionKey: "o1", Payload: []byte("shipped")}},
		"key":       {{Tenant: "t", Topic: "orders", PartitionKey: "o2"}},
		"tenant":    {{Tenant: "u", Topic: "orders", PartitionKey: "o1"}},
		"one each":  {{Tenant: "t", Topic: "orders", PartitionKey: "o1"}, {Tenant: "t", Topic: "orders", PartitionKey: "o1"}, {Tenant: "t", Topic: "orders", PartitionKey: "o1"}},
		"key order": {{Tenant: "t", Topic: "orders", PartitionKey: "o1", ID: "b"}, {Tenant: "t", Topic: "orders", PartitionKey: "o1", ID: "a"}},
	} {
		msg := fails(t, func(tb testing.TB) { shardqtest.RequirePublished(tb, c, w...) })
		if !strings.Contains(msg, "not published") {
			t.Errorf("%s: failed with %q, want not published", name, msg)
		}
	}
}

// What PublishTx stored is seen in its transaction before the commit,
// and by RequirePublished only after it.
func TestRequirePublishedTx(t *testing.T) {
	for _, db := range []struct {
		name string
		open func(t *testing.T) driver.Driver
	}{
		{"sqlite", func(t *testing.T) driver.Driver { return testdb.Migrated(t, testdb.SQLite(t)) }},
		{"mariadb", func(t *testing.T) driver.Driver { return testdb.Migrated(t, testdb.MySQL(t)) }},
	} {
		t.Run(db.name, func(t *testing.T) {
			ctx := context.Background()
			drv := db.open(t)
			c, err := shardq.NewClient(drv, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			tx, err := drv.DB().BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			if _, err := c.PublishTx(ctx, tx, shardq.Message{Tenant: "t", Topic: "orders", PartitionKey: "o1", ID: "a", Payload: []byte("created")}); err != nil {
				t.Fatal(err)
			}
			want := shardqtest.Want{Tenant: "t", Topic: "orders", PartitionKey: "o1", ID: "a", Payload: []byte("created")}
			if got := shardqtest.RequirePublishedTx(t, tx, want); len(got) != 1 || got[0].Offset == 0 {
				t.Fatalf("in the transaction: %+v", got)
			}
			if msg := fails(t, func(tb testing.TB) {
				shardqtest.RequirePublishedTx(tb, tx, shardqtest.Want{Tenant: "t", Topic: "orders", PartitionKey: "o1", ID: "b"})
			}); !strings.Contains(msg, "not published in the transaction") {
				t.Fatalf("a message the transaction did not store: failed with %q", msg)
			}
			if db.name == "mariadb" { // SQLite's one writer would wait for the commit
				if msg := fails(t, func(tb testing.TB) { shardqtest.RequirePublished(tb, c, want) }); msg == "" {
					t.Fatal("RequirePublished saw a message before its commit")
				}
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			shardqtest.RequirePublished(t, c, want)
		})
	}
}

func TestHandle(t *testing.T) {
	ctx := context.Background()
	d := &shardq.Delivery{Tenant: "t", Topic: "orders", PartitionKey: "o1", ID: "a", Payload: []byte("created")}
	boom := errors.New("boom")
	for _, tc := range []struct {
		name    string
		h       shardq.Handler
		attempt int
		opts    *shardqtest.Options
		want    shardqtest.Settled
	}{
		{"ack", func(context.Context, *shardq.Delivery) error { return nil }, 0, nil, shardqtest.Settled{Ack: true}},
		{"retry with the backoff", func(context.Context, *shardq.Delivery) error { return boom }, 3, nil,
			shardqtest.Settled{Retry: true, RetryAfter: 4 * shardq.DefaultBackoffMin, Err: boom}},
		{"retry after", func(context.Context, *shardq.Delivery) error { return shardq.RetryAfter(time.Minute, boom) }, 1, nil,
			shardqtest.Settled{Retry: true, RetryAfter: time.Minute}},
		{"dead letter", func(context.Context, *shardq.Delivery) error { return shardq.DeadLetter(boom) }, 1, nil,
			shardqtest.Settled{DeadLetter: true}},
		{"last attempt", func(context.Context, *shardq.Delivery) error { return boom }, 3, &shardqtest.Options{MaxAttempts: 3},
			shardqtest.Settled{DeadLetter: true, Err: boom}},
		{"unlimited", func(context.Context, *shardq.Delivery) error { return boom }, 50, &shardqtest.Options{MaxAttempts: shardq.UnlimitedAttempts, BackoffMax: time.Hour},
			shardqtest.Settled{Retry: true, RetryAfter: time.Hour, Err: boom}},
		{"defer", func(ctx context.Context, d *shardq.Delivery) error { return d.Defer(ctx) }, 1, nil, shardqtest.Settled{Deferred: true}},
		{"defer then fail", func(ctx context.Context, d *shardq.Delivery) error { d.Defer(ctx); return boom }, 1, nil,
			shardqtest.Settled{Deferred: true, Err: boom}},
		{"defer on the last attempt", func(ctx context.Context, d *shardq.Delivery) error { d.Defer(ctx); return boom }, 3, &shardqtest.Options{MaxAttempts: 3},
			shardqtest.Settled{Deferred: true, Err: boom}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := *d
			in.Attempt = tc.attempt
			got := shardqtest.Handle(ctx, tc.h, &in, tc.opts)
			if got.Err != nil && tc.want.Err == nil {
				tc.want.Err = got.Err // a wrapped cause: compared below
			}
			// A backoff is jittered down to half its length.
			jittered := tc.want.RetryAfter == got.RetryAfter || tc.want.Err == boom && got.RetryAfter >= tc.want.RetryAfter/2 && got.RetryAfter <= tc.want.RetryAfter
			if !errors.Is(got.Err, tc.want.Err) || got.Ack != tc.want.Ack || got.Deferred != tc.want.Deferred || got.Retry != tc.want.Retry ||
				!jittered || got.DeadLetter != tc.want.DeadLetter || got.AckedTx != tc.want.AckedTx {
				t.Fatalf("Handle = %+v, want %+v", got, tc.want)
			}
			if tc.name == "dead letter" || tc.name == "retry after" {
				if !errors.Is(got.Err, boom) {
					t.Fatalf("Err %v does not wrap the cause", got.Err)
				}
			}
		})
	}
	// The copy the handler gets is d's, and d is left as it was.
	var seen *shardq.Delivery
	shardqtest.Handle(ctx, func(_ context.Context, got *shardq.Delivery) error { seen = got; return nil }, d, nil)
	if seen == d || seen.ID != "a" || string(seen.Payload) != "created" || seen.Attempt != 1 || d.Attempt != 0 {
		t.Fatalf("handler saw %+v of %+v", seen, d)
	}
	// AckTx with the test's transaction is recorded; without one it is
	// refused as the subscriber refuses it.
	drv := testdb.SQLite(t)
	tx, err := drv.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if got := shardqtest.Handle(ctx, func(ctx context.Context, d *shardq.Delivery) error { return d.AckTx(ctx, tx) }, d, nil); !got.AckedTx || got.Ack {
		t.Fatalf("AckTx(tx) = %+v, want AckedTx", got)
	}
	if got := shardqtest.Handle(ctx, func(ctx context.Context, d *shardq.Delivery) error { return d.AckTx(ctx, nil) }, d, nil); !got.Retry {
		t.Fatalf("AckTx(nil) = %+v, want a failure", got)
	}
}
