// SPDX-License-Identifier: Apache-2.0

package shardq

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"strconv"
	"time"

	"github.com/shardq/shardq/driver"
)

// LargeDelivery is the group's next message whole: a large message (its
// chunks as one stream) or an ordinary one (its payload).
type LargeDelivery struct {
	// Delivery settles it (Ack, Nack, DeadLetter on the receiver). For a
	// large message its ID and Headers are the end marker's (the
	// caller's id and headers), its Offset the first chunk's, and its
	// Payload nil: read Body.
	*Delivery
	// Body yields the payload. For a large message it reads one chunk at
	// a time from the database and fails, at the end, if the size or the
	// SHA-256 differs from the end marker's.
	Body   io.Reader
	Size   int64
	Chunks int // 0 for an ordinary message
}

// ErrLargeCorrupt means a large message's stored chunks do not add up to
// what its end marker says.
var ErrLargeCorrupt = errors.New("shardq: large message corrupt")

// ReceiveLarge is Receive for groups that carry large messages
// (PublishLarge): it returns the next message whole. A large message is
// handed out only once its end marker is stored (it waits for it, until
// ctx ends), so a reader never sees half of one; one whose writer failed
// (an aborted end marker) is passed over. Settle the result like any
// delivery: Ack passes the cursor over every chunk and the end marker;
// Nack, Close or a crash before Ack deliver it again from its first chunk
// (the next reader starts over; nothing resumes mid-message).
func (r *GroupReceiver) ReceiveLarge(ctx context.Context) (*LargeDelivery, error) {
	r.large = true
	for {
		d, err := r.Receive(ctx)
		if err != nil {
			return nil, err
		}
		id, ok := d.Headers[HeaderLargeID]
		if !ok {
			return &LargeDelivery{Delivery: d, Body: bytes.NewReader(d.Payload), Size: int64(len(d.Payload))}, nil
		}
		// Waiting for the writer is not the application's time: the
		// handler timeout starts when the message is handed out.
		r.mu.Lock()
		r.stopHeldTimer()
		r.mu.Unlock()
		end, err := r.waitLargeEnd(ctx, id)
		if err != nil {
			r.unhold() // not handed out: the next call starts here again
			return nil, err
		}
		if end.Headers[HeaderLargeAborted] == "true" {
			r.mu.Lock()
			r.heldEnd = end
			r.mu.Unlock()
			if err := r.Ack(ctx, d); err != nil { // pass over the aborted chunks
				return nil, err
			}
			r.log.Warn("shardq: passed over a large message whose writer failed", "offset", d.Offset, "id", id)
			continue
		}
		ld, err := r.largeDelivery(ctx, d, id, end)
		if err != nil {
			r.unhold()
			return nil, err
		}
		return ld, nil
	}
}

// waitLargeEnd waits until large message id's end marker is stored.
func (r *GroupReceiver) waitLargeEnd(ctx context.Context, id string) (*driver.Message, error) {
	ref := driver.MessageRef{Tenant: r.ref.Tenant, Topic: r.ref.Topic, PartitionKey: r.ref.PartitionKey, ID: id}
	for {
		m, _, err := r.c.drv.GetMessage(ctx, ref)
		if err != nil {
			return nil, fmt.Errorf("shardq: receive large %s id %q: %w", r.ref, id, err)
		}
		if m != nil {
			return m, nil
		}
		t := time.NewTimer(r.o.PollInterval)
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
// chunk d is in hand and whose end marker is end.
func (r *GroupReceiver) largeDelivery(ctx context.Context, d *Delivery, id string, end *driver.Message) (*LargeDelivery, error) {
	chunks, err1 := strconv.Atoi(end.Headers[HeaderLargeChunks])
	size, err2 := strconv.ParseInt(end.Headers[HeaderLargeBytes], 10, 64)
	if err := errors.Join(err1, err2); err != nil || d.Headers[HeaderLargeChunk] != "0" {
		return nil, fmt.Errorf("%w: %s id %q: end marker %v, first chunk numbered %q", ErrLargeCorrupt, r.ref, id, end.Headers, d.Headers[HeaderLargeChunk])
	}
	r.mu.Lock()
	r.heldEnd = end
	r.buf = nil // the body reads chunk by chunk; what was prefetched would only hold memory
	r.startHeldTimer(d.Offset, d.Attempt)
	r.mu.Unlock()
	headers := make(map[string]string, len(end.Headers))
	for k, v := range end.Headers {
		headers[k] = v
	}
	body := &largeBody{r: r, ctx: ctx, id: id, chunks: chunks, size: size, want: end.Headers[HeaderLargeSHA256],
		next: 1, last: d.Offset, cur: d.Payload, read: int64(len(d.Payload)), sum: sha256.New()}
	body.sum.Write(d.Payload)
	ld := *d
	ld.ID, ld.Headers, ld.Payload, ld.CreatedAt = id, headers, nil, end.CreatedAt
	return &LargeDelivery{Delivery: &ld, Body: body, Size: size, Chunks: chunks}, nil
}

// largeBody reads a large message's chunks in order, one at a time.
type largeBody struct {
	r          *GroupReceiver
	ctx        context.Context
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
	msgs, err := r.c.drv.FetchAfter(b.ctx, r.ref.Tenant, r.ref.Topic, r.ref.PartitionKey, b.last, 1)
	if err != nil {
		return fmt.Errorf("shardq: read large %s id %q chunk %d: %w", r.ref, b.id, b.next, err)
	}
	if len(msgs) == 0 || msgs[0].Headers[HeaderLargeID] != b.id || msgs[0].Headers[HeaderLargeChunk] != strconv.Itoa(b.next) {
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
func (r *GroupReceiver) unhold() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.held != nil {
		r.buf = append([]driver.Message{*r.held}, r.buf...)
		r.held, r.heldEnd = nil, nil
		r.stopHeldTimer()
	}
}
