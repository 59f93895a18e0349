// SPDX-License-Identifier: Apache-2.0

// Package settings fills and checks the root package's configurations:
// the rules that several of them share (member names, attempts, liveness
// timing, dead-letter topics, tenant lists). The defaults themselves are
// the root package's exported constants, which its callers pass in.
package settings

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/shardq/shardq/internal/ident"
)

// Positive sets *v to def unless *v is above zero: a zero (or negative)
// duration or count takes the default.
func Positive[T int | time.Duration](v *T, def T) {
	if *v <= 0 {
		*v = def
	}
}

// HandlerTimeout settles a handler timeout: 0 is def, none (a negative
// sentinel) means no limit, and any other negative value is refused.
func HandlerTimeout(v *time.Duration, def, none time.Duration) error {
	switch {
	case *v == 0:
		*v = def
	case *v < 0 && *v != none:
		return &ident.Error{Field: "handler timeout", Rule: fmt.Sprintf("%s is negative; NoHandlerTimeout (-1ns) means no limit", *v)}
	}
	return nil
}

// MaxAttempts settles a MaxAttempts setting: 0 is def, and unlimited the
// only negative allowed.
func MaxAttempts(v, def, unlimited int) (int, error) {
	switch {
	case v == 0:
		return def, nil
	case v < 0 && v != unlimited:
		return 0, &ident.Error{Field: "MaxAttempts", Rule: fmt.Sprintf("%d: want a positive count, 0 for the default (%d) or UnlimitedAttempts", v, def)}
	}
	return v, nil
}

// Liveness checks the cross-field rules of a member's timing: its
// heartbeats must renew its leases in time, and a peer must not call it
// dead between two of its heartbeats.
func Liveness(leaseTTL, heartbeat, staleAfter time.Duration) error {
	if heartbeat*3 > leaseTTL {
		return &ident.Error{Field: "LeaseTTL", Rule: fmt.Sprintf("%s is under 3 heartbeat intervals (%s): renewal (due after a third of the TTL, at heartbeats) could come too late", leaseTTL, heartbeat)}
	}
	if staleAfter < 2*heartbeat {
		return &ident.Error{Field: "StaleAfter", Rule: fmt.Sprintf("%s is under 2 heartbeat intervals (%s): a live member would be swept", staleAfter, heartbeat)}
	}
	return nil
}

// FrozenHold checks that a lease outlives the longest a frozen process
// can hold up its renewals: renewal is due when a third of leaseTTL has
// passed, and a transaction frozen with the lease row locked keeps it
// until the server ends the session (idle, after its last statement,
// which may itself have waited lockWait); a renewal that failed meanwhile
// is tried again retry later; 1 s covers the members' margin. Zero
// bounds (unknown, or no server) check nothing; a negative one is none.
func FrozenHold(leaseTTL, retry, idle, lockWait time.Duration) error {
	if idle < 0 || lockWait < 0 {
		return &ident.Error{Field: "LeaseTTL", Rule: "the session sets no idle-transaction bound (or no lock-wait bound): " +
			"a member frozen inside a transaction would hold its row locks, and a healthy member's lease, until it resumed"}
	}
	if idle == 0 || lockWait == 0 {
		return nil
	}
	if need := idle + lockWait + retry + time.Second; leaseTTL*2/3 < need {
		return &ident.Error{Field: "LeaseTTL", Rule: fmt.Sprintf("two thirds of %s are under %s (the session's idle-transaction bound %s, "+
			"its lock wait %s, a renewal's retry %s and 1 s): a member frozen inside a transaction could make a healthy member lose a lease",
			leaseTTL, need, idle, lockWait, retry)}
	}
	return nil
}

// DLQTopic checks that topic's dead-letter topic is a valid topic name.
func DLQTopic(topic, suffix string) error {
	if err := ident.Topic(topic + suffix); err != nil {
		var ie *ident.Error
		if errors.As(err, &ie) {
			return &ident.Error{Field: "dead-letter topic", Rule: fmt.Sprintf("%q + %q: %s", topic, suffix, ie.Rule)}
		}
		return err
	}
	return nil
}

// Name names a member for people: host-pid, or kind-pid where the host
// name is not a valid member name. Its identity (lease owner, heartbeat
// row) adds a random suffix: ident.MemberID.
func Name(kind string) string {
	host, _ := os.Hostname()
	name := fmt.Sprintf("%s-%d", host, os.Getpid())
	if ident.MemberName("name", name) != nil {
		name = fmt.Sprintf("%s-%d", kind, os.Getpid())
	}
	return name
}

// The process's served tenants, comma-separated, are TenantsVar.
// LegacyTenantsVar is its former name, read for one release while
// TenantsVar is unset.
const (
	TenantsVar       = "SHARDQ_TENANTS"
	LegacyTenantsVar = "MQ_TENANTS"
)

// LookupTenants reads the served tenant list through lookup (os.LookupEnv,
// or a command's own environment): TenantsVar, else LegacyTenantsVar. name
// is the variable read ("" when neither is set), and a set but invalid or
// empty list is an error naming it. warning, when not empty, says that
// LegacyTenantsVar is set and deprecated, and whether TenantsVar, set too,
// overrides a different value.
func LookupTenants(lookup func(string) (string, bool)) (tenants []string, name, warning string, err error) {
	v, set := lookup(TenantsVar)
	legacy, legacySet := lookup(LegacyTenantsVar)
	switch {
	case set && legacySet && legacy != v:
		name, warning = TenantsVar, fmt.Sprintf("%s is deprecated and ignored: %s is set too, and differs from it (%s wins: %q, not %q)",
			LegacyTenantsVar, TenantsVar, TenantsVar, v, legacy)
	case set && legacySet:
		name, warning = TenantsVar, fmt.Sprintf("%s is deprecated and ignored: %s is set too; remove %s", LegacyTenantsVar, TenantsVar, LegacyTenantsVar)
	case set:
		name = TenantsVar
	case legacySet:
		name, v, warning = LegacyTenantsVar, legacy, fmt.Sprintf("%s is deprecated: rename it %s (%s is read only while %s is unset, for one more release)",
			LegacyTenantsVar, TenantsVar, LegacyTenantsVar, TenantsVar)
	default:
		return nil, "", "", nil
	}
	tenants, err = ident.TenantList(name, v)
	return tenants, name, warning, err
}

// legacyWarning logs LookupTenants' warning once per process: every
// client, subscriber and cleaner reads the variables.
var legacyWarning sync.Once

// EnvTenants reads the process's served tenant list (LookupTenants):
// set reports whether either variable is set at all, and a set but
// invalid or empty list is an error naming the variable read. A
// deprecation warning is logged once (slog's default logger).
func EnvTenants() (tenants []string, set bool, err error) {
	ts, name, warning, err := LookupTenants(os.LookupEnv)
	if warning != "" {
		legacyWarning.Do(func() { slog.Warn("shardq: " + warning) })
	}
	return ts, name != "", err
}

// ConsumerTenants is tenants when given, else the served tenant list
// (EnvTenants), which must then be set and valid: a consumer without a
// tenant list does not start.
func ConsumerTenants(field string, tenants []string) ([]string, error) {
	if len(tenants) > 0 {
		return tenants, ident.Tenants(field, tenants)
	}
	ts, set, err := EnvTenants()
	if err == nil && !set {
		err = &ident.Error{Field: TenantsVar, Rule: "empty tenant list"}
	}
	if err != nil {
		return nil, fmt.Errorf("%w (set %s or %s)", err, field, TenantsVar)
	}
	return ts, nil
}
