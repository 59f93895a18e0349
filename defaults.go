// SPDX-License-Identifier: Apache-2.0

package shardq

import (
	"cmp"
	"log/slog"
	"time"

	"github.com/shardq/shardq/internal/ident"
	"github.com/shardq/shardq/internal/settings"
	"github.com/shardq/shardq/internal/settle"
)

// Defaults: what a zero field of Config, SubscriberConfig,
// ReceiverOptions, TransactionProducerConfig or RetentionConfig means.
const (
	DefaultMaxPayloadBytes    = 1 << 20
	DefaultLargeWriteTimeout  = 5 * time.Minute
	DefaultPublishMaxBatch    = 500
	DefaultPublishMaxInflight = 2
	DefaultPublishTimeout     = 30 * time.Second
	DefaultPublishRetries     = 5
	DefaultTenantSettingsTTL  = time.Second
	DefaultClockSync          = 10 * time.Second

	DefaultLeaseTTL          = 30 * time.Second
	DefaultHeartbeatInterval = 3 * time.Second
	DefaultDiscoveryInterval = time.Second
	// DefaultDiscoveryWindow is twice DefaultPublishTimeout, which bounds
	// a Publish transaction.
	DefaultDiscoveryWindow       = 2 * DefaultPublishTimeout
	DefaultFullDiscoveryInterval = 5 * time.Minute
	DefaultPollInterval          = 200 * time.Millisecond
	// DefaultFeedPollInterval is the safety-net poll while the change
	// feed streams: ten times PollInterval.
	DefaultFeedPollInterval     = 2 * time.Second
	DefaultIdleRelease          = 30 * time.Second
	DefaultCommitInterval       = time.Second
	DefaultBatchSize            = 100
	DefaultMaxPartitions        = 64
	DefaultUngroupedConcurrency = 16
	DefaultVisibilityTimeout    = 30 * time.Second
	// DefaultMaxVisibilityRenewal is Service Bus's default for
	// MaxAutoLockRenewalDuration.
	DefaultMaxVisibilityRenewal = 5 * time.Minute
	// DefaultHandlerTimeout bounds one handler call: as long as an
	// ungrouped message's claim may be renewed, so that a handler that
	// times out does so before its claim lapses to another member.
	DefaultHandlerTimeout = DefaultMaxVisibilityRenewal
	DefaultMaxAttempts    = 10
	DefaultMaxDelay       = 24 * time.Hour
	DefaultBackoffMin     = time.Second
	DefaultBackoffMax     = 5 * time.Minute
	DefaultDLQSuffix      = ".dlq"

	DefaultReceiverIdleTimeout = time.Minute

	DefaultTransactionTimeout = 6 * time.Second
	DefaultCheckInterval      = 30 * time.Second
	DefaultMaxChecks          = 15
	DefaultClaimTTL           = time.Minute
	DefaultProducerPoll       = time.Second

	DefaultMinRetention        = time.Hour
	DefaultMaxRetention        = 7 * 24 * time.Hour
	DefaultDeadLetterRetention = 14 * 24 * time.Hour
	DefaultRetentionBatch      = 1000
	DefaultPartitionIdle       = time.Hour
	DefaultCleanerInterval     = 5 * time.Minute
	// DefaultDedupWindow is RetentionConfig.DedupWindow's default, SQS
	// FIFO's de-duplication interval.
	DefaultDedupWindow = 5 * time.Minute
)

// NoHandlerTimeout as HandlerTimeout lets a handler run for as long as it
// takes.
const NoHandlerTimeout time.Duration = -1

// UnlimitedAttempts as MaxAttempts retries a failing message forever: it
// is never dead-lettered for its attempts (a DeadLetter result still
// moves it at once).
const UnlimitedAttempts = settle.Unlimited

// EnvTenants is SHARDQ_TENANTS, the process's comma-separated tenant list,
// read in this one place: set reports whether the variable is set at all
// (a Client serves any tenant when it is not; consumers need a list), and
// a set but invalid or empty list is an error naming it. MQ_TENANTS, its
// former name, is read while SHARDQ_TENANTS is unset, for one release,
// with a warning logged once (slog's default logger).
func EnvTenants() (tenants []string, set bool, err error) { return settings.EnvTenants() }

// ParseTenants reads a comma-separated tenant list as SHARDQ_TENANTS is read:
// entries trimmed of spaces and tabs, each a valid tenant, no repeats, not
// empty. field names the source in errors (the CLI passes its own).
func ParseTenants(field, list string) ([]string, error) {
	return ident.TenantList(field, list)
}

// consumerTenants is tenants when given, else SHARDQ_TENANTS, which must then
// be set and valid: a consumer without a tenant list does not start.
func consumerTenants(field string, tenants []string) ([]string, error) {
	return settings.ConsumerTenants(field, tenants)
}

// maxAttempts settles a MaxAttempts setting: 0 is the default, and
// UnlimitedAttempts the only negative allowed.
func maxAttempts(v int) (int, error) {
	return settings.MaxAttempts(v, DefaultMaxAttempts, UnlimitedAttempts)
}

// checkLiveness checks the cross-field rules of a member's timing
// (settings.Liveness).
func checkLiveness(leaseTTL, heartbeat, staleAfter time.Duration) error {
	return settings.Liveness(leaseTTL, heartbeat, staleAfter)
}

// warnFrozenHold warns when a member's lease is too short for the bounds
// of the driver's sessions (settings.FrozenHold): allowed, since tests
// and some deployments want short leases, but a frozen member could then
// cost a healthy one a lease. retry is how soon the member tries a failed
// renewal again.
func (c *Client) warnFrozenHold(log *slog.Logger, leaseTTL, retry time.Duration) {
	if c.bounds == nil {
		return
	}
	idle, wait := c.bounds.LockBounds()
	if err := settings.FrozenHold(leaseTTL, retry, idle, wait); err != nil {
		if _, warned := c.frozenWarned.LoadOrStore([2]time.Duration{leaseTTL, retry}, true); !warned {
			log.Warn("shardq: lease shorter than the database's lock bounds allow", "err", err)
		}
	}
}

// dlqTopic checks that topic's dead-letter topic is a valid topic name.
func dlqTopic(topic, suffix string) error { return settings.DLQTopic(topic, suffix) }

// defaultName names a member for people (settings.Name): host-pid.
func defaultName(kind string) string { return settings.Name(kind) }

// settleDefaults fills the settings that subscribers and receivers share:
// attempts before dead-lettering, the dead-letter suffix, clock, logger
// and name.
func (c *Client) settleDefaults(attempts *int, dlqSuffix *string, clock *func() time.Time, logger **slog.Logger, name *string, kind string) error {
	n, err := maxAttempts(*attempts)
	if err != nil {
		return err
	}
	*attempts = n
	*dlqSuffix = cmp.Or(*dlqSuffix, DefaultDLQSuffix)
	if *clock == nil {
		*clock = c.cfg.Clock
	}
	*logger = cmp.Or(*logger, c.cfg.Logger)
	if *name == "" {
		*name = defaultName(kind)
	}
	return nil
}
