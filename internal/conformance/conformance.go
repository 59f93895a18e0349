// SPDX-License-Identifier: Apache-2.0

// Package conformance is the conformance suite of the client (the root
// package: publish, subscribers, receivers, receipts, transactions, admin)
// over each shardq driver; driver/drivertest is the suite of the driver
// alone. Its tests, in this package, run RunParallel on SQLite, MariaDB
// and Vitess with a function that opens the driver on a fresh, empty (not
// migrated) database of the test's own.
package conformance

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
)

// Open returns a driver on a fresh, empty database owned by t.
type Open func(t *testing.T) driver.Driver

// needsFresh names the tests of migration itself: they take open's
// database, never an already migrated one.
var needsFresh = map[string]bool{"NotMigratedSaysSo": true}

// changesEnv names the tests that set environment variables, which every
// client of the process reads: they run alone, before the others start.
var changesEnv = map[string]bool{"ServedTenantsOnly": true, "SubscribeValidates": true}

// RunParallel runs the conformance tests side by side (t.Parallel), but
// for those that change the process's environment: open must return a
// database of the test's own (the same one again when a test calls it
// twice, as Vitess's keyspace pool does, or another: either is fresh).
// migrated, when not nil, is open with the database already migrated to
// the latest schema version and emptied of rows: every test but those of
// migration takes it, for servers where a test's DDL costs seconds
// (Vitess). only, when not empty, names the tests to run; a name that is
// not a test fails the run, so that a rename cannot shrink it unseen.
func RunParallel(t *testing.T, open, migrated Open, only ...string) {
	tests := []conformanceTest{
		{"NotMigratedSaysSo", testNotMigratedSaysSo},
		{"PublishRoundTrip", testPublishRoundTrip},
		{"PublishLargestLegalBatch", testPublishLargestLegalBatch},
		{"OffsetsIncreasePerPartition", testOffsetsIncreasePerPartition},
		{"IdempotentAcrossCalls", testIdempotentAcrossCalls},
		{"IdempotentInsideOneBatch", testIdempotentInsideOneBatch},
		{"IdempotentUnderRace", testIdempotentUnderRace},
		{"DuplicatesInALargeBatch", testDuplicatesInALargeBatch},
		{"IdentifiersCompareExactly", testIdentifiersCompareExactly},
		{"PublishTxCommitAndRollback", testPublishTxCommitAndRollback},
		{"InvalidInputStoresNothing", testInvalidInputStoresNothing},
		{"ServedTenantsOnly", testServedTenantsOnly},
		{"Selectors", testSelectors},
		{"ConcurrentPublishersCoalesce", testConcurrentPublishersCoalesce},
		{"LaterCommitNeverHidesBehindOpenOne", testLaterCommitNeverHidesBehindOpenOne},
		{"NoSkipWithSlowConcurrentCommits", testNoSkipWithSlowConcurrentCommits},
	}
	all := slices.Concat(tests, subscriberTests, discoveryTests, groupTests, transactionTests, adminTests, lifecycleTests, tenantTests, receiptTests, settleTests, largeTests, producerTests)
	for _, name := range only {
		if !slices.ContainsFunc(all, func(tc conformanceTest) bool { return tc.name == name }) {
			t.Fatalf("conformance: no test named %q", name)
		}
	}
	for _, tc := range all {
		if len(only) > 0 && !slices.Contains(only, tc.name) {
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			if !changesEnv[tc.name] {
				t.Parallel()
			}
			if migrated != nil && !needsFresh[tc.name] {
				tc.fn(t, migrated)
				return
			}
			tc.fn(t, open)
		})
	}
}

