// SPDX-License-Identifier: Apache-2.0

package sqlcommon

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	_ "modernc.org/sqlite"
)

// A statement is prepared and cached when its lists are short; one that
// expands a longer list (a batch of claims or acks, one text per length)
// runs unprepared and leaves the cache as it was.
func TestLongListsAreNotPrepared(t *testing.T) {
	ctx := context.Background()
	db, err := sql.Open("sqlite", filepath.Join(t.TempDir(), "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, "CREATE TABLE t (a INTEGER, b INTEGER)"); err != nil {
		t.Fatal(err)
	}
	d := &Store{Dialect: Dialect{PreparedStatements: 100, PreparedListMax: 8}, Read: db, Write: db}
	defer d.CloseStatements()
	rows := func(n int) Rows {
		r := make(Rows, n)
		for i := range r {
			r[i] = []any{i, i}
		}
		return r
	}
	cached := func() int {
		d.caches.read.mu.Lock()
		defer d.caches.read.mu.Unlock()
		return len(d.caches.read.m)
	}
	for n := 1; n <= 40; n++ {
		if _, err := d.exec(ctx, db, "INSERT INTO t (a, b) VALUES :rows", Args{"rows": rows(n)}); err != nil {
			t.Fatal(err)
		}
		var got int
		if err := d.queryRow(ctx, db, "SELECT COUNT(*) FROM t WHERE a IN (:as)", Args{"as": List(make([]any, n))}).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if want := 2 * min(n, d.PreparedListMax); cached() != want {
			t.Fatalf("after lists of 1 to %d: %d statements cached, want %d (lists up to %d)", n, cached(), want, d.PreparedListMax)
		}
	}
}
