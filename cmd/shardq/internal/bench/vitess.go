// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/shardq/shardq/driver"
)

// isVitess reports whether d's database is vtgate.
func isVitess(ctx context.Context, d driver.Driver) (bool, error) {
	if d.Name() != "mysql" {
		return false, nil
	}
	var version string
	if err := d.DB().QueryRowContext(ctx, "SELECT @@version").Scan(&version); err != nil {
		return false, fmt.Errorf("read the server's version: %w", err)
	}
	return strings.Contains(strings.ToLower(version), "vitess"), nil
}

// route adds a raw table to vtgate's VSchema, sharded by tenant as the
// queue tables are (driver/mysqldriver/vschema.json), so that the raw
// baselines go through vtgate as shardq does. It needs vtgate's
// --vschema-ddl-authorized-users to name the bench's user.
func (e *env) route(ctx context.Context, table string) error {
	if !e.vitess {
		return nil
	}
	if _, err := e.d.DB().ExecContext(ctx, "ALTER VSCHEMA ON "+table+" ADD VINDEX tenant_xxhash(tenant)"); err != nil {
		return fmt.Errorf("add raw table %s to the VSchema (vtgate's --vschema-ddl-authorized-users must name this user): %w", table, err)
	}
	return nil
}

// unroute takes a raw table out of the VSchema again.
func (e *env) unroute(ctx context.Context, table string) error {
	if !e.vitess {
		return nil
	}
	if _, err := e.d.DB().ExecContext(ctx, "ALTER VSCHEMA DROP TABLE "+table); err != nil && !strings.Contains(err.Error(), "does not contain table") {
		return fmt.Errorf("drop raw table %s from the VSchema: %w", table, err)
	}
	return nil
}

// vitessDeleteRows bounds one DELETE through vtgate: vttablet refuses a
// statement that touches more rows than its limit (10,000 by default).
const vitessDeleteRows = 5000

// deleteTenants empties table of tenants' rows through vtgate, one tenant
// (one shard) and at most vitessDeleteRows rows a statement.
func (e *env) deleteTenants(ctx context.Context, table string, tenants []string) error {
	for _, tenant := range tenants {
		for {
			res, err := e.d.DB().ExecContext(ctx, "DELETE FROM "+table+" WHERE tenant = ? LIMIT "+strconv.Itoa(vitessDeleteRows), tenant)
			if err != nil {
				return fmt.Errorf("delete tenant %q from %s: %w", tenant, table, err)
			}
			if n, err := res.RowsAffected(); err != nil || n < vitessDeleteRows {
				break
			}
		}
	}
	return nil
}
