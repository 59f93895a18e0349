// SPDX-License-Identifier: Apache-2.0

package mysqldriver_test

import (
	"testing"

	"github.com/shardq/shardq/driver/drivertest"
	"github.com/shardq/shardq/internal/testdb"
)

// go test -bench Tick -run '^$' ./driver/mysqldriver/
func BenchmarkTick(b *testing.B) {
	drivertest.BenchmarkTick(b, testdb.Migrated(b, testdb.MySQL(b)))
}
