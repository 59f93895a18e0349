// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
	dsnpkg "github.com/shardq/shardq/internal/dsn"
	"github.com/shardq/shardq/internal/testdb"
)

func TestMain(m *testing.M) {
	// `shardq bench --processes` starts this binary as its worker
	// processes, and the serve tests their servers: run as the shardq
	// command then, stopped by SIGINT/SIGTERM as cmd/shardq is.
	if os.Getenv("SHARDQ_TEST_RUN_AS_CLI") == "1" {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		code := Main(ctx, os.Args[1:], Env{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr, Getenv: os.Getenv})
		stop()
		os.Exit(code)
	}
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"))
}

type result struct {
	code           int
	stdout, stderr string
}

func runCLI(t *testing.T, env map[string]string, stdin string, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	code := Main(context.Background(), args, Env{
		Stdin: strings.NewReader(stdin), Stdout: &out, Stderr: &errb,
		Getenv: func(k string) string { return env[k] },
	})
	return result{code, out.String(), errb.String()}
}

func decodeLines(t *testing.T, s string) []publishLine {
	t.Helper()
	return jsonLines[publishLine](t, s)
}

// jsonLines decodes s, one JSON object per line, as Ts.
func jsonLines[T any](t *testing.T, s string) []T {
	t.Helper()
	var out []T
	dec := json.NewDecoder(strings.NewReader(s))
	for dec.More() {
		var l T
		if err := dec.Decode(&l); err != nil {
			t.Fatalf("stdout is not JSON lines: %v\n%s", err, s)
		}
		out = append(out, l)
	}
	return out
}

// consumedPayloads is the payloads a successful consume printed.
func consumedPayloads(t *testing.T, r result) []string {
	t.Helper()
	if r.code != 0 {
		t.Fatalf("consume: %+v", r)
	}
	var out []string
	for _, l := range jsonLines[struct {
		Payload string `json:"payload"`
	}](t, r.stdout) {
		out = append(out, l.Payload)
	}
	return out
}

// openURL opens the driver of a shardq database URL, closed when t ends.
func openURL(t *testing.T, url string) driver.Driver {
	t.Helper()
	spec, err := dsnpkg.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	drv, err := dsnpkg.Open(spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { drv.Close() })
	return drv
}

func mysqlURL(t *testing.T) string { return testdb.MySQLURL(t, testdb.MySQLDatabase(t)) }

// databases are the targets of the CLI tests that run on both drivers:
// each dsn gives a fresh database.
var databases = []struct {
	name string
	dsn  func(t *testing.T) string
}{
	{"sqlite", func(t *testing.T) string { return "sqlite://" + filepath.Join(t.TempDir(), "q.db") }},
	{"mysql", mysqlURL},
}

func TestPublishFlow(t *testing.T) {
	for _, db := range databases {
		t.Run(db.name, func(t *testing.T) {
			env := map[string]string{"SHARDQ_DSN": db.dsn(t)} // the env var, not --dsn
			r := runCLI(t, env, "", "publish", "--tenant", "acme", "--topic", "orders", "x")
			want := 1 // MySQL: the tables are missing
			if db.name == "sqlite" {
				want = 2 // the file is missing, and only migrate creates it
			}
			if r.code != want || !strings.Contains(r.stderr, "shardq migrate") {
				t.Fatalf("publish before migrate: code %d, stderr %q; want %d and the fix named", r.code, r.stderr, want)
			}
			if r := runCLI(t, env, "", "migrate"); r.code != 0 || !strings.HasPrefix(r.stdout, "applied migrations [1 ") {
				t.Fatalf("migrate: %+v", r)
			}
			if r := runCLI(t, env, "", "migrate"); r.code != 0 || !strings.Contains(r.stdout, "up to date") {
				t.Fatalf("second migrate: %+v", r)
			}
			r = runCLI(t, env, "", "publish", "--tenant", "acme", "--topic", "orders", "--key", "o-1", "--id", "m1",
				"--header", "trace=abc", "--json", `{"paid":true}`)
			first := decodeLines(t, r.stdout)
			if r.code != 0 || len(first) != 1 || first[0].Duplicate || first[0].ID != "m1" || first[0].PartitionKey != "o-1" || first[0].Offset <= 0 {
				t.Fatalf("publish: %+v", r)
			}
			r = runCLI(t, env, "", "publish", "--tenant", "acme", "--topic", "orders", "--key", "o-1", "--id", "m1", "again")
			if r.code != 0 || r.stdout != fmt.Sprintf("duplicate offset=%d tenant=acme topic=orders key=\"o-1\" id=m1\n", first[0].Offset) {
				t.Fatalf("republish: %+v", r)
			}
			var lines strings.Builder
			for i := range 250 {
				fmt.Fprintf(&lines, "line %d\n", i)
			}
			r = runCLI(t, env, lines.String(), "publish", "--tenant", "acme", "--topic", "orders", "--key", "o-1", "--lines", "--batch", "100", "--json")
			got := decodeLines(t, r.stdout)
			if r.code != 0 || len(got) != 250 {
				t.Fatalf("--lines: code %d, %d results, stderr %q", r.code, len(got), r.stderr)
			}
			for i, l := range got {
				if l.Duplicate || (i > 0 && l.Offset <= got[i-1].Offset) || l.Offset <= first[0].Offset {
					t.Fatalf("--lines result %d: %+v", i, l)
				}
			}
		})
	}
}

