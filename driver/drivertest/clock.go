// SPDX-License-Identifier: Apache-2.0

package drivertest

import (
	"context"
	"testing"
	"time"

	"github.com/shardq/shardq/driver"
)

// The driver reads the database's clock (driver.Clock), which members
// keep to: in UTC, moving forward, and, on the test's own host, within
// seconds of this process's clock.
func testDatabaseClock(t *testing.T, open Open) {
	d := open(t)
	clock, ok := d.(driver.Clock)
	if !ok {
		t.Fatalf("%s driver does not implement driver.Clock: its members would keep to their hosts' clocks", d.Name())
	}
	ctx := context.Background()
	first, err := clock.DatabaseTime(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if first.Location() != time.UTC {
		t.Errorf("DatabaseTime is in %v, want UTC", first.Location())
	}
	if off := time.Since(first); off < -5*time.Second || off > 5*time.Second {
		t.Errorf("DatabaseTime %v is %v from this host's clock", first, off)
	}
	time.Sleep(2 * time.Millisecond) // the clocks tick in microseconds: two reads a tick apart differ
	second, err := clock.DatabaseTime(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !second.After(first) {
		t.Errorf("DatabaseTime went from %v to %v", first, second)
	}
}
