// SPDX-License-Identifier: Apache-2.0

// Package shardq is an ordered, tenant-sharded message queue on MySQL
// (MariaDB, MySQL, Vitess) or an embedded SQLite file.
//
// Messages are published to (tenant, topic, partition key). The partition
// key is the ordering unit (a message group): within one partition, offsets
// increase in commit order and readers see messages in that order. Publish
// is idempotent by message id.
//
// A Client wraps a driver (see driver/mysqldriver and driver/sqlitedriver):
//
//	drv, _ := sqlitedriver.Open("shardq.db", nil)
//	client, _ := shardq.NewClient(drv, nil)
//	defer client.Close()
//	_ = client.Migrate(ctx)
//	res, err := client.Publish(ctx, shardq.Message{
//		Tenant: "acme", Topic: "orders", PartitionKey: "order-42",
//		Payload: []byte(`{"status":"paid"}`),
//	})
//
// Concurrent Publish calls of one tenant share transactions (group commit),
// and each returns once its own messages are committed. PublishTx writes
// inside the caller's own *sql.Tx instead: the messages exist if and only if
// that transaction commits.
//
// Subscribe starts a member of a consumer group (ordered, at-least-once
// delivery over fenced partition leases; ungrouped messages, with an empty
// partition key, through per-message claims); AcceptGroup and
// AcceptNextGroup hold one message group exclusively, like a Service Bus
// session receiver; StartTransactionProducer sends
// RocketMQ-style transactional messages with check-back; Admin is the
// operator's API (listings, messages by identity, offset reset, retention).
// docs/ in the repository explains the mechanisms and their state machines.
package shardq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/coalesce"
	"github.com/shardq/shardq/internal/ident"
	"github.com/shardq/shardq/internal/receiptkey"
	"github.com/shardq/shardq/internal/telemetry"
	"github.com/shardq/shardq/internal/wakeup"
)

// Config tunes a Client. The zero value (or nil) gives the defaults.
type Config struct {
	// MaxPayloadBytes bounds one message's payload. Default 1 MiB.
	MaxPayloadBytes int

	// PublishMaxBatch bounds the messages that concurrent Publish calls
	// share in one transaction. A single call with more messages is still
	// one transaction of its own. Default 500.
	PublishMaxBatch int

	// PublishMaxInflight bounds the publish transactions running at once
	// per tenant; calls arriving meanwhile queue and share the next one.
	// Default 2.
	PublishMaxInflight int

	// PublishLinger is how long a publish transaction waits for more
	// concurrent calls to join it before it starts (unless PublishMaxBatch
	// messages are already waiting). Default 0: under load, calls that
	// arrive while a transaction runs share the next one anyway, and a lone
	// caller waits for nothing but its own commit.
	PublishLinger time.Duration

	// PublishTimeout bounds one shared publish transaction, which runs
	// detached from any single caller's context. Default 30 s.
	PublishTimeout time.Duration

	// MaxDelay bounds how far ahead Message.NotBefore (or Delay) may be.
	// Default 24 h: a delayed message is stored like any other, so a delay
	// must stay well under the retention that would delete it
	// (MaxRetention, 7 days by default) and under what an ordered
	// partition may reasonably wait behind. (SQS caps its delay at 15
	// minutes for the same kind of reason: the queue is not a scheduler.)
	MaxDelay time.Duration

	// PublishRetries is how many times a publish transaction that failed
	// with a retryable error (a deadlock, a busy SQLite file) is run again.
	// Default 5.
	PublishRetries int

	// Tenants, when set, are the only tenants this client publishes to:
	// Publish, PublishTx and transactional sends to any other tenant fail
	// with a ValidationError before any SQL runs. When nil, the
	// comma-separated MQ_TENANTS environment variable is read once at
	// NewClient; when that is unset too, any tenant is accepted. On
	// Vitess, this keeps a process on the shards it was deployed for.
	Tenants []string

	// ChangeFeed chooses how this client's consumers hear of messages
	// published by other processes: FeedAuto (the default) runs the
	// database's change feed when its driver has one (docs/feed.md), and
	// FeedOff polls only.
	ChangeFeed FeedMode

	// Clock stamps CreatedAt on messages without one. Default time.Now.
	Clock func() time.Time

	// Logger receives what the client does not return to a caller.
	// Default slog.Default().
	Logger *slog.Logger

	// TracerProvider and MeterProvider receive the client's spans and
	// metrics (docs/observability.md). Default: the OpenTelemetry
	// globals, which record nothing until the application installs an
	// SDK. shardq imports only the OpenTelemetry API.
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
}