// setup opens and migrates a driver and returns a client over it.
func setup(t *testing.T, open Open, cfg *shardq.Config) (driver.Driver, *shardq.Client) {
	t.Helper()
	d := open(t)
	if _, err := d.Migrate(context.Background()); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	c, err := shardq.NewClient(d, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return d, c
}

func fetchAll(t *testing.T, d driver.Driver, tenant, topic, key string) []driver.Message {
	t.Helper()
	msgs, err := d.FetchAfter(context.Background(), driver.TopicPartition{Tenant: tenant, Topic: topic, PartitionKey: key}, 0, 1_000_000)
	if err != nil {
		t.Fatalf("fetch: %v", err)
	}
	return msgs
}

func mustPublish(t *testing.T, c *shardq.Client, msgs ...shardq.Message) []shardq.PublishResult {
	t.Helper()
	res, err := c.Publish(context.Background(), msgs...)
	if err != nil {
		t.Fatalf("publish: %v", err)
	}
	if len(res) != len(msgs) {
		t.Fatalf("publish returned %d results for %d messages", len(res), len(msgs))
	}
	return res
}

func testNotMigratedSaysSo(t *testing.T, open Open) {
	d := open(t)
	c, err := shardq.NewClient(d, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.Publish(context.Background(), shardq.Message{Tenant: "t", Topic: "x", Payload: []byte("p")})
	if !errors.Is(err, shardq.ErrNotMigrated) {
		t.Fatalf("publish before migrate = %v, want ErrNotMigrated", err)
	}
	if !strings.Contains(err.Error(), "shardq migrate") {
		t.Fatalf("error %q does not name the command that fixes it", err)
	}
	if _, err := d.FetchAfter(context.Background(), driver.TopicPartition{Tenant: "t", Topic: "x", PartitionKey: ""}, 0, 10); !errors.Is(err, shardq.ErrNotMigrated) {
		t.Fatalf("fetch before migrate = %v, want ErrNotMigrated", err)
	}
}

func testPublishRoundTrip(t *testing.T, open Open) {
	created := time.Date(2026, 11, 30, 8, 1, 2, 123456789, time.FixedZone("X", 3600))
	clock := func() time.Time { return created }
	d, c := setup(t, open, &shardq.Config{Clock: clock})
	payload := []byte{0, 1, 2, 0xff, 'a', 0}
	key := "order-€-𝄞"
	res := mustPublish(t, c,
		shardq.Message{Tenant: "acme", Topic: "orders", PartitionKey: key, ID: "m-1", Payload: payload,
			Headers: map[string]string{"trace": "abc", "unicode": "ü"}},
		shardq.Message{Tenant: "acme", Topic: "orders", PartitionKey: key, Payload: nil},
	)
	if res[0].Duplicate || res[1].Duplicate || res[0].Offset <= 0 || res[1].Offset <= res[0].Offset {
		t.Fatalf("results %+v: want two new messages with increasing offsets", res)
	}
	if res[1].ID == "" || len(res[1].ID) != 36 {
		t.Fatalf("generated id %q, want a UUID", res[1].ID)
	}
	got := fetchAll(t, d, "acme", "orders", key)
	if len(got) != 2 {
		t.Fatalf("fetched %d messages, want 2", len(got))
	}
	m := got[0]
	if m.ID != "m-1" || m.Offset != res[0].Offset || !bytes.Equal(m.Payload, payload) ||
		m.Tenant != "acme" || m.Topic != "orders" || m.PartitionKey != key {
		t.Fatalf("round trip changed the message: %+v", m)
	}
	want := map[string]string{"trace": "abc", "unicode": "ü", shardq.HeaderQueueName: "acme"}
	if fmt.Sprint(m.Headers) != fmt.Sprint(want) {
		t.Fatalf("headers %v, want %v", m.Headers, want)
	}
	if !m.CreatedAt.Equal(created.Truncate(time.Microsecond)) || m.CreatedAt.Location() != time.UTC {
		t.Fatalf("created_at %v, want %v in UTC", m.CreatedAt, created.Truncate(time.Microsecond))
	}
	if got[1].ID != res[1].ID || len(got[1].Payload) != 0 {
		t.Fatalf("second message %+v", got[1])
	}
	heads, err := d.PartitionHeads(context.Background(), []string{"acme"}, "orders")
	if err != nil || len(heads) != 1 || heads[0].HeadOffset != res[1].Offset || heads[0].PartitionKey != key {
		t.Fatalf("heads %+v, %v; want one partition at offset %d", heads, err, res[1].Offset)
	}
}

func testOffsetsIncreasePerPartition(t *testing.T, open Open) {
	d, c := setup(t, open, nil)
	var last = map[string]int64{}
	for round := range 5 {
		var batch []shardq.Message
		for _, k := range []string{"b", "a", "c", "a"} {
			batch = append(batch, shardq.Message{Tenant: "t1", Topic: "x", PartitionKey: k,
				Payload: []byte(fmt.Sprintf("%s-%d", k, round))})
		}
		for i, r := range mustPublish(t, c, batch...) {
			if r.Offset <= last[r.PartitionKey] {
				t.Fatalf("round %d message %d: offset %d not above %d", round, i, r.Offset, last[r.PartitionKey])
			}
			last[r.PartitionKey] = r.Offset
		}
	}
	for _, k := range []string{"a", "b", "c"} {
		msgs := fetchAll(t, d, "t1", "x", k)
		for i := 1; i < len(msgs); i++ {
			if msgs[i].Offset <= msgs[i-1].Offset {
				t.Fatalf("partition %s out of order: %d after %d", k, msgs[i].Offset, msgs[i-1].Offset)
			}
		}
		if msgs[len(msgs)-1].Offset != last[k] {
			t.Fatalf("partition %s: last fetched %d, last published %d", k, msgs[len(msgs)-1].Offset, last[k])
		}
	}
}

func testIdempotentAcrossCalls(t *testing.T, open Open) {
	d, c := setup(t, open, nil)
	msg := shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "same", Payload: []byte("first")}
	first := mustPublish(t, c, msg)[0]
	mustPublish(t, c, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", Payload: []byte("other")})
	msg.Payload = []byte("second")
	again := mustPublish(t, c, msg, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "new"})
	if !again[0].Duplicate || again[0].Offset != first.Offset {
		t.Fatalf("republish = %+v, want Duplicate with offset %d", again[0], first.Offset)
	}
	if again[1].Duplicate || again[1].Offset <= first.Offset {
		t.Fatalf("new message beside a duplicate = %+v", again[1])
	}
	got := fetchAll(t, d, "t", "x", "k")
	if len(got) != 3 || string(got[0].Payload) != "first" {
		t.Fatalf("stored %d messages (first payload %q), want 3 with the first payload kept", len(got), got[0].Payload)
	}
	// The same id in another partition is another message.
	other := mustPublish(t, c, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k2", ID: "same"})[0]
	if other.Duplicate {
		t.Fatal("same id in another partition reported as duplicate")
	}
}

func testIdempotentInsideOneBatch(t *testing.T, open Open) {
	d, c := setup(t, open, nil)
	res := mustPublish(t, c,
		shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "a", Payload: []byte("1")},
		shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "b", Payload: []byte("2")},
		shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "a", Payload: []byte("3")},
	)
	if res[0].Duplicate || res[1].Duplicate || !res[2].Duplicate || res[2].Offset != res[0].Offset {
		t.Fatalf("results %+v: want the third to repeat the first", res)
	}
	if got := fetchAll(t, d, "t", "x", "k"); len(got) != 2 || string(got[0].Payload) != "1" {
		t.Fatalf("stored %d messages, want 2", len(got))
	}
}

