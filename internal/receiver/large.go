// SPDX-License-Identifier: Apache-2.0

package receiver

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/expiry"
	"github.com/shardq/shardq/internal/large"
)

// Whole is the group's next message whole (ReceiveWhole).
type Whole struct {
	// Message is the message handed out; for a large message, its view
	// (large.Whole.Message): read Body.
	Message driver.Message
	Attempt int
	Body    io.Reader // nil for an ordinary message: its Payload is all
	Size    int64
	Chunks  int // 0 for an ordinary message
}

// ReceiveWhole is Receive for a group that may carry large messages: it
// hands out a large message once, whole, only once its end marker is
// stored (waiting for it, until ctx ends, or until the write is given up
// as abandoned), and passes over what a reader must never see alone: the
// chunks of a write that failed or was abandoned, and an end marker
// without its chunks. Settling it settles its chunks and end marker
// together.
func (r *Receiver) ReceiveWhole(ctx context.Context) (Whole, error) {
	for {
		m, attempt, err := r.Receive(ctx)
		if err != nil {
			return Whole{}, err
		}
		var end *driver.Message
		switch large.KindOf(&m) {
		case large.Ordinary:
			if expiry.Expired(&m, r.now()) {
				if err := r.expire(ctx, m); err != nil {
					r.unhold() // not handed out: the next call starts here again
					return Whole{}, err
				}
				continue
			}
			return Whole{Message: m, Attempt: attempt, Size: int64(len(m.Payload))}, nil
		case large.Chunk:
			if err := r.passOver(ctx, m, "a chunk of a large message that was passed over"); err != nil {
				return Whole{}, err
			}
			continue
		case large.End:
			if large.IsAborted(&m) || m.Headers[large.HeaderChunks] != "0" {
				if err := r.passOver(ctx, m, "an end marker without its chunks"); err != nil {
					return Whole{}, err
				}
				continue
			}
			end = &m // a large message without chunks: its end marker is all of it
		case large.First:
			// Waiting for the writer is not the application's time: the
			// handler timeout starts when the message is handed out.
			r.mu.Lock()
			r.stopHeldTimer()
			r.mu.Unlock()
			if end, err = r.waitEnd(ctx, &m); err != nil {
				r.unhold() // not handed out: the next call starts here again
				return Whole{}, err
			}
			if large.IsAborted(end) {
				// Chunk 0 only: the rest are passed over one by one, so
				// that a message published between them and the aborted
				// end marker is still delivered.
				if err := r.passOver(ctx, m, "a large message whose write failed or was abandoned"); err != nil {
					return Whole{}, err
				}
				continue
			}
		}
		span, err := large.SpanOf(ctx, r.drv, &m, end)
		if err != nil {
			r.unhold() // not handed out: the next call starts here again
			return Whole{}, fmt.Errorf("shardq: receive large %s: %w", r.ref, err)
		}
		return r.whole(m, span, attempt), nil
	}
}

// whole hands out the large message with end marker end, whose chunk 0
// (or, without chunks, end itself) is m, the message in hand.
func (r *Receiver) whole(m driver.Message, span large.Span, attempt int) Whole {
	var first *driver.Message
	if span.End.Offset != m.Offset {
		first = &m
	}
	tp := driver.TopicPartition{Tenant: r.ref.Tenant, Topic: r.ref.Topic, PartitionKey: r.ref.PartitionKey}
	next := large.FetchNext(context.Background(), r.drv, tp, dbTimeout)
	// The body is read after ReceiveWhole returns, so its reads are not
	// bound by ctx (which bounds the wait): each is bounded by dbTimeout,
	// and none starts once the receiver is closed.
	w := large.Open(first, span, func(after int64) (driver.Message, bool, error) {
		select {
		case <-r.closing:
			_, err := r.current()
			return driver.Message{}, false, err
		default:
		}
		return next(after)
	}, r.ref)
	r.mu.Lock()
	r.heldSpan = &span
	r.buf = nil // the body reads chunk by chunk; what was prefetched would only hold memory
	r.stopHeldTimer()
	r.startHeldTimer(m.Offset, attempt)
	r.mu.Unlock()
	return Whole{Message: w.Message, Attempt: attempt, Body: w.Body, Size: w.Size, Chunks: w.Chunks}
}

// passOver acks m, the message in hand, which no reader may be handed,
// and logs why.
func (r *Receiver) passOver(ctx context.Context, m driver.Message, why string) error {
	r.mu.Lock()
	r.heldSpan = nil
	r.mu.Unlock()
	if err := r.Ack(ctx, m.Offset); err != nil {
		// Not passed over (a receive whose context ended, say): the next
		// call starts here again instead of refusing as unsettled.
		r.unhold()
		return err
	}
	level := slog.LevelWarn
	if large.KindOf(&m) == large.Chunk {
		level = slog.LevelDebug // each later chunk of what was passed over: thousands
	}
	r.log.Log(ctx, level, "shardq: passed over "+why, "offset", m.Offset, "id", m.ID)
	return nil
}

// expire settles m, the message in hand, expired, without handing it
// out: the cursor passes it, or it is dead-lettered.
func (r *Receiver) expire(ctx context.Context, m driver.Message) error {
	r.metrics.Expired(r.ref.Tenant, 1)
	if r.cfg.Settler.Policy.DeadLetterExpired {
		return r.DeadLetter(ctx, m.Offset, expiry.Cause(&m))
	}
	r.log.Debug("shardq: passed over an expired message", "offset", m.Offset, "id", m.ID)
	return r.Ack(ctx, m.Offset)
}

// waitEnd waits until the end marker of the large message whose chunk 0
// is first is stored, or its write is given up (an aborted marker).
func (r *Receiver) waitEnd(ctx context.Context, first *driver.Message) (*driver.Message, error) {
	for {
		end, err := r.waiter.End(ctx, first, r.now())
		if err != nil {
			return nil, fmt.Errorf("shardq: receive large %s id %q: %w", r.ref, first.Headers[large.HeaderID], err)
		}
		if end != nil {
			return end, nil
		}
		if err := r.sleep(ctx); err != nil {
			return nil, err
		}
	}
}

// sleep waits PollInterval, or until a wake-up says the group's head
// moved.
func (r *Receiver) sleep(ctx context.Context) error {
	t := time.NewTimer(r.cfg.PollInterval)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-r.wake:
		return nil
	case <-r.closing:
		_, err := r.current()
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// unhold puts the message in hand back, unsettled and uncounted: it was
// never handed to the caller.
func (r *Receiver) unhold() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.held != nil {
		r.buf = append([]driver.Message{*r.held}, r.buf...)
		r.held, r.heldSpan, r.heldInTx = nil, nil, false
		r.stopHeldTimer()
	}
}
