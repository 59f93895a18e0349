// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shardq/shardq/driver"
)

// oneLine checks a refusal: exit 2, one stderr line that contains want.
func oneLine(t *testing.T, r result, args []string, want string) {
	t.Helper()
	if r.code != 2 || strings.Count(r.stderr, "\n") != 1 || !strings.Contains(r.stderr, want) {
		t.Errorf("shardq %q: code %d stderr %q; want exit 2 and one line with %q", args, r.code, r.stderr, want)
	}
}

// Refused before anything happens: bad flags are refused (exit 2, one
// line naming the flag or field and the rule) before the database is
// opened, so a new SQLite path is not created; a command other than
// migrate never creates one.
func TestRefusedBeforeAnything(t *testing.T) {
	path := filepath.Join(t.TempDir(), "typo.db")
	env := map[string]string{"SHARDQ_DSN": "sqlite://" + path}
	for _, tc := range []struct {
		stdin string
		args  []string
		want  string
	}{
		{"", []string{"publish", "--tenant", "", "--topic", "x", "--lines"}, "tenant: must not be empty"},
		{"a\n", []string{"publish", "--tenant", "", "--topic", "x", "--lines"}, "tenant: must not be empty"},
		{"", []string{"publish", "--tenant", "t", "--topic", "x", "--id", "a\x00", "p"}, "message id: byte 0x00 not allowed"},
		{"", []string{"publish", "--tenant", "t", "--topic", "x", "--batch", "-1", "--lines"}, `"--batch" flag: must not be negative`},
		{"", []string{"publish", "--tenant", "t", "--topic", "x", "p"}, "does not exist (run `shardq migrate`"},
		{"", []string{"admin", "topics", "--tenant", "t"}, "does not exist (run `shardq migrate`"},
		{"", []string{"admin", "topics", "--tenant", ""}, "tenant: must not be empty"},
		{"", []string{"admin", "offsets", "--tenant", "t", "--group", "$x"}, "consumer group: names starting with '$' are reserved"},
		{"", []string{"admin", "inspect", "--tenant", "t", "--topic", "x", "--key", "k", "--id", ""}, "message id: must not be empty"},
		{"", []string{"admin", "delete", "--tenant", "t", "--topic", "", "--key", "k", "--id", "i"}, "topic: must not be empty"},
		{"", []string{"admin", "dlq", "list", "--tenant", "t", "--topic", ""}, "topic: must not be empty"},
		{"", []string{"admin", "dlq", "list", "--tenant", "t", "--topic", "x", "--limit", "-1"}, `"--limit" flag: must not be negative`},
		{"", []string{"admin", "dlq", "requeue", "--tenant", "t\x01\x00", "--topic", "x", "--all"}, "tenant: byte 0x00 not allowed"},
		{"", []string{"admin", "reset-offsets", "--tenant", "t", "--topic", "x", "--group", "g", "--key", "k", "--to-offset", "-5"}, "--to-offset -5: must not be negative"},
		{"", []string{"admin", "reset-offsets", "--tenant", "t", "--topic", "x", "--group", "", "--to-latest"}, "consumer group: must not be empty"},
		{"", []string{"consume", "--tenant", "t", "--topic", "x", "--group", "g", "--idle-exit", "-1s"}, `"--idle-exit" flag: must not be negative`},
		{"", []string{"consume", "--tenant", "t", "--topic", "x", "--group", "g", "--key", "k", "--wait", "-1s"}, `"--wait" flag: must not be negative`},
		{"", []string{"consume", "--tenant", "t", "--topic", "x", "--group", "g", "--max", "-1"}, `"--max" flag: must not be negative`},
		{"", []string{"consume", "--tenant", "t", "--topic", "x", "--group", "g", "--name", strings.Repeat("n", 247)}, "subscriber name: 247 bytes, limit 246"},
		{"", []string{"consume", "--tenant", "t", "--topic", "x", "--group", "g", "--key", "k "}, "partition key: must not end with a space"},
		{"", []string{"admin", "stale-leases", "--tenant", "t", "--stale-after", "-1s"}, `"--stale-after" flag: must not be negative`},
		{"", []string{"admin", "retention", "run", "--tenant", "t", "--min", "-1h"}, `"--min" flag: must not be negative`},
		{"", []string{"admin", "retention", "run", "--tenant", "t", "--max", "-1h"}, `"--max" flag: must not be negative`},
		{"", []string{"admin", "retention", "run", "--tenant", "t", "--dlq-max", "-1h"}, `"--dlq-max" flag: must not be negative`},
		{"", []string{"bench", "latency", "--duration", "-1s"}, `"--duration" flag: must not be negative`},
		{"", []string{"bench", "latency", "--poll", "-1s"}, `"--poll" flag: must not be negative`},
		{"", []string{"tx", "resolve", "--tenant", "t", "--topic", "x", "--key", "k", "--id", "", "commit"}, "message id: must not be empty"},
	} {
		r := runCLI(t, env, tc.stdin, tc.args...)
		oneLine(t, r, tc.args, tc.want)
		if _, err := os.Stat(path); err == nil {
			t.Fatalf("shardq %q created %s", tc.args, path)
		}
	}
}

