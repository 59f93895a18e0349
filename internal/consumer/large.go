// SPDX-License-Identifier: Apache-2.0

package consumer

import (
	"context"
	"log/slog"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/large"
)

// A worker hands out a large message once, whole, when its chunk 0 comes
// up and its end marker is stored (docs/large.md): until then the
// partition waits there, as it waits for a retry. What no handler may see
// alone it passes over: a later chunk whose chunk 0 was passed over, an
// end marker without its chunks, and the chunks of a write that failed or
// that the worker gave up (large.Waiter).

// largeFetchBytes bounds a worker's reads after it met a large message's
// part: its chunks are read one at a time by the body, not a batch at once.
const largeFetchBytes = 1 << 20

// largeEnd returns what m, a chunk or an end marker at the cursor, is
// part of: its end marker (m itself for a large message without chunks),
// or nil while its write is still going on. A message the worker passed
// over also returns nil, with the cursor past it. ok is false when the
// worker must stop.
func (w *worker) largeEnd(m *driver.Message) (end *driver.Message, ok bool) {
	switch large.KindOf(m) {
	case large.Chunk:
		return nil, w.passOver(m, m.Offset, "a chunk of a large message that was passed over")
	case large.End:
		if large.IsAborted(m) || m.Headers[large.HeaderChunks] != "0" {
			return nil, w.passOver(m, m.Offset, "an end marker without its chunks")
		}
		return m, true
	}
	ctx, cancel := context.WithTimeout(w.ctx, dbTimeout)
	end, err := w.waiter.End(ctx, m, w.s.cfg.Clock())
	cancel()
	if err != nil {
		if w.stopping() || w.ctx.Err() != nil {
			return nil, false
		}
		w.s.log.Warn("shardq: reading a large message's end marker failed; retrying", w.logArgs("offset", m.Offset, "err", err)...)
		return nil, w.wait(w.s.cfg.PollInterval)
	}
	if end == nil {
		// Wait for the writer: a wake-up (the head moved) or the poll.
		w.idle(w.s.pollEvery())
	}
	return end, true
}

// passOver moves the cursor to upTo past m, which no handler may see, and
// says why: at WARN for the start of something passed over, at DEBUG for
// each later chunk of it (a large write has thousands).
func (w *worker) passOver(m *driver.Message, upTo int64, why string) bool {
	w.cursor = upTo
	level := slog.LevelWarn
	if large.KindOf(m) == large.Chunk {
		level = slog.LevelDebug
	}
	w.s.log.Log(context.Background(), level, "shardq: passed over "+why, w.logArgs("offset", m.Offset, "id", m.ID, "up_to", upTo)...)
	return true
}

// span is what settling the large message first (chunk 0, or end itself)
// starts covers; false when the worker must stop.
func (w *worker) span(first, end *driver.Message) (*large.Span, bool) {
	for {
		ctx, cancel := context.WithTimeout(w.ctx, dbTimeout)
		span, err := large.SpanOf(ctx, w.s.drv, first, end)
		cancel()
		if err == nil {
			return &span, true
		}
		if w.stopping() || w.ctx.Err() != nil {
			return nil, false
		}
		w.s.log.Warn("shardq: reading a large message's span failed; retrying", w.logArgs("offset", first.Offset, "err", err)...)
		if !w.wait(w.s.cfg.PollInterval) {
			return nil, false
		}
	}
}

// open makes the large message that first (chunk 0, or its end marker)
// starts: its body reads one chunk at a time, each read bounded on its own
// and ended with the worker's lease.
func (w *worker) open(first *driver.Message, span large.Span) *large.Whole {
	if first.Offset == span.End.Offset {
		first = nil
	}
	tp := driver.TopicPartition{Tenant: w.lease.Tenant, Topic: w.lease.Topic, PartitionKey: w.lease.PartitionKey}
	whole := large.Open(first, span, large.FetchNext(w.ctx, w.s.drv, tp, dbTimeout), w.lease.PartitionRef)
	return &whole
}