func TestUsageErrors(t *testing.T) {
	dsn := "sqlite://" + filepath.Join(t.TempDir(), "q.db")
	if r := runCLI(t, nil, "", "--dsn", dsn, "migrate"); r.code != 0 {
		t.Fatal(r) // so that the refusals below come from the rules, not a missing file
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"publish", "--topic", "x", "p"}, `required flag(s) "tenant" not set`},
		{[]string{"publish", "--tenant", "t", "--topic", "x"}, "want exactly one PAYLOAD argument"},
		{[]string{"publish", "--tenant", "t", "--topic", "x", "--lines", "p"}, "do not also give PAYLOAD"},
		{[]string{"publish", "--tenant", "t", "--topic", "x", "--lines", "--id", "1"}, "--id names one message"},
		{[]string{"publish", "--tenant", "t", "--topic", "x", "--header", "novalue", "p"}, `--header "novalue": want k=v`},
		{[]string{"publish", "--tenant", "t\x00", "--topic", "x", "p"}, "tenant: byte 0x00 not allowed"},
		{[]string{"publish", "--tenant", "t", "--topic", "x", "--key", strings.Repeat("k", 256), "p"}, "partition key: 256 characters, limit 255"},
		{[]string{"bogus"}, `unknown command "bogus"`},
		{[]string{"publish", "--nope"}, "unknown flag: --nope"},
		{[]string{"--dsn", "postgres://x/y", "migrate"}, "want sqlite://PATH, mysql://USER:PASS@HOST:PORT/DB or a go-sql-driver DSN"},
		{[]string{"bench"}, "want one scenario (raw, publish, async, consume, latency, ungrouped, discovery, idle, api, large, noisy), got 0 arguments"},
		{[]string{"tx", "resolve", "--tenant", "t", "--topic", "x", "--key", "k", "--id", "i"}, "want one decision (commit, rollback), got 0"},
		{[]string{"tx", "resolve", "--tenant", "t", "--topic", "x", "--key", "k", "--id", "i", "maybe"}, `decision "maybe": want one of commit, rollback`},
		{[]string{"admin", "retention", "run", "--all-tenants", "--min", "0s"}, "must be positive (omit the flag for the default, 1h0m0s)"},
		{[]string{"admin", "retention", "run", "--all-tenants", "--min", "2h", "--max", "1h"}, "minimum 2h0m0s is longer than maximum 1h0m0s"},
		{[]string{"publish", "--tenant", "t", "--topic", "x", "--delay", "1m", "--not-before", "2030-01-01T00:00:00Z", "p"}, "--delay and --not-before both say when"},
		{[]string{"publish", "--tenant", "t", "--topic", "x", "--not-before", "tomorrow", "p"}, `--not-before "tomorrow": want an RFC 3339 time`},
		{[]string{"publish", "--tenant", "t", "--topic", "x", "--delay", "48h", "p"}, "delay: 48h0m0s ahead, limit 24h0m0s (Config.MaxDelay)"},
		{[]string{"publish", "--tenant", "t", "--topic", "x", "--file", "-", "--ttl", "1m"}, "--file: a large message does not expire"},
		{[]string{"publish", "--tenant", "t", "--topic", "x", "--ttl", "-1m", "p"}, `invalid argument "-1m" for "--ttl"`},
		{[]string{"publish", "--tenant", "t", "--topic", "x", "--ttl", "1m", "--delay", "2m", "p"}, "is not after the message's delivery time"},
	} {
		args := append([]string{"--dsn", dsn}, tc.args...)
		if tc.args[0] == "--dsn" {
			args = tc.args
		}
		r := runCLI(t, nil, "", args...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) || strings.Contains(r.stderr, "goroutine") {
			t.Errorf("shardq %q: code %d stderr %q; want 2 and %q", tc.args, r.code, r.stderr, tc.want)
		}
	}
}

func TestTooLongLineIsNamed(t *testing.T) {
	dsn := "sqlite://" + filepath.Join(t.TempDir(), "q.db")
	if r := runCLI(t, nil, "", "--dsn", dsn, "migrate"); r.code != 0 {
		t.Fatal(r)
	}
	long := "ok\n" + strings.Repeat("x", maxLineBytes+1) + "\n"
	r := runCLI(t, nil, long, "--dsn", dsn, "publish", "--tenant", "t", "--topic", "x", "--lines")
	if r.code != 2 || !strings.Contains(r.stderr, "stdin line 2: payload: more than 1048576 bytes") {
		t.Fatalf("too-long line: %+v", r)
	}
}

