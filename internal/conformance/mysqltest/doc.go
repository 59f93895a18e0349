// SPDX-License-Identifier: Apache-2.0

// Package mysqltest runs the conformance suite (internal/conformance) on
// MariaDB (MySQL), a database of each test's own, the change feed's
// wake-up of consumers, and the upgrade from the previous release's
// schema.
package mysqltest
