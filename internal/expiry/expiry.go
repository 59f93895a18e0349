// SPDX-License-Identifier: Apache-2.0

// Package expiry is a message's time to live: the header that carries
// when it expires, and the check every reader makes before it hands a
// message out (docs/consumers.md, "Expiry").
package expiry

import (
	"errors"
	"fmt"
	"time"

	"github.com/shardq/shardq/driver"
)

// Header holds when a message expires, RFC 3339 in UTC with milliseconds.
const Header = "shardq-expires-at"

// Layout is Header's format.
const Layout = "2006-01-02T15:04:05.000Z07:00"

// ErrExpired is the cause an expired message is settled with.
var ErrExpired = errors.New("shardq: message expired")

// Format is at as Header's value.
func Format(at time.Time) string { return at.UTC().Format(Layout) }

// Parse reads a Header value (any RFC 3339 time).
func Parse(v string) (time.Time, error) { return time.Parse(time.RFC3339Nano, v) }

// At is when m expires; false when it does not (no header, or one that
// does not parse: a reader never drops a message for a value it cannot
// read).
func At(m *driver.Message) (time.Time, bool) {
	v, ok := m.Headers[Header]
	if !ok {
		return time.Time{}, false
	}
	at, err := Parse(v)
	return at, err == nil
}

// Expired reports whether m has expired by now.
func Expired(m *driver.Message, now time.Time) bool {
	at, ok := At(m)
	return ok && !now.Before(at)
}

// Cause is the error an expired m is settled (dead-lettered) with.
func Cause(m *driver.Message) error {
	at, _ := At(m)
	return fmt.Errorf("%w at %s", ErrExpired, Format(at))
}
