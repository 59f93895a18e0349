// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/shardq/shardq"
)

// group is the consumer group every bench subscriber joins.
const group = "bench"

// WorkerConfig is what a subscriber process (`shardq bench worker`) serves.
type WorkerConfig struct {
	Name         string
	Topic        string
	Tenants      []string
	PollInterval time.Duration
	// Latency: report each message's due time, for end-to-end latency.
	Latency bool
	// Ungrouped: take ungrouped messages only, Handlers at once, each
	// handler call taking Delay.
	Ungrouped bool
	Handlers  int
	Delay     time.Duration
	Feed      string // the worker client's change feed: auto or off
}

// Args are the command-line arguments of `shardq bench worker` for cfg.
func (cfg WorkerConfig) Args() []string {
	feed := cfg.Feed
	if feed == "" {
		feed = "auto"
	}
	args := []string{"--name", cfg.Name, "--topic", cfg.Topic, "--poll", cfg.PollInterval.String(), "--feed", feed}
	for _, t := range cfg.Tenants {
		args = append(args, "--tenant", t)
	}
	if cfg.Latency {
		args = append(args, "--latency")
	}
	if cfg.Ungrouped {
		args = append(args, "--ungrouped", "--handlers", strconv.Itoa(cfg.Handlers), "--delay", cfg.Delay.String())
	}
	return args
}

func (cfg WorkerConfig) subscriber(handler shardq.Handler) shardq.SubscriberConfig {
	sc := shardq.SubscriberConfig{ConsumerGroup: group, Topic: cfg.Topic, Tenants: cfg.Tenants, Name: cfg.Name,
		PollInterval: cfg.PollInterval, Handler: handler}
	if cfg.Ungrouped {
		sc.Take, sc.UngroupedConcurrency = shardq.TakeUngrouped, cfg.Handlers
	}
	return sc
}

// handler records each delivery as an event.
func (cfg WorkerConfig) handler(record func(event)) shardq.Handler {
	return func(ctx context.Context, d *shardq.Delivery) error {
		if cfg.Delay > 0 {
			t := time.NewTimer(cfg.Delay)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			}
		}
		at := time.Now()
		seq, due, _, err := parsePayload(d.Payload)
		if err != nil {
			return shardq.DeadLetter(err)
		}
		ev := event{tenant: d.Tenant, key: d.PartitionKey, seq: seq, at: at}
		if cfg.Latency && seq > 0 { // sequence 0 is the warm-up
			ev.published = due
		}
		record(ev)
		return nil
	}
}

// startSubscribers starts --subscribers members of the bench group, in
// this process or (--processes) each in its own, feeding rec. stop stops
// them all.
func (e *env) startSubscribers(ctx context.Context, c *shardq.Client, ns namespace, rec *recorder, latency, ungrouped bool) (stop func() error, err error) {
	var stops []func() error
	stopAll := func() error {
		var errs []error
		for _, s := range stops {
			errs = append(errs, s())
		}
		return errors.Join(errs...)
	}
	for i := range e.p.Subscribers {
		cfg := WorkerConfig{Name: fmt.Sprintf("bench-%s-%d", ns.id, i), Topic: ns.topic, Tenants: ns.tenants,
			PollInterval: e.p.PollInterval, Latency: latency, Ungrouped: ungrouped, Handlers: e.p.Handlers, Delay: e.p.HandlerDelay,
			Feed: e.p.Feed}
		if !e.p.Processes {
			s, err := c.Subscribe(ctx, cfg.subscriber(cfg.handler(rec.record)))
			if err != nil {
				return nil, errors.Join(err, stopAll())
			}
			stops = append(stops, func() error {
				sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
				defer cancel()
				return s.Stop(sctx)
			})
			continue
		}
		out, in, wait, err := e.Worker(ctx, cfg.Args())
		if err != nil {
			return nil, errors.Join(err, stopAll())
		}
		read := make(chan error, 1)
		go func() { read <- readEvents(out, rec.record) }()
		stops = append(stops, func() error {
			// Closing stdin stops the worker; its stdout then ends.
			return errors.Join(in.Close(), <-read, wait())
		})
	}
	return stopAll, nil
}

// Work runs one subscriber process: it writes one line per delivery to
// out until in reaches EOF, then stops gracefully.
func Work(ctx context.Context, c *shardq.Client, cfg WorkerConfig, in io.Reader, out io.Writer) error {
	w := bufio.NewWriter(out)
	var mu sync.Mutex
	var werr error
	record := func(ev event) {
		mu.Lock()
		defer mu.Unlock()
		var pub int64
		if !ev.published.IsZero() {
			pub = ev.published.UnixNano()
		}
		if _, err := fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%d\n", ev.tenant, ev.key, ev.seq, ev.at.UnixNano(), pub); err == nil {
			err = w.Flush()
			werr = errors.Join(werr, err)
		} else {
			werr = errors.Join(werr, err)
		}
	}
	s, err := c.Subscribe(ctx, cfg.subscriber(cfg.handler(record)))
	if err != nil {
		return err
	}
	io.Copy(io.Discard, in) // until the parent closes stdin
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	err = s.Stop(sctx)
	mu.Lock()
	defer mu.Unlock()
	return errors.Join(err, werr, w.Flush())
}

// readEvents parses Work's lines.
func readEvents(r io.Reader, record func(event)) error {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Split(sc.Text(), "\t")
		if len(f) != 5 {
			return fmt.Errorf("bench worker line %q: want 5 tab-separated fields", sc.Text())
		}
		seq, err1 := strconv.ParseUint(f[2], 10, 64)
		at, err2 := strconv.ParseInt(f[3], 10, 64)
		pub, err3 := strconv.ParseInt(f[4], 10, 64)
		if err := errors.Join(err1, err2, err3); err != nil {
			return fmt.Errorf("bench worker line %q: %w", sc.Text(), err)
		}
		ev := event{tenant: f[0], key: f[1], seq: seq, at: time.Unix(0, at)}
		if pub != 0 {
			ev.published = time.Unix(0, pub)
		}
		record(ev)
	}
	return sc.Err()
}