// testDuplicatesInALargeBatch publishes more messages than one INSERT
// statement carries, with stored ids in a later statement's share.
func testDuplicatesInALargeBatch(t *testing.T, open Open) {
	d, c := setup(t, open, nil)
	early := mustPublish(t, c,
		shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "id-650"},
		shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "id-10"})
	var batch []shardq.Message
	for i := range 1200 {
		batch = append(batch, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: fmt.Sprintf("id-%d", i)})
	}
	res := mustPublish(t, c, batch...)
	var last int64
	for i, r := range res {
		switch i {
		case 10, 650:
			want := early[0].Offset
			if i == 10 {
				want = early[1].Offset
			}
			if !r.Duplicate || r.Offset != want {
				t.Fatalf("message %d = %+v, want a duplicate at offset %d", i, r, want)
			}
		default:
			if r.Duplicate || r.Offset <= last || r.Offset <= early[1].Offset {
				t.Fatalf("message %d = %+v after offset %d", i, r, last)
			}
			last = r.Offset
		}
	}
	if got := fetchAll(t, d, "t", "x", "k"); len(got) != 1200 {
		t.Fatalf("stored %d messages, want 1200", len(got))
	}
}

func testIdempotentUnderRace(t *testing.T, open Open) {
	d, c := setup(t, open, nil)
	ctx := context.Background()
	const racers = 16
	var wg sync.WaitGroup
	results := make(chan shardq.PublishResult, 2*racers)
	errs := make(chan error, 2*racers)
	for i := range racers {
		wg.Add(2)
		go func() { // through the coalescer
			defer wg.Done()
			res, err := c.Publish(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "dup",
				Payload: []byte(fmt.Sprint(i))})
			if err != nil {
				errs <- err
				return
			}
			results <- res[0]
		}()
		go func() { // each in its own transaction
			defer wg.Done()
			tx, err := beginWrite(ctx, d)
			if err != nil {
				errs <- err
				return
			}
			res, err := c.PublishTx(ctx, tx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "dup"})
			if err != nil {
				tx.Rollback()
				errs <- err
				return
			}
			if err := tx.Commit(); err != nil {
				errs <- err
				return
			}
			results <- res[0]
		}()
	}
	wg.Wait()
	close(results)
	close(errs)
	for err := range errs {
		t.Fatalf("racing publish: %v", err)
	}
	fresh, offsets := 0, map[int64]bool{}
	for r := range results {
		if !r.Duplicate {
			fresh++
		}
		offsets[r.Offset] = true
	}
	if fresh != 1 || len(offsets) != 1 {
		t.Fatalf("%d publishers stored the message, offsets %v; want exactly one and one offset", fresh, offsets)
	}
	if got := fetchAll(t, d, "t", "x", "k"); len(got) != 1 {
		t.Fatalf("stored %d rows, want 1", len(got))
	}
}

