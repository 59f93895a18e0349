// SPDX-License-Identifier: Apache-2.0

package mysqldriver_test

import (
	"testing"

	"github.com/shardq/shardq/driver"

	"github.com/shardq/shardq/driver/drivertest"
	"github.com/shardq/shardq/internal/testdb"
)

// go test -bench . -run '^$' ./driver/mysqldriver/
func BenchmarkPublish(b *testing.B) {
	d := testdb.Migrated(b, testdb.MySQL(b))
	drivertest.Benchmark(b, d, "CREATE TABLE bench_raw_messages LIKE queue_messages", "2026-01-01 00:00:00.000000")
}

// go test -bench Tick -run '^$' ./driver/mysqldriver/
func BenchmarkTick(b *testing.B) {
	drivertest.BenchmarkTick(b, testdb.Migrated(b, testdb.MySQL(b)))
}

// go test -bench Consume -run '^$' ./driver/mysqldriver/
func BenchmarkConsume(b *testing.B) {
	drivertest.BenchmarkConsume(b, func(b *testing.B) driver.Driver { return testdb.Migrated(b, testdb.MySQL(b)) })
}

// go test -bench Ungrouped -run '^$' ./driver/mysqldriver/
func BenchmarkUngrouped(b *testing.B) {
	drivertest.BenchmarkUngrouped(b, func(b *testing.B) driver.Driver { return testdb.Migrated(b, testdb.MySQL(b)) })
}
