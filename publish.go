// SPDX-License-Identifier: Apache-2.0

package shardq

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/coalesce"
	"github.com/shardq/shardq/internal/ident"
	"github.com/shardq/shardq/internal/large"
	"github.com/shardq/shardq/internal/retry"
	"github.com/shardq/shardq/internal/telemetry"
)

// HeaderQueueName is the header that mirrors a message's tenant.
const HeaderQueueName = "queue_name"

// Message is a message to publish.
type Message struct {
	// Tenant is the shard key and isolation unit: ASCII, 1–255 bytes.
	// Required. It is also stored in the header "queue_name".
	Tenant string
	// Topic is the stream inside the tenant: ASCII, 1–255 bytes. Required.
	Topic string
	// PartitionKey is the ordering unit (message group): UTF-8, up to 255
	// characters. Empty means ungrouped.
	PartitionKey string
	// ID is the message's identity within its partition: UTF-8, 1–255
	// characters. Publishing an id that is stored already stores nothing
	// and reports the stored offset. Generated (a UUIDv7: unique and
	// time-ordered) when empty.
	ID string
	// Payload is the body, at most Config.MaxPayloadBytes.
	Payload []byte
	// Headers are string pairs: at most 64, keys 1–255 bytes, values up to
	// 8 KiB, all valid UTF-8.
	Headers map[string]string
	// CreatedAt defaults to the client's clock. Stored in UTC with
	// microsecond precision.
	CreatedAt time.Time
	// NotBefore delays delivery until then; Delay does the same relative
	// to the client's clock (set at most one). In an ordered partition the
	// messages after a delayed one wait behind it, as in a FIFO group;
	// an ungrouped one becomes claimable at its time without holding up
	// others. At most Config.MaxDelay ahead; a time already past means at
	// once.
	NotBefore time.Time
	Delay     time.Duration

	// Selector, when set, chooses PartitionKey from the message and
	// SelectorArg before anything is written; PartitionKey must then be
	// empty.
	Selector    Selector
	SelectorArg any
}

// PublishResult reports where a message is stored.
type PublishResult struct {
	Tenant       string
	Topic        string
	PartitionKey string
	ID           string
	// Offset is the message's position in its partition.
	Offset int64
	// Duplicate is set when the id was stored already (by an earlier call,
	// earlier in the same call, or by a concurrent publisher); Offset is
	// then the stored message's.
	Duplicate bool
}

// Publish stores msgs atomically: all of them or none. All messages of one
// call must share a tenant, so that the transaction stays on one shard.
// Concurrent calls for one tenant share transactions; each returns once its
// own messages are committed.
//
// If ctx ends before the commit is confirmed, Publish returns ctx's error and
// the messages may or may not be stored; publishing them again with the same
// ids is safe.
func (c *Client) Publish(ctx context.Context, msgs ...Message) ([]PublishResult, error) {
	return c.publish(ctx, msgs, false)
}

// publish is Publish; reserved allows shardq's own headers (large
// messages' chunks and end markers).
func (c *Client) publish(ctx context.Context, msgs []Message, reserved bool) (_ []PublishResult, err error) {
	start := time.Now()
	ctx, span := c.tel.StartSend(ctx, false)
	var sent []*driver.InsertMessage // what reached the database
	defer func() { c.tel.EndSend(ctx, span, start, sent, err) }()
	rows, err := c.prepare(ctx, msgs, reserved)
	if err != nil {
		return nil, err
	}
	if len(rows) == 0 {
		return nil, nil
	}
	for i, r := range rows[1:] {
		if r.Tenant != rows[0].Tenant {
			return nil, &MessageError{Index: i + 1, Err: &ident.Error{Field: "tenant",
				Rule: fmt.Sprintf("%q differs from message 0's %q; one Publish call writes one tenant", r.Tenant, rows[0].Tenant)}}
		}
	}
	sent = rows
	if err := c.batcher.Submit(ctx, rows[0].Tenant, rows); err != nil {
		if errors.Is(err, coalesce.ErrClosed) {
			return nil, ErrClosed
		}
		return nil, fmt.Errorf("shardq: publish: %w", err)
	}
	return results(rows), nil
}

