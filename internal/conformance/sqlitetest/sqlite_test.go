// SPDX-License-Identifier: Apache-2.0

package sqlitetest

import (
	"testing"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/conformance"
	"github.com/shardq/shardq/internal/testdb"
)

// TestConformanceSQLite runs the client's conformance suite on SQLite, a
// file of each test's own.
func TestConformanceSQLite(t *testing.T) {
	conformance.RunParallel(t, func(t *testing.T) driver.Driver { return testdb.SQLite(t) }, nil)
}
