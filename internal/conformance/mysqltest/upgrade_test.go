// SPDX-License-Identifier: Apache-2.0

package mysqltest

import (
	"testing"

	"github.com/shardq/shardq/driver/mysqldriver"
	"github.com/shardq/shardq/internal/conformance"
	"github.com/shardq/shardq/internal/testdb"
)

// TestUpgradeMySQL migrates a database that a member of the previous
// release is using, with state in flight (conformance.Upgrade).
func TestUpgradeMySQL(t *testing.T) {
	dsn := testdb.MySQLDatabase(t)
	open := func() *mysqldriver.Driver {
		d, err := mysqldriver.Open(dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		return d
	}
	older, newer := open(), open()
	conformance.Upgrade(t, older, newer, conformance.Previous{EncodeTime: newer.EncodeTime,
		ClaimRead: "SELECT message_offset FROM queue_message_claims FORCE INDEX (idx_claims_open) WHERE tenant = ? AND done = 0"})
}
