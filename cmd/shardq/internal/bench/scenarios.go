// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
)

// stallTimeout ends a wait for deliveries that stopped arriving; what did
// not arrive is reported lost.
const stallTimeout = 60 * time.Second

func (e *env) client() (*shardq.Client, error) {
	feed := shardq.FeedAuto
	if e.p.Feed == "off" {
		feed = shardq.FeedOff
	}
	return shardq.NewClient(e.d, &shardq.Config{Logger: e.Logger, ChangeFeed: feed})
}

// publish: --publishers goroutines publish --messages in calls of --batch
// messages; call n goes to partition n mod --partitions. Afterwards every
// partition is read back: each publisher's messages must be there once, in
// the order it published them.
func (e *env) publish(ctx context.Context, ns namespace) (rep, error) {
	c, err := e.client()
	if err != nil {
		return rep{}, err
	}
	defer c.Close()
	return e.publishWith(ctx, ns, func(msgs []shardq.Message) error {
		_, err := c.Publish(ctx, msgs...)
		return err
	})
}

// publishAsync is one goroutine handing --messages to a Producer over
// --partitions keys, then waiting for the last; read back.
func (e *env) publishAsync(ctx context.Context, ns namespace) (rep, error) {
	c, err := e.client()
	if err != nil {
		return rep{}, err
	}
	defer c.Close()
	p, err := c.Producer(nil)
	if err != nil {
		return rep{}, err
	}
	defer p.Stop(context.WithoutCancel(ctx))
	seqs := map[int]uint64{}
	futures := make([]*shardq.PublishFuture, 0, e.p.Messages)
	start := time.Now()
	for i := range e.p.Messages {
		k := i % e.p.Partitions
		tenant, key := ns.partition(k)
		futures = append(futures, p.Publish(ctx, shardq.Message{Tenant: tenant, Topic: ns.topic, PartitionKey: key,
			Payload: payload(e.p.Size, seqs[k], time.Now(), 0)}))
		seqs[k]++
	}
	for _, f := range futures {
		if _, err := f.Wait(ctx); err != nil {
			return rep{}, err
		}
	}
	elapsed := time.Since(start)
	r, err := e.readBack(ctx, ns)
	r.elapsed = elapsed
	return r, err
}

