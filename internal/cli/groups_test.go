// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"fmt"
	"strings"
	"testing"
)

// consume --key, --next-group and --ungrouped.
func TestConsumeMessageGroups(t *testing.T) {
	for _, db := range databases {
		t.Run(db.name, func(t *testing.T) {
			env := map[string]string{"SHARDQ_DSN": db.dsn(t)}
			if r := runCLI(t, env, "", "migrate"); r.code != 0 {
				t.Fatal(r)
			}
			publish := func(key string, n int) {
				var lines strings.Builder
				for i := range n {
					fmt.Fprintf(&lines, "%s-%d\n", key, i)
				}
				args := []string{"publish", "--tenant", "acme", "--topic", "orders", "--lines"}
				if key != "" {
					args = append(args, "--key", key)
				}
				if r := runCLI(t, env, lines.String(), args...); r.code != 0 {
					t.Fatal(r)
				}
			}
			publish("a", 3)
			publish("b", 2)
			publish("", 2)
			base := []string{"consume", "--topic", "orders", "--group", "g", "--tenant", "acme"}
			got := consumedPayloads(t, runCLI(t, env, "", append(base, "--key", "a", "--max", "2")...))
			if fmt.Sprint(got) != "[a-0 a-1]" {
				t.Fatalf("--key a --max 2: %v", got)
			}
			// a still has a-2 and is older than b: the next group is a again.
			got = consumedPayloads(t, runCLI(t, env, "", append(base, "--next-group", "--idle-exit", "500ms")...))
			if fmt.Sprint(got) != "[a-2]" {
				t.Fatalf("--next-group: %v", got)
			}
			got = consumedPayloads(t, runCLI(t, env, "", append(base, "--next-group", "--wait", "1s", "--idle-exit", "500ms")...))
			if fmt.Sprint(got) != "[b-0 b-1]" {
				t.Fatalf("second --next-group: %v", got)
			}
			if r := runCLI(t, env, "", append(base, "--next-group")...); r.code != 1 || !strings.Contains(r.stderr, "no free message group") {
				t.Fatalf("--next-group with nothing ready: %+v", r)
			}
			got = consumedPayloads(t, runCLI(t, env, "", append(base, "--ungrouped", "--idle-exit", "1s")...))
			if len(got) != 2 || !strings.HasPrefix(got[0], "-") {
				t.Fatalf("--ungrouped: %v", got)
			}
			for _, bad := range [][]string{
				{"--key", "a", "--ungrouped"},
				{"--key", "a", "--tenant", "other"},
				{"--wait", "1s"},
				{"--next-group", "--wait", "-1s"},
			} {
				if r := runCLI(t, env, "", append(base, bad...)...); r.code != 2 {
					t.Errorf("%v: exit %d, want 2 (%s)", bad, r.code, r.stderr)
				}
			}
		})
	}
}
