// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"fmt"
	"log/slog"
	"strings"
)

// logFormatFlag is --log-format: text (slog's key=value lines) or json.
type logFormatFlag string

func (f *logFormatFlag) String() string { return string(*f) }
func (f *logFormatFlag) Type() string   { return "text|json" }
func (f *logFormatFlag) Set(s string) error {
	if s != "text" && s != "json" {
		return fmt.Errorf("%q: want text or json", s)
	}
	*f = logFormatFlag(s)
	return nil
}

// logLevelFlag is --log-level: debug, info, warn or error.
type logLevelFlag slog.Level

func (f *logLevelFlag) String() string { return strings.ToLower(slog.Level(*f).String()) }
func (f *logLevelFlag) Type() string   { return "debug|info|warn|error" }
func (f *logLevelFlag) Set(s string) error {
	var l slog.Level
	switch strings.ToLower(s) {
	case "debug":
		l = slog.LevelDebug
	case "info":
		l = slog.LevelInfo
	case "warn":
		l = slog.LevelWarn
	case "error":
		l = slog.LevelError
	default:
		return fmt.Errorf("%q: want debug, info, warn or error", s)
	}
	*f = logLevelFlag(l)
	return nil
}

// logger is the command's logger on stderr, as --log-format and
// --log-level say; one for the whole run.
func (a *app) logger() *slog.Logger {
	a.logOnce.Do(func() {
		opts := &slog.HandlerOptions{Level: slog.Level(a.logLevel)}
		if a.logFormat == "json" {
			a.log = slog.New(slog.NewJSONHandler(a.env.Stderr, opts))
		} else {
			a.log = slog.New(slog.NewTextHandler(a.env.Stderr, opts))
		}
	})
	return a.log
}
