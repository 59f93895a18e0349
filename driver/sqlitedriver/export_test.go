// SPDX-License-Identifier: Apache-2.0

package sqlitedriver

// WithoutNewestMigration makes d embed every migration but the newest, as
// the previous release did.
func WithoutNewestMigration(d *Driver) { d.migrations = d.migrations[:len(d.migrations)-1] }
