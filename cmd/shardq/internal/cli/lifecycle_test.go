// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
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
			r = runCLI(t, env, "", "admin", "retention", "run", "--tenant", "acme", "--min", "1ns", "--partition-idle", "1ns", "--dedup-window", "0", "--json")
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

// admin tenant delete: a preview by default, --execute deletes the
// tenant's rows and nothing of another tenant's, bad flags are usage
// errors naming the rule.
func TestAdminTenantDelete(t *testing.T) {
	for _, db := range databases {
		t.Run(db.name, func(t *testing.T) {
			env := map[string]string{"SHARDQ_DSN": db.dsn(t)}
			if r := runCLI(t, env, "", "migrate"); r.code != 0 {
				t.Fatal(r)
			}
			for _, tenant := range []string{"acme", "other"} {
				for _, key := range []string{"a", "b"} {
					if r := runCLI(t, env, "", "publish", "--tenant", tenant, "--topic", "orders", "--key", key, "p"); r.code != 0 {
						t.Fatal(r)
					}
				}
			}
			rows := func(tenant string) map[string]int64 {
				t.Helper()
				r := runCLI(t, env, "", "admin", "tenant", "delete", "--tenant", tenant, "--json")
				if r.code != 0 {
					t.Fatal(r)
				}
				out := map[string]int64{}
				for _, l := range jsonLines[struct {
					Table   string `json:"table"`
					Rows    int64  `json:"rows"`
					Deleted bool   `json:"deleted"`
				}](t, r.stdout) {
					if l.Deleted {
						t.Fatalf("a preview says deleted: %s", r.stdout)
					}
					out[l.Table] = l.Rows
				}
				return out
			}
			if got := rows("acme"); got["queue_messages"] != 2 || got["queue_partitions"] != 2 {
				t.Fatalf("preview of acme: %v", got)
			}
			if r := runCLI(t, env, "", "admin", "tenant", "delete", "--tenant", "acme"); r.code != 0 || !strings.Contains(r.stdout, "preview: nothing changed") {
				t.Fatalf("preview: %+v", r)
			}
			if r := runCLI(t, env, "", "admin", "tenant", "delete", "--tenant", "acme", "--execute", "--batch", "1"); r.code != 0 ||
				!strings.Contains(r.stdout, "deleted 4 rows of tenant acme") {
				t.Fatalf("--execute: %+v", r)
			}
			for table, n := range rows("acme") {
				if n != 0 {
					t.Errorf("%s keeps %d rows of acme", table, n)
				}
			}
			if got := rows("other"); got["queue_messages"] != 2 || got["queue_partitions"] != 2 {
				t.Fatalf("the other tenant after acme's delete: %v", got)
			}
			for _, c := range []struct {
				args []string
				want string
			}{
				{[]string{"--tenant", "acme", "--batch", "0"}, "--batch 0: must be between 1 and"},
				{[]string{"--tenant", ""}, "tenant: must not be empty"},
			} {
				if r := runCLI(t, env, "", append([]string{"admin", "tenant", "delete"}, c.args...)...); r.code != 2 || !strings.Contains(r.stderr, c.want) {
					t.Errorf("%v: %+v, want exit 2 naming %q", c.args, r, c.want)
				}
			}
		})
	}
}

