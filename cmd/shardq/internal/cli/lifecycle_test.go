// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// consume --start latest, admin offsets --group with partitions the group
// has no cursor for, admin groups, admin groups delete and retention's
// partition removal.
func TestGroupLifecycleCommands(t *testing.T) {
	for _, db := range databases {
		t.Run(db.name, func(t *testing.T) {
			env := map[string]string{"SHARDQ_DSN": db.dsn(t)}
			if r := runCLI(t, env, "", "migrate"); r.code != 0 {
				t.Fatal(r)
			}
			publish := func(key, payload string) {
				if r := runCLI(t, env, "", "publish", "--tenant", "acme", "--topic", "orders", "--key", key, payload); r.code != 0 {
					t.Fatal(r)
				}
			}
			consume := func(group string, extra ...string) []string {
				t.Helper()
				out := consumedPayloads(t, runCLI(t, env, "", append([]string{"consume", "--topic", "orders", "--group", group, "--tenant", "acme",
					"--idle-exit", "1s"}, extra...)...))
				slices.Sort(out) // partitions are read concurrently
				return out
			}
			if r := runCLI(t, env, "", "consume", "--topic", "orders", "--group", "g", "--tenant", "acme", "--start", "sideways"); r.code != 2 ||
				!strings.Contains(r.stderr, "start position: must be earliest or latest") {
				t.Fatalf("--start sideways: %+v", r)
			}
			publish("a", "old-a")
			publish("b", "old-b")
			// A new group told to start at the latest reads nothing old...
			if got := consume("late", "--start", "latest"); len(got) != 0 {
				t.Fatalf("latest group read %v before anything new", got)
			}
			publish("a", "new-a")
			publish("c", "new-c")
			if got := consume("late"); fmt.Sprint(got) != "[new-a new-c]" {
				t.Fatalf("latest group read %v, want the new messages only", got)
			}
			if got := consume("early", "--key", "c", "--max", "1", "--start", "earliest"); fmt.Sprint(got) != "[new-c]" {
				t.Fatalf("earliest group read %v", got)
			}
			// ...and the offsets report names the partitions a group has no
			// cursor for.
			r := runCLI(t, env, "", "admin", "offsets", "--tenant", "acme", "--group", "early", "--json")
			if r.code != 0 {
				t.Fatal(r)
			}
			var noCursor []string
			for _, o := range jsonLines[struct {
				Key      string `json:"partition_key"`
				NoCursor bool   `json:"no_cursor"`
				Lag      int    `json:"lag"`
			}](t, r.stdout) {
				if o.NoCursor {
					noCursor = append(noCursor, fmt.Sprintf("%s:%d", o.Key, o.Lag))
				}
			}
			if fmt.Sprint(noCursor) != "[a:2 b:1]" {
				t.Fatalf("partitions without a cursor of early: %v\n%s", noCursor, r.stdout)
			}
			r = runCLI(t, env, "", "admin", "groups", "--tenant", "acme", "--json")
			if r.code != 0 {
				t.Fatal(r)
			}
			var groups []string
			for _, g := range jsonLines[struct {
				Group      string `json:"group"`
				Partitions int    `json:"partitions"`
				Unread     int    `json:"unread_partitions"`
				Lag        int    `json:"lag"`
			}](t, r.stdout) {
				groups = append(groups, fmt.Sprintf("%s:%d/%d/%d", g.Group, g.Partitions, g.Unread, g.Lag))
			}
			// early read c: a has two messages for it, b one.
			if fmt.Sprint(groups) != "[early:1/2/3 late:2/0/0]" {
				t.Fatalf("admin groups: %v\n%s", groups, r.stdout)
			}
			// Pause and resume, shown by admin groups.
			if r := runCLI(t, env, "", "admin", "pause", "--tenant", "acme", "--topic", "orders", "--group", "late"); r.code != 0 ||
				r.stdout != "paused group late on topic orders of tenant acme\n" {
				t.Fatalf("pause: %+v", r)
			}
			if r := runCLI(t, env, "", "admin", "groups", "--tenant", "acme"); !strings.Contains(r.stdout, "STATE") || !strings.Contains(r.stdout, "paused") {
				t.Fatalf("groups while late is paused: %+v", r)
			}
			if r := runCLI(t, env, "", "admin", "pause", "--tenant", "acme", "--topic", "orders", "--group", "lat"); r.code != 2 || !strings.Contains(r.stderr, `"lat" has never read`) {
				t.Fatalf("pause of an unknown group: %+v", r)
			}
			if r := runCLI(t, env, "", "admin", "resume", "--all-tenants", "--topic", "orders", "--group", "late"); r.code != 0 ||
				!strings.Contains(r.stdout, "resumed group late") {
				t.Fatalf("resume: %+v", r)
			}
			if r := runCLI(t, env, "", "admin", "groups", "--tenant", "acme", "--json"); strings.Contains(r.stdout, `"paused":true`) {
				t.Fatalf("groups after resume: %+v", r)
			}
			if r := runCLI(t, env, "", "admin", "groups", "delete", "--tenant", "acme", "--topic", "orders", "--group", "early"); r.code != 0 {
				t.Fatal(r)
			}
			r = runCLI(t, env, "", "admin", "groups", "--tenant", "acme")
			if r.code != 0 || strings.Contains(r.stdout, "early") || !strings.Contains(r.stdout, "late") {
				t.Fatalf("groups after deleting early: %+v", r)
			}
			if r := runCLI(t, env, "", "admin", "groups", "delete", "--tenant", "acme", "--topic", "orders", "--group", "$retention"); r.code == 0 ||
				!strings.Contains(r.stderr, "consumer group") {
				t.Fatalf("delete of a reserved group: %+v", r)
			}
			// Retention removes the partitions late has drained once they are
			// idle; b still holds a message late never read (it started
			// after it), which only the maximum age removes.
			r = runCLI(t, env, "", "admin", "retention", "run", "--tenant", "acme", "--min", "1ns", "--partition-idle", "1ns", "--json")
			var rep struct {
				Deleted int `json:"deleted"`
				Removed int `json:"removed_partitions"`
			}
			if r.code != 0 || json.Unmarshal([]byte(r.stdout), &rep) != nil || rep.Removed != 2 || rep.Deleted != 3 {
				t.Fatalf("retention: %+v", r)
			}
		})
	}
}