func testIdentifiersCompareExactly(t *testing.T, open Open) {
	d, c := setup(t, open, nil)
	for _, m := range []shardq.Message{
		{Tenant: "acme", Topic: "x", PartitionKey: "k", ID: "id"},
		{Tenant: "Acme", Topic: "x", PartitionKey: "k", ID: "id"},
		{Tenant: "acme", Topic: "X", PartitionKey: "k", ID: "id"},
		{Tenant: "acme", Topic: "x", PartitionKey: "K", ID: "id"},
		{Tenant: "acme", Topic: "x", PartitionKey: " k", ID: "id"},
		{Tenant: "acme", Topic: "x", PartitionKey: "k\t", ID: "id"},
		{Tenant: "acme", Topic: "x", PartitionKey: "é", ID: "id"},
		{Tenant: "acme", Topic: "x", PartitionKey: "e", ID: "id"},
		{Tenant: "acme", Topic: "x", PartitionKey: "k", ID: "ID"},
		{Tenant: "acme", Topic: "x", PartitionKey: "k", ID: "ïd"},
	} {
		if r := mustPublish(t, c, m)[0]; r.Duplicate {
			t.Fatalf("%+v reported as a duplicate: identifiers must compare byte for byte / by code point", m)
		}
	}
	if got := fetchAll(t, d, "acme", "x", "k"); len(got) != 3 {
		t.Fatalf("partition k holds %d messages, want 3 (id, ID, ïd)", len(got))
	}
}