func TestVersion(t *testing.T) {
	r := runCLI(t, nil, "", "version")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "shardq ") || !strings.Contains(r.stdout, "go1.") {
		t.Fatalf("version: %+v", r)
	}
	if f := runCLI(t, nil, "", "--version"); f.code != 0 || f.stdout != r.stdout {
		t.Fatalf("--version = %+v, want what version prints: %q", f, r.stdout)
	}
	for _, tc := range []struct {
		bi   *debug.BuildInfo
		want string
	}{
		{&debug.BuildInfo{GoVersion: "go1.24.0", Main: debug.Module{Version: "v0.3.0"}}, "shardq v0.3.0 go1.24.0"},
		{&debug.BuildInfo{GoVersion: "go1.24.0", Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "0123456789abcdef0123"}, {Key: "vcs.time", Value: "2026-11-30T20:00:00Z"}, {Key: "vcs.modified", Value: "true"}}},
			"shardq 0123456789ab+dirty (2026-11-30T20:00:00Z) go1.24.0"},
		{&debug.BuildInfo{GoVersion: "go1.24.0", Main: debug.Module{Version: "(devel)"}}, "shardq (devel) go1.24.0"},
	} {
		if got := versionLine(tc.bi); got != tc.want {
			t.Errorf("versionLine = %q, want %q", got, tc.want)
		}
	}
	// A release says the version it was stamped with, over the
	// pseudo-version the go command gives a checkout.
	stampedVersion = "v1.2.3"
	defer func() { stampedVersion = "" }()
	if got := versionLine(&debug.BuildInfo{GoVersion: "go1.24.0", Main: debug.Module{Version: "v0.0.0-20261207102314-bdc89b4762ee+dirty"}}); got != "shardq v1.2.3 go1.24.0" {
		t.Errorf("stamped: versionLine = %q", got)
	}
}

func TestConsume(t *testing.T) {
	for _, db := range databases {
		t.Run(db.name, func(t *testing.T) {
			env := map[string]string{"SHARDQ_DSN": db.dsn(t)}
			if r := runCLI(t, env, "", "migrate"); r.code != 0 {
				t.Fatal(r)
			}
			var lines strings.Builder
			for i := range 30 {
				fmt.Fprintf(&lines, "msg %d\n", i)
			}
			for _, key := range []string{"a", "b", "c"} {
				if r := runCLI(t, env, lines.String(), "publish", "--tenant", "acme", "--topic", "orders", "--key", key, "--lines"); r.code != 0 {
					t.Fatal(r)
				}
			}
			if r := runCLI(t, env, "", "publish", "--tenant", "acme", "--topic", "orders", "--key", "bin", "\xff\x00"); r.code != 0 {
				t.Fatal(r)
			}
			seen := map[string]int64{}
			ids := map[string]bool{}
			read := func(r result) int {
				t.Helper()
				if r.code != 0 {
					t.Fatalf("consume: %+v", r)
				}
				n := 0
				dec := json.NewDecoder(strings.NewReader(r.stdout))
				for dec.More() {
					var l struct {
						PartitionKey  string            `json:"partition_key"`
						Offset        int64             `json:"offset"`
						ID            string            `json:"id"`
						Attempt       int               `json:"attempt"`
						Headers       map[string]string `json:"headers"`
						Payload       *string           `json:"payload"`
						PayloadBase64 []byte            `json:"payload_base64"`
					}
					if err := dec.Decode(&l); err != nil {
						t.Fatalf("not JSON lines: %v\n%s", err, r.stdout)
					}
					if l.Offset <= seen[l.PartitionKey] || ids[l.ID] || l.Attempt != 1 || l.Headers["queue_name"] != "acme" {
						t.Fatalf("line %+v: out of order, repeated or malformed", l)
					}
					if l.PartitionKey == "bin" && (l.Payload != nil || string(l.PayloadBase64) != "\xff\x00") {
						t.Fatalf("binary payload printed as %+v", l)
					}
					if l.PartitionKey != "bin" && l.Payload == nil {
						t.Fatalf("text payload missing: %+v", l)
					}
					seen[l.PartitionKey], ids[l.ID] = l.Offset, true
					n++
				}
				return n
			}
			// --max stops after exactly N; the rest stays for the next run.
			r := runCLI(t, env, "", "consume", "--topic", "orders", "--group", "g", "--tenant", "acme", "--max", "40")
			if n := read(r); n != 40 {
				t.Fatalf("--max 40 printed %d", n)
			}
			if r.stderr != "" {
				t.Fatalf("--max 40 ended with warnings: %s", r.stderr)
			}
			env["SHARDQ_TENANTS"] = "acme"
			if n := read(runCLI(t, env, "", "consume", "--topic", "orders", "--group", "g", "--idle-exit", "1s")); n != 51 {
				t.Fatalf("second run printed %d, want the remaining 51", n)
			}
			// Another group reads everything again.
			delete(env, "SHARDQ_TENANTS")
			if r := runCLI(t, env, "", "consume", "--topic", "orders", "--group", "other", "--tenant", "acme", "--idle-exit", "1s"); strings.Count(r.stdout, "\n") != 91 {
				t.Fatalf("group other printed %d lines", strings.Count(r.stdout, "\n"))
			}
			if r := runCLI(t, env, "", "consume", "--topic", "orders", "--group", "g"); r.code != 2 || !strings.Contains(r.stderr, "no tenants: give --tenant or SHARDQ_TENANTS (SHARDQ_TENANTS is not set)") {
				t.Fatalf("consume without tenants: %+v", r)
			}
		})
	}
}

