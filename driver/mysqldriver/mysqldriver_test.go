// SPDX-License-Identifier: Apache-2.0

package mysqldriver_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/driver/drivertest"
	"github.com/shardq/shardq/internal/testdb"
)

func TestMain(m *testing.M) {
	// database/sql closes idle connections from a background goroutine that
	// may still be exiting after DB.Close returns.
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"))
}

func TestConformance(t *testing.T) {
	drivertest.RunParallel(t, func(t *testing.T) driver.Driver { return testdb.MySQL(t) }, nil)
}
