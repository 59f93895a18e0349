// SPDX-License-Identifier: Apache-2.0

package large

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"strconv"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/ident"
	"github.com/shardq/shardq/internal/publish"
)

// Result reports a stored large message (shardq.LargeResult, field for
// field).
type Result struct {
	Tenant, Topic, PartitionKey, ID string
	Chunks                          int
	Bytes                           int64
	SHA256                          string
	EndOffset                       int64
}

// ErrIDTaken refuses a large message whose id (or a chunk's) is already
// stored in its partition as another message: publishing by id is
// idempotent, so the write would "succeed" onto someone else's message.
// Writing the same large message again under its id (a resume after an
// unknown outcome) is its own earlier write, and succeeds.
var ErrIDTaken = errors.New("message id taken by another message")

// ErrAbandoned fails a write whose end marker is stored aborted: by the
// writer itself after a failure, or by a reader that gave the write up
// after no progress for its LargeWriteTimeout (Waiter). Readers pass over
// its chunks; publish the message again under a new id.
var ErrAbandoned = errors.New("large message write abandoned")

// Write stores what body yields until EOF as one large message: chunks of
// chunkSize published in order in msg's group, perTx to a transaction,
// then the end marker. When a chunk fails it stores an aborted end marker
// (when the database allows), so that readers skip the partial message.
// A chunk or end marker that comes back a duplicate must be this
// message's own earlier write (same numbering, bytes and checksum), or
// Write fails with ErrIDTaken.
func Write(ctx context.Context, p *publish.Publisher, msg publish.Message, body io.Reader, chunkSize, perTx int) (Result, error) {
	if err := check(p, &msg, body, chunkSize, perTx); err != nil {
		return Result{}, fmt.Errorf("shardq: publish large: %w", err)
	}
	// The end marker's id taken by an ordinary message (or an aborted
	// marker) would leave these chunks without a marker: refuse first.
	if err := checkEnd(ctx, p, msg, complete); err != nil {
		return Result{}, err
	}
	res := Result{Tenant: msg.Tenant, Topic: msg.Topic, PartitionKey: msg.PartitionKey, ID: msg.ID}
	sum := sha256.New()
	buf := make([]byte, chunkSize)
	batch := make([]publish.Message, 0, perTx)
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		rows, err := p.Publish(ctx, batch, true)
		if err == nil {
			err = ownDuplicates(ctx, p, msg, rows)
		}
		if err == nil {
			// A reader that gave the write up stored an aborted end
			// marker: stop now rather than at the end.
			err = checkEnd(ctx, p, msg, complete)
		}
		batch = batch[:0]
		return err
	}
	for {
		n, end, rerr := readChunk(body, buf)
		if n > 0 {
			chunk := make([]byte, n)
			copy(chunk, buf[:n])
			sum.Write(chunk)
			batch = append(batch, publish.Message{Tenant: msg.Tenant, Topic: msg.Topic, PartitionKey: msg.PartitionKey,
				ID: ChunkID(msg.ID, res.Chunks), Payload: chunk, CreatedAt: msg.CreatedAt,
				Headers: map[string]string{HeaderID: msg.ID, HeaderChunk: strconv.Itoa(res.Chunks)}})
			res.Chunks++
			res.Bytes += int64(n)
			if len(batch) == perTx {
				if err := flush(); err != nil {
					return res, abort(ctx, p, msg, res, err)
				}
			}
		}
		if rerr != nil {
			return res, abort(ctx, p, msg, res, fmt.Errorf("read the payload: %w", rerr))
		}
		if end {
			break
		}
	}
	if err := flush(); err != nil {
		return res, abort(ctx, p, msg, res, err)
	}
	res.SHA256 = hex.EncodeToString(sum.Sum(nil))
	end := msg
	end.Headers = maps.Clone(msg.Headers)
	if end.Headers == nil {
		end.Headers = map[string]string{}
	}
	end.Headers[HeaderChunks] = strconv.Itoa(res.Chunks)
	end.Headers[HeaderBytes] = strconv.FormatInt(res.Bytes, 10)
	end.Headers[HeaderSHA256] = res.SHA256
	stored, err := p.Publish(ctx, []publish.Message{end}, true)
	if err != nil {
		return res, abort(ctx, p, msg, res, err)
	}
	if stored[0].Duplicate {
		if err := checkEnd(ctx, p, msg, func(m *driver.Message) bool {
			return m.Headers[HeaderSHA256] == res.SHA256 && m.Headers[HeaderBytes] == end.Headers[HeaderBytes] &&
				m.Headers[HeaderChunks] == end.Headers[HeaderChunks]
		}); err != nil {
			return res, err
		}
	}
	res.EndOffset = stored[0].Offset
	return res, nil
}

// readChunk fills buf from r as io.ReadFull does, but only io.EOF ends
// the body (end): a reader that reports being cut short
// (io.ErrUnexpectedEOF, as an HTTP body that ends before its length does)
// fails the write instead of storing what came as the whole message.
func readChunk(r io.Reader, buf []byte) (n int, end bool, err error) {
	for n < len(buf) {
		m, err := r.Read(buf[n:])
		n += m
		if err == io.EOF { //nolint:errorlint // io.EOF is returned as is, never wrapped (io.Reader's contract)
			return n, true, nil
		}
		if err != nil {
			return n, false, err
		}
	}
	return n, false, nil
}