func TestTxCommands(t *testing.T) {
	dsn := "sqlite://" + filepath.Join(t.TempDir(), "q.db")
	env := map[string]string{"SHARDQ_DSN": dsn}
	if r := runCLI(t, env, "", "migrate"); r.code != 0 {
		t.Fatal(r)
	}
	drv := openURL(t, dsn)
	for _, h := range []driver.HalfMessage{
		{InsertMessage: driver.InsertMessage{Tenant: "acme", Topic: "orders", PartitionKey: "k", ID: "a", CreatedAt: time.Now()}, ProducerGroup: "pg", NextCheckAt: time.Now().Add(time.Hour)},
		{InsertMessage: driver.InsertMessage{Tenant: "acme", Topic: "orders", PartitionKey: "k", ID: "b", CreatedAt: time.Now()}, ProducerGroup: "pg", NextCheckAt: time.Now().Add(time.Hour)},
		// c's check is two hours late: no producer of pg runs.
		{InsertMessage: driver.InsertMessage{Tenant: "globex", Topic: "orders", PartitionKey: "k", ID: "c", CreatedAt: time.Now()}, ProducerGroup: "pg", NextCheckAt: time.Now().Add(-2 * time.Hour)},
	} {
		if err := drv.InsertHalf(context.Background(), &h); err != nil {
			t.Fatal(err)
		}
	}
	if r := runCLI(t, env, "", "tx", "list"); r.code != 2 || !strings.Contains(r.stderr, "exactly one of --tenant") {
		t.Fatalf("tx list without scope: %+v", r)
	}
	if r := runCLI(t, env, "", "tx", "list", "--tenant", "acme", "--all-tenants"); r.code != 2 {
		t.Fatalf("tx list with both scopes: %+v", r)
	}
	r := runCLI(t, env, "", "tx", "list", "--tenant", "acme")
	if r.code != 0 || strings.Count(r.stdout, "\n") != 3 || strings.Contains(r.stdout, "globex") || !strings.Contains(r.stdout, "unknown") {
		t.Fatalf("tx list --tenant acme: %+v", r)
	}
	r = runCLI(t, env, "", "tx", "list", "--tenant", "globex")
	if r.code != 0 || !strings.Contains(r.stdout, "check overdue") ||
		!strings.Contains(r.stdout, "producer group pg: check-backs more than 1m0s overdue; no producer of this group seems to be running") {
		t.Fatalf("tx list of an overdue half message: %+v", r)
	}
	r = runCLI(t, env, "", "tx", "list", "--all-tenants", "--json")
	if r.code != 0 || strings.Count(r.stdout, "\n") != 3 || !strings.Contains(r.stdout, `"tenant":"globex"`) || !strings.Contains(r.stdout, `"checks":0`) ||
		strings.Count(r.stdout, `"overdue":true`) != 1 {
		t.Fatalf("tx list --all-tenants: %+v", r)
	}
	r = runCLI(t, env, "", "tx", "resolve", "--tenant", "acme", "--topic", "orders", "--key", "k", "--id", "a", "commit")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "committed offset=") {
		t.Fatalf("resolve commit: %+v", r)
	}
	if r := runCLI(t, env, "", "tx", "resolve", "--tenant", "acme", "--topic", "orders", "--key", "k", "--id", "b", "rollback"); r.code != 0 {
		t.Fatalf("resolve rollback: %+v", r)
	}
	if r := runCLI(t, env, "", "tx", "resolve", "--tenant", "acme", "--topic", "orders", "--key", "k", "--id", "a", "commit"); r.code != 1 || !strings.Contains(r.stderr, "already resolved") {
		t.Fatalf("second resolve: %+v", r)
	}
	if r := runCLI(t, env, "", "tx", "resolve", "--tenant", "acme", "--topic", "orders", "--key", "k", "--id", "c", "maybe"); r.code != 2 {
		t.Fatalf("bad verb: %+v", r)
	}
	if msgs, _ := drv.FetchAfter(context.Background(), driver.TopicPartition{Tenant: "acme", Topic: "orders", PartitionKey: "k"}, 0, 10); len(msgs) != 1 || msgs[0].ID != "a" {
		t.Fatalf("after resolving: %+v", msgs)
	}
}