// PublishTx stores msgs inside tx, the caller's transaction on the same
// database: they exist if and only if the caller commits. Publishers of one
// partition are serialised by a row lock held until tx ends, so keep such
// transactions short. On SQLite, begin tx on the driver's DB() (its write
// connection).
func (c *Client) PublishTx(ctx context.Context, tx *sql.Tx, msgs ...Message) (_ []PublishResult, err error) {
	if tx == nil {
		return nil, fmt.Errorf("shardq: PublishTx: %w", &ident.Error{Field: "tx", Rule: "must not be nil"})
	}
	start := time.Now()
	ctx, span := c.tel.StartSend(ctx, true)
	rows, err := c.prepare(ctx, msgs, false)
	if err != nil {
		c.tel.EndSend(ctx, span, start, nil, err)
		return nil, err
	}
	defer func() { c.tel.EndSend(ctx, span, start, rows, err) }()
	if len(rows) == 0 {
		return nil, nil
	}
	// The caller's pool is the caller's: whatever it is set to do, shardq's
	// statements run prepared on tx, their values bound, never spliced.
	if err := c.drv.InsertMessages(ctx, driver.PreparedTx(tx), rows); err != nil {
		return nil, fmt.Errorf("shardq: publish in transaction: %w", err)
	}
	return results(rows), nil
}

// prepare validates every message, runs selectors, fills ids, headers and
// times, and returns the rows to insert; each carries ctx's trace context
// (the send span's) in its headers. Nothing touches the database.
// Headers starting with shardq-large- are refused unless reserved.
func (c *Client) prepare(ctx context.Context, msgs []Message, reserved bool) ([]*driver.InsertMessage, error) {
	rows := make([]*driver.InsertMessage, len(msgs))
	now := c.cfg.Clock().UTC().Truncate(time.Microsecond)
	for i := range msgs {
		if !reserved {
			for k := range msgs[i].Headers {
				if strings.HasPrefix(k, large.HeaderPrefix) {
					return nil, &MessageError{Index: i, Err: &ident.Error{Field: fmt.Sprintf("header %q", k),
						Rule: "the prefix " + large.HeaderPrefix + " is shardq's (PublishLarge)"}}
				}
			}
		}
		r, err := c.prepareOne(ctx, &msgs[i], now)
		if err != nil {
			return nil, &MessageError{Index: i, Err: err}
		}
		rows[i] = r
	}
	return rows, nil
}

func (c *Client) prepareOne(ctx context.Context, m *Message, now time.Time) (*driver.InsertMessage, error) {
	if err := ident.Tenant(m.Tenant); err != nil {
		return nil, err
	}
	if err := c.checkServed(m.Tenant); err != nil {
		return nil, err
	}
	if err := ident.Topic(m.Topic); err != nil {
		return nil, err
	}
	key := m.PartitionKey
	if m.Selector != nil {
		if key != "" {
			return nil, &ident.Error{Field: "partition key", Rule: "must be empty when a Selector chooses it"}
		}
		var err error
		if key, err = m.Selector.SelectPartition(m, m.SelectorArg); err != nil {
			return nil, &ident.Error{Field: "partition key", Rule: "selector: " + err.Error()}
		}
	}
	if err := ident.PartitionKey(key); err != nil {
		return nil, err
	}
	id := m.ID
	if id == "" {
		u, err := uuid.NewV7()
		if err != nil {
			return nil, fmt.Errorf("generate message id: %w", err)
		}
		id = u.String()
	} else if err := ident.MessageID(id); err != nil {
		return nil, err
	}
	if err := ident.Payload(m.Payload, c.cfg.MaxPayloadBytes); err != nil {
		return nil, err
	}
	if v, ok := m.Headers[HeaderQueueName]; ok && v != m.Tenant {
		return nil, &ident.Error{Field: `header "queue_name"`,
			Rule: fmt.Sprintf("%q differs from tenant %q; it mirrors the tenant and may be omitted", v, m.Tenant)}
	}
	// The limits apply to the caller's headers; queue_name, which shardq
	// adds, does not count against them.
	if err := ident.Headers(m.Headers); err != nil {
		return nil, err
	}
	headers := make(map[string]string, len(m.Headers)+1)
	maps.Copy(headers, m.Headers)
	headers[HeaderQueueName] = m.Tenant
	// Like queue_name, the trace context shardq adds does not count
	// against the caller's header limits.
	telemetry.Inject(ctx, headers)
	created := now
	if !m.CreatedAt.IsZero() {
		created = m.CreatedAt.UTC().Truncate(time.Microsecond)
	}
	notBefore, err := c.notBefore(m, now)
	if err != nil {
		return nil, err
	}
	return &driver.InsertMessage{
		Tenant: m.Tenant, Topic: m.Topic, PartitionKey: key, ID: id,
		Headers: headers, Payload: m.Payload, CreatedAt: created, NotBefore: notBefore,
	}, nil
}