func testPublishTxCommitAndRollback(t *testing.T, open Open) {
	d, c := setup(t, open, nil)
	ctx := context.Background()
	tx, err := beginWrite(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.PublishTx(ctx, tx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "rolled"}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if got := fetchAll(t, d, "t", "x", "k"); len(got) != 0 {
		t.Fatalf("rolled-back message visible: %+v", got)
	}
	if heads, _ := d.PartitionHeads(ctx, []string{"t"}, "x"); len(heads) != 0 {
		t.Fatalf("rolled-back publish left a head row: %+v", heads)
	}
	tx, err = beginWrite(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.PublishTx(ctx, tx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "kept"})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	got := fetchAll(t, d, "t", "x", "k")
	if len(got) != 1 || got[0].ID != "kept" || got[0].Offset != res[0].Offset {
		t.Fatalf("committed message: %+v, want id kept at offset %d", got, res[0].Offset)
	}
	if _, err := c.PublishTx(ctx, nil, shardq.Message{Tenant: "t", Topic: "x"}); !errors.Is(err, shardq.ErrInvalid) {
		t.Fatalf("PublishTx(nil tx) = %v, want ErrInvalid", err)
	}
}

func testInvalidInputStoresNothing(t *testing.T, open Open) {
	d, c := setup(t, open, &shardq.Config{MaxPayloadBytes: 16})
	ctx := context.Background()
	good := shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "ok"}
	cases := []struct {
		msg  shardq.Message
		want string
	}{
		{shardq.Message{Topic: "x"}, "message 1: tenant: must not be empty"},
		{shardq.Message{Tenant: "t", Topic: "a\x00"}, "message 1: topic: byte 0x00 not allowed"},
		{shardq.Message{Tenant: "t", Topic: "x", PartitionKey: strings.Repeat("k", 256)}, "message 1: partition key: 256 characters, limit 255"},
		{shardq.Message{Tenant: "t", Topic: "x", ID: "\xff"}, "message 1: message id: invalid UTF-8 at byte 0"},
		{shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k "}, "message 1: partition key: must not end with a space"},
		{shardq.Message{Tenant: "t", Topic: "x", Payload: make([]byte, 17)}, "message 1: payload: 17 bytes, limit 16"},
		{shardq.Message{Tenant: "t", Topic: "x", Headers: map[string]string{"queue_name": "other"}}, `message 1: header "queue_name": "other" differs from tenant "t"`},
		{shardq.Message{Tenant: "u", Topic: "x"}, `message 1: tenant: "u" differs from message 0's "t"`},
		{shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", Selector: shardq.KeySelector, SelectorArg: "k"}, "message 1: partition key: must be empty when a Selector chooses it"},
		{shardq.Message{Tenant: "t", Topic: "x", Selector: shardq.KeySelector, SelectorArg: 7}, "message 1: partition key: selector: KeySelector: argument is int, want string"},
		{shardq.Message{Tenant: "t", Topic: "x", Headers: map[string]string{"": "v"}}, `message 1: header "": the key must not be empty`},
		{shardq.Message{Tenant: "t", Topic: "x", Headers: map[string]string{"k\xff": "v"}}, `message 1: header key "k\xff": invalid UTF-8 at byte 1`},
	}
	for _, tc := range cases {
		_, err := c.Publish(ctx, good, tc.msg)
		var ve *shardq.ValidationError
		if !errors.Is(err, shardq.ErrInvalid) || !errors.As(err, &ve) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Publish(%+v) = %v, want a validation error containing %q", tc.msg, err, tc.want)
		}
		if me := (*shardq.MessageError)(nil); !errors.As(err, &me) || me.Index != 1 {
			t.Errorf("Publish(%+v) = %v, want a MessageError of index 1", tc.msg, err)
		}
		tx, err := beginWrite(ctx, d)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.PublishTx(ctx, tx, good, tc.msg); !errors.Is(err, shardq.ErrInvalid) && !strings.Contains(tc.want, "differs from message 0") {
			t.Errorf("PublishTx(%+v) = %v, want ErrInvalid", tc.msg, err)
		}
		tx.Rollback()
	}
	if got := fetchAll(t, d, "t", "x", "k"); len(got) != 0 {
		t.Fatalf("a rejected batch stored %d messages", len(got))
	}
	// Something stored before is untouched by a rejected batch.
	mustPublish(t, c, good)
	if _, err := c.Publish(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "ok", Payload: make([]byte, 17)}); err == nil {
		t.Fatal("oversized republish accepted")
	}
	if got := fetchAll(t, d, "t", "x", "k"); len(got) != 1 || len(got[0].Payload) != 0 {
		t.Fatalf("stored message changed by a rejected publish: %+v", got)
	}
}

