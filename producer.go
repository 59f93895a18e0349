// SPDX-License-Identifier: Apache-2.0

package shardq

import (
	"cmp"
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/shardq/shardq/internal/ident"
	"github.com/shardq/shardq/internal/publish"
)

// ErrKeyPaused fails a message handed to a Producer whose key has an
// earlier message that failed: nothing of a key is stored after a message
// of it that failed, until Producer.Resume (Pub/Sub's ordering keys do the
// same). errors.Is also matches the earlier failure's cause.
var ErrKeyPaused = publish.ErrKeyPaused

// ErrProducerFull fails a message that finds the producer's buffer full,
// with ProducerOptions.FailFast.
var ErrProducerFull = publish.ErrFull

// ProducerOptions configure Client.Producer.
type ProducerOptions struct {
	// MaxBatch bounds the messages of one transaction [500], and
	// MaxBatchBytes their payload, header, key and id bytes [4 MiB] (a
	// larger message goes alone).
	MaxBatch      int
	MaxBatchBytes int64
	// Linger is how long a lane that is not writing waits for more
	// messages before it writes a batch short of MaxBatch [0: at once; a
	// batch grows anyway while the one before it is in flight].
	Linger time.Duration
	// Lanes is how many transactions of one tenant may be in flight at
	// once [4]. The messages of one key always take one lane.
	Lanes int
	// MaxBuffered and MaxBufferedBytes bound the messages handed in and
	// not yet stored or failed [10,000; 64 MiB]: past them Publish waits
	// for room, or with FailFast fails with ErrProducerFull.
	MaxBuffered      int
	MaxBufferedBytes int64
	FailFast         bool
}

// Producer publishes asynchronously, as Kafka's producer, Pub/Sub's
// client and NATS's PublishAsync do: Publish hands a message over and
// returns a PublishFuture at once, and the messages handed in are written
// in batches behind the caller's back. The messages of one key are
// stored in the order they were handed in, across batches; a message that
// fails in its write, or at hand-in after it was numbered (its tenant
// suspended or over a quota, a full buffer, its wait for room ended),
// fails every later one of its key (ErrKeyPaused), queued ones included,
// until Resume. A message refused before that (invalid, or the clock
// unsynchronised) pauses nothing. Publishing is idempotent by id: an id
// is chosen when a message is handed in, so a batch written again is a
// duplicate, not a copy. Stop (or the client's Close) writes what was
// handed in, then ends.
type Producer struct {
	c    *Client
	p    *publish.Producer
	done chan struct{}
	once sync.Once
}

// PublishFuture is a message handed to a Producer.
type PublishFuture struct{ f *publish.Future }

// Done is closed once the message is stored or has failed.
func (f *PublishFuture) Done() <-chan struct{} { return f.f.Done() }

// Wait waits until the message is stored or has failed, or ctx ends.
func (f *PublishFuture) Wait(ctx context.Context) (PublishResult, error) {
	row, err := f.f.Wait(ctx)
	if err != nil {
		return PublishResult{}, err
	}
	return PublishResult{Tenant: row.Tenant, Topic: row.Topic, PartitionKey: row.PartitionKey, ID: row.ID, Offset: row.Offset, Duplicate: row.Duplicate}, nil
}

// Producer returns an asynchronous publisher on c.
func (c *Client) Producer(opts *ProducerOptions) (*Producer, error) {
	var o ProducerOptions
	if opts != nil {
		o = *opts
	}
	for _, f := range []struct {
		name string
		v    int64
	}{{"max batch", int64(o.MaxBatch)}, {"max batch bytes", o.MaxBatchBytes}, {"lanes", int64(o.Lanes)},
		{"max buffered", int64(o.MaxBuffered)}, {"max buffered bytes", o.MaxBufferedBytes}, {"linger", int64(o.Linger)}} {
		if f.v < 0 {
			return nil, fmt.Errorf("shardq: producer: %w", &ident.Error{Field: f.name, Rule: fmt.Sprintf("%d: must not be negative", f.v)})
		}
	}
	cfg := publish.ProducerConfig{MaxBatch: cmp.Or(o.MaxBatch, 500), MaxBatchBytes: cmp.Or(o.MaxBatchBytes, 4<<20), Linger: o.Linger,
		Lanes: cmp.Or(o.Lanes, 4), MaxBuffered: cmp.Or(o.MaxBuffered, 10_000), MaxBufferedBytes: cmp.Or(o.MaxBufferedBytes, 64<<20), FailFast: o.FailFast}
	pr := &Producer{c: c, p: publish.NewProducer(c.pub, cfg), done: make(chan struct{})}
	if err := c.track(pr); err != nil {
		pr.p.Close(context.Background())
		return nil, fmt.Errorf("shardq: producer: %w", err)
	}
	return pr, nil
}

// Publish hands msg over and returns its future at once: already failed
// when msg is invalid (a ValidationError), its key is paused
// (ErrKeyPaused), its tenant is suspended or over a quota, the buffer is
// full with FailFast (ErrProducerFull), ctx ends while it waits for room,
// or the producer is stopped (ErrClosed). ctx bounds only that wait and
// carries the trace context: the write itself is the producer's.
func (p *Producer) Publish(ctx context.Context, msg Message) *PublishFuture {
	if err := p.c.syncClock(ctx); err != nil {
		return &PublishFuture{publish.FailedFuture(fmt.Errorf("shardq: publish tenant %q topic %q partition %q: %w", msg.Tenant, msg.Topic, msg.PartitionKey, err))}
	}
	return &PublishFuture{p.p.Publish(ctx, toPublish([]Message{msg})[0])}
}

// Resume lets a paused key of t take messages again.
func (p *Producer) Resume(t TopicRef, partitionKey string) {
	p.p.Resume(t.Tenant, t.Topic, partitionKey)
}

// Flush waits until every message handed in before it is stored or has
// failed, or ctx ends.
func (p *Producer) Flush(ctx context.Context) error { return p.p.Flush(ctx) }

// Stop refuses new messages and waits until those handed in are stored
// or have failed. When ctx ends first it gives up: the messages not yet
// written fail (ErrClosed), a write in flight is cancelled (its messages
// fail, each stored or not: publish them again by id to store each
// once), and Stop returns ctx's error once the producer's goroutines have
// ended.
//
// Stop may be called again, and concurrently (Client.Close does): each
// call waits on its own ctx, and gives up when it ends.
func (p *Producer) Stop(ctx context.Context) error {
	err := p.p.Close(ctx)
	p.once.Do(func() {
		p.c.untrack(p)
		close(p.done)
	})
	return err
}

// Done is closed once the producer is stopped.
func (p *Producer) Done() <-chan struct{} { return p.done }

func (p *Producer) stopOrder() int                         { return 1 }
func (p *Producer) stopForClose(ctx context.Context) error { return p.Stop(ctx) }

var _ Handle = (*Producer)(nil)
