// SPDX-License-Identifier: Apache-2.0

package shardq

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"strconv"
	"strings"

	"github.com/google/uuid"

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
// mid-way leaves one that readers wait for (docs/large.md). msg.Payload,
// Delay and NotBefore must be unset.
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
	if err := c.checkLarge(&msg, body, o); err != nil {
		return LargeResult{}, fmt.Errorf("shardq: publish large: %w", err)
	}
	res := LargeResult{Tenant: msg.Tenant, Topic: msg.Topic, PartitionKey: msg.PartitionKey, ID: msg.ID}
	sum := sha256.New()
	buf := make([]byte, o.ChunkSize)
	batch := make([]Message, 0, o.ChunksPerTx)
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		_, err := c.publish(ctx, batch, true)
		batch = batch[:0]
		return err
	}
	for {
		n, rerr := io.ReadFull(body, buf)
		if n > 0 {
			chunk := make([]byte, n)
			copy(chunk, buf[:n])
			sum.Write(chunk)
			batch = append(batch, Message{Tenant: msg.Tenant, Topic: msg.Topic, PartitionKey: msg.PartitionKey,
				ID: large.ChunkID(msg.ID, res.Chunks), Payload: chunk, CreatedAt: msg.CreatedAt,
				Headers: map[string]string{HeaderLargeID: msg.ID, HeaderLargeChunk: strconv.Itoa(res.Chunks)}})
			res.Chunks++
			res.Bytes += int64(n)
			if len(batch) == o.ChunksPerTx {
				if err := flush(); err != nil {
					return res, c.abortLarge(ctx, msg, res, err)
				}
			}
		}
		if errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF) {
			break
		}
		if rerr != nil {
			return res, c.abortLarge(ctx, msg, res, fmt.Errorf("read the payload: %w", rerr))
		}
	}
	if err := flush(); err != nil {
		return res, c.abortLarge(ctx, msg, res, err)
	}
	res.SHA256 = hex.EncodeToString(sum.Sum(nil))
	end := msg
	end.Headers = maps.Clone(msg.Headers)
	if end.Headers == nil {
		end.Headers = map[string]string{}
	}
	end.Headers[HeaderLargeChunks] = strconv.Itoa(res.Chunks)
	end.Headers[HeaderLargeBytes] = strconv.FormatInt(res.Bytes, 10)
	end.Headers[HeaderLargeSHA256] = res.SHA256
	stored, err := c.publish(ctx, []Message{end}, true)
	if err != nil {
		return res, c.abortLarge(ctx, msg, res, err)
	}
	res.EndOffset = stored[0].Offset
	return res, nil
}

// checkLarge validates a large message before anything is written, and
// fills its id and (fresh) partition key.
func (c *Client) checkLarge(msg *Message, body io.Reader, o LargeOptions) error {
	switch {
	case body == nil:
		return &ident.Error{Field: "body", Rule: "must not be nil"}
	case msg.Payload != nil:
		return &ident.Error{Field: "payload", Rule: "must be unset: PublishLarge reads the payload from body"}
	case msg.Delay != 0 || !msg.NotBefore.IsZero():
		return &ident.Error{Field: "delay", Rule: "not supported for large messages"}
	case msg.Selector != nil:
		return &ident.Error{Field: "selector", Rule: "not supported for large messages: a large message is its own group"}
	case o.ChunkSize < 1 || o.ChunkSize > c.cfg.MaxPayloadBytes:
		return &ident.Error{Field: "chunk size", Rule: fmt.Sprintf("%d: want 1 to %d (Config.MaxPayloadBytes)", o.ChunkSize, c.cfg.MaxPayloadBytes)}
	case o.ChunksPerTx < 1:
		return &ident.Error{Field: "chunks per transaction", Rule: fmt.Sprintf("%d: want at least 1", o.ChunksPerTx)}
	}
	if msg.ID == "" {
		u, err := uuid.NewV7()
		if err != nil {
			return fmt.Errorf("generate message id: %w", err)
		}
		msg.ID = u.String()
	}
	if msg.PartitionKey == "" {
		u, err := uuid.NewV7()
		if err != nil {
			return fmt.Errorf("generate partition key: %w", err)
		}
		msg.PartitionKey = "large-" + u.String()
	}
	// Every chunk's id must be valid too: check the longest one.
	if err := ident.MessageID(large.ChunkID(msg.ID, 1<<30)); err != nil {
		var ie *ident.Error
		if errors.As(err, &ie) {
			return &ident.Error{Field: "message id", Rule: "too long for a large message, whose chunk ids add up to 11 characters: " + ie.Rule}
		}
		return err
	}
	for k := range msg.Headers {
		if strings.HasPrefix(k, large.HeaderPrefix) {
			return &ident.Error{Field: fmt.Sprintf("header %q", k), Rule: "the prefix " + large.HeaderPrefix + " is shardq's"}
		}
	}
	// The end marker carries the caller's fields: validate them now.
	probe := *msg
	probe.Payload = nil
	_, err := c.prepare(context.Background(), []Message{probe}, false)
	return err
}

// abortLarge stores an aborted end marker, so that readers skip the
// chunks already stored, and returns cause (with the marker's own
// failure, if any).
func (c *Client) abortLarge(ctx context.Context, msg Message, res LargeResult, cause error) error {
	end := Message{Tenant: msg.Tenant, Topic: msg.Topic, PartitionKey: msg.PartitionKey, ID: msg.ID,
		Headers: map[string]string{HeaderLargeAborted: "true", HeaderLargeChunks: strconv.Itoa(res.Chunks)}}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.PublishTimeout)
	defer cancel()
	if _, err := c.publish(actx, []Message{end}, true); err != nil {
		return fmt.Errorf("shardq: publish large %q: %w (and marking it aborted failed: %v)", msg.ID, cause, err)
	}
	return fmt.Errorf("shardq: publish large %q: %w (marked aborted after %d chunks)", msg.ID, cause, res.Chunks)
}
