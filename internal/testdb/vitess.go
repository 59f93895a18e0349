// SPDX-License-Identifier: Apache-2.0

package testdb

import (
	"context"
	"database/sql"
	"fmt"
	"testing"

	"github.com/go-sql-driver/mysql"
)

// VitessShards are the test keyspace's shards (scripts/vitess).
var VitessShards = []string{"-80", "80-"}

// VitessKeyspace is the test keyspace's name (VitessDSN's database).
func VitessKeyspace() string {
	cfg, err := mysql.ParseDSN(VitessDSN())
	if err != nil {
		return ""
	}
	return cfg.DBName
}

// VitessShard opens vtgate targeted at one shard of the test keyspace,
// closed when t ends.
func VitessShard(t testing.TB, shard string) *sql.DB {
	t.Helper()
	cfg, err := mysql.ParseDSN(VitessDSN())
	if err != nil {
		t.Fatal(err)
	}
	cfg.DBName += ":" + shard
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// VitessTenantsByShard has publish put one message in each of n tenants
// (t00, t01, …) and reads back, shard by shard, which tenants each holds.
func VitessTenantsByShard(t testing.TB, n int, publish func(tenant string) error) map[string][]string {
	t.Helper()
	ctx := context.Background()
	for i := range n {
		tenant := fmt.Sprintf("t%02d", i)
		if err := publish(tenant); err != nil {
			t.Fatalf("publish to %s: %v", tenant, err)
		}
	}
	out := map[string][]string{}
	for _, shard := range VitessShards {
		rows, err := VitessShard(t, shard).QueryContext(ctx, "SELECT DISTINCT tenant FROM queue_messages ORDER BY tenant")
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var tenant string
			if err := rows.Scan(&tenant); err != nil {
				t.Fatal(err)
			}
			out[shard] = append(out[shard], tenant)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		rows.Close()
	}
	return out
}