// notBefore is when m may be delivered: zero for at once.
func (c *Client) notBefore(m *Message, now time.Time) (time.Time, error) {
	at := m.NotBefore
	switch {
	case m.Delay < 0:
		return time.Time{}, &ident.Error{Field: "delay", Rule: fmt.Sprintf("%s is negative", m.Delay)}
	case m.Delay > 0 && !at.IsZero():
		return time.Time{}, &ident.Error{Field: "delay", Rule: "set Delay or NotBefore, not both"}
	case m.Delay > 0:
		at = now.Add(m.Delay)
	}
	if at.IsZero() || !at.After(now) {
		return time.Time{}, nil
	}
	if ahead := at.Sub(now); ahead > c.cfg.MaxDelay {
		field := "not before"
		if m.Delay > 0 {
			field = "delay"
		}
		return time.Time{}, &ident.Error{Field: field, Rule: fmt.Sprintf("%s ahead, limit %s (Config.MaxDelay)", ahead.Round(time.Second), c.cfg.MaxDelay)}
	}
	return at.UTC().Truncate(time.Microsecond), nil
}

// writeBatch is the coalescer's flush: one write transaction, run again on
// a retryable error (deadlock, busy file). Running it again is safe because
// publish is idempotent by id.
func (c *Client) writeBatch(ctx context.Context, rows []*driver.InsertMessage, calls int) error {
	err := retry.Do(ctx, c.cfg.PublishRetries, c.drv.Retryable, func(n int, err error) {
		c.cfg.Logger.Warn("shardq: publish transaction retried", "tenant", rows[0].Tenant, "attempt", n, "err", err)
	}, func() error { return c.writeOnce(ctx, rows) })
	if err == nil {
		c.tel.Batch(ctx, rows[0].Tenant, len(rows), calls)
	}
	return err
}

func (c *Client) writeOnce(ctx context.Context, rows []*driver.InsertMessage) error {
	tx, err := c.drv.BeginWrite(ctx)
	if err != nil {
		return err
	}
	if err := c.drv.InsertMessages(ctx, tx, rows); err != nil {
		return errors.Join(err, ignoreDone(tx.Rollback()))
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	c.local.Committed(rows)
	return nil
}

// ignoreDone drops the error of rolling back a transaction the database
// already ended (it aborts on deadlock).
func ignoreDone(err error) error {
	if errors.Is(err, sql.ErrTxDone) {
		return nil
	}
	return err
}

func results(rows []*driver.InsertMessage) []PublishResult {
	out := make([]PublishResult, len(rows))
	for i, r := range rows {
		out[i] = PublishResult{Tenant: r.Tenant, Topic: r.Topic, PartitionKey: r.PartitionKey, ID: r.ID,
			Offset: r.Offset, Duplicate: r.Duplicate}
	}
	return out
}
