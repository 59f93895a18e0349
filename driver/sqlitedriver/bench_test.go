// SPDX-License-Identifier: Apache-2.0

package sqlitedriver_test

import (
	"testing"

	"github.com/shardq/shardq/driver"

	"github.com/shardq/shardq/driver/drivertest"
	"github.com/shardq/shardq/internal/testdb"
)

// go test -bench . -run '^$' ./driver/sqlitedriver/
func BenchmarkPublish(b *testing.B) {
	d := testdb.Migrated(b, testdb.SQLite(b))
	drivertest.Benchmark(b, d, `CREATE TABLE bench_raw_messages (
  "offset" INTEGER PRIMARY KEY AUTOINCREMENT, tenant TEXT NOT NULL, topic TEXT NOT NULL, partition_key TEXT NOT NULL,
  id TEXT NOT NULL, headers TEXT NOT NULL, payload BLOB NOT NULL, created_at INTEGER NOT NULL,
  UNIQUE (tenant, topic, partition_key, id))`, int64(0))
}

// go test -bench Tick -run '^$' ./driver/sqlitedriver/
func BenchmarkTick(b *testing.B) {
	drivertest.BenchmarkTick(b, testdb.Migrated(b, testdb.SQLite(b)))
}

// go test -bench Consume -run '^$' ./driver/sqlitedriver/
func BenchmarkConsume(b *testing.B) {
	drivertest.BenchmarkConsume(b, func(b *testing.B) driver.Driver { return testdb.Migrated(b, testdb.SQLite(b)) })
}

// go test -bench Ungrouped -run '^$' ./driver/sqlitedriver/
func BenchmarkUngrouped(b *testing.B) {
	drivertest.BenchmarkUngrouped(b, func(b *testing.B) driver.Driver { return testdb.Migrated(b, testdb.SQLite(b)) })
}