func TestAdminCommands(t *testing.T) {
	dsn := "sqlite://" + filepath.Join(t.TempDir(), "q.db")
	env := map[string]string{"SHARDQ_DSN": dsn}
	if r := runCLI(t, env, "", "migrate"); r.code != 0 {
		t.Fatal(r)
	}
	for _, tenant := range []string{"acme", "globex"} {
		if r := runCLI(t, env, "a\nb\nc\n", "publish", "--tenant", tenant, "--topic", "orders", "--key", "k", "--lines"); r.code != 0 {
			t.Fatal(r)
		}
	}
	for _, listing := range [][]string{{"topics"}, {"offsets"}, {"leases"}, {"stale-leases"}, {"subscribers"}, {"dlq", "list", "--topic", "orders"}, {"retention", "run"}} {
		for _, scope := range [][]string{nil, {"--tenant", "acme", "--all-tenants"}} {
			args := append(append([]string{"admin"}, listing...), scope...)
			if r := runCLI(t, env, "", args...); r.code != 2 || !strings.Contains(r.stderr, "exactly one of --tenant") {
				t.Errorf("shardq %q: code %d, stderr %q; want a usage error naming --tenant and --all-tenants", args, r.code, r.stderr)
			}
		}
	}
	r := runCLI(t, env, "", "admin", "topics", "--tenant", "acme")
	if r.code != 0 || !strings.Contains(r.stdout, "acme") || strings.Contains(r.stdout, "globex") || !strings.HasPrefix(r.stdout, "TENANT") {
		t.Fatalf("topics --tenant acme: %+v", r)
	}
	if r := runCLI(t, env, "", "admin", "topics", "--all-tenants", "--json"); r.code != 0 || strings.Count(r.stdout, "\n") != 2 {
		t.Fatalf("topics --all-tenants --json: %+v", r)
	}
	// Consume one message of acme as group g, then see the lag.
	if r := runCLI(t, env, "", "consume", "--tenant", "acme", "--topic", "orders", "--group", "g", "--max", "1"); r.code != 0 {
		t.Fatal(r)
	}
	r = runCLI(t, env, "", "admin", "offsets", "--tenant", "acme", "--group", "g", "--json")
	if r.code != 0 || !strings.Contains(r.stdout, `"lag":2`) || !strings.Contains(r.stdout, `"committed_offset":1`) {
		t.Fatalf("offsets: %+v", r)
	}
	// Reset to earliest: a preview first, which changes nothing; then
	// --execute. Inspect and delete by full identity after.
	reset := []string{"admin", "reset-offsets", "--tenant", "acme", "--topic", "orders", "--group", "g", "--to-earliest"}
	r = runCLI(t, env, "", reset...)
	if r.code != 0 || !strings.Contains(r.stdout, "PARTITION  CURRENT  NEW  REPLAY  SKIP") || !strings.Contains(r.stdout, `"k"        1        0    1       0`) ||
		!strings.Contains(r.stdout, "preview: nothing changed") {
		t.Fatalf("reset-offsets preview: %+v", r)
	}
	if r := runCLI(t, env, "", "admin", "offsets", "--tenant", "acme", "--group", "g", "--json"); !strings.Contains(r.stdout, `"committed_offset":1`) {
		t.Fatalf("the preview moved the cursor: %+v", r)
	}
	r = runCLI(t, env, "", append(reset, "--execute", "--json")...)
	if rows := jsonLines[map[string]any](t, r.stdout); r.code != 0 || len(rows) != 1 || rows[0]["current"] != 1.0 || rows[0]["new"] != 0.0 || rows[0]["replay"] != 1.0 {
		t.Fatalf("reset-offsets --execute: %+v", r)
	}
	if r := runCLI(t, env, "", "admin", "offsets", "--tenant", "acme", "--group", "g", "--json"); !strings.Contains(r.stdout, `"committed_offset":0`) {
		t.Fatalf("--execute did not move the cursor: %+v", r)
	}
	if r := runCLI(t, env, "", "admin", "reset-offsets", "--tenant", "acme", "--topic", "orders", "--group", "typo", "--to-earliest"); r.code != 2 ||
		!strings.Contains(r.stderr, `"typo" has never read`) || !strings.Contains(r.stderr, "--create") {
		t.Fatalf("reset of an unknown group: %+v", r)
	}
	if r := runCLI(t, env, "", "admin", "reset-offsets", "--tenant", "acme", "--topic", "orders", "--group", "g", "--to-offset", "2"); r.code != 2 || !strings.Contains(r.stderr, "--key") {
		t.Fatalf("reset --to-offset without --key: %+v", r)
	}
	pub := decodeLines(t, runCLI(t, env, "", "publish", "--tenant", "acme", "--topic", "orders", "--key", "k", "--id", "x1", "--json", "payload").stdout)[0]
	inspect := []string{"admin", "inspect", "--tenant", "acme", "--topic", "orders", "--key", "k", "--id", "x1"}
	r = runCLI(t, env, "", append(inspect, "--json")...)
	if r.code != 0 || !strings.Contains(r.stdout, `"payload": "payload"`) || !strings.Contains(r.stdout, fmt.Sprintf(`"offset": %d`, pub.Offset)) ||
		!strings.Contains(r.stdout, `"status": "not reached"`) {
		t.Fatalf("inspect --json: %+v", r)
	}
	if r := runCLI(t, env, "", "admin", "reset-offsets", "--tenant", "acme", "--topic", "orders", "--group", "g", "--to-latest", "--execute"); r.code != 0 {
		t.Fatal(r)
	}
	r = runCLI(t, env, "", inspect...)
	if r.code != 0 || !strings.Contains(r.stdout, `payload (7 bytes): "payload"`) || !strings.Contains(r.stdout, "GROUP  STATUS") ||
		!strings.Contains(r.stdout, "\ng      consumed") {
		t.Fatalf("inspect (table) after the group passed it: %+v", r)
	}
	if r := runCLI(t, env, "", "admin", "delete", "--tenant", "acme", "--topic", "orders", "--key", "k"); r.code != 2 || !strings.Contains(r.stderr, `"id" not set`) {
		t.Fatalf("delete without --id: %+v", r)
	}
	if r := runCLI(t, env, "", "admin", "delete", "--tenant", "acme", "--topic", "orders", "--key", "k", "--id", "x1"); r.code != 0 || r.stdout != "deleted 1 message\n" {
		t.Fatalf("delete: %+v", r)
	}
	if r := runCLI(t, env, "", "admin", "inspect", "--tenant", "acme", "--topic", "orders", "--key", "k", "--id", "x1"); r.code != 1 || !strings.Contains(r.stderr, "no such message") {
		t.Fatalf("inspect after delete: %+v", r)
	}
	// A dead letter, listed and requeued.
	if r := runCLI(t, env, "", "publish", "--tenant", "acme", "--topic", "orders.dlq", "--key", "k", "--id", "dead1", "--header", "dlq_attempts=10", "bad"); r.code != 0 {
		t.Fatal(r)
	}
	r = runCLI(t, env, "", "admin", "dlq", "list", "--tenant", "acme", "--topic", "orders")
	if r.code != 0 || !strings.Contains(r.stdout, "dead1") {
		t.Fatalf("dlq list: %+v", r)
	}
	r = runCLI(t, env, "", "admin", "dlq", "list", "--tenant", "acme", "--topic", "orders", "--json")
	if dl := jsonLines[map[string]any](t, r.stdout); r.code != 0 || len(dl) != 1 || dl[0]["attempts"] != 10.0 || dl[0]["original_offset"] != nil {
		t.Fatalf("dlq list --json: %+v; want attempts as the number 10 and no original offset (null)", r)
	}
	if r := runCLI(t, env, "", "admin", "dlq", "requeue", "--tenant", "acme", "--topic", "orders"); r.code != 2 {
		t.Fatalf("requeue without --id or --all: %+v", r)
	}
	if r := runCLI(t, env, "", "admin", "dlq", "requeue", "--tenant", "acme", "--topic", "orders", "--all"); r.code != 0 || r.stdout != "requeued 1 dead letters\n" {
		t.Fatalf("requeue --all: %+v", r)
	}
	if r := runCLI(t, env, "", "admin", "dlq", "list", "--tenant", "acme", "--topic", "orders", "--json"); r.code != 0 || r.stdout != "" {
		t.Fatalf("dlq after requeue: %+v", r)
	}
	// Group g has passed everything of acme; a minimum retention of 0
	// lets the pass delete all four (a, b, c and the requeued dead letter),
	// and nothing of globex, where no group has a cursor.
	if r := runCLI(t, env, "", "admin", "reset-offsets", "--tenant", "acme", "--topic", "orders", "--group", "g", "--to-latest", "--execute"); r.code != 0 {
		t.Fatal(r)
	}
	r = runCLI(t, env, "", "admin", "retention", "run", "--all-tenants", "--min", "1ns", "--dedup-window", "0", "--json")
	if r.code != 0 || !strings.Contains(r.stdout, `"deleted":4`) {
		t.Fatalf("retention run: %+v", r)
	}
	if r := runCLI(t, env, "", "admin", "topics", "--tenant", "globex", "--json"); !strings.Contains(r.stdout, `"head_offset"`) {
		t.Fatalf("globex: %+v", r)
	}
}