// admin tenants lists tenants with their use, admin tenant suspend refuses
// a tenant's publishes until resume, and admin tenant export writes its
// messages as JSON lines, resumable from a line's cursor.
func TestAdminTenantLifecycle(t *testing.T) {
	for _, db := range databases {
		t.Run(db.name, func(t *testing.T) {
			env := map[string]string{"SHARDQ_DSN": db.dsn(t)}
			if r := runCLI(t, env, "", "migrate"); r.code != 0 {
				t.Fatal(r)
			}
			for _, tenant := range []string{"acme", "other"} {
				for _, key := range []string{"a", "b", "c"} {
					if r := runCLI(t, env, "", "publish", "--tenant", tenant, "--topic", "orders", "--key", key, "pay-"+key); r.code != 0 {
						t.Fatal(r)
					}
				}
			}
			// Limits: set, kept across a change of another, refused when
			// negative, and enforced on the next publish.
			if r := runCLI(t, env, "", "admin", "tenant", "quota", "--tenant", "other", "--max-messages", "3", "--max-retention", "1h"); r.code != 0 || !strings.Contains(r.stdout, "max-messages") {
				t.Fatalf("set limits: %+v", r)
			}
			if r := runCLI(t, env, "", "admin", "tenant", "limits", "--tenant", "other", "--publish-rate", "100", "--json"); r.code != 0 ||
				!strings.Contains(r.stdout, `"max_messages":3`) || !strings.Contains(r.stdout, `"publish_rate":100`) || !strings.Contains(r.stdout, `"max_retention":"1h0m0s"`) {
				t.Fatalf("change one limit: %+v", r)
			}
			if r := runCLI(t, env, "", "admin", "tenant", "limits", "--tenant", "other", "--max-bytes", "-1"); r.code != 2 || !strings.Contains(r.stderr, "max bytes") {
				t.Fatalf("a negative limit: %+v", r)
			}
			if r := runCLI(t, env, "", "publish", "--tenant", "other", "--topic", "orders", "--key", "a", "over"); r.code == 0 || !strings.Contains(r.stderr, "max_messages quota of 3 exceeded") {
				t.Fatalf("publish over the quota: %+v", r)
			}
			if r := runCLI(t, env, "", "admin", "tenant", "limits", "--tenant", "other", "--clear"); r.code != 0 {
				t.Fatalf("clear limits: %+v", r)
			}
			if r := runCLI(t, env, "", "admin", "tenant", "suspend", "--tenant", "acme"); r.code != 0 || !strings.Contains(r.stdout, "suspended tenant acme") {
				t.Fatalf("suspend: %+v", r)
			}
			if r := runCLI(t, env, "", "publish", "--tenant", "acme", "--topic", "orders", "--key", "a", "refused"); r.code == 0 || !strings.Contains(r.stderr, `tenant "acme" is suspended`) {
				t.Fatalf("publish to a suspended tenant: %+v", r)
			}
			type topic struct {
				Topic    string `json:"topic"`
				Messages int64  `json:"messages"`
				Bytes    int64  `json:"bytes"`
			}
			type tenantLine struct {
				Tenant      string  `json:"tenant"`
				Messages    int64   `json:"messages"`
				Bytes       int64   `json:"bytes"`
				SuspendedAt string  `json:"suspended_at"`
				Topics      []topic `json:"topics"`
			}
			r := runCLI(t, env, "", "admin", "tenants", "--json")
			if r.code != 0 {
				t.Fatal(r)
			}
			got := jsonLines[tenantLine](t, r.stdout)
			if len(got) != 2 || got[0].Tenant != "acme" || got[0].SuspendedAt == "" || got[0].Messages != 3 || got[0].Bytes != int64(3*(5+len(`{"queue_name":"acme"}`)+1+36)) ||
				len(got[0].Topics) != 1 || got[0].Topics[0].Topic != "orders" || got[1].Tenant != "other" || got[1].SuspendedAt != "" {
				t.Fatalf("admin tenants: %+v", got)
			}
			if r := runCLI(t, env, "", "admin", "tenants", "--after", "acme", "--limit", "1"); r.code != 0 || !strings.Contains(r.stdout, "other") || strings.Contains(r.stdout, "acme") {
				t.Fatalf("admin tenants, second page: %+v", r)
			}
			// A suspended tenant can still be exported.
			file := filepath.Join(t.TempDir(), "acme.jsonl")
			if r := runCLI(t, env, "", "admin", "tenant", "export", "--tenant", "acme", "--output", file, "--batch", "1"); r.code != 0 || !strings.Contains(r.stdout, "exported 3 messages") {
				t.Fatalf("export: %+v", r)
			}
			raw, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(r)
			}
			type exportLine struct {
				Kind    string `json:"kind"`
				Tenant  string `json:"tenant"`
				Payload []byte `json:"payload"`
				Cursor  string `json:"cursor"`
			}
			lines := jsonLines[exportLine](t, string(raw))
			if len(lines) != 5 || lines[0].Kind != "tenant" || lines[0].Tenant != "acme" || lines[4].Kind != "end" || string(lines[1].Payload) != "pay-a" {
				t.Fatalf("export lines: %+v", lines)
			}
			r = runCLI(t, env, "", "admin", "tenant", "export", "--tenant", "acme", "--after", lines[1].Cursor)
			rest := jsonLines[exportLine](t, r.stdout)
			if r.code != 0 || len(rest) != 4 || string(rest[1].Payload) != "pay-b" || string(rest[2].Payload) != "pay-c" {
				t.Fatalf("export resumed after the first message: %+v", r)
			}
			if r := runCLI(t, env, "", "admin", "tenant", "export", "--tenant", "acme", "--after", "nonsense!"); r.code != 2 || !strings.Contains(r.stderr, "after:") {
				t.Fatalf("export after a bad cursor: %+v", r)
			}
			if r := runCLI(t, env, "", "admin", "tenant", "resume", "--tenant", "acme"); r.code != 0 || !strings.Contains(r.stdout, "resumed tenant acme") {
				t.Fatalf("resume: %+v", r)
			}
			if r := runCLI(t, env, "", "publish", "--tenant", "acme", "--topic", "orders", "--key", "a", "again"); r.code != 0 {
				t.Fatalf("publish after the resume: %+v", r)
			}
		})
	}
}
