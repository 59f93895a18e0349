// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/shardq/shardq"
)

// noisyKeys is how many partition keys the quiet tenant publishes to.
const noisyKeys = 16

// noisyCases are the noisy-neighbour scenario's four measurements, in
// pairs: the quiet tenant's latency alone and beside the other tenant's
// backlog (compared by p99), and the busy tenant's throughput alone and
// beside the quiet tenant (compared by rate).
func (e *env) noisyCases() (quietAlone, quietBeside, busyAlone, busyBeside scenCase) {
	return scenCase{"noisy-quiet-alone", e.noisy(false, true, false)}, scenCase{"noisy-quiet", e.noisy(true, true, false)},
		scenCase{"noisy-busy-alone", e.noisy(true, false, true)}, scenCase{"noisy-busy", e.noisy(true, true, true)}
}

// noisy runs --subscribers members of one consumer group serving two
// tenants, each handler call taking --handler-delay. With backlog, the
// busy tenant holds --messages over --partitions keys before the members
// start; with quiet, the quiet tenant publishes --rate msg/s over 16 keys
// for --duration, from a client of its own (its wake-ups come through the
// change feed, as from another process). It reports the quiet tenant's
// latencies from publish to handler, or with reportBusy the busy tenant's
// messages handled during the window.
func (e *env) noisy(backlog, quiet, reportBusy bool) func(ctx context.Context, ns namespace) (rep, error) {
	return func(ctx context.Context, ns namespace) (rep, error) {
		p := e.p
		busyTenant, quietTenant := ns.tenants[0], ns.tenants[1] // Run makes two
		pub, err := e.client()
		if err != nil {
			return rep{}, err
		}
		defer pub.Close()
		if backlog {
			var batch []shardq.Message
			for i := range p.Messages {
				k := i % p.Partitions
				batch = append(batch, shardq.Message{Tenant: busyTenant, Topic: ns.topic, PartitionKey: fmt.Sprintf("p%05d", k),
					Payload: payload(p.Size, uint64(i/p.Partitions), time.Now(), 0)})
				if len(batch) == 500 || i == p.Messages-1 {
					if _, err := pub.Publish(ctx, batch...); err != nil {
						return rep{}, err
					}
					batch = batch[:0]
				}
			}
		}
		c, err := e.client()
		if err != nil {
			return rep{}, err
		}
		defer c.Close()
		total := 0
		if quiet {
			total = int(float64(p.Rate) * p.Duration.Seconds())
		}
		quietRec, busyRec := newRecorder(total, noisyKeys), newRecorder(p.Messages, p.Partitions)
		var windowOn atomic.Bool
		var inWindow atomic.Int64
		handler := func(ctx context.Context, dl *shardq.Delivery) error {
			seq, at, _, err := parsePayload(dl.Payload)
			if err != nil {
				return shardq.DeadLetter(err)
			}
			if dl.Tenant == quietTenant {
				quietRec.record(event{tenant: dl.Tenant, key: dl.PartitionKey, seq: seq, at: time.Now(), published: at})
			} else {
				busyRec.record(event{tenant: dl.Tenant, key: dl.PartitionKey, seq: seq, at: time.Now()})
				if windowOn.Load() {
					inWindow.Add(1)
				}
			}
			if p.HandlerDelay > 0 {
				select {
				case <-time.After(p.HandlerDelay):
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return nil
		}
		var subs []*shardq.Subscriber
		defer func() {
			for _, s := range subs {
				stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
				s.Stop(stopCtx)
				cancel()
			}
		}()
		// Each member's slots are fewer than its share of the backlog's
		// partitions (the default, 64, unless the partitions are few),
		// so that the backlog fills them.
		slots := min(shardq.DefaultMaxPartitions, max(1, p.Partitions/(2*p.Subscribers)))
		for i := range p.Subscribers {
			cfg := shardq.SubscriberConfig{ConsumerGroup: "bench", Topic: ns.topic, Tenants: []string{busyTenant, quietTenant},
				Name: fmt.Sprintf("bench-%s-%d", ns.id, i), Handler: handler, PollInterval: p.PollInterval, MaxPartitions: slots}
			s, err := c.Subscribe(ctx, cfg)
			if err != nil {
				return rep{}, err
			}
			subs = append(subs, s)
		}
		// The window opens once the backlog is being handled.
		if backlog {
			deadline := time.Now().Add(stallTimeout)
			for busyRec.count() == 0 {
				if time.Now().After(deadline) {
					return rep{}, fmt.Errorf("no message of the backlog handled within %s", stallTimeout)
				}
				if err := sleepCtx(ctx, 10*time.Millisecond); err != nil {
					return rep{}, err
				}
			}
		}
		start := time.Now()
		windowOn.Store(true)
		if quiet {
			interval := time.Second / time.Duration(p.Rate)
			for j := range total {
				due := start.Add(time.Duration(j) * interval)
				if err := sleepCtx(ctx, time.Until(due)); err != nil {
					return rep{}, err
				}
				if _, err := pub.Publish(ctx, shardq.Message{Tenant: quietTenant, Topic: ns.topic, PartitionKey: fmt.Sprintf("q%02d", j%noisyKeys),
					Payload: payload(p.Size, uint64(j/noisyKeys), due, 1)}); err != nil {
					return rep{}, err
				}
			}
		} else if err := sleepCtx(ctx, p.Duration); err != nil {
			return rep{}, err
		}
		elapsed := time.Since(start)
		windowOn.Store(false)
		if backlog && busyRec.count() >= int64(p.Messages) {
			return rep{}, fmt.Errorf("the busy tenant's backlog drained within the window: raise --messages or --handler-delay")
		}
		if quiet {
			if err := quietRec.wait(ctx); err != nil {
				return rep{}, err
			}
		}
		r := quietRec.rep(elapsed)
		busy := busyRec.rep(elapsed)
		r.dups += busy.dups
		r.outOfOrder += busy.outOfOrder
		r.extraParams = map[string]any{"max_partitions": slots}
		if !reportBusy {
			return r, nil
		}
		r.latencies = nil
		r.msgs, r.elapsed = inWindow.Load(), elapsed
		if r.msgs == 0 {
			return rep{}, errors.New("the busy tenant handled nothing during the window")
		}
		return r, nil
	}
}

// sleepCtx sleeps d unless ctx ends first.
func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