func testSelectors(t *testing.T, open Open) {
	_, c := setup(t, open, nil)
	lanes := shardq.HashSelector(8)
	seen := map[string]string{}
	for i := range 200 {
		biz := fmt.Sprintf("customer-%d", i%20)
		r := mustPublish(t, c, shardq.Message{Tenant: "t", Topic: "x", Selector: lanes, SelectorArg: biz})[0]
		if prev, ok := seen[biz]; ok && prev != r.PartitionKey {
			t.Fatalf("business key %s moved from lane %s to %s", biz, prev, r.PartitionKey)
		}
		seen[biz] = r.PartitionKey
	}
	distinct := map[string]bool{}
	for _, k := range seen {
		distinct[k] = true
	}
	if len(distinct) < 4 {
		t.Fatalf("20 business keys used %d of 8 lanes", len(distinct))
	}
	r := mustPublish(t, c, shardq.Message{Tenant: "t", Topic: "x", Selector: shardq.KeySelector, SelectorArg: "explicit"})[0]
	if r.PartitionKey != "explicit" {
		t.Fatalf("KeySelector chose %q", r.PartitionKey)
	}
	custom := shardq.SelectorFunc(func(m *shardq.Message, arg any) (string, error) {
		return fmt.Sprintf("%s-%d", m.Topic, arg.(int)%3), nil
	})
	r = mustPublish(t, c, shardq.Message{Tenant: "t", Topic: "x", Selector: custom, SelectorArg: 7})[0]
	if r.PartitionKey != "x-1" {
		t.Fatalf("custom selector chose %q", r.PartitionKey)
	}
}

func testConcurrentPublishersCoalesce(t *testing.T, open Open) {
	d, c := setup(t, open, nil)
	ctx := context.Background()
	const publishers, each = 16, 25
	var wg sync.WaitGroup
	errs := make(chan error, publishers)
	for p := range publishers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			last := int64(0)
			for i := range each {
				r, err := c.Publish(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: fmt.Sprint(p % 4),
					ID: fmt.Sprintf("%d-%d", p, i)})
				if err != nil {
					errs <- err
					return
				}
				if r[0].Duplicate || r[0].Offset <= last {
					errs <- fmt.Errorf("publisher %d message %d: %+v after offset %d", p, i, r[0], last)
					return
				}
				last = r[0].Offset
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	total := 0
	for k := range 4 {
		msgs := fetchAll(t, d, "t", "x", fmt.Sprint(k))
		for i := 1; i < len(msgs); i++ {
			if msgs[i].Offset <= msgs[i-1].Offset {
				t.Fatalf("partition %d out of order", k)
			}
		}
		total += len(msgs)
	}
	if total != publishers*each {
		t.Fatalf("stored %d messages, want %d", total, publishers*each)
	}
}

// testLaterCommitNeverHidesBehindOpenOne is invariant 2 in its sharpest
// form: while a transaction that published to a partition is open, a later
// publisher of that partition must not commit a higher offset, or a reader
// would pass the open one's offset before it becomes visible.
func testLaterCommitNeverHidesBehindOpenOne(t *testing.T, open Open) {
	d, c := setup(t, open, nil)
	ctx := context.Background()
	tx, err := beginWrite(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback() // on failure, end it before cleanup drops the database
	first, err := c.PublishTx(ctx, tx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "first"})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := c.Publish(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "second"})
		done <- err
	}()
	// Give the second publisher time to commit if nothing stops it. It must
	// not: nothing of the partition may be visible past the open offset.
	select {
	case err := <-done:
		t.Fatalf("second publish finished (%v) while the first transaction was open", err)
	case <-time.After(300 * time.Millisecond):
	}
	if got := fetchAll(t, d, "t", "x", "k"); len(got) != 0 {
		t.Fatalf("reader sees %+v while offset %d is uncommitted", got, first[0].Offset)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	got := fetchAll(t, d, "t", "x", "k")
	if len(got) != 2 || got[0].ID != "first" || got[1].ID != "second" {
		t.Fatalf("partition after both commits: %+v, want first then second", got)
	}
}

