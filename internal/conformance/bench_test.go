// SPDX-License-Identifier: Apache-2.0

package conformance_test

import (
	"testing"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/conformance"
	"github.com/shardq/shardq/internal/testdb"
)

// go test -bench PublishSQLite -run '^$' ./internal/conformance/
func BenchmarkPublishSQLite(b *testing.B) {
	d := testdb.Migrated(b, testdb.SQLite(b))
	conformance.Benchmark(b, d, `CREATE TABLE bench_raw_messages (
  "offset" INTEGER PRIMARY KEY AUTOINCREMENT, tenant TEXT NOT NULL, topic TEXT NOT NULL, partition_key TEXT NOT NULL,
  id TEXT NOT NULL, headers TEXT NOT NULL, payload BLOB NOT NULL, created_at INTEGER NOT NULL,
  UNIQUE (tenant, topic, partition_key, id))`, int64(0))
}

// go test -bench ConsumeSQLite -run '^$' ./internal/conformance/
func BenchmarkConsumeSQLite(b *testing.B) {
	conformance.BenchmarkConsume(b, func(b *testing.B) driver.Driver { return testdb.Migrated(b, testdb.SQLite(b)) })
}

// go test -bench UngroupedSQLite -run '^$' ./internal/conformance/
func BenchmarkUngroupedSQLite(b *testing.B) {
	conformance.BenchmarkUngrouped(b, func(b *testing.B) driver.Driver { return testdb.Migrated(b, testdb.SQLite(b)) })
}

// go test -bench PublishMySQL -run '^$' ./internal/conformance/
func BenchmarkPublishMySQL(b *testing.B) {
	d := testdb.Migrated(b, testdb.MySQL(b))
	conformance.Benchmark(b, d, "CREATE TABLE bench_raw_messages LIKE queue_messages", "2026-01-01 00:00:00.000000")
}

// go test -bench ConsumeMySQL -run '^$' ./internal/conformance/
func BenchmarkConsumeMySQL(b *testing.B) {
	conformance.BenchmarkConsume(b, func(b *testing.B) driver.Driver { return testdb.Migrated(b, testdb.MySQL(b)) })
}

// go test -bench UngroupedMySQL -run '^$' ./internal/conformance/
func BenchmarkUngroupedMySQL(b *testing.B) {
	conformance.BenchmarkUngrouped(b, func(b *testing.B) driver.Driver { return testdb.Migrated(b, testdb.MySQL(b)) })
}
