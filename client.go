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
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/dbtime"
	"github.com/shardq/shardq/internal/groupreg"
	"github.com/shardq/shardq/internal/ident"
	"github.com/shardq/shardq/internal/large"
	"github.com/shardq/shardq/internal/lifecycle"
	"github.com/shardq/shardq/internal/publish"
	"github.com/shardq/shardq/internal/schema"
	"github.com/shardq/shardq/internal/settings"
	"github.com/shardq/shardq/internal/telemetry"
	"github.com/shardq/shardq/internal/tenants"
	"github.com/shardq/shardq/internal/wakeup"
)

// Config tunes a Client. The zero value (or nil) gives the defaults.
type Config struct {
	// MaxPayloadBytes bounds one message's payload. Default 1 MiB.
	MaxPayloadBytes int

	// LargeWriteTimeout is how long a large message's write (PublishLarge)
	// may make no progress, as this client's readers see it, before a
	// reader waiting for it gives it up: it stores an aborted end marker,
	// passes over the chunks, and the writer, if it was only slow, fails
	// with ErrLargeAbandoned (docs/large.md). Default 5 minutes.
	LargeWriteTimeout time.Duration

	// PublishMaxBatch bounds the messages that concurrent Publish calls
	// (and transactional sends' commits) share in one transaction. A
	// single call with more messages is still one transaction of its own.
	// Default 500.
	PublishMaxBatch int

	// PublishMaxInflight bounds the publish transactions running at once
	// per tenant, and apart from them the transactional sends' commits;
	// calls arriving meanwhile queue and share the next one. Default 2.
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
	// comma-separated SHARDQ_TENANTS environment variable is read once at
	// NewClient (EnvTenants); when that is unset too, any tenant is
	// accepted. On
	// Vitess, this keeps a process on the shards it was deployed for.
	Tenants []string

	// TenantSettingsTTL is how long this client trusts what it read of a
	// tenant's settings (its suspension): a publish, receive or accept in
	// a tenant reads its row at most once per TTL, so a suspension made
	// elsewhere reaches this client within it. Default 1 s.
	TenantSettingsTTL time.Duration

	// TenantUsageInterval is how old the measure of what a tenant stores
	// may be when a write is checked against the tenant's storage quotas
	// (Admin.SetTenantLimits): older, it is measured again in the
	// background, a count of the tenant's messages and bytes. This
	// client's own writes are held until a measure holds them; other
	// clients' writes of this time are what a tenant may go over such a
	// quota by (docs/tenants.md). Default 30 s.
	TenantUsageInterval time.Duration

	// ChangeFeed chooses how this client's consumers hear of messages
	// published by other processes: FeedAuto (the default) runs the
	// database's change feed when its driver has one (docs/feed.md), and
	// FeedOff polls only.
	ChangeFeed FeedMode

	// Clock is this process's clock. Default time.Now. Its elapsed time
	// is trusted between reads of the database's clock (ClockSync): one
	// that jumps ahead of the time that passes by more than a LeaseTTL
	// can take a lease that has not expired (docs/chaos.md, "Left out").
	Clock func() time.Time

	// ClockSync is how often the client reads the database's clock
	// (driver.Clock). Its members keep to that clock, advanced between
	// reads by Clock's elapsed time, so that members on hosts whose
	// clocks disagree still agree on when a lease, heartbeat or claim
	// expires (docs/leases.md, "Clocks"). The first read is made before
	// the client's first publish, receive, settlement of a receipt or
	// member start. Default DefaultClockSync when Clock is unset;
	// when Clock is set, Clock is taken as it is unless ClockSync is
	// positive. Negative: never read.
	ClockSync time.Duration

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
	settings.Positive(&c.MaxPayloadBytes, DefaultMaxPayloadBytes)
	settings.Positive(&c.LargeWriteTimeout, DefaultLargeWriteTimeout)
	settings.Positive(&c.PublishMaxBatch, DefaultPublishMaxBatch)
	settings.Positive(&c.PublishMaxInflight, DefaultPublishMaxInflight)
	settings.Positive(&c.PublishTimeout, DefaultPublishTimeout)
	settings.Positive(&c.MaxDelay, DefaultMaxDelay)
	settings.Positive(&c.PublishRetries, DefaultPublishRetries)
	settings.Positive(&c.TenantSettingsTTL, DefaultTenantSettingsTTL)
	settings.Positive(&c.TenantUsageInterval, DefaultTenantUsageInterval)
	if c.Clock == nil {
		c.Clock = time.Now
	}
	c.Logger = cmp.Or(c.Logger, slog.Default())
	return c
}

// Client publishes to one database. It is safe for concurrent use. It
// owns what it starts: Close stops every subscriber, group receiver,
// transaction producer and cleaner still running.
type Client struct {
	// handles are the subscribers, receivers, producers and cleaners
	// started through this client and not yet stopped.
	handles lifecycle.Handles

	drv driver.Driver
	cfg Config
	tel *telemetry.T
	pub *publish.Publisher // the publish pipeline (internal/publish)
	// local tells this client's consumers of heads that moved: its own
	// publishes, and the change feed.
	local wakeup.Registry
	// registered remembers the registry rows this client made or found
	// (registerGroup), keyed by groupreg.Key, so that accepting message
	// groups in a loop does not read the registry every time.
	registered sync.Map
	// tenants caches the tenants' settings rows (internal/tenants).
	tenants *tenants.States
	// stalls is since when this client's readers have seen each stalled
	// large message's write make no progress (large.Stalls).
	stalls large.Stalls
	// clock is the database's clock that cfg.Clock reads; nil when the
	// client keeps to Clock as it is.
	clock *dbtime.Clock
	// bounds reports the driver's lock bounds, when it knows them
	// (warnFrozenHold); drv wraps the driver and hides them.
	bounds driver.LockBounded
	// frozenWarned holds the lease timings warnFrozenHold has warned of,
	// so that a receiver accepted in a loop warns once.
	frozenWarned sync.Map
}

