// SPDX-License-Identifier: Apache-2.0

package mysqldriver_test

import (
	"encoding/json"
	"io/fs"
	"os"
	"regexp"
	"testing"

	"github.com/shardq/shardq/driver/mysqldriver"
)

// Every table the migrations create is in the VSchema, and every queue
// table is sharded by its tenant column: a table missing here would fail
// on Vitess, or scatter.
func TestVSchemaCoversEveryTable(t *testing.T) {
	var vs struct {
		Sharded  bool `json:"sharded"`
		Vindexes map[string]struct {
			Type string `json:"type"`
		} `json:"vindexes"`
		Tables map[string]struct {
			ColumnVindexes []struct {
				Column, Name string
			} `json:"column_vindexes"`
		} `json:"tables"`
	}
	if err := json.Unmarshal(mysqldriver.VSchema, &vs); err != nil {
		t.Fatal(err)
	}
	if !vs.Sharded {
		t.Fatal("the keyspace must be sharded")
	}
	created := regexp.MustCompile(`CREATE TABLE IF NOT EXISTS (\w+)`)
	tables := map[string]bool{"shardq_schema_migrations": true} // created by Migrate itself
	err := fs.WalkDir(os.DirFS("migrations"), ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile("migrations/" + path)
		for _, m := range created.FindAllStringSubmatch(string(b), -1) {
			tables[m[1]] = true
		}
		return err
	})
	if err != nil || len(tables) < 10 {
		t.Fatalf("read %d tables from the migrations: %v", len(tables), err)
	}
	for table := range tables {
		vt, ok := vs.Tables[table]
		if !ok || len(vt.ColumnVindexes) != 1 {
			t.Errorf("table %s: not in vschema.json with one column vindex", table)
			continue
		}
		cv := vt.ColumnVindexes[0]
		want, wantType := "tenant", "xxhash"
		switch table {
		case "shardq_schema_migrations":
			want, wantType = "version", "hash"
		case "shardq_receipt_keys": // no tenant: a few rows every server reads whole
			want, wantType = "key_id", "hash"
		}
		if cv.Column != want || vs.Vindexes[cv.Name].Type != wantType {
			t.Errorf("table %s: sharded by %s (%s), want %s (%s)", table, cv.Column, vs.Vindexes[cv.Name].Type, want, wantType)
		}
	}
	for table := range vs.Tables {
		if !tables[table] {
			t.Errorf("vschema.json names %s, which no migration creates", table)
		}
	}
}