// SHARDQ_TENANTS is the served tenant list: publishing elsewhere is
// refused before any SQL (exit 2), and nothing is stored. MQ_TENANTS, its
// former name, is read while SHARDQ_TENANTS is unset, with a warning, and
// loses to SHARDQ_TENANTS when both are set (the warning says so).
func TestPublishOutsideServedTenants(t *testing.T) {
	dsn := "sqlite://" + filepath.Join(t.TempDir(), "q.db")
	if r := runCLI(t, map[string]string{"SHARDQ_DSN": dsn}, "", "migrate"); r.code != 0 {
		t.Fatal(r)
	}
	for _, c := range []struct {
		env              map[string]string
		served, unserved string
		warning          string
	}{
		{map[string]string{"SHARDQ_TENANTS": "acme"}, "acme", "globex", ""},
		{map[string]string{"MQ_TENANTS": "acme"}, "acme", "globex", "warning: MQ_TENANTS is deprecated: rename it SHARDQ_TENANTS"},
		{map[string]string{"SHARDQ_TENANTS": "globex", "MQ_TENANTS": "acme"}, "globex", "acme",
			`warning: MQ_TENANTS is deprecated and ignored: SHARDQ_TENANTS is set too, and differs from it (SHARDQ_TENANTS wins: "globex", not "acme")`},
	} {
		env := map[string]string{"SHARDQ_DSN": dsn}
		for k, v := range c.env {
			env[k] = v
		}
		r := runCLI(t, env, "", "publish", "--tenant", c.unserved, "--topic", "refused", "hello")
		if r.code != 2 || !strings.Contains(r.stderr, fmt.Sprintf("%q is not served", c.unserved)) || !strings.Contains(r.stderr, c.warning) {
			t.Fatalf("%v: publish to %s: %+v; want it refused (exit 2)", c.env, c.unserved, r)
		}
		r = runCLI(t, env, "", "publish", "--tenant", c.served, "--topic", "orders", "hello")
		if r.code != 0 || strings.Count(r.stderr, "warning:") != min(1, len(c.warning)) || !strings.Contains(r.stderr, c.warning) {
			t.Fatalf("%v: publish to %s: %+v; want it stored, warned about at most once", c.env, c.served, r)
		}
		if r := runCLI(t, env, "", "admin", "topics", "--tenant", c.unserved); r.code != 0 || strings.Contains(r.stdout, "refused") {
			t.Fatalf("%v: %s after the refused publish: %+v", c.env, c.unserved, r)
		}
	}
}

