// SPDX-License-Identifier: Apache-2.0

package sqlitetest

import (
	"path/filepath"
	"testing"

	"github.com/shardq/shardq/driver/sqlitedriver"
	"github.com/shardq/shardq/internal/conformance"
)

// TestUpgradeSQLite migrates a file that a member of the previous release
// is using, with state in flight (conformance.Upgrade).
func TestUpgradeSQLite(t *testing.T) {
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
	conformance.Upgrade(t, older, newer, conformance.Previous{EncodeTime: newer.EncodeTime,
		ClaimRead: "SELECT message_offset FROM queue_message_claims INDEXED BY idx_claims_open WHERE tenant = ? AND done = 0"})
}
