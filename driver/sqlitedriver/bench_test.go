// SPDX-License-Identifier: Apache-2.0

package sqlitedriver_test

import (
	"testing"

	"github.com/shardq/shardq/driver/drivertest"
	"github.com/shardq/shardq/internal/testdb"
)

// go test -bench Tick -run '^$' ./driver/sqlitedriver/
func BenchmarkTick(b *testing.B) {
	drivertest.BenchmarkTick(b, testdb.Migrated(b, testdb.SQLite(b)))
}
