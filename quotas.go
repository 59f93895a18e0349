// SPDX-License-Identifier: Apache-2.0

package shardq

import (
	"time"

	"github.com/shardq/shardq/internal/tenants"
)

// The tenants' quotas are enforced in internal/tenants; these are their
// public names.

// ErrQuotaExceeded refuses a publish that would take its tenant over one
// of its quotas (Admin.SetTenantLimits); the error is a
// *QuotaExceededError, and nothing of the call is stored.
var ErrQuotaExceeded = tenants.ErrQuotaExceeded

// The quotas a QuotaExceededError names.
const (
	QuotaPublishRate     = tenants.QuotaPublishRate     // "publish_rate": messages per second
	QuotaPublishByteRate = tenants.QuotaPublishByteRate // "publish_byte_rate": message bytes per second (driver.MessageBytes)
	QuotaMaxMessages     = tenants.QuotaMaxMessages     // "max_messages": messages stored
	QuotaMaxBytes        = tenants.QuotaMaxBytes        // "max_bytes": bytes stored (TopicUsage.Bytes)
	QuotaMaxPartitions   = tenants.QuotaMaxPartitions   // "max_partitions": partitions with a message
)

// QuotaExceededError names the tenant, the quota and its limit. For a rate,
// RetryAfter is when the call would fit (zero: never, the call alone is
// over a second's worth); for what is stored, Usage is what was last
// measured and the call fits only once the tenant stores less.
//
// Its fields (the type is defined in an internal package, so go doc shows
// only this alias):
//
//	Tenant     string
//	Quota      string // one of the Quota constants
//	Limit      int64
//	Usage      int64 // stored (as last measured) or, for a rate, the call's own
//	Call       int64 // what the call adds
//	RetryAfter time.Duration
//
// A *QuotaExceededError is the error, and errors.Is(err, ErrQuotaExceeded)
// matches it.
type QuotaExceededError = tenants.QuotaExceededError

// DefaultTenantUsageInterval is Config.TenantUsageInterval's default.
const DefaultTenantUsageInterval = 30 * time.Second
