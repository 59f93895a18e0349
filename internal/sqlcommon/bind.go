// SPDX-License-Identifier: Apache-2.0

package sqlcommon

import (
	"fmt"
	"strings"
)

// Args names a statement's parameters: Bind replaces each :name in the
// statement with a placeholder and appends its value, in the statement's
// order. A name may appear several times (its value is bound each time),
// so a statement that names (tenant, group, topic) in one key order and
// (tenant, topic, group) in another cannot mix them up.
type Args map[string]any

// List is an Args value that expands to a list of placeholders, one per
// element, without parentheses: `IN (:offsets)`.
type List []any

// Rows is an Args value that expands to parenthesised rows of
// placeholders, one row per element: `VALUES :rows`, or a row value's IN
// list. Every row has the same length.
type Rows [][]any

// Bind turns query's :name parameters into ? placeholders and returns the
// arguments in order. Statements are the package's own constants, so a
// name missing from args is a programming error: Bind panics, and every
// statement runs in the conformance suite. Quoted text is left alone.
func Bind(query string, args Args) (string, []any) {
	var sb strings.Builder
	sb.Grow(len(query))
	var out []any
	inQuote := false
	for i := 0; i < len(query); i++ {
		c := query[i]
		if c == '\'' {
			inQuote = !inQuote
		}
		if c != ':' || inQuote || i+1 >= len(query) || !nameStart(query[i+1]) {
			sb.WriteByte(c)
			continue
		}
		j := i + 1
		for j < len(query) && nameChar(query[j]) {
			j++
		}
		name := query[i+1 : j]
		v, ok := args[name]
		if !ok {
			panic(fmt.Sprintf("sqlcommon.Bind: parameter :%s has no value in %q", name, query))
		}
		switch v := v.(type) {
		case List:
			if len(v) == 0 {
				panic(fmt.Sprintf("sqlcommon.Bind: list :%s is empty in %q", name, query))
			}
			sb.WriteString(placeholders(len(v)))
			out = append(out, v...)
		case Rows:
			if len(v) == 0 || len(v[0]) == 0 {
				panic(fmt.Sprintf("sqlcommon.Bind: rows :%s are empty in %q", name, query))
			}
			row := "(" + placeholders(len(v[0])) + ")"
			for r, vals := range v {
				if len(vals) != len(v[0]) {
					panic(fmt.Sprintf("sqlcommon.Bind: row %d of :%s has %d values, row 0 has %d", r, name, len(vals), len(v[0])))
				}
				if r > 0 {
					sb.WriteString(", ")
				}
				sb.WriteString(row)
				out = append(out, vals...)
			}
		default:
			sb.WriteByte('?')
			out = append(out, v)
		}
		i = j - 1
	}
	return sb.String(), out
}

func nameStart(c byte) bool { return c == '_' || c >= 'a' && c <= 'z' }
func nameChar(c byte) bool  { return nameStart(c) || c >= '0' && c <= '9' }