// migrate status compares the database's schema version with the
// binary's; migrate --dry-run prints the pending migrations' SQL and
// changes nothing; migrate --print-sql prints every migration of the
// dialect without connecting.
func TestMigrateStatusDryRunAndPrintSQL(t *testing.T) {
	for _, db := range databases {
		t.Run(db.name, func(t *testing.T) {
			url := db.dsn(t)
			env := map[string]string{"SHARDQ_DSN": url}
			if strings.HasPrefix(url, "sqlite://") {
				// status and --dry-run never create a SQLite file.
				if r := runCLI(t, env, "", "migrate", "status"); r.code != 2 || !strings.Contains(r.stderr, "does not exist") {
					t.Fatalf("status of a missing file: %+v", r)
				}
				if err := os.WriteFile(strings.TrimPrefix(url, "sqlite://"), nil, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			r := runCLI(t, env, "", "migrate", "status")
			if r.code != 0 || !strings.Contains(r.stdout, "database: schema version 0") || !strings.Contains(r.stdout, "pending: 0001_init") {
				t.Fatalf("status before migrate: %+v", r)
			}
			r = runCLI(t, env, "", "migrate", "--dry-run")
			if r.code != 0 || !strings.Contains(r.stdout, "-- 0001_init") || !strings.Contains(r.stdout, "CREATE TABLE IF NOT EXISTS queue_messages") {
				t.Fatalf("--dry-run: %+v", r)
			}
			if r := runCLI(t, env, "", "migrate", "status"); !strings.Contains(r.stdout, "database: schema version 0") {
				t.Fatalf("--dry-run changed the schema: %+v", r)
			}
			if r := runCLI(t, env, "", "migrate"); r.code != 0 {
				t.Fatal(r)
			}
			r = runCLI(t, env, "", "migrate", "status")
			if r.code != 0 || !strings.Contains(r.stdout, "state:    up to date") || strings.Contains(r.stdout, "schema version 0") {
				t.Fatalf("status after migrate: %+v", r)
			}
			if r := runCLI(t, env, "", "migrate", "--dry-run"); r.code != 0 || !strings.Contains(r.stdout, "nothing would run") {
				t.Fatalf("--dry-run after migrate: %+v", r)
			}
			r = runCLI(t, env, "", "migrate", "--print-sql")
			if r.code != 0 || !strings.Contains(r.stdout, "-- 0001_init") || !strings.Contains(r.stdout, "-- 0009_receipt_keys") {
				t.Fatalf("--print-sql: %+v", r)
			}
			if r := runCLI(t, env, "", "migrate", "--dry-run", "--print-sql"); r.code != 2 {
				t.Fatalf("--dry-run with --print-sql: %+v", r)
			}
		})
	}
}

// publish --ttl stores the message's expiry, which readers honour.
func TestPublishTTL(t *testing.T) {
	dsn := "sqlite://" + filepath.Join(t.TempDir(), "q.db")
	env := map[string]string{"SHARDQ_DSN": dsn}
	if r := runCLI(t, env, "", "migrate"); r.code != 0 {
		t.Fatal(r)
	}
	before := time.Now()
	if r := runCLI(t, env, "", "publish", "--tenant", "acme", "--topic", "orders", "--key", "k", "--ttl", "1h", "p"); r.code != 0 {
		t.Fatalf("publish --ttl: %+v", r)
	}
	drv := openURL(t, dsn)
	msgs, err := drv.FetchAfter(context.Background(), driver.TopicPartition{Tenant: "acme", Topic: "orders", PartitionKey: "k"}, 0, 10)
	if err != nil || len(msgs) != 1 {
		t.Fatalf("stored: %+v, %v", msgs, err)
	}
	at, err := time.Parse(time.RFC3339Nano, msgs[0].Headers["shardq-expires-at"])
	if err != nil || at.Before(before.Add(time.Hour-time.Second)) || at.After(time.Now().Add(time.Hour)) {
		t.Fatalf("expiry header %q (%v), want an hour from the publish", msgs[0].Headers["shardq-expires-at"], err)
	}
}

// consume --dead-letter-expired dead-letters what expired instead of
// passing over it.
func TestConsumeDeadLetterExpired(t *testing.T) {
	dsn := "sqlite://" + filepath.Join(t.TempDir(), "q.db")
	env := map[string]string{"SHARDQ_DSN": dsn}
	if r := runCLI(t, env, "", "migrate"); r.code != 0 {
		t.Fatal(r)
	}
	for _, args := range [][]string{{"--id", "gone", "--ttl", "50ms", "p1"}, {"--id", "kept", "p2"}} {
		if r := runCLI(t, env, "", append([]string{"publish", "--tenant", "acme", "--topic", "orders", "--key", "k"}, args...)...); r.code != 0 {
			t.Fatalf("publish: %+v", r)
		}
	}
	time.Sleep(100 * time.Millisecond) // the first expires: no clock to inject into a command
	r := runCLI(t, env, "", "consume", "--tenant", "acme", "--topic", "orders", "--group", "g", "--max", "1", "--dead-letter-expired")
	if r.code != 0 || !strings.Contains(r.stdout, "p2") || strings.Contains(r.stdout, "p1") {
		t.Fatalf("consume: %+v", r)
	}
	drv := openURL(t, dsn)
	dlq, err := drv.FetchAfter(context.Background(), driver.TopicPartition{Tenant: "acme", Topic: "orders.dlq", PartitionKey: "k"}, 0, 10)
	if err != nil || len(dlq) != 1 || dlq[0].ID != "gone" {
		t.Fatalf("dead letters %+v, %v; want gone", dlq, err)
	}
}

// admin deferred lists a group's deferred messages and receives them by
// offset: printed and given back (deferred still), acked, or
// dead-lettered.
func TestAdminDeferred(t *testing.T) {
	ctx := context.Background()
	dsn := "sqlite://" + filepath.Join(t.TempDir(), "q.db")
	env := map[string]string{"SHARDQ_DSN": dsn}
	if r := runCLI(t, env, "", "migrate"); r.code != 0 {
		t.Fatal(r)
	}
	drv := openURL(t, dsn)
	c, err := shardq.NewClient(drv, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	res, err := c.Publish(ctx, shardq.Message{Tenant: "acme", Topic: "orders", PartitionKey: "k", ID: "a", Payload: []byte("pa")},
		shardq.Message{Tenant: "acme", Topic: "orders", PartitionKey: "k", ID: "b", Payload: []byte("pb")})
	if err != nil {
		t.Fatal(err)
	}
	rv, err := c.AcceptGroup(ctx, shardq.GroupRef{Tenant: "acme", Topic: "orders", ConsumerGroup: "g"}, "k", nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		d, err := rv.Receive(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := rv.Defer(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	if err := rv.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	group := []string{"--tenant", "acme", "--topic", "orders", "--group", "g"}
	r := runCLI(t, env, "", append([]string{"admin", "deferred", "list", "--json"}, group...)...)
	if r.code != 0 || strings.Count(r.stdout, "\n") != 2 || !strings.Contains(r.stdout, `"id":"a"`) {
		t.Fatalf("list: %+v", r)
	}
	a, b := fmt.Sprint(res[0].Offset), fmt.Sprint(res[1].Offset)
	r = runCLI(t, env, "", append([]string{"admin", "deferred", "receive", "--offset", a}, group...)...)
	if r.code != 0 || !strings.Contains(r.stdout, `"payload":"pa"`) {
		t.Fatalf("receive (given back): %+v", r)
	}
	r = runCLI(t, env, "", append([]string{"admin", "deferred", "receive", "--offset", a + "," + b, "--ack"}, group...)...)
	if r.code != 0 || strings.Count(r.stdout, "\n") != 2 {
		t.Fatalf("receive --ack: %+v", r)
	}
	if list, err := c.Admin().Deferred(ctx, shardq.GroupRef{Tenant: "acme", Topic: "orders", ConsumerGroup: "g"}, 0, 10); err != nil || len(list) != 0 {
		t.Fatalf("after --ack: %+v, %v", list, err)
	}
	r = runCLI(t, env, "", append([]string{"admin", "deferred", "receive", "--offset", "0"}, group...)...)
	if r.code == 0 || !strings.Contains(r.stderr, "offsets[0]") {
		t.Fatalf("a bad offset: %+v", r)
	}
}

// consume --instance-id runs a static member (its identity InstanceID@…)
// and applies to subscribers only.
func TestConsumeInstanceID(t *testing.T) {
	dsn := "sqlite://" + filepath.Join(t.TempDir(), "q.db")
	env := map[string]string{"SHARDQ_DSN": dsn}
	if r := runCLI(t, env, "", "migrate"); r.code != 0 {
		t.Fatal(r)
	}
	if r := runCLI(t, env, "", "publish", "--tenant", "acme", "--topic", "orders", "--key", "k", "p1"); r.code != 0 {
		t.Fatal(r)
	}
	r := runCLI(t, env, "", "consume", "--tenant", "acme", "--topic", "orders", "--group", "g", "--max", "1", "--instance-id", "billing-0", "--stale-after", "1m")
	if r.code != 0 || !strings.Contains(r.stdout, "p1") {
		t.Fatalf("consume --instance-id: %+v", r)
	}
	for _, args := range [][]string{{"--key", "k"}, {"--ungrouped"}} {
		r := runCLI(t, env, "", append([]string{"consume", "--tenant", "acme", "--topic", "orders", "--group", "g", "--max", "1", "--instance-id", "billing-0"}, args...)...)
		if r.code != 2 || !strings.Contains(r.stderr, "--instance-id") {
			t.Fatalf("consume --instance-id %v: %+v, want a usage error", args, r)
		}
	}
	if r := runCLI(t, env, "", "consume", "--tenant", "acme", "--topic", "orders", "--group", "g", "--max", "1", "--instance-id", strings.Repeat("x", 300)); r.code == 0 || !strings.Contains(r.stderr, "instance-id") {
		t.Fatalf("a bad --instance-id: %+v", r)
	}
}
