// SPDX-License-Identifier: Apache-2.0

package mysqltest

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// database/sql closes idle connections from a background goroutine that
	// may still be exiting after DB.Close returns.
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"))
}
