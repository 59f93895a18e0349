// SPDX-License-Identifier: Apache-2.0

package tenants

// The errors and constants here are shardq's own: the root package
// re-exports them under the same names (quotas.go, tenants.go), so their
// docs speak of its API (Admin, TopicUsage). Its aliases' docs list the
// errors' fields, which go doc does not show through an alias: keep them
// in step.

import (
	"errors"
	"fmt"
	"time"
)

// ErrQuotaExceeded refuses a publish that would take its tenant over one
// of its quotas (Admin.SetTenantLimits); the error is a
// *QuotaExceededError, and nothing of the call is stored.
var ErrQuotaExceeded = errors.New("tenant quota exceeded")

// The quotas a QuotaExceededError names.
const (
	QuotaPublishRate     = "publish_rate"      // messages per second
	QuotaPublishByteRate = "publish_byte_rate" // message bytes per second (driver.MessageBytes)
	QuotaMaxMessages     = "max_messages"      // messages stored
	QuotaMaxBytes        = "max_bytes"         // bytes stored (TopicUsage.Bytes)
	QuotaMaxPartitions   = "max_partitions"    // partitions with a message
)

// QuotaExceededError names the tenant, the quota and its limit. For a rate,
// RetryAfter is when the call would fit (zero: never, the call alone is
// over a second's worth); for what is stored, Usage is what was last
// measured and the call fits only once the tenant stores less.
type QuotaExceededError struct {
	Tenant     string
	Quota      string // one of the Quota constants
	Limit      int64
	Usage      int64 // stored (as last measured) or, for a rate, the call's own
	Call       int64 // what the call adds
	RetryAfter time.Duration
}

func (e *QuotaExceededError) Error() string {
	switch {
	case e.Quota == QuotaPublishRate || e.Quota == QuotaPublishByteRate:
		if e.RetryAfter == 0 {
			return fmt.Sprintf("tenant %q: %s quota is %d per second; a call of %d is more than a second's worth", e.Tenant, e.Quota, e.Limit, e.Call)
		}
		return fmt.Sprintf("tenant %q: %s quota of %d per second exceeded; retry after %v", e.Tenant, e.Quota, e.Limit, e.RetryAfter)
	default:
		return fmt.Sprintf("tenant %q: %s quota of %d exceeded: %d stored, the call adds %d", e.Tenant, e.Quota, e.Limit, e.Usage, e.Call)
	}
}

// Is makes errors.Is(err, ErrQuotaExceeded) match.
func (e *QuotaExceededError) Is(target error) bool { return target == ErrQuotaExceeded }

// ErrTenantSuspended refuses a publish, receive or accept in a suspended
// tenant, and a consumer's write that keeps or adds something (a group's
// state, a deferral, a longer visibility) (Admin.SuspendTenant); the
// error is a *TenantSuspendedError.
var ErrTenantSuspended = errors.New("tenant is suspended")

// TenantSuspendedError names the suspended tenant and since when.
type TenantSuspendedError struct {
	Tenant string
	Since  time.Time
}

func (e *TenantSuspendedError) Error() string {
	return fmt.Sprintf("tenant %q is suspended since %s; an operator resumes it (shardq admin tenant resume)",
		e.Tenant, e.Since.UTC().Format(time.RFC3339))
}

// Is makes errors.Is(err, ErrTenantSuspended) match.
func (e *TenantSuspendedError) Is(target error) bool { return target == ErrTenantSuspended }
