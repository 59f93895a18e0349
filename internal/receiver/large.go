// SPDX-License-Identifier: Apache-2.0

package receiver

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"maps"
	"strconv"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/large"
)

// Large is the group's next message whole (ReceiveLarge).
type Large struct {
	// Message is the message handed out; for a large message, its first
	// chunk with the end marker's id, headers and time, and no payload:
	// read Body.
	Message driver.Message
	Attempt int
	Body    io.Reader // nil for an ordinary message: its Payload is all
	Size    int64
	Chunks  int // 0 for an ordinary message
}

// ReceiveLarge is Receive for groups that carry large messages: it hands
// out a large message only once its end marker is stored (waiting for
// it, until ctx ends), and passes over one whose writer failed. Settling
// it settles its chunks and end marker together.
func (r *Receiver) ReceiveLarge(ctx context.Context) (Large, error) {
	r.large = true
	for {
		m, attempt, err := r.Receive(ctx)
		if err != nil {
			return Large{}, err
		}
		id, ok := m.Headers[large.HeaderID]
		if !ok {
			return Large{Message: m, Attempt: attempt, Size: int64(len(m.Payload))}, nil
		}
		// Waiting for the writer is not the application's time: the
		// handler timeout starts when the message is handed out.
		r.mu.Lock()
		r.stopHeldTimer()
		r.mu.Unlock()
		end, err := r.waitLargeEnd(ctx, id)
		if err != nil {
			r.unhold() // not handed out: the next call starts here again
			return Large{}, err
		}
		if end.Headers[large.HeaderAborted] == "true" {
			r.mu.Lock()
			r.heldEnd = end
			r.mu.Unlock()
			if err := r.Ack(ctx, m.Offset); err != nil { // pass over the aborted chunks
				return Large{}, err
			}
			r.log.Warn("shardq: passed over a large message whose writer failed", "offset", m.Offset, "id", id)
			continue
		}
		ld, err := r.largeDelivery(ctx, m, attempt, id, end)
		if err != nil {
			r.unhold()
			return Large{}, err
		}
		return ld, nil
	}
}

// waitLargeEnd waits until large message id's end marker is stored.
func (r *Receiver) waitLargeEnd(ctx context.Context, id string) (*driver.Message, error) {
	ref := driver.MessageRef{Tenant: r.ref.Tenant, Topic: r.ref.Topic, PartitionKey: r.ref.PartitionKey, ID: id}
	for {
		m, _, err := r.drv.GetMessage(ctx, ref)
		if err != nil {
			return nil, fmt.Errorf("shardq: receive large %s id %q: %w", r.ref, id, err)
		}
		if m != nil {
			return m, nil
		}
		t := time.NewTimer(r.cfg.PollInterval)
		select {
		case <-t.C:
		case <-r.wake: // the group's head moved: the marker may be there
			t.Stop()
		case <-r.closing:
			t.Stop()
			_, err := r.current()
			return nil, err
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		}
	}
}

// largeDelivery makes the delivery of large message id, whose first
// chunk first is in hand and whose end marker is end.
func (r *Receiver) largeDelivery(ctx context.Context, first driver.Message, attempt int, id string, end *driver.Message) (Large, error) {
	chunks, err1 := strconv.Atoi(end.Headers[large.HeaderChunks])
	size, err2 := strconv.ParseInt(end.Headers[large.HeaderBytes], 10, 64)
	if err := errors.Join(err1, err2); err != nil || first.Headers[large.HeaderChunk] != "0" {
		return Large{}, fmt.Errorf("%w: %s id %q: end marker %v, first chunk numbered %q", ErrLargeCorrupt, r.ref, id, end.Headers, first.Headers[large.HeaderChunk])
	}
	r.mu.Lock()
	r.heldEnd = end
	r.buf = nil // the body reads chunk by chunk; what was prefetched would only hold memory
	r.startHeldTimer(first.Offset, attempt)
	r.mu.Unlock()
	body := &largeBody{r: r, id: id, chunks: chunks, size: size, want: end.Headers[large.HeaderSHA256],
		next: 1, last: first.Offset, cur: first.Payload, read: int64(len(first.Payload)), sum: sha256.New()}
	body.sum.Write(first.Payload)
	m := first
	m.ID, m.Headers, m.Payload, m.CreatedAt = id, maps.Clone(end.Headers), nil, end.CreatedAt
	return Large{Message: m, Attempt: attempt, Body: body, Size: size, Chunks: chunks}, nil
}

// largeBody reads a large message's chunks in order, one at a time. Its
// reads are not bound by the receive's context, which bounds the wait for
// the message: a caller reads the body after the receive has returned.
// Each chunk's read is bounded by dbTimeout, and none starts once the
// receiver is closed.
type largeBody struct {
	r          *Receiver
	id         string
	chunks     int
	size, read int64
	want       string // the end marker's SHA-256
	next       int    // the next chunk's number
	last       int64  // the offset of the last chunk read
	cur        []byte // what is left of the chunk being read
	sum        hash.Hash
	err        error // sticky
}

func (b *largeBody) Read(p []byte) (int, error) {
	for len(b.cur) == 0 && b.err == nil {
		b.err = b.nextChunk()
	}
	if len(b.cur) == 0 {
		return 0, b.err
	}
	n := copy(p, b.cur)
	b.cur = b.cur[n:]
	return n, nil
}

// nextChunk loads the next chunk into cur, or checks the whole at the end
// (io.EOF when it adds up).
func (b *largeBody) nextChunk() error {
	r := b.r
	if b.next == b.chunks {
		if got := hex.EncodeToString(b.sum.Sum(nil)); b.read != b.size || got != b.want {
			return fmt.Errorf("%w: %s id %q: %d bytes with SHA-256 %s; the end marker says %d bytes, %s",
				ErrLargeCorrupt, r.ref, b.id, b.read, got, b.size, b.want)
		}
		return io.EOF
	}
	select {
	case <-r.closing:
		_, err := r.current()
		return fmt.Errorf("shardq: read large %s id %q chunk %d: %w", r.ref, b.id, b.next, err)
	default:
	}
	ctx, cancel := context.WithTimeout(context.Background(), dbTimeout)
	defer cancel()
	msgs, err := r.drv.FetchAfter(ctx, driver.TopicPartition{Tenant: r.ref.Tenant, Topic: r.ref.Topic, PartitionKey: r.ref.PartitionKey}, b.last, 1)
	if err != nil {
		return fmt.Errorf("shardq: read large %s id %q chunk %d: %w", r.ref, b.id, b.next, err)
	}
	if len(msgs) == 0 || msgs[0].Headers[large.HeaderID] != b.id || msgs[0].Headers[large.HeaderChunk] != strconv.Itoa(b.next) {
		return fmt.Errorf("%w: %s id %q: chunk %d is not next in the group", ErrLargeCorrupt, r.ref, b.id, b.next)
	}
	m := msgs[0]
	b.sum.Write(m.Payload)
	b.cur, b.last, b.read = m.Payload, m.Offset, b.read+int64(len(m.Payload))
	b.next++
	return nil
}

// unhold puts the message in hand back, unsettled and uncounted: it was
// never handed to the caller.
func (r *Receiver) unhold() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.held != nil {
		r.buf = append([]driver.Message{*r.held}, r.buf...)
		r.held, r.heldEnd = nil, nil
		r.stopHeldTimer()
	}
}
