// SPDX-License-Identifier: Apache-2.0

package sqlitedriver

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/shardq/shardq/driver"
)

var _ driver.HeadFeed = (*Driver)(nil)

// FeedHeads is the SQLite change feed: every FeedInterval, on a read-only
// connection of its own, it reads PRAGMA data_version, which changes when
// any other connection, of this process or another, committed to the
// file. It cannot name what moved, so a change is a Rescan: each consumer
// reads the heads it waits on (one statement). An idle file costs one
// PRAGMA per interval and no statement on the queue's tables.
func (d *Driver) FeedHeads(ctx context.Context, sink driver.FeedSink) error {
	db, err := sql.Open("sqlite", d.readDSN)
	if err != nil {
		return fmt.Errorf("sqlite: change feed: %w: %w", driver.ErrFeedUnavailable, err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	db.SetConnMaxLifetime(0)
	db.SetConnMaxIdleTime(0)
	pause := 100 * time.Millisecond // after a failed check
	up := false
	var last int64
	t := time.NewTicker(d.feedEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil // stopped, not down
		case <-t.C:
		}
		var v int64
		if err := db.QueryRowContext(ctx, "PRAGMA data_version").Scan(&v); err != nil {
			if ctx.Err() != nil {
				continue
			}
			if up {
				sink.Down(fmt.Errorf("sqlite: change feed: %w", err))
				up = false
			}
			select {
			case <-ctx.Done():
			case <-time.After(pause):
			}
			continue
		}
		switch {
		case !up:
			// Up rescans: whatever committed before this first read is
			// found by the consumers' own reads.
			up, last = true, v
			sink.Up(false)
		case v != last:
			last = v
			sink.Rescan()
		}
	}
}