// syncClock reads the database's clock unless it has been read: members
// call it before they take a lease or claim.
func (c *Client) syncClock(ctx context.Context) error {
	if c.clock == nil {
		return nil
	}
	return c.clock.Ensure(ctx)
}

// registerGroup registers group in the tenants' topic (driver.RegisterGroup)
// where this client has not done so yet.
func (c *Client) registerGroup(ctx context.Context, tenants []string, topic, group string, start StartPosition, now time.Time) error {
	if err := c.syncClock(ctx); err != nil {
		return err
	}
	return groupreg.Register(ctx, c.drv, &c.registered, tenants, topic, group, start == StartLatest, now)
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
	cl.bounds, _ = drv.(driver.LockBounded)
	if dc, ok := drv.(driver.Clock); ok && (c.ClockSync > 0 || c.ClockSync == 0 && c.Clock == nil) {
		cl.clock = dbtime.New(cl.cfg.Clock, dc.DatabaseTime, cmp.Or(c.ClockSync, DefaultClockSync), cl.cfg.Logger)
		cl.cfg.Clock = cl.clock.Now
	}
	cl.tel = telemetry.New(cl.cfg.TracerProvider, cl.cfg.MeterProvider)
	cl.tenants = tenants.New(drv, tenants.Options{TTL: cl.cfg.TenantSettingsTTL, UsageEvery: cl.cfg.TenantUsageInterval,
		Clock: cl.cfg.Clock, Tel: cl.tel, Log: cl.cfg.Logger})
	// Consumers' state and deferral writes pass their tenants' checks.
	cl.drv = tenants.Writes(drv, cl.tenants)
	cl.tel.SetQuotas(cl.tenants.QuotaUses)
	if l, ok := drv.(driver.Logged); ok {
		l.UseLogger(cl.cfg.Logger)
	}
	var err error
	cl.pub, err = publish.New(drv, cl.tel, &cl.local, publish.Config{MaxPayloadBytes: cl.cfg.MaxPayloadBytes,
		MaxDelay: cl.cfg.MaxDelay, Retries: cl.cfg.PublishRetries, MaxBatch: cl.cfg.PublishMaxBatch,
		MaxInflight: cl.cfg.PublishMaxInflight, Linger: cl.cfg.PublishLinger, Timeout: cl.cfg.PublishTimeout,
		Tenants: cl.cfg.Tenants, ReservedPrefix: large.HeaderPrefix, Clock: cl.cfg.Clock, Logger: cl.cfg.Logger,
		MessageError: func(i int, err error) error { return &MessageError{Index: i, Err: err} },
		Admit:        cl.tenants.Admit})
	if err != nil {
		return nil, fmt.Errorf("shardq: new client: %w", err)
	}
	switch feed, ok := drv.(driver.HeadFeed); {
	case cl.cfg.ChangeFeed != FeedAuto && cl.cfg.ChangeFeed != FeedOff:
		return nil, fmt.Errorf("shardq: new client: %w", &ident.Error{Field: "change feed", Rule: fmt.Sprintf("%d is not FeedAuto or FeedOff", cl.cfg.ChangeFeed)})
	case ok && cl.cfg.ChangeFeed == FeedAuto:
		cl.local.UseFeed(feed, cl.cfg.Logger.With("driver", drv.Name()))
	}
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

// Migrate applies the schema migrations that are not applied yet.
func (c *Client) Migrate(ctx context.Context) error { return schema.Migrate(ctx, c.drv, c.cfg.Logger) }

// DefaultCloseTimeout bounds how long Close lets in-flight handlers and
// checks finish before it cancels them.
const DefaultCloseTimeout = 30 * time.Second

// stopper is a handle the client started: a *Subscriber, *GroupReceiver,
// *Producer, *TransactionProducer or *Cleaner. Close stops lower orders first.
type stopper interface {
	stopOrder() int
	stopForClose(ctx context.Context) error
}

// track registers h, unless the client is closed.
func (c *Client) track(h stopper) error { return c.handles.Add(h, h.stopOrder(), h.stopForClose) }

func (c *Client) untrack(h stopper) { c.handles.Remove(h) }

// Close stops, in this order, and waits for: the subscribers and group
// receivers still running (no more deliveries; in-flight handlers get up
// to DefaultCloseTimeout; cursors are committed and leases released),
// then the producers (Producer: what was handed in is written, within
// DefaultCloseTimeout) and the transaction producers (check-back), then
// the cleaners; last,
// it lets queued publishes finish and refuses new calls (ErrClosed),
// including new subscribers, receivers, producers and cleaners. The
// driver stays open: close it after the client.
func (c *Client) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), DefaultCloseTimeout)
	defer cancel()
	err := c.handles.Close(ctx)
	if c.clock != nil {
		err = errors.Join(err, c.clock.Stop(ctx))
	}
	c.local.Close()
	c.pub.Close()
	c.tenants.Close()
	c.tel.SetQuotas(nil)
	return err
}
