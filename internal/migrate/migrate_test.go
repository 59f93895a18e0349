// SPDX-License-Identifier: Apache-2.0

package migrate

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"testing/fstest"
)

func TestLoadOrdersAndSplits(t *testing.T) {
	fsys := fstest.MapFS{
		"m/0002_more.sql": {Data: []byte("-- comment\nALTER TABLE a ADD b INT;\n")},
		"m/0001_init.sql": {Data: []byte("CREATE TABLE a (\n  x INT\n);\n\nCREATE INDEX i ON a (x);\n")},
		"m/README.md":     {Data: []byte("not a migration")},
	}
	ms, err := Load(fsys, "m")
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 2 || ms[0].Version != 1 || ms[1].Version != 2 || ms[0].Name != "init" || Latest(ms) != 2 {
		t.Fatalf("loaded %+v", ms)
	}
	want := []string{"CREATE TABLE a (\n  x INT\n)", "CREATE INDEX i ON a (x)"}
	if !slices.Equal(ms[0].Statements, want) {
		t.Fatalf("statements %q, want %q", ms[0].Statements, want)
	}
	if len(ms[1].Statements) != 1 || strings.Contains(ms[1].Statements[0], "comment") {
		t.Fatalf("comment kept: %q", ms[1].Statements)
	}
}

func TestLoadRejectsBadNames(t *testing.T) {
	for name, fsys := range map[string]fstest.MapFS{
		"no number": {"m/init.sql": {Data: []byte("x;")}},
		"zero":      {"m/0000_init.sql": {Data: []byte("x;")}},
		"twice":     {"m/0001_a.sql": {Data: []byte("x;")}, "m/1_b.sql": {Data: []byte("y;")}},
	} {
		if _, err := Load(fsys, "m"); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// A binary runs on a database migrated past it while every migration past
// it only adds; a contract migration past it refuses it.
func TestCompatible(t *testing.T) {
	errNewer := errors.New("newer")
	for _, tc := range []struct {
		current, latest int
		beyond          []string
		ok              bool
	}{
		{10, 10, nil, true},
		{9, 10, nil, true},
		{12, 10, []string{"0011_tenants", "0012_limits"}, true},
		{12, 10, []string{"0011_tenants", "0012_drop_old_contract"}, false},
		{11, 10, []string{"0011_x_contract"}, false},
	} {
		err := Compatible(tc.current, tc.latest, tc.beyond, errNewer)
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, errNewer)) {
			t.Errorf("Compatible(%d, %d, %v) = %v, want ok=%t", tc.current, tc.latest, tc.beyond, err, tc.ok)
		}
	}
}
