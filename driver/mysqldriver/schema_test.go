// SPDX-License-Identifier: Apache-2.0

package mysqldriver_test

import (
	"context"
	"database/sql"
	"slices"
	"strings"
	"testing"

	"github.com/shardq/shardq/internal/testdb"
)

// TestNaiveAutoIncrementCursorSkips shows the bug the head row prevents:
// with a plain AUTO_INCREMENT column and no per-partition lock, a later
// transaction commits a higher offset first, the reader's cursor passes the
// lower offset, and when that commits it is never read.
func TestNaiveAutoIncrementCursorSkips(t *testing.T) {
	ctx := context.Background()
	db, err := sql.Open("mysql", testdb.MySQLDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, "CREATE TABLE naive (`offset` BIGINT AUTO_INCREMENT PRIMARY KEY, v INT) ENGINE=InnoDB"); err != nil {
		t.Fatal(err)
	}
	slow, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Rollback()
	if _, err := slow.ExecContext(ctx, "INSERT INTO naive (v) VALUES (1)"); err != nil { // draws offset 1
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "INSERT INTO naive (v) VALUES (2)"); err != nil { // draws 2, commits first
		t.Fatal(err)
	}
	read := func(after int64) []int64 {
		rows, err := db.QueryContext(ctx, "SELECT `offset` FROM naive WHERE `offset` > ? ORDER BY `offset`", after)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var out []int64
		for rows.Next() {
			var o int64
			if err := rows.Scan(&o); err != nil {
				t.Fatal(err)
			}
			out = append(out, o)
		}
		return out
	}
	var cursor int64
	var seen []int64
	for _, o := range read(cursor) {
		seen, cursor = append(seen, o), o
	}
	if err := slow.Commit(); err != nil {
		t.Fatal(err)
	}
	seen = append(seen, read(cursor)...)
	if !slices.Equal(seen, []int64{2}) {
		t.Fatalf("naive reader saw %v; expected it to skip offset 1 and see only [2]", seen)
	}
}

// TestSchemaMatchesDesign checks the keys, charsets and collations that
// docs/design.md fixes, as the server reports them.
func TestSchemaMatchesDesign(t *testing.T) {
	ctx := context.Background()
	d := testdb.Migrated(t, testdb.MySQL(t))
	db := d.DB()
	index := func(table, name string) string {
		rows, err := db.QueryContext(ctx, "SELECT column_name FROM information_schema.statistics "+
			"WHERE table_schema = DATABASE() AND table_name = ? AND index_name = ? ORDER BY seq_in_index", table, name)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var cols []string
		for rows.Next() {
			var c string
			if err := rows.Scan(&c); err != nil {
				t.Fatal(err)
			}
			cols = append(cols, c)
		}
		return strings.Join(cols, ",")
	}
	for _, k := range []struct{ table, index, cols string }{
		{"queue_messages", "PRIMARY", "tenant,topic,partition_key,offset"},
		{"queue_messages", "uq_queue_messages_id", "tenant,topic,partition_key,id"},
		{"queue_messages", "idx_offset", "offset"},
		{"queue_delivery_state", "PRIMARY", "tenant,consumer_group,topic,partition_key,message_offset"},
		{"queue_offsets", "PRIMARY", "tenant,topic,partition_key,consumer_group"},
		{"queue_partition_leases", "PRIMARY", "tenant,consumer_group,topic,partition_key"},
		{"queue_subscriber_heartbeats", "PRIMARY", "tenant,consumer_group,topic,subscriber_name"},
		{"queue_partitions", "PRIMARY", "tenant,topic,partition_key"},
	} {
		if got := index(k.table, k.index); got != k.cols {
			t.Errorf("%s %s = (%s), want (%s)", k.table, k.index, got, k.cols)
		}
	}
	rows, err := db.QueryContext(ctx, "SELECT table_name, column_name, character_set_name, collation_name, is_nullable "+
		"FROM information_schema.columns WHERE table_schema = DATABASE() AND table_name LIKE 'queue\\_%' "+
		"AND column_name IN ('tenant', 'topic', 'consumer_group', 'subscriber_name', 'owner', 'partition_key', 'id')")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var table, col, cs, coll, nullable string
		if err := rows.Scan(&table, &col, &cs, &coll, &nullable); err != nil {
			t.Fatal(err)
		}
		n++
		want := "ascii/ascii_bin"
		if col == "partition_key" || col == "id" {
			want = "utf8mb4/utf8mb4_bin"
		}
		if got := cs + "/" + coll; got != want || nullable != "NO" {
			t.Errorf("%s.%s is %s nullable=%s, want %s NOT NULL", table, col, got, nullable, want)
		}
	}
	if n < 20 {
		t.Fatalf("checked %d identifier columns, expected every table's", n)
	}
	var tables int
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() "+
		"AND table_name LIKE 'queue\\_%' AND (table_collation <> 'utf8mb4_bin' OR engine <> 'InnoDB')").Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if tables != 0 {
		t.Fatalf("%d queue tables are not InnoDB with utf8mb4_bin defaults", tables)
	}
}

// TestMigrationCutShortAfterAnIndex: MySQL has no CREATE INDEX IF NOT
// EXISTS, so a migration cut short after creating an index must not fail
// on it when run again.
func TestMigrationCutShortAfterAnIndex(t *testing.T) {
	ctx := context.Background()
	d := testdb.Migrated(t, testdb.MySQL(t))
	if _, err := d.DB().ExecContext(ctx, "DELETE FROM shardq_schema_migrations WHERE version >= 4"); err != nil {
		t.Fatal(err)
	}
	applied, err := d.Migrate(ctx)
	if err != nil || len(applied) == 0 || applied[0] != 4 {
		t.Fatalf("migrate again = %v, %v; want 4 and later applied over the existing indexes", applied, err)
	}
}
