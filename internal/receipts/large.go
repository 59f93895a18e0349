// SPDX-License-Identifier: Apache-2.0

package receipts

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/ident"
	"github.com/shardq/shardq/internal/large"
	"github.com/shardq/shardq/internal/lifecycle"
)

// A receive hands out a large message alone, with a receipt that names
// its chunk 0 and its end marker; its body is read by that receipt
// (Body). A receive of ordinary messages stops before a large one, which
// comes in the next receive. What no reader may see alone (a chunk whose
// chunk 0 was passed over, an end marker without its chunks, a write
// that failed or was given up) is passed over under the lease, as the
// other readers do.

// maxPassOver bounds the messages one receive passes over before it
// answers (with nothing): the next receive goes on.
const maxPassOver = 1000

// wholes cuts msgs, read under l, before the first chunk or end marker;
// when msgs starts with one, it returns the large message that starts
// there, alone, with its Whole, or nothing while its end marker is not
// stored. It passes over what no reader may see, committing l's cursor,
// and reads on.
func (r *Receipts) wholes(ctx context.Context, l *driver.Lease, rq Request, msgs []driver.Message, states map[int64]driver.DeliveryState,
	truncated bool, now time.Time) ([]driver.Message, map[int64]driver.DeliveryState, *large.Whole, error) {
	for passed := 0; len(msgs) > 0; {
		for i := range msgs {
			if large.KindOf(&msgs[i]) != large.Ordinary {
				if i > 0 {
					return msgs[:i], states, nil, nil
				}
				break
			}
			if i == len(msgs)-1 {
				return msgs, states, nil, nil
			}
		}
		m := &msgs[0]
		var end *driver.Message
		switch large.KindOf(m) {
		case large.End:
			if !large.IsAborted(m) && m.Headers[large.HeaderChunks] == "0" {
				end = m // a large message without chunks
			}
		case large.First:
			var err error
			if end, err = r.waiter(l.PartitionRef).End(ctx, m, now); err != nil {
				return nil, nil, nil, fmt.Errorf("large message %q: %w", m.Headers[large.HeaderID], err)
			}
			if end == nil {
				return nil, nil, nil, nil // still being written: the group is not ready
			}
			if large.IsAborted(end) {
				end = nil // pass over chunk 0; the later chunks follow one by one
			}
		}
		r.forget(l.PartitionRef)
		if end != nil {
			span, err := large.SpanOf(ctx, r.drv, m, end)
			if err != nil {
				return nil, nil, nil, err
			}
			w := large.Open(firstOf(m, end), span, nil, l.PartitionRef)
			return msgs[:1], states, &w, nil
		}
		if passed++; passed > maxPassOver {
			return nil, nil, nil, nil
		}
		if err := r.drv.CommitReceived(ctx, driver.CommitReceivedParams{Lease: *l, Offset: m.Offset, Release: false, Now: now}); err != nil {
			return nil, nil, nil, fmt.Errorf("pass over offset %d: %w", m.Offset, err)
		}
		level := slog.LevelWarn
		if large.KindOf(m) == large.Chunk {
			level = slog.LevelDebug // each later chunk of what was passed over: thousands
		}
		r.cfg.Log.Log(ctx, level, "shardq: passed over a part of a large message that no reader may see alone", "tenant", l.Tenant, "topic", l.Topic,
			"partition_key", l.PartitionKey, "group", l.ConsumerGroup, "offset", m.Offset, "id", m.ID)
		l.Committed = m.Offset
		if len(msgs) > 1 {
			msgs = msgs[1:]
			continue
		}
		var err error
		if msgs, states, _, err = r.ready(ctx, *l, rq, now); err != nil {
			return nil, nil, nil, err
		}
	}
	return nil, nil, nil, nil
}

// firstOf is the chunk 0 of the large message m starts (nil when m is its
// end marker: it has no chunks).
func firstOf(m, end *driver.Message) *driver.Message {
	if m.Offset == end.Offset {
		return nil
	}
	return m
}

