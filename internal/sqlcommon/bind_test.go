// SPDX-License-Identifier: Apache-2.0

package sqlcommon

import (
	"fmt"
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
