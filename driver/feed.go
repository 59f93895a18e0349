// SPDX-License-Identifier: Apache-2.0

package driver

import (
	"context"
	"errors"
	"time"
)

// HeadFeed is implemented by a driver whose database can push the changes
// of partition heads to a process (docs/feed.md): the MySQL driver reads
// the server's binary log as a replica does, the SQLite driver checks the
// file's data version every few milliseconds. A client runs one feed and
// shares it among its consumers; correctness never depends on it, since
// every consumer still polls, more slowly while the feed is up.
type HeadFeed interface {
	// FeedHeads reports head changes to sink until ctx ends, reconnecting
	// after a cut. It calls sink.Up each time it starts streaming (first
	// and after every reconnect) and sink.Down when it stops. It returns
	// nil when ctx ends, or an error wrapping ErrFeedUnavailable when the
	// database cannot feed at all (binary log off, a missing privilege):
	// the caller then polls, as without a feed.
	FeedHeads(ctx context.Context, sink FeedSink) error
}

// ErrFeedUnavailable is wrapped by FeedHeads' error when the database
// cannot feed head changes; the error says what is missing.
var ErrFeedUnavailable = errors.New("change feed unavailable")

// FeedSink receives a feed's events. Its methods are called from the
// feed's goroutine, one at a time, and must not block.
type FeedSink interface {
	// Moved reports partitions whose head moved (a message committed).
	Moved(heads []HeadChange)
	// Rescan reports that any head may have moved without being named
	// (the SQLite file changed, a position the server no longer has):
	// consumers read their heads again.
	Rescan()
	// Up reports that the feed streams. Events between a consumer's last
	// read and Up may be missing, so Up implies Rescan. names says
	// whether the feed names each partition that moves (Moved), or only
	// that something changed (Rescan).
	Up(names bool)
	// Down reports that the feed stopped streaming, with why.
	Down(err error)
	// Note logs what the feed did that an operator may want to know (a
	// position given up, say), through the client's logger.
	Note(msg string, args ...any)
}

// HeadChange names a partition whose head moved, and to what offset when
// the feed knows it (0 otherwise). A consumer that finds nothing new after
// a change with a Head past its cursor reads again shortly: a replica can
// see a commit in the binary log before the commit is visible to readers.
type HeadChange struct {
	Tenant, Topic, PartitionKey string
	Head                        int64
}

// Clock is implemented by a driver that reads the database's clock. A
// client's members then keep to it rather than to their hosts' clocks,
// so that they agree on when a lease, heartbeat or claim expires
// (docs/leases.md, "Clocks").
type Clock interface {
	// DatabaseTime returns the database's current time.
	DatabaseTime(ctx context.Context) (time.Time, error)
}