// testNoSkipWithSlowConcurrentCommits is invariant 2 of docs/design.md under load: 16
// publishers hold their transactions open 0–20 ms before commit while a
// reader fetches after its cursor and advances it. The reader must end with
// every message, in offset order.
func testNoSkipWithSlowConcurrentCommits(t *testing.T, open Open) {
	d, c := setup(t, open, nil)
	ctx := context.Background()
	const publishers, each = 16, 12
	var wg sync.WaitGroup
	errs := make(chan error, publishers+1)
	for p := range publishers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				tx, err := beginWrite(ctx, d)
				if err != nil {
					errs <- err
					return
				}
				if _, err := c.PublishTx(ctx, tx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "hot",
					ID: fmt.Sprintf("%d-%d", p, i)}); err != nil {
					tx.Rollback()
					errs <- err
					return
				}
				time.Sleep(time.Duration(rand.IntN(21)) * time.Millisecond)
				if err := tx.Commit(); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	published := make(chan struct{})
	go func() { wg.Wait(); close(published) }()

	var cursor int64
	seen := map[string]bool{}
	var order []int64
	for finished := false; ; {
		select {
		case <-published:
			finished = true
		default:
		}
		msgs, err := d.FetchAfter(ctx, driver.TopicPartition{Tenant: "t", Topic: "x", PartitionKey: "hot"}, cursor, 7)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			if seen[m.ID] {
				t.Fatalf("message %s delivered twice", m.ID)
			}
			seen[m.ID] = true
			order = append(order, m.Offset)
			cursor = m.Offset
		}
		if finished && len(msgs) == 0 {
			break
		}
	}
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if len(seen) != publishers*each {
		t.Fatalf("reader got %d of %d messages: its cursor skipped rows committed late", len(seen), publishers*each)
	}
	if !slices.IsSorted(order) {
		t.Fatal("reader got messages out of offset order")
	}
}

