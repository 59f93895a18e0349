// SPDX-License-Identifier: Apache-2.0

package server

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/shardq/shardq/internal/testdb"
)

// The access log has one INFO line per request with its method, route
// template (not the path), status, duration, tenant and token id, and
// never the token; the probes stay out of it.
func TestAccessLog(t *testing.T) {
	drv := testdb.Migrated(t, testdb.SQLite(t))
	h := newHarness(t, drv, harnessOptions{})
	lines := &testdb.LogLines{}
	h.srv.log = slog.New(lines)
	tok, id := h.token(RolePublish, 0, "acme")
	h.must(200, "POST", "/v1/tenants/acme/topics/orders/messages", tok, map[string]any{"key": "k", "payload": "x"})
	h.must(401, "POST", "/v1/tenants/acme/topics/orders/messages", "", map[string]any{"key": "k", "payload": "x"})
	h.must(200, "GET", "/healthz", "", nil)
	var got []string
	for _, l := range lines.All() {
		if strings.HasPrefix(l, "shardq serve: request") {
			got = append(got, l)
		}
	}
	if len(got) != 2 {
		t.Fatalf("access lines %q; want the two API requests, not the probe", got)
	}
	for i, want := range []string{"status=200", "status=401"} {
		l := got[i]
		if !strings.Contains(l, "method=POST") || !strings.Contains(l, "route=POST /v1/tenants/{tenant}/topics/{topic}/messages") ||
			!strings.Contains(l, want) || !strings.Contains(l, "tenant=acme") || !strings.Contains(l, "duration_ms=") {
			t.Errorf("access line %q", l)
		}
		if strings.Contains(l, tok) {
			t.Errorf("access line %q holds the token", l)
		}
	}
	if !strings.Contains(got[0], "token_id="+id) || !strings.HasSuffix(got[1], "token_id=") {
		t.Errorf("token ids: %q", got)
	}
	// At the default level (warn) there is no access log.
	var buf bytes.Buffer
	h.srv.log = slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}))
	h.must(200, "POST", "/v1/tenants/acme/topics/orders/messages", tok, map[string]any{"key": "k", "payload": "x"})
	if buf.Len() != 0 {
		t.Errorf("at warn: %q", buf.String())
	}
}