func (c Config) withDefaults() Config {
	if c.MaxPayloadBytes <= 0 {
		c.MaxPayloadBytes = DefaultMaxPayloadBytes
	}
	if c.PublishMaxBatch <= 0 {
		c.PublishMaxBatch = DefaultPublishMaxBatch
	}
	if c.PublishMaxInflight <= 0 {
		c.PublishMaxInflight = DefaultPublishMaxInflight
	}
	if c.PublishTimeout <= 0 {
		c.PublishTimeout = DefaultPublishTimeout
	}
	if c.MaxDelay <= 0 {
		c.MaxDelay = DefaultMaxDelay
	}
	if c.PublishRetries <= 0 {
		c.PublishRetries = DefaultPublishRetries
	}
	if c.Clock == nil {
		c.Clock = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Client publishes to one database. It is safe for concurrent use. It
// owns what it starts: Close stops every subscriber, group receiver,
// transaction producer and cleaner still running.
type Client struct {
	// running holds the handles started through this client and not yet
	// stopped, by kind; closed refuses new ones.
	mu      sync.Mutex
	closed  bool
	running map[stopper]struct{}

	drv     driver.Driver
	cfg     Config
	tel     *telemetry.T
	batcher *coalesce.Batcher[string, *driver.InsertMessage]
	// local tells this client's consumers of heads that moved: its own
	// publishes, and the change feed.
	local wakeup.Registry
	// served is the served tenant list as a set; nil when any tenant goes.
	served     map[string]bool
	servedList string
	// registered remembers the (tenant, topic, group) registry rows this
	// client made or found (registerGroup), so that accepting message
	// groups in a loop does not read the registry every time.
	registered sync.Map
}

// registerGroup registers group in the tenants' topic (driver.RegisterGroup)
// where this client has not done so yet.
func (c *Client) registerGroup(ctx context.Context, tenants []string, topic, group string, start StartPosition, now time.Time) error {
	var todo []string
	for _, t := range tenants {
		if _, ok := c.registered.Load([3]string{t, topic, group}); !ok {
			todo = append(todo, t)
		}
	}
	if len(todo) == 0 {
		return nil
	}
	if err := c.drv.RegisterGroup(ctx, todo, topic, group, start == StartLatest, now); err != nil {
		return err
	}
	for _, t := range todo {
		c.registered.Store([3]string{t, topic, group}, true)
	}
	return nil
}

// NewClient returns a client over drv. Closing the client does not close
// the driver.
func NewClient(drv driver.Driver, cfg *Config) (*Client, error) {
	if drv == nil {
		return nil, errors.New("shardq: driver must not be nil")
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	cl := &Client{drv: drv, cfg: c.withDefaults()}
	cl.tel = telemetry.New(cl.cfg.TracerProvider, cl.cfg.MeterProvider)
	if l, ok := drv.(driver.Logged); ok {
		l.UseLogger(cl.cfg.Logger)
	}
	if err := cl.serveTenants(); err != nil {
		return nil, fmt.Errorf("shardq: new client: %w", err)
	}
	switch feed, ok := drv.(driver.HeadFeed); {
	case cl.cfg.ChangeFeed != FeedAuto && cl.cfg.ChangeFeed != FeedOff:
		return nil, fmt.Errorf("shardq: new client: %w", &ident.Error{Field: "change feed", Rule: fmt.Sprintf("%d is not FeedAuto or FeedOff", cl.cfg.ChangeFeed)})
	case ok && cl.cfg.ChangeFeed == FeedAuto:
		cl.local.UseFeed(feed, cl.cfg.Logger.With("driver", drv.Name()))
	}
	cl.batcher = coalesce.New[string](cl.writeBatch, cl.cfg.PublishMaxBatch, cl.cfg.PublishMaxInflight, cl.cfg.PublishLinger, cl.cfg.PublishTimeout)
	return cl, nil
}

// FeedMode chooses whether a client runs the database's change feed.
type FeedMode int

const (
	FeedAuto FeedMode = iota // run the driver's change feed when it has one
	FeedOff                  // poll only
)

// FeedUp reports whether the client's change feed streams now: its
// consumers then poll only every FeedPollInterval, as a safety net.
func (c *Client) FeedUp() bool { return c.local.Up() }

// serveTenants settles the served tenant list: Config.Tenants, else
// MQ_TENANTS when set, else none (any tenant).
func (c *Client) serveTenants() error {
	ts := c.cfg.Tenants
	if ts == nil {
		env, set, err := EnvTenants()
		if err != nil || !set {
			return err // unset: any tenant
		}
		ts = env
	} else if err := ident.Tenants("tenants", ts); err != nil {
		return err
	}
	c.served = make(map[string]bool, len(ts))
	for _, t := range ts {
		c.served[t] = true
	}
	c.servedList = strings.Join(ts, ", ")
	return nil
}

// checkServed rejects a tenant outside the served list.
func (c *Client) checkServed(tenant string) error {
	if c.served != nil && !c.served[tenant] {
		return &ident.Error{Field: "tenant", Rule: fmt.Sprintf("%q is not served by this client (served: %s; Config.Tenants or MQ_TENANTS)", tenant, c.servedList)}
	}
	return nil
}

// Migrate applies the schema migrations that are not applied yet.
func (c *Client) Migrate(ctx context.Context) error {
	applied, err := c.drv.Migrate(ctx)
	if err != nil {
		return fmt.Errorf("shardq: %w", err)
	}
	if len(applied) > 0 {
		c.cfg.Logger.Info("shardq: migrations applied", "driver", c.drv.Name(), "versions", applied)
	}
	// The key that signs receipts (shardq serve); a server that finds none
	// creates it too.
	if _, err := receiptkey.Ensure(ctx, c.drv, time.Now()); err != nil {
		return fmt.Errorf("shardq: create the receipt key: %w", err)
	}
	return nil
}

// DefaultCloseTimeout bounds how long Close lets in-flight handlers and
// checks finish before it cancels them.
const DefaultCloseTimeout = 30 * time.Second

// stopper is a handle the client started: a *Subscriber, *GroupReceiver,
// *TransactionProducer or *Cleaner.
type stopper interface {
	stopOrder() int
	stopForClose(ctx context.Context) error
}

// track registers h, unless the client is closed.
func (c *Client) track(h stopper) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	if c.running == nil {
		c.running = map[stopper]struct{}{}
	}
	c.running[h] = struct{}{}
	return nil
}

func (c *Client) untrack(h stopper) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.running, h)
}