// The password of SHARDQ_DSN never reaches help or an error.
func TestPasswordNeverPrinted(t *testing.T) {
	env := map[string]string{"SHARDQ_DSN": "mysql://root:S3cretPw@127.0.0.1:1/db"}
	for _, args := range [][]string{{"publish", "--help"}, {"--help"}, {"admin", "topics", "--help"}, {"admin", "topics", "--tenant", "t"}} {
		r := runCLI(t, env, "", args...)
		if strings.Contains(r.stdout+r.stderr, "S3cretPw") {
			t.Errorf("shardq %q printed the password:\n%s%s", args, r.stdout, r.stderr)
		}
	}
}

// A server that drops the connection: go-sql-driver's own log lines
// ("[mysql] packets.go:…") do not reach stderr; the failure is one line.
func TestDriverLogSilenced(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte{0x05, 0x00}) // half a packet header, then gone
			c.Close()
		}
	}()
	// The CLI's errors go to its Env; the driver's logger would write to
	// the process's stderr, so capture that too.
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := os.Stderr
	os.Stderr = w
	res := runCLI(t, nil, "", "--dsn", "mysql://root@"+ln.Addr().String()+"/db", "admin", "topics", "--tenant", "t")
	os.Stderr = stderr
	w.Close()
	leaked := make([]byte, 4096)
	n, _ := r.Read(leaked)
	r.Close()
	if res.code == 0 || strings.Count(res.stderr, "\n") != 1 {
		t.Fatalf("failure: code %d stderr %q; want one line", res.code, res.stderr)
	}
	if n > 0 {
		t.Fatalf("the driver wrote to stderr: %q", leaked[:n])
	}
}

