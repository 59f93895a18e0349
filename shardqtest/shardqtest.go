// SPDX-License-Identifier: Apache-2.0

// Package shardqtest helps the tests of applications that use shardq, as
// River's rivertest does for River: a throwaway client, assertions on
// what a call or a transaction published, and a handler run against a
// hand-built Delivery with what it settled reported.
package shardqtest

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver/sqlitedriver"
	"github.com/shardq/shardq/internal/settle"
	"github.com/shardq/shardq/internal/testhook"
)

// NewClient returns a client on a migrated SQLite file in a directory of
// t's own, closed and removed when the test ends. cfg may be nil; without
// a Logger the client logs nothing.
func NewClient(t testing.TB, cfg *shardq.Config) *shardq.Client {
	t.Helper()
	if cfg == nil {
		cfg = &shardq.Config{}
	}
	if cfg.Logger == nil {
		c := *cfg
		c.Logger = slog.New(slog.DiscardHandler)
		cfg = &c
	}
	drv, err := sqlitedriver.Open(filepath.Join(t.TempDir(), "shardq.db"), nil)
	if err != nil {
		t.Fatalf("shardqtest: open SQLite: %v", err)
	}
	c, err := shardq.NewClient(drv, cfg)
	if err != nil {
		drv.Close()
		t.Fatalf("shardqtest: new client: %v", err)
	}
	t.Cleanup(func() {
		c.Close()
		drv.Close()
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.Migrate(ctx); err != nil {
		t.Fatalf("shardqtest: migrate: %v", err)
	}
	return c
}

// Want is a message a test expects: Tenant, Topic and PartitionKey must
// match; ID and Payload when set.
type Want struct {
	Tenant, Topic, PartitionKey string
	ID                          string // "": any
	Payload                     []byte // nil: any
}

func (w Want) String() string {
	s := fmt.Sprintf("tenant %q topic %q key %q", w.Tenant, w.Topic, w.PartitionKey)
	if w.ID != "" {
		s += fmt.Sprintf(" id %q", w.ID)
	}
	if w.Payload != nil {
		s += fmt.Sprintf(" payload %q", w.Payload)
	}
	return s
}

func (w Want) matches(m shardq.StoredMessage) bool {
	return m.Tenant == w.Tenant && m.Topic == w.Topic && m.PartitionKey == w.PartitionKey &&
		(w.ID == "" || m.ID == w.ID) && (w.Payload == nil || bytes.Equal(m.Payload, w.Payload))
}

// maxScan bounds what the assertions read of one topic.
const maxScan = 10_000

// RequirePublished fails t unless each of want is stored and committed,
// each matched by a message of its own and, within a partition key, in
// the order given; it returns the messages matched. It reads the first
// 10,000 messages of each topic named.
func RequirePublished(t testing.TB, c *shardq.Client, want ...Want) []shardq.StoredMessage {
	t.Helper()
	return require(t, "published", want, func(ctx context.Context, tenant, topic string) ([]shardq.StoredMessage, error) {
		var all []shardq.StoredMessage
		for after := int64(0); len(all) < maxScan; {
			page, err := c.Admin().Messages(ctx, shardq.BrowseRequest{Tenant: tenant, Topic: topic, AfterOffset: after, Limit: shardq.MaxPageLimit})
			if err != nil {
				return nil, err
			}
			all = append(all, page...)
			if len(page) < shardq.MaxPageLimit {
				break
			}
			after = page[len(page)-1].Offset
		}
		return all, nil
	})
}

// RequirePublishedTx is RequirePublished of what tx stored, tx being
// still open (PublishTx, before the commit). tx must be on a database
// that shardq's SQLite or MySQL driver migrated.
func RequirePublishedTx(t testing.TB, tx *sql.Tx, want ...Want) []shardq.StoredMessage {
	t.Helper()
	return require(t, "published in the transaction", want, func(ctx context.Context, tenant, topic string) ([]shardq.StoredMessage, error) {
		return readTx(ctx, tx, tenant, topic)
	})
}

// require reads each topic named by want once, in offset order, and
// matches want in it (match).
func require(t testing.TB, what string, want []Want, read func(ctx context.Context, tenant, topic string) ([]shardq.StoredMessage, error)) []shardq.StoredMessage {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stored := map[[2]string][]shardq.StoredMessage{}
	for _, w := range want {
		k := [2]string{w.Tenant, w.Topic}
		if _, done := stored[k]; done {
			continue
		}
		ms, err := read(ctx, w.Tenant, w.Topic)
		if err != nil {
			t.Fatalf("shardqtest: read tenant %q topic %q: %v", w.Tenant, w.Topic, err)
		}
		stored[k] = ms
	}
	return match(t, what, want, func(w Want) []shardq.StoredMessage { return stored[[2]string{w.Tenant, w.Topic}] })
}

// readTx reads a topic's messages as tx sees them. Both drivers' tables
// have these columns, and SQLite takes MySQL's quoted `offset`.
func readTx(ctx context.Context, tx *sql.Tx, tenant, topic string) ([]shardq.StoredMessage, error) {
	rows, err := tx.QueryContext(ctx, "SELECT partition_key, id, `offset`, payload FROM queue_messages WHERE tenant = ? AND topic = ? ORDER BY `offset` LIMIT ?",
		tenant, topic, maxScan)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []shardq.StoredMessage
	for rows.Next() {
		m := shardq.StoredMessage{Tenant: tenant, Topic: topic}
		if err := rows.Scan(&m.PartitionKey, &m.ID, &m.Offset, &m.Payload); err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, rows.Err()
}

// match finds each of want in stored (in offset order), a message
// matching once and after the one matched for the previous want of its
// partition key, and fails t with what is there when one is missing.
func match(t testing.TB, what string, want []Want, stored func(Want) []shardq.StoredMessage) []shardq.StoredMessage {
	t.Helper()
	after := map[[3]string]int64{} // tenant, topic, key: the offset matched last
	var out []shardq.StoredMessage
	for _, w := range want {
		key := [3]string{w.Tenant, w.Topic, w.PartitionKey}
		found := false
		for _, m := range stored(w) {
			if m.Offset > after[key] && w.matches(m) {
				after[key], found = m.Offset, true
				out = append(out, m)
				break
			}
		}
		if !found {
			all := stored(w)
			var have []string
			for _, m := range all[:min(len(all), 20)] {
				have = append(have, fmt.Sprintf("key %q id %q payload %.40q", m.PartitionKey, m.ID, m.Payload))
			}
			if len(all) > 20 {
				have = append(have, "…")
			}
			t.Fatalf("shardqtest: not %s: %s; tenant %q topic %q holds %d: [%s]", what, w, w.Tenant, w.Topic, len(all), strings.Join(have, ", "))
		}
	}
	return out
}

// Settled is what a subscriber would do with a handler's result.
type Settled struct {
	// Ack: the handler returned nil (and neither deferred nor acked the
	// delivery in a transaction).
	Ack bool
	// Deferred: the handler called Defer, which settles the delivery
	// whatever the handler returns then (Err says what it returned).
	Deferred bool
	// AckedTx: the handler called AckTx with a transaction, which settles
	// the delivery if that transaction commits, whatever the handler
	// returns then; if it rolls back, the result is as if it had not been
	// called.
	AckedTx bool
	// Retry: the handler failed; the message is delivered again after
	// RetryAfter (its RetryAfter or nack delay, else the backoff).
	Retry      bool
	RetryAfter time.Duration
	// DeadLetter: the handler asked for it, or failed the last attempt
	// allowed (Options.MaxAttempts).
	DeadLetter bool
	// Err is what the handler returned.
	Err error
}

// Options are the subscriber settings a result is settled by; zero
// values take shardq's defaults.
type Options struct {
	MaxAttempts            int // shardq.UnlimitedAttempts: never dead-letter for the count
	BackoffMin, BackoffMax time.Duration
}

// Handle runs h on a copy of d (fill its exported fields; Attempt 0 is
// taken as 1) and reports what a subscriber with opts (nil: the
// defaults) would settle. Defer and AckTx are recorded, not run. A panic
// in h is not recovered: the test sees it. What Handle leaves to the
// subscriber: a handler timeout (SubscriberConfig.HandlerTimeout), a
// context cancelled by a stop (the message comes again, no attempt
// counted), and expired messages (never handed to a handler).
func Handle(ctx context.Context, h shardq.Handler, d *shardq.Delivery, opts *Options) Settled {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.MaxAttempts == 0 {
		o.MaxAttempts = shardq.DefaultMaxAttempts
	}
	if o.BackoffMin == 0 {
		o.BackoffMin = shardq.DefaultBackoffMin
	}
	if o.BackoffMax == 0 {
		o.BackoffMax = shardq.DefaultBackoffMax
	}
	in := *d
	if in.Attempt == 0 {
		in.Attempt = 1
	}
	rec := &testhook.Recorder{}
	err := h(ctx, testhook.Record(&in, rec).(*shardq.Delivery))
	deferred, ackedTx := rec.Calls()
	// A Defer settles the delivery in a transaction of its own, and an
	// AckTx in the caller's: the subscriber then leaves the message be,
	// whatever the handler returns.
	switch {
	case deferred:
		return Settled{Deferred: true, Err: err}
	case ackedTx:
		return Settled{AckedTx: true, Err: err}
	}
	v := settle.Policy{MaxAttempts: o.MaxAttempts, BackoffMin: o.BackoffMin, BackoffMax: o.BackoffMax}.Decide(err, in.Attempt)
	s := Settled{Err: err, DeadLetter: v.DeadLetter}
	switch {
	case v.Ack:
		s.Ack = true
	case !v.DeadLetter:
		s.Retry, s.RetryAfter = true, v.Delay
	}
	return s
}