// ownDuplicates checks that the chunks among rows that came back
// duplicates are this message's own earlier writes.
func ownDuplicates(ctx context.Context, p *publish.Publisher, msg publish.Message, rows []*driver.InsertMessage) error {
	for _, row := range rows {
		if !row.Duplicate {
			continue
		}
		if err := checkOwn(ctx, p, msg, row.ID, func(m *driver.Message) bool {
			return m.Headers[HeaderID] == row.Headers[HeaderID] && m.Headers[HeaderChunk] == row.Headers[HeaderChunk] &&
				bytes.Equal(m.Payload, row.Payload)
		}); err != nil {
			return err
		}
	}
	return nil
}

// complete reports whether m is a complete end marker (a resumed write
// finds its own; the last step compares it).
func complete(m *driver.Message) bool {
	_, ok := m.Headers[HeaderSHA256]
	return ok
}

// checkEnd checks the end marker stored under msg's id, if any: an
// aborted one fails with ErrAbandoned, and one that own does not accept
// with ErrIDTaken.
func checkEnd(ctx context.Context, p *publish.Publisher, msg publish.Message, own func(*driver.Message) bool) error {
	return checkOwn(ctx, p, msg, msg.ID, func(m *driver.Message) bool {
		return m.Headers[HeaderAborted] == "true" || own(m)
	})
}

// checkOwn fails with ErrIDTaken when id is stored in msg's partition and
// the stored message is not what own accepts.
func checkOwn(ctx context.Context, p *publish.Publisher, msg publish.Message, id string, own func(*driver.Message) bool) error {
	m, err := p.Stored(ctx, driver.MessageRef{Tenant: msg.Tenant, Topic: msg.Topic, PartitionKey: msg.PartitionKey, ID: id})
	switch {
	case err != nil:
		return fmt.Errorf("shardq: publish large tenant %q topic %q partition %q id %q: %w", msg.Tenant, msg.Topic, msg.PartitionKey, id, err)
	case m != nil && m.Headers[HeaderAborted] == "true" && id == msg.ID:
		return fmt.Errorf("shardq: publish large tenant %q topic %q partition %q id %q: %w (%s; end marker at offset %d)", msg.Tenant, msg.Topic,
			msg.PartitionKey, id, ErrAbandoned, cmp.Or(m.Headers[HeaderAbandoned], "the write failed"), m.Offset)
	case m != nil && !own(m):
		return fmt.Errorf("shardq: publish large tenant %q topic %q partition %q id %q: %w (at offset %d)", msg.Tenant, msg.Topic,
			msg.PartitionKey, id, ErrIDTaken, m.Offset)
	}
	return nil
}

// check validates a large message before anything is written, and fills
// its id and (fresh) partition key.
func check(p *publish.Publisher, msg *publish.Message, body io.Reader, chunkSize, perTx int) error {
	switch limit := p.MaxPayloadBytes(); {
	case body == nil:
		return &ident.Error{Field: "body", Rule: "must not be nil"}
	case msg.Payload != nil:
		return &ident.Error{Field: "payload", Rule: "must be unset: PublishLarge reads the payload from body"}
	case msg.Delay != 0 || !msg.NotBefore.IsZero():
		return &ident.Error{Field: "delay", Rule: "not supported for large messages"}
	case msg.Select != nil:
		return &ident.Error{Field: "selector", Rule: "not supported for large messages: a large message is its own group"}
	case chunkSize < 1 || chunkSize > limit:
		return &ident.Error{Field: "chunk size", Rule: fmt.Sprintf("%d: want 1 to %d (Config.MaxPayloadBytes)", chunkSize, limit)}
	case perTx < 1:
		return &ident.Error{Field: "chunks per transaction", Rule: fmt.Sprintf("%d: want at least 1", perTx)}
	}
	if msg.ID == "" {
		id, err := publish.NewID()
		if err != nil {
			return fmt.Errorf("generate message id: %w", err)
		}
		msg.ID = id
	}
	if msg.PartitionKey == "" {
		key, err := publish.NewID()
		if err != nil {
			return fmt.Errorf("generate partition key: %w", err)
		}
		msg.PartitionKey = "large-" + key
	}
	// Every chunk's id must be valid too: check the longest one.
	if err := ident.MessageID(ChunkID(msg.ID, 1<<30)); err != nil {
		var ie *ident.Error
		if errors.As(err, &ie) {
			return &ident.Error{Field: "message id", Rule: "too long for a large message, whose chunk ids add up to 11 characters: " + ie.Rule}
		}
		return err
	}
	if err := p.CheckReserved(msg.Headers, ""); err != nil {
		return err
	}
	// The end marker carries the caller's fields: validate them now.
	probe := *msg
	probe.Payload = nil
	_, err := p.Prepare(context.Background(), []publish.Message{probe}, false)
	return err
}

// abort stores an aborted end marker, so that readers skip the chunks
// already stored, and returns cause (with the marker's own failure, if
// any). When cause says the id is someone else's (ErrIDTaken) or the
// write was given up already (ErrAbandoned), it stores nothing: a marker
// under that id is not this write's to store.
func abort(ctx context.Context, p *publish.Publisher, msg publish.Message, res Result, cause error) error {
	if errors.Is(cause, ErrIDTaken) || errors.Is(cause, ErrAbandoned) {
		return cause
	}
	end := publish.Message{Tenant: msg.Tenant, Topic: msg.Topic, PartitionKey: msg.PartitionKey, ID: msg.ID,
		Headers: map[string]string{HeaderAborted: "true", HeaderChunks: strconv.Itoa(res.Chunks)}}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.Timeout())
	defer cancel()
	if _, err := p.Publish(actx, []publish.Message{end}, true); err != nil {
		return fmt.Errorf("shardq: publish large %q: %w (and marking it aborted failed: %v)", msg.ID, cause, err)
	}
	return fmt.Errorf("shardq: publish large %q: %w (marked aborted after %d chunks)", msg.ID, cause, res.Chunks)
}