// Hostile and mistaken input against a migrated database, on both
// drivers: identifiers with control bytes are escaped in every human
// output, an offset past the head is refused, a database migrated by a
// newer shardq is refused by every command when that went past a
// contract migration (and served when only past additive ones), and none
// of it stores anything.
func TestHostileInputMigrated(t *testing.T) {
	for _, db := range databases {
		t.Run(db.name, func(t *testing.T) {
			url := db.dsn(t)
			env := map[string]string{"SHARDQ_DSN": url}
			if r := runCLI(t, env, "", "migrate"); r.code != 0 {
				t.Fatal(r)
			}
			tenant, id := "ctl\x1b[31m", "a\npublished offset=999"
			r := runCLI(t, env, "", "publish", "--tenant", tenant, "--topic", "x", "--key", "k\t", "--id", id, "p")
			if r.code != 0 || strings.Count(r.stdout, "\n") != 1 || strings.ContainsAny(r.stdout, "\x1b\t") || !strings.Contains(r.stdout, `"ctl\x1b[31m"`) {
				t.Fatalf("publish output not escaped: %+v", r)
			}
			if r := runCLI(t, env, "", "consume", "--tenant", tenant, "--topic", "x", "--group", "g", "--max", "1"); r.code != 0 {
				t.Fatal(r)
			}
			for _, args := range [][]string{{"admin", "topics", "--all-tenants"}, {"admin", "offsets", "--all-tenants"}} {
				r := runCLI(t, env, "", args...)
				if r.code != 0 || strings.ContainsAny(r.stdout, "\x1b") || !strings.Contains(r.stdout, `"ctl\x1b[31m"`) {
					t.Fatalf("shardq %q not escaped: %+v", args, r)
				}
			}
			r = runCLI(t, env, "", "admin", "dlq", "requeue", "--tenant", "t", "--topic", "x", "--key", "k", "--id", "nope")
			if r.code != 1 || strings.Contains(r.stderr, "{") || !strings.Contains(r.stderr, `tenant "t" topic "x.dlq" partition "k" id "nope"`) {
				t.Fatalf("requeue of a missing dead letter: %+v", r)
			}
			// Past the head.
			if r := runCLI(t, env, "", "publish", "--tenant", "t", "--topic", "x", "--key", "k", "p"); r.code != 0 {
				t.Fatal(r)
			}
			args := []string{"admin", "reset-offsets", "--tenant", "t", "--topic", "x", "--group", "g", "--create", "--key", "k", "--to-offset", "999999"}
			oneLine(t, runCLI(t, env, "", args...), args, "offset: 999999 is outside partition")
			// 64 caller headers are legal; queue_name is shardq's.
			hargs := []string{"publish", "--tenant", "t", "--topic", "x", "--key", "h"}
			for i := range 64 {
				hargs = append(hargs, "--header", fmt.Sprintf("h%d=v", i))
			}
			if r := runCLI(t, env, "", append(hargs, "p")...); r.code != 0 {
				t.Fatalf("64 caller headers: %+v", r)
			}

			// A newer shardq migrated this database.
			drv := openURL(t, url)
			ctx := context.Background()
			current, latest, err := drv.SchemaVersion(ctx)
			if err != nil || current != latest {
				t.Fatalf("schema %d of %d: %v", current, latest, err)
			}
			var appliedAt any = 0 // SQLite: unix time
			if drv.Name() == "mysql" {
				appliedAt = "2030-01-01 00:00:00"
			}
			// An additive migration past this binary: it goes on working
			// (expand, then contract).
			if _, err := drv.DB().ExecContext(ctx, "INSERT INTO shardq_schema_migrations (version, name, applied_at) VALUES (?, 'future', ?)", latest+1, appliedAt); err != nil {
				t.Fatal(err)
			}
			for _, args := range [][]string{{"migrate"}, {"publish", "--tenant", "t", "--topic", "x", "p"}, {"migrate", "status"}} {
				if r := runCLI(t, env, "", args...); r.code != 0 {
					t.Errorf("shardq %q past an additive migration: %+v", args, r)
				}
			}
			// A contract migration: refused.
			if _, err := drv.DB().ExecContext(ctx, "INSERT INTO shardq_schema_migrations (version, name, applied_at) VALUES (?, 'drop_things_contract', ?)", latest+2, appliedAt); err != nil {
				t.Fatal(err)
			}
			before := countMessages(t, drv)
			want := fmt.Sprintf("schema version %d, this shardq knows versions up to %d, and migration %04d_drop_things_contract removes or changes what it reads", latest+2, latest, latest+2)
			for _, args := range [][]string{{"migrate"}, {"publish", "--tenant", "t", "--topic", "x", "p"}, {"admin", "topics", "--tenant", "t"},
				{"consume", "--tenant", "t", "--topic", "x", "--group", "g", "--max", "1"}} {
				r := runCLI(t, env, "", args...)
				if r.code != 1 || strings.Count(r.stderr, "\n") != 1 || !strings.Contains(r.stderr, want) {
					t.Errorf("shardq %q on a newer schema: code %d stderr %q; want 1 and %q", args, r.code, r.stderr, want)
				}
			}
			if after := countMessages(t, drv); after != before {
				t.Fatalf("messages %d -> %d on a refused database", before, after)
			}
		})
	}
}

func countMessages(t *testing.T, d driver.Driver) int {
	t.Helper()
	var n int
	if err := d.DB().QueryRow("SELECT COUNT(*) FROM queue_messages").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// --after is decoded strictly: a JSON array of one to four valid strings,
// or an error naming the flag; never a panic.
func FuzzDecodeAfter(f *testing.F) {
	for _, s := range []string{``, `[]`, `["acme"]`, `["a","b","c","d"]`, `["a","b","c","d","e"]`, `{"a":1}`, `[1]`, `["\ud800"]`, `null`, `"x"`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		after, err := decodeAfter(s)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "--after") {
				t.Fatalf("error %q does not name --after", err)
			}
			return
		}
		if s == "" {
			if after != nil {
				t.Fatalf("empty --after gave %q", after)
			}
			return
		}
		if len(after) < 1 || len(after) > maxAfterValues {
			t.Fatalf("%q accepted with %d values", s, len(after))
		}
		b, _ := json.Marshal(after)
		again, err := decodeAfter(string(b))
		if err != nil || len(again) != len(after) {
			t.Fatalf("round trip of %q: %q, %v", after, again, err)
		}
	})
}
