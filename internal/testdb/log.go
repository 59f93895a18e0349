// SPDX-License-Identifier: Apache-2.0

package testdb

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
)

// LogLines is a slog handler that keeps each record as one line: its
// message, then " key=value" per attribute. Tests read what a client
// logged through it.
type LogLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *LogLines) Enabled(context.Context, slog.Level) bool { return true }
func (l *LogLines) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *LogLines) WithGroup(string) slog.Handler            { return l }
func (l *LogLines) Handle(_ context.Context, r slog.Record) error {
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

// All is every line so far.
func (l *LogLines) All() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lines...)
}

// Count is the number of lines containing s.
func (l *LogLines) Count(s string) int {
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
