// SPDX-License-Identifier: Apache-2.0

package sqlcommon

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
)

func TestBind(t *testing.T) {
	q, args := Bind("SELECT 1 FROM t WHERE tenant = :tenant AND consumer_group = :group AND x IN (:offs) AND y = ':lit' "+
		"AND z = (SELECT 1 FROM u WHERE tenant = :tenant AND topic = :topic)", Args{"tenant": "a", "group": "g", "topic": "x", "offs": List{1, 2, 3}})
	want := "SELECT 1 FROM t WHERE tenant = ? AND consumer_group = ? AND x IN (?, ?, ?) AND y = ':lit' AND z = (SELECT 1 FROM u WHERE tenant = ? AND topic = ?)"
	if q != want || fmt.Sprint(args) != "[a g 1 2 3 a x]" {
		t.Fatalf("Bind = %q %v", q, args)
	}
	q, args = Bind("INSERT INTO t (a, b) VALUES :rows", Args{"rows": Rows{{1, "x"}, {2, "y"}}})
	if q != "INSERT INTO t (a, b) VALUES (?, ?), (?, ?)" || fmt.Sprint(args) != "[1 x 2 y]" {
		t.Fatalf("Bind rows = %q %v", q, args)
	}
	for _, bad := range []Args{{"rows": Rows{}}, {"rows": Rows{{1, 2}, {3}}}} {
		func() {
			defer func() {
				if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), ":rows") {
					t.Fatalf("bad rows %v: %v", bad, r)
				}
			}()
			Bind("VALUES :rows", bad)
		}()
	}
	func() {
		defer func() {
			if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), ":missing") {
				t.Fatalf("a missing parameter: %v", r)
			}
		}()
		Bind("SELECT :missing", Args{})
	}()
}

// Bind never panics on a statement whose names all have values, and
// binds exactly one argument per placeholder it writes.
func FuzzBind(f *testing.F) {
	f.Add("SELECT :a, ':b', :a_1 FROM t")
	f.Add("::a :: ':' :")
	f.Fuzz(func(t *testing.T, q string) {
		args := Args{}
		for i := 0; i < len(q); i++ {
			if q[i] == ':' && i+1 < len(q) && nameStart(q[i+1]) {
				j := i + 1
				for j < len(q) && nameChar(q[j]) {
					j++
				}
				args[q[i+1:j]] = "v"
			}
		}
		if strings.Contains(q, "?") {
			return // positional marks in the input are not Bind's
		}
		out, vals := Bind(q, args)
		if strings.Count(out, "?") != len(vals) {
			t.Fatalf("%q -> %q with %d values", q, out, len(vals))
		}
	})
}

// Every statement of every table is whole: written for its syntax, with
// named parameters only, no template left in it.
func TestStatementTablesAreWhole(t *testing.T) {
	for _, s := range []Syntax{MySQL, SQLite} {
		st := newStatements(s)
		var check func(path string, v reflect.Value)
		check = func(path string, v reflect.Value) {
			switch v.Kind() {
			case reflect.Struct:
				for i := range v.NumField() {
					check(path+"."+v.Type().Field(i).Name, v.Field(i))
				}
			case reflect.String:
				q := v.String()
				if q == "" {
					if path == "statements.publish.insertFresh" && s == MySQL {
						return // SQLite only
					}
					if path == "statements.publish.insertLocked" && s == SQLite {
						return // MySQL only
					}
					t.Errorf("%v %s is empty", s, path)
				}
				if strings.ContainsAny(q, "?{}") {
					t.Errorf("%v %s has a positional mark or a template: %s", s, path, q)
				}
			}
		}
		check("statements", reflect.ValueOf(*st))
	}
}
