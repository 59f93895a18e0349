// SPDX-License-Identifier: Apache-2.0

package shardq

import (
	"context"
	"fmt"
	"io"

	"github.com/shardq/shardq/internal/expiry"
	"github.com/shardq/shardq/internal/ident"
	"github.com/shardq/shardq/internal/large"
)

// Large messages (docs/large.md): a payload larger than one message is
// stored as a message group of chunks followed by an end marker, the
// motivating case of AMQP's message groups. Chunk i has the id ID#i and
// the headers HeaderLargeID and HeaderLargeChunk; the end marker has the
// id ID, the caller's headers, and HeaderLargeChunks, HeaderLargeBytes
// and HeaderLargeSHA256. A reader (GroupReceiver.ReceiveLarge) starts a
// large message only once its end marker is stored, so it never sees
// half of one.
const (
	HeaderLargeID      = large.HeaderID      // on a chunk: the large message's id
	HeaderLargeChunk   = large.HeaderChunk   // on a chunk: its number, from 0
	HeaderLargeChunks  = large.HeaderChunks  // on the end marker: how many chunks
	HeaderLargeBytes   = large.HeaderBytes   // on the end marker: the payload's size
	HeaderLargeSHA256  = large.HeaderSHA256  // on the end marker: the payload's SHA-256, hex
	HeaderLargeAborted = large.HeaderAborted // on the end marker of a write that failed: "true"
)

// Defaults of LargeOptions.
const (
	DefaultLargeChunkSize   = 256 << 10 // a quarter of the default payload limit: well inside MySQL's packet limits
	DefaultLargeChunksPerTx = 16        // 4 MiB a transaction
)

// LargeOptions tune PublishLarge. Zero values take the defaults.
type LargeOptions struct {
	ChunkSize   int // bytes per chunk [256 KiB], at most Config.MaxPayloadBytes
	ChunksPerTx int // chunks per publish transaction [16]
}

// ErrLargeIDTaken refuses a large message whose id (or a chunk's id) is
// already stored in its partition as another message: publishes are
// idempotent by id, so the write would otherwise report success onto
// someone else's message. Publishing the same large message again under
// its id, after a failure or an unknown outcome, is its own earlier
// write and succeeds; a write that stored an aborted end marker cannot be
// resumed (publish it under a new id).
var ErrLargeIDTaken = large.ErrIDTaken

// ErrLargeAbandoned fails a large write whose end marker is stored
// aborted: by an earlier write under the id that failed, or by a reader
// that gave the write up after it made no progress for the reader's
// Config.LargeWriteTimeout. Readers pass over its chunks; publish it again
// under a new id.
var ErrLargeAbandoned = large.ErrAbandoned

// LargeResult reports a stored large message.
type LargeResult struct {
	Tenant, Topic, PartitionKey, ID string
	Chunks                          int
	Bytes                           int64
	SHA256                          string // hex
	// EndOffset is the end marker's offset: the message is complete from
	// the moment it is stored.
	EndOffset int64
}

// PublishLarge stores what body yields until EOF as one large message:
// chunks of ChunkSize published in order in one message group, ChunksPerTx
// to a transaction, then an end marker carrying msg's id and headers, the
// size and the SHA-256. Memory stays at one transaction's chunks whatever
// the size. msg.PartitionKey empty means a fresh group ("large-" and a
// UUIDv7): nothing else is published there. With the caller's key,
// nothing else may be published to that key until PublishLarge returns.
// If a chunk fails, an aborted end marker is stored (when the database
// allows) so that readers skip the partial message; a writer killed
// mid-way leaves one that readers wait for (docs/large.md). A chunk or end
// marker id already taken by another message fails the call with
// ErrLargeIDTaken. msg.Payload, Delay and NotBefore must be unset.
func (c *Client) PublishLarge(ctx context.Context, msg Message, body io.Reader, opts *LargeOptions) (LargeResult, error) {
	var o LargeOptions
	if opts != nil {
		o = *opts
	}
	if o.ChunkSize == 0 {
		o.ChunkSize = min(DefaultLargeChunkSize, c.cfg.MaxPayloadBytes)
	}
	if o.ChunksPerTx == 0 {
		o.ChunksPerTx = DefaultLargeChunksPerTx
	}
	if _, ok := msg.Headers[expiry.Header]; ok || msg.TTL != 0 || !msg.ExpiresAt.IsZero() {
		return LargeResult{}, fmt.Errorf("shardq: publish large: %w", &ident.Error{Field: "ttl", Rule: "a large message does not expire (set no TTL, ExpiresAt or " + expiry.Header + ")"})
	}
	if err := c.syncClock(ctx); err != nil {
		return LargeResult{}, fmt.Errorf("shardq: publish large: %w", err)
	}
	res, err := large.Write(ctx, c.pub, toPublish([]Message{msg})[0], body, o.ChunkSize, o.ChunksPerTx)
	return LargeResult(res), err
}
