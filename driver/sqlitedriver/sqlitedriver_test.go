package sqlitedriver_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/driver/drivertest"
	"github.com/shardq/shardq/internal/testdb"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"))
}

func TestConformance(t *testing.T) {
	drivertest.Run(t, func(t *testing.T) driver.Driver { return testdb.SQLite(t) })
}