// maxWaiters bounds Receipts.waiters before it sheds them all: a waiter
// forgotten starts its timeout again.
const maxWaiters = 10_000

// waiter is the Waiter of the large message at ref's cursor.
func (r *Receipts) waiter(ref driver.PartitionRef) *large.Waiter {
	r.mu.Lock()
	defer r.mu.Unlock()
	w := r.waiters[ref]
	if w == nil {
		if len(r.waiters) >= maxWaiters {
			clear(r.waiters)
		}
		w = &large.Waiter{Store: r.drv, Timeout: r.cfg.LargeWriteTimeout, Stalls: r.cfg.LargeStalls}
		r.waiters[ref] = w
	}
	return w
}

// writing reports whether a receive found a large message still being
// written at ref's cursor, and has not seen it complete or given up since.
func (r *Receipts) writing(ref driver.PartitionRef) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.waiters[ref] != nil
}

func (r *Receipts) forget(ref driver.PartitionRef) {
	r.mu.Lock()
	delete(r.waiters, ref)
	r.mu.Unlock()
}

// endAt reads the end marker a large message's receipt names, checking
// that m, the message at its offset, starts that large message.
func (r *Receipts) endAt(ctx context.Context, rc Receipt, m driver.Message) (*driver.Message, error) {
	end := &m
	if rc.End != rc.Offset {
		ms, err := r.drv.FetchAfter(ctx, driver.TopicPartition{Tenant: rc.Tenant, Topic: rc.Topic, PartitionKey: rc.Key}, rc.End-1, 1)
		if err != nil {
			return nil, err
		}
		if len(ms) == 0 || ms[0].Offset != rc.End {
			return nil, ErrStale // removed meanwhile (retention, delete)
		}
		end = &ms[0]
	}
	if large.KindOf(end) != large.End || (end != &m && (large.KindOf(&m) != large.First || m.Headers[large.HeaderID] != end.ID)) {
		return nil, fmt.Errorf("%w: offsets %d to %d of tenant %q topic %q partition %q are not one large message", large.ErrCorrupt,
			rc.Offset, rc.End, rc.Tenant, rc.Topic, rc.Key)
	}
	return end, nil
}

// Body opens the body of the large message a receipt of tenant's topic
// and group names: its chunks are read one at a time (each read bounded
// by lifecycle.CallTimeout and ended with ctx) and checked at the end
// against its end marker. The receipt is checked (signature, tenant,
// topic, group) and must name a large message; its lease need not be
// current: the body is what the receive handed out.
func (r *Receipts) Body(ctx context.Context, tenant, topic, group, rcpt string) (large.Whole, error) {
	// Opening is bounded on its own; ctx goes on to bound the reads.
	octx, cancel := context.WithTimeout(ctx, lifecycle.CallTimeout)
	defer cancel()
	rc, err := r.Decode(octx, rcpt, tenant, topic, group)
	if err == nil && rc.End == 0 {
		err = &ident.Error{Field: "receipt", Rule: "does not name a large message"}
	}
	if err != nil {
		return large.Whole{}, fmt.Errorf("shardq: read body: %w", err)
	}
	tp := driver.TopicPartition{Tenant: tenant, Topic: topic, PartitionKey: rc.Key}
	ms, err := r.drv.FetchAfter(octx, tp, rc.Offset-1, 1)
	if err == nil && (len(ms) == 0 || ms[0].Offset != rc.Offset) {
		err = ErrStale
	}
	var end *driver.Message
	if err == nil {
		end, err = r.endAt(octx, rc, ms[0])
	}
	if err != nil {
		return large.Whole{}, settled("read body of", rc, err)
	}
	return large.Open(firstOf(&ms[0], end), large.Span{End: end, UpTo: rc.upTo()}, large.FetchNext(ctx, r.drv, tp, lifecycle.CallTimeout), rc.ref()), nil
}
