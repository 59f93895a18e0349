// SPDX-License-Identifier: Apache-2.0

package otelcheck_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
)

func newTestClient(t *testing.T, d driver.Driver, cfg *shardq.Config) *shardq.Client {
	t.Helper()
	c, err := shardq.NewClient(d, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// waitFor polls cond until it holds or 30 s pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func faultSubscriberConfig(h shardq.Handler) shardq.SubscriberConfig {
	return shardq.SubscriberConfig{ConsumerGroup: "g", Topic: "x", Tenants: []string{"t"}, Handler: h,
		LeaseTTL: 5 * time.Second, HeartbeatInterval: 100 * time.Millisecond, StaleAfter: 3 * time.Second,
		DiscoveryInterval: 50 * time.Millisecond, PollInterval: 10 * time.Millisecond, CommitInterval: 20 * time.Millisecond}
}

// logLines keeps the messages logged through it.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) Enabled(context.Context, slog.Level) bool { return true }
func (l *logLines) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logLines) WithGroup(string) slog.Handler            { return l }
func (l *logLines) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	})
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, b.String())
	return nil
}

func (l *logLines) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lines...)
}

// count is the number of lines containing s.
func (l *logLines) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, line := range l.lines {
		if strings.Contains(line, s) {
			n++
		}
	}
	return n
}
