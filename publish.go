// SPDX-License-Identifier: Apache-2.0

package shardq

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/publish"
)

// HeaderQueueName is the header that mirrors a message's tenant.
const HeaderQueueName = publish.HeaderQueueName

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
	// ExpiresAt is when the message expires; TTL does the same relative
	// to the client's clock at publish (set at most one, after NotBefore).
	// An expired message is never handed out: a reader settles it
	// unhandled (dead-lettered when the consumer asks for it) and counts
	// it in shardq.consumer.expired. Stored in the header
	// "shardq-expires-at" (RFC 3339), which a caller may set instead. Not
	// for large messages. See docs/consumers.md, "Expiry".
	ExpiresAt time.Time
	TTL       time.Duration

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
	if err := c.syncClock(ctx); err != nil {
		return nil, fmt.Errorf("shardq: publish: %w", err)
	}
	return results(c.pub.Publish(ctx, toPublish(msgs), false))
}

// PublishTx stores msgs inside tx, the caller's transaction on the same
// database: they exist if and only if the caller commits. Publishers of one
// partition are serialised by a row lock held until tx ends, so keep such
// transactions short. On SQLite, begin tx on the driver's DB() (its write
// connection).
func (c *Client) PublishTx(ctx context.Context, tx *sql.Tx, msgs ...Message) ([]PublishResult, error) {
	if err := c.syncClock(ctx); err != nil {
		return nil, fmt.Errorf("shardq: publish in transaction: %w", err)
	}
	return results(c.pub.PublishTx(ctx, tx, toPublish(msgs)))
}

// toPublish is msgs as the pipeline reads them; a selector is called with
// the caller's own message.
func toPublish(msgs []Message) []publish.Message {
	out := make([]publish.Message, len(msgs))
	for i := range msgs {
		m := &msgs[i]
		out[i] = publish.Message{Tenant: m.Tenant, Topic: m.Topic, PartitionKey: m.PartitionKey, ID: m.ID, Payload: m.Payload,
			Headers: m.Headers, CreatedAt: m.CreatedAt, NotBefore: m.NotBefore, Delay: m.Delay, ExpiresAt: m.ExpiresAt, TTL: m.TTL}
		if m.Selector != nil {
			out[i].Select = func() (string, error) { return m.Selector.SelectPartition(m, m.SelectorArg) }
		}
	}
	return out
}

// results reports stored rows; nil when err is set or nothing was stored.
func results(rows []*driver.InsertMessage, err error) ([]PublishResult, error) {
	if err != nil || len(rows) == 0 {
		return nil, err
	}
	out := make([]PublishResult, len(rows))
	for i, r := range rows {
		out[i] = PublishResult{Tenant: r.Tenant, Topic: r.Topic, PartitionKey: r.PartitionKey, ID: r.ID,
			Offset: r.Offset, Duplicate: r.Duplicate}
	}
	return out, nil
}