// Close stops, in this order, and waits for: the subscribers and group
// receivers still running (no more deliveries; in-flight handlers get up
// to DefaultCloseTimeout; cursors are committed and leases released),
// then the transaction producers (check-back), then the cleaners; last,
// it lets queued publishes finish and refuses new calls (ErrClosed),
// including new subscribers, receivers, producers and cleaners. The
// driver stays open: close it after the client.
func (c *Client) Close() error {
	c.mu.Lock()
	c.closed = true
	var hs []stopper
	for h := range c.running {
		hs = append(hs, h)
	}
	c.mu.Unlock()
	slices.SortStableFunc(hs, func(a, b stopper) int { return a.stopOrder() - b.stopOrder() })
	ctx, cancel := context.WithTimeout(context.Background(), DefaultCloseTimeout)
	defer cancel()
	var errs []error
	for order := 0; len(hs) > 0; order++ {
		// Handles of one kind stop together.
		n := 0
		for n < len(hs) && hs[n].stopOrder() == order {
			n++
		}
		var wg sync.WaitGroup
		errc := make(chan error, n)
		for _, h := range hs[:n] {
			wg.Go(func() { errc <- h.stopForClose(ctx) })
		}
		wg.Wait()
		close(errc)
		for err := range errc {
			if err != nil {
				errs = append(errs, err)
			}
		}
		hs = hs[n:]
	}
	c.local.Close()
	c.batcher.Close()
	return errors.Join(errs...)
}