// A client with a served tenant list (Config.Tenants or SHARDQ_TENANTS)
// refuses to publish elsewhere, naming the tenant and the list, and
// stores nothing.
func testServedTenantsOnly(t *testing.T, open Open) {
	ctx := context.Background()
	d, c := setup(t, open, &shardq.Config{Tenants: []string{"a", "b"}})
	check := func(what string, err error) {
		t.Helper()
		var ve *shardq.ValidationError
		if !errors.As(err, &ve) || ve.Field != "tenant" || !strings.Contains(err.Error(), `"z" is not served`) || !strings.Contains(err.Error(), "a, b") {
			t.Fatalf("%s to an unserved tenant: %v", what, err)
		}
	}
	mustPublish(t, c, shardq.Message{Tenant: "a", Topic: "x", PartitionKey: "k"})
	_, err := c.Publish(ctx, shardq.Message{Tenant: "z", Topic: "x", PartitionKey: "k"})
	check("Publish", err)
	tx, err := beginWrite(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.PublishTx(ctx, tx, shardq.Message{Tenant: "z", Topic: "x"})
	check("PublishTx", err)
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	p, err := c.StartTransactionProducer(ctx, shardq.TransactionProducerConfig{ProducerGroup: "pg", Tenants: []string{"a"},
		Checker: func(context.Context, *shardq.HalfMessage) (shardq.TxState, error) { return shardq.TxCommit, nil }})
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.SendInTransaction(ctx, shardq.Message{Tenant: "z", Topic: "x"}, nil, nil, func(context.Context, *shardq.HalfMessage) (shardq.TxState, error) {
		t.Error("the local transaction ran for a refused message")
		return shardq.TxCommit, nil
	})
	check("SendInTransaction", err)
	if err := p.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if heads, err := d.PartitionHeads(ctx, []string{"z"}, "x"); err != nil || len(heads) != 0 {
		t.Fatalf("tenant z has partitions %v, %v; nothing may be stored", heads, err)
	}

	fromEnv := func(variable, served, unserved string) {
		t.Helper()
		c, err := shardq.NewClient(d, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Publish(ctx, shardq.Message{Tenant: served, Topic: "x"}); err != nil {
			t.Fatalf("publish to %s, served by %s: %v", served, variable, err)
		}
		if _, err := c.Publish(ctx, shardq.Message{Tenant: unserved, Topic: "x"}); err == nil || !strings.Contains(err.Error(), "SHARDQ_TENANTS") {
			t.Fatalf("publish to %s, outside %s: %v", unserved, variable, err)
		}
	}
	t.Setenv("SHARDQ_TENANTS", "a")
	fromEnv("SHARDQ_TENANTS", "a", "b")
	t.Setenv("SHARDQ_TENANTS", "a,,b")
	if _, err := shardq.NewClient(d, nil); !errors.Is(err, shardq.ErrInvalid) || !strings.Contains(err.Error(), "SHARDQ_TENANTS") {
		t.Fatalf("NewClient with a malformed SHARDQ_TENANTS: %v", err)
	}
	// MQ_TENANTS, the former name, is read while SHARDQ_TENANTS is unset
	// (for one release), and SHARDQ_TENANTS wins when both are set.
	os.Unsetenv("SHARDQ_TENANTS") // t.Setenv restores it
	t.Setenv("MQ_TENANTS", "b")
	fromEnv("MQ_TENANTS", "b", "a")
	t.Setenv("MQ_TENANTS", "b,,c")
	if _, err := shardq.NewClient(d, nil); !errors.Is(err, shardq.ErrInvalid) || !strings.Contains(err.Error(), "MQ_TENANTS: entry 2") {
		t.Fatalf("NewClient with a malformed MQ_TENANTS: %v", err)
	}
	t.Setenv("SHARDQ_TENANTS", "a")
	fromEnv("SHARDQ_TENANTS over MQ_TENANTS", "a", "b")
}

// The largest legal messages publish in one call: 64 caller headers (the
// queue_name header shardq adds does not count) of 8 KiB values, 40 at
// once, about 20 MiB of headers that MariaDB's 16 MiB max_allowed_packet
// must not refuse: statements are sized by their encoded length.
func testPublishLargestLegalBatch(t *testing.T, open Open) {
	d, c := setup(t, open, nil)
	value := strings.Repeat("v'\\", 8<<10/3)
	var msgs []shardq.Message
	for i := range 40 {
		h := map[string]string{}
		for j := range 64 {
			h[fmt.Sprintf("h%02d", j)] = value
		}
		msgs = append(msgs, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: fmt.Sprintf("m%02d", i), Headers: h, Payload: []byte("p")})
	}
	res := mustPublish(t, c, msgs...)
	if len(res) != 40 {
		t.Fatalf("%d results", len(res))
	}
	got, err := d.FetchAfter(context.Background(), driver.TopicPartition{Tenant: "t", Topic: "x", PartitionKey: "k"}, 0, 100)
	if err != nil || len(got) != 40 {
		t.Fatalf("fetched %d, %v", len(got), err)
	}
	if len(got[39].Headers) != 65 || got[39].Headers["h63"] != value {
		t.Fatalf("headers of the last message: %d entries", len(got[39].Headers))
	}
	// 65 caller headers are one too many, named as the caller's.
	msgs[0].Headers["h64"] = "x"
	if _, err := c.Publish(context.Background(), msgs[0]); err == nil || !strings.Contains(err.Error(), "65 entries, limit 64") {
		t.Fatalf("65 caller headers: %v", err)
	}
}

// beginWrite is d.BeginWrite as the *sql.Tx an application holds
// (PublishTx and AckTx take one): every driver here begins one.
func beginWrite(ctx context.Context, d driver.Driver) (*sql.Tx, error) {
	tx, err := d.BeginWrite(ctx)
	if err != nil {
		return nil, err
	}
	return tx.(*sql.Tx), nil
}

// conformanceTest is one scenario of the suite.
type conformanceTest struct {
	name string
	fn   func(*testing.T, Open)
}
