// SPDX-License-Identifier: Apache-2.0

package sqlitedriver_test

import (
	"path/filepath"
	"testing"

	"github.com/shardq/shardq/driver/drivertest"
	"github.com/shardq/shardq/driver/sqlitedriver"
)

// TestUpgrade migrates a file that a member of the previous release is
// using, with state in flight (drivertest.Upgrade).
func TestUpgrade(t *testing.T) {
	path := filepath.Join(t.TempDir(), "shardq.db")
	open := func() *sqlitedriver.Driver {
		d, err := sqlitedriver.Open(path, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		return d
	}
	older, newer := open(), open()
	sqlitedriver.WithoutNewestMigration(older)
	drivertest.Upgrade(t, older, newer, drivertest.Previous{EncodeTime: newer.EncodeTime,
		ClaimRead: "SELECT message_offset FROM queue_message_claims INDEXED BY idx_claims_open WHERE tenant = ? AND done = 0"})
}