// publishWith is publish's loop with send as the call: timed, then read
// back.
func (e *env) publishWith(ctx context.Context, ns namespace, send func(msgs []shardq.Message) error) (rep, error) {
	p := e.p
	var next atomic.Int64
	var mu sync.Mutex
	var lat []time.Duration
	errc := make(chan error, p.Publishers)
	start := time.Now()
	var wg sync.WaitGroup
	for pub := range p.Publishers {
		wg.Go(func() {
			seqs := map[int]uint64{}
			var mine []time.Duration
			defer func() { mu.Lock(); lat = append(lat, mine...); mu.Unlock() }()
			msgs := make([]shardq.Message, 0, p.Batch)
			for {
				first := int(next.Add(int64(p.Batch))) - p.Batch
				if first >= p.Messages {
					return
				}
				k := first / p.Batch % p.Partitions
				tenant, key := ns.partition(k)
				msgs = msgs[:0]
				now := time.Now()
				for range min(p.Batch, p.Messages-first) {
					msgs = append(msgs, shardq.Message{Tenant: tenant, Topic: ns.topic, PartitionKey: key,
						Payload: payload(p.Size, seqs[k], now, uint32(pub))})
					seqs[k]++
				}
				if err := send(msgs); err != nil {
					errc <- err
					return
				}
				mine = append(mine, time.Since(now))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errc)
	if err := <-errc; err != nil {
		return rep{}, err
	}
	r, err := e.readBack(ctx, ns)
	r.elapsed, r.latencies = elapsed, lat
	return r, err
}

// readBack reads every partition of the namespace in offset order and
// checks each publisher's messages: present once, in publish order.
func (e *env) readBack(ctx context.Context, ns namespace) (rep, error) {
	type stream struct {
		tenant, key string
		publisher   uint32
	}
	last := map[stream]uint64{}
	seen := map[stream]map[uint64]bool{}
	var found, ooo, dups int64
	heads, err := e.d.PartitionHeads(ctx, ns.tenants, ns.topic)
	if err != nil {
		return rep{}, err
	}
	for _, h := range heads {
		var after int64
		for {
			msgs, err := e.d.FetchAfter(ctx, driver.TopicPartition{Tenant: h.Tenant, Topic: h.Topic, PartitionKey: h.PartitionKey}, after, 1000)
			if err != nil {
				return rep{}, err
			}
			for _, m := range msgs {
				seq, _, pub, err := parsePayload(m.Payload)
				if err != nil {
					return rep{}, fmt.Errorf("tenant %s partition %s offset %d: %w", m.Tenant, m.PartitionKey, m.Offset, err)
				}
				s := stream{m.Tenant, m.PartitionKey, pub}
				if seen[s] == nil {
					seen[s] = map[uint64]bool{}
				}
				switch {
				case seen[s][seq]:
					dups++
					continue
				case len(seen[s]) > 0 && seq < last[s]:
					ooo++
				}
				seen[s][seq], last[s] = true, seq
				found++
			}
			if len(msgs) < 1000 {
				break
			}
			after = msgs[len(msgs)-1].Offset
		}
	}
	return rep{msgs: int64(e.p.Messages), lost: max(0, int64(e.p.Messages)-found), dups: dups, outOfOrder: ooo}, nil
}

// fill publishes --messages untimed: message i is the (i / K)th of
// partition i mod K, published in that order.
func (e *env) fill(ctx context.Context, c *shardq.Client, ns namespace) error {
	byTenant := map[string][]shardq.Message{}
	now := time.Now()
	flush := func(tenant string) error {
		if _, err := c.Publish(ctx, byTenant[tenant]...); err != nil {
			return fmt.Errorf("fill tenant %s: %w", tenant, err)
		}
		byTenant[tenant] = byTenant[tenant][:0]
		return nil
	}
	for i := range e.p.Messages {
		tenant, key := ns.partition(i % e.p.Partitions)
		byTenant[tenant] = append(byTenant[tenant], shardq.Message{Tenant: tenant, Topic: ns.topic, PartitionKey: key,
			ID: fmt.Sprint(i), Payload: payload(e.p.Size, uint64(i/e.p.Partitions), now, 0)})
		if len(byTenant[tenant]) == 500 {
			if err := flush(tenant); err != nil {
				return err
			}
		}
	}
	for tenant, msgs := range byTenant {
		if len(msgs) > 0 {
			if err := flush(tenant); err != nil {
				return err
			}
		}
	}
	return nil
}

// consume: --messages are published beforehand over --partitions; then
// --subscribers members of one consumer group, with a per-message handler,
// consume them all.
func (e *env) consume(ctx context.Context, ns namespace) (rep, error) {
	c, err := e.client()
	if err != nil {
		return rep{}, err
	}
	defer c.Close()
	if err := e.fill(ctx, c, ns); err != nil {
		return rep{}, err
	}
	return e.consumeAll(ctx, c, ns, newRecorder(e.p.Messages, e.p.Partitions), false)
}

// consumeAll starts the subscribers (ungrouped: competing consumers) and
// times them until rec has every message or deliveries stall.
func (e *env) consumeAll(ctx context.Context, c *shardq.Client, ns namespace, rec *recorder, ungrouped bool) (rep, error) {
	start := time.Now()
	stop, err := e.startSubscribers(ctx, c, ns, rec, false, ungrouped)
	if err != nil {
		return rep{}, err
	}
	waitErr := rec.wait(ctx)
	elapsed := time.Since(start)
	if err := errors.Join(waitErr, stop()); err != nil {
		return rep{}, err
	}
	return rec.rep(elapsed), nil
}

// wait returns when every message was delivered, or nil after deliveries
// stalled (what is missing is then reported lost), or ctx's error.
func (r *recorder) wait(ctx context.Context) error {
	stall := time.NewTimer(stallTimeout)
	defer stall.Stop()
	for {
		select {
		case <-r.done:
			return nil
		case <-r.progressed:
			stall.Reset(stallTimeout)
		case <-stall.C:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// latency: subscribers run while publishers send --rate messages per
// second for --duration, one per call, each timed from when it was due to
// be published (so a publisher falling behind counts against it) to its
// delivery to a handler.
func (e *env) latency(ctx context.Context, ns namespace) (rep, error) {
	c, err := e.client()
	if err != nil {
		return rep{}, err
	}
	defer c.Close()
	p := e.p
	total := int(float64(p.Rate) * p.Duration.Seconds())
	rec := newRecorder(p.Partitions+total, p.Partitions)
	stop, err := e.startSubscribers(ctx, c, ns, rec, true, false)
	if err != nil {
		return rep{}, err
	}
	defer func() {
		if stop != nil {
			stop()
		}
	}()
	// Warm up: sequence 0 of every partition, so that every partition is
	// leased before the clock starts.
	for k := range p.Partitions {
		tenant, key := ns.partition(k)
		if _, err := c.Publish(ctx, shardq.Message{Tenant: tenant, Topic: ns.topic, PartitionKey: key,
			Payload: payload(p.Size, 0, time.Now(), 0)}); err != nil {
			return rep{}, err
		}
	}
	warm, cancel := context.WithTimeout(ctx, stallTimeout)
	for rec.count() < int64(p.Partitions) {
		select {
		case <-rec.progressed:
		case <-warm.Done():
			cancel()
			return rep{}, fmt.Errorf("warm-up: %d of %d partitions delivered within %s", rec.count(), p.Partitions, stallTimeout)
		}
	}
	cancel()

	// Message j is due at start + j/rate, goes to partition j mod K and is
	// published by the publisher that owns that partition, so each
	// partition's order is one publisher's order.
	queues := make([]chan int, p.Publishers)
	for i := range queues {
		queues[i] = make(chan int, total/p.Publishers+1)
	}
	for j := range total {
		queues[j%p.Partitions%p.Publishers] <- j
	}
	start := time.Now().Add(10 * time.Millisecond)
	interval := time.Second / time.Duration(p.Rate)
	errc := make(chan error, p.Publishers)
	var wg sync.WaitGroup
	for i := range queues {
		close(queues[i])
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range queues[i] {
				due := start.Add(time.Duration(j) * interval)
				time.Sleep(time.Until(due))
				k := j % p.Partitions
				tenant, key := ns.partition(k)
				if _, err := c.Publish(ctx, shardq.Message{Tenant: tenant, Topic: ns.topic, PartitionKey: key,
					Payload: payload(p.Size, uint64(1+j/p.Partitions), due, uint32(i))}); err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	published := time.Since(start)
	close(errc)
	if err := <-errc; err != nil {
		return rep{}, err
	}
	waitErr := rec.wait(ctx)
	err = stop()
	stop = nil
	if err := errors.Join(waitErr, err); err != nil {
		return rep{}, err
	}
	r := rec.rep(published)
	r.msgs = int64(total)
	r.lost = max(0, r.lost)
	return r, nil
}

// ungrouped: --messages ungrouped messages (empty partition key) are
// published beforehand, message i to tenant i mod --tenants; then
// --subscribers competing consumers, each running --handlers handlers of
// --handler-delay, consume them all. Ungrouped messages have no order;
// duplicates (a claim that expired) are counted.
func (e *env) ungrouped(ctx context.Context, ns namespace) (rep, error) {
	c, err := e.client()
	if err != nil {
		return rep{}, err
	}
	defer c.Close()
	now := time.Now()
	for t, tenant := range ns.tenants { // one Publish call writes one tenant
		var batch []shardq.Message
		for i := t; i < e.p.Messages; i += len(ns.tenants) {
			batch = append(batch, shardq.Message{Tenant: tenant, Topic: ns.topic, ID: fmt.Sprint(i), Payload: payload(e.p.Size, uint64(i), now, 0)})
			if len(batch) == 500 || i+len(ns.tenants) >= e.p.Messages {
				if _, err := c.Publish(ctx, batch...); err != nil {
					return rep{}, fmt.Errorf("fill: %w", err)
				}
				batch = batch[:0]
			}
		}
	}
	rec := newRecorder(e.p.Messages, len(ns.tenants))
	rec.unordered = true
	return e.consumeAll(ctx, c, ns, rec, true)
}
