// SPDX-License-Identifier: Apache-2.0

package settings

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardq/shardq/internal/ident"
)

// SHARDQ_TENANTS is the served tenant list; MQ_TENANTS, its former name,
// is read only while it is unset, with a warning, and loses to it when
// both are set (the warning then says so). Errors name the variable read.
func TestLookupTenants(t *testing.T) {
	for _, c := range []struct {
		env                   map[string]string
		want                  []string
		name, warning, errStr string
	}{
		{env: nil},
		{env: map[string]string{"SHARDQ_TENANTS": "a, b"}, want: []string{"a", "b"}, name: "SHARDQ_TENANTS"},
		{env: map[string]string{"MQ_TENANTS": "a"}, want: []string{"a"}, name: "MQ_TENANTS",
			warning: "MQ_TENANTS is deprecated: rename it SHARDQ_TENANTS"},
		{env: map[string]string{"SHARDQ_TENANTS": "a", "MQ_TENANTS": "a"}, want: []string{"a"}, name: "SHARDQ_TENANTS",
			warning: "MQ_TENANTS is deprecated and ignored: SHARDQ_TENANTS is set too; remove MQ_TENANTS"},
		{env: map[string]string{"SHARDQ_TENANTS": "a", "MQ_TENANTS": "b,c"}, want: []string{"a"}, name: "SHARDQ_TENANTS",
			warning: `differs from it (SHARDQ_TENANTS wins: "a", not "b,c")`},
		{env: map[string]string{"SHARDQ_TENANTS": ""}, name: "SHARDQ_TENANTS", errStr: "SHARDQ_TENANTS: empty tenant list"},
		{env: map[string]string{"MQ_TENANTS": "a,,b"}, name: "MQ_TENANTS", warning: "MQ_TENANTS is deprecated", errStr: "MQ_TENANTS: entry 2: tenant: must not be empty"},
		// SHARDQ_TENANTS wins even when it is the one that is wrong.
		{env: map[string]string{"SHARDQ_TENANTS": "a,a", "MQ_TENANTS": "a"}, name: "SHARDQ_TENANTS", warning: "differs",
			errStr: `SHARDQ_TENANTS: entry 2: tenant "a" appears twice`},
	} {
		lookup := func(k string) (string, bool) { v, ok := c.env[k]; return v, ok }
		ts, name, warning, err := LookupTenants(lookup)
		switch {
		case !slices.Equal(ts, c.want), name != c.name:
			t.Errorf("%v: tenants %q from %q; want %q from %q", c.env, ts, name, c.want, c.name)
		case (c.warning == "") != (warning == "") || !strings.Contains(warning, c.warning):
			t.Errorf("%v: warning %q; want one containing %q", c.env, warning, c.warning)
		case c.errStr == "" && err != nil, c.errStr != "" && (err == nil || err.Error() != c.errStr):
			t.Errorf("%v: error %v; want %q", c.env, err, c.errStr)
		}
	}
}

// EnvTenants reads the process's environment and logs the deprecation of
// MQ_TENANTS once, however many clients read it.
func TestEnvTenantsWarnsOnce(t *testing.T) {
	var logged bytes.Buffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&logged, nil)))
	t.Cleanup(func() { slog.SetDefault(prev) })
	legacyWarning = sync.Once{}
	t.Cleanup(func() { legacyWarning = sync.Once{} })

	t.Setenv("SHARDQ_TENANTS", "")
	os.Unsetenv("SHARDQ_TENANTS") // t.Setenv restores it
	t.Setenv("MQ_TENANTS", "acme,globex")
	for range 3 {
		ts, set, err := EnvTenants()
		if err != nil || !set || !slices.Equal(ts, []string{"acme", "globex"}) {
			t.Fatalf("EnvTenants with MQ_TENANTS only: %q, %v, %v", ts, set, err)
		}
	}
	if n := strings.Count(logged.String(), "MQ_TENANTS is deprecated"); n != 1 || !strings.Contains(logged.String(), "level=WARN") {
		t.Fatalf("logged %d deprecation warnings; want one at WARN:\n%s", n, logged.String())
	}
	t.Setenv("SHARDQ_TENANTS", "acme")
	if ts, set, err := EnvTenants(); err != nil || !set || !slices.Equal(ts, []string{"acme"}) {
		t.Fatalf("EnvTenants with both set: %q, %v, %v; want SHARDQ_TENANTS's", ts, set, err)
	}
	os.Unsetenv("MQ_TENANTS")
	os.Unsetenv("SHARDQ_TENANTS")
	if ts, set, err := EnvTenants(); err != nil || set || ts != nil {
		t.Fatalf("EnvTenants with neither set: %q, %v, %v", ts, set, err)
	}
	if _, err := ConsumerTenants("tenants", nil); err == nil || err.Error() != "SHARDQ_TENANTS: empty tenant list (set tenants or SHARDQ_TENANTS)" {
		t.Fatalf("ConsumerTenants without a list: %v", err)
	}
}

// The defaults (30 s leases, 3 s heartbeats) outlast MariaDB's bounds as
// mysqldriver sets them (10 s idle, 5 s lock wait); a lease whose
// two thirds do not cover the hold is named, and unknown bounds pass.
func TestFrozenHold(t *testing.T) {
	for _, c := range []struct {
		ttl, retry, idle, wait time.Duration
		ok                     bool
	}{
		{30 * time.Second, 3 * time.Second, 10 * time.Second, 5 * time.Second, true},
		{28 * time.Second, 3 * time.Second, 10 * time.Second, 5 * time.Second, false},
		{6 * time.Second, 500 * time.Millisecond, time.Second, time.Second, true},
		{5 * time.Second, 500 * time.Millisecond, time.Second, time.Second, false},
		{time.Second, 300 * time.Millisecond, 0, 0, true},
		{time.Hour, time.Second, -1, 5 * time.Second, false},
	} {
		err := FrozenHold(c.ttl, c.retry, c.idle, c.wait)
		var ie *ident.Error
		if (err == nil) != c.ok || (err != nil && (!errors.As(err, &ie) || ie.Field != "LeaseTTL")) {
			t.Errorf("FrozenHold(%s, retry %s, idle %s, wait %s) = %v; want ok %v, else a LeaseTTL error", c.ttl, c.retry, c.idle, c.wait, err, c.ok)
		}
	}
}
