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
			// a still has a-2 and is older than b: the first group is a
			// again; once a is quiet for --group-idle, the same run takes
			// b, until --idle-exit.
			r := runCLI(t, env, "", append(base, "--next-group", "--group-idle", "100ms", "--idle-exit", "1s")...)
			if got = consumedPayloads(t, r); fmt.Sprint(got) != "[a-2 b-0 b-1]" {
				t.Fatalf("--next-group: %v", got)
			}
			if strings.Count(r.stderr, "accepted message group") != 2 {
				t.Fatalf("--next-group accepted: %s; want a, then b", r.stderr)
			}
			// --max counts across groups.
			publish("c", 2)
			publish("d", 2)
			if got = consumedPayloads(t, runCLI(t, env, "", append(base, "--next-group", "--group-idle", "100ms", "--max", "3")...)); fmt.Sprint(got) != "[c-0 c-1 d-0]" {
				t.Fatalf("--next-group --max 3: %v", got)
			}
			if got = consumedPayloads(t, runCLI(t, env, "", append(base, "--next-group", "--idle-exit", "500ms")...)); fmt.Sprint(got) != "[d-1]" {
				t.Fatalf("--next-group after --max: %v", got)
			}
			if r := runCLI(t, env, "", append(base, "--next-group")...); r.code != 1 || !strings.Contains(r.stderr, "no free message group") {
				t.Fatalf("--next-group with nothing ready: %+v", r)
			}
			// --require-ready: a drained group is refused, one with a
			// ready message is served.
			if r := runCLI(t, env, "", append(base, "--key", "a", "--require-ready", "--idle-exit", "1s")...); r.code != 1 || !strings.Contains(r.stderr, "no free message group") {
				t.Fatalf("--key a --require-ready on a drained group: %+v", r)
			}
			publish("a", 1)
			if got = consumedPayloads(t, runCLI(t, env, "", append(base, "--key", "a", "--require-ready", "--idle-exit", "500ms")...)); fmt.Sprint(got) != "[a-0]" {
				t.Fatalf("--key a --require-ready with a ready message: %v", got)
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
				{"--next-group", "--group-idle", "0s"},
				{"--next-group", "--require-ready"},
			} {
				if r := runCLI(t, env, "", append(base, bad...)...); r.code != 2 {
					t.Errorf("%v: exit %d, want 2 (%s)", bad, r.code, r.stderr)
				}
			}
		})
	}
}
