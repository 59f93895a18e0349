// SPDX-License-Identifier: Apache-2.0

// Package sqlitetest runs the conformance suite (internal/conformance) on
// SQLite, a file of each test's own, and the upgrade from the previous
// release's schema.
package sqlitetest
