// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/dsn"
)

// admin messages reads a topic, or one partition, from an offset or a
// time, as a table or JSON lines, and moves no cursor.
func TestBrowseMessages(t *testing.T) {
	for _, db := range databases {
		t.Run(db.name, func(t *testing.T) {
			env := map[string]string{"SHARDQ_DSN": db.dsn(t)}
			if r := runCLI(t, env, "", "migrate"); r.code != 0 {
				t.Fatal(r)
			}
			a := decodeLines(t, runCLI(t, env, "a0\na1\na2\n", "publish", "--tenant", "acme", "--topic", "orders", "--key", "a", "--lines", "--json").stdout)
			runCLI(t, env, "u0\nu1\n", "publish", "--tenant", "acme", "--topic", "orders", "--lines")
			base := []string{"admin", "messages", "--tenant", "acme", "--topic", "orders"}
			payloads := func(args ...string) []string {
				t.Helper()
				r := runCLI(t, env, "", append(append(base, args...), "--json")...)
				if r.code != 0 {
					t.Fatalf("%v: %+v", args, r)
				}
				var out []string
				for _, l := range jsonLines[consumeLine](t, r.stdout) {
					out = append(out, *l.Payload)
				}
				return out
			}
			if got := strings.Join(payloads(), " "); got != "a0 a1 a2 u0 u1" {
				t.Fatalf("the whole topic: %s", got)
			}
			if got := strings.Join(payloads("--key", "a", "--from-offset", itoa(a[0].Offset)), " "); got != "a1 a2" {
				t.Fatalf("--key a after its first: %s", got)
			}
			if got := strings.Join(payloads("--key", "", "--limit", "1"), " "); got != "u0" {
				t.Fatalf("ungrouped, limit 1: %s", got)
			}
			if got := payloads("--key", "a", "--from-time", "2099-01-01T00:00:00Z"); len(got) != 0 {
				t.Fatalf("from a future time: %v", got)
			}
			r := runCLI(t, env, "", base...)
			if r.code != 0 || !strings.Contains(r.stdout, "OFFSET") || !strings.Contains(r.stdout, `"a2"`) {
				t.Fatalf("table: %+v", r)
			}
			if r := runCLI(t, env, "", append(base, "--from-time", "2026-01-01T00:00:00Z")...); r.code != 2 || !strings.Contains(r.stderr, "needs a partition key") {
				t.Fatalf("--from-time without --key: %+v", r)
			}
			// Browsing made no consumer group.
			if r := runCLI(t, env, "", "admin", "groups", "--tenant", "acme", "--json"); r.code != 0 || r.stdout != "" {
				t.Fatalf("groups after browsing: %+v", r)
			}
		})
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// publish --file stores a file as one large message; consume --key K
// --assemble --max 1 writes it back whole on stdout, and so do --idle-exit
// and --next-group.
func TestLargeMessageThroughTheCLI(t *testing.T) {
	for _, db := range databases {
		t.Run(db.name, func(t *testing.T) {
			env := map[string]string{"SHARDQ_DSN": db.dsn(t)}
			if r := runCLI(t, env, "", "migrate"); r.code != 0 {
				t.Fatal(r)
			}
			data := make([]byte, 3<<20+17)
			rand.NewChaCha8([32]byte{9}).Read(data)
			path := filepath.Join(t.TempDir(), "blob.bin")
			if err := os.WriteFile(path, data, 0o600); err != nil {
				t.Fatal(err)
			}
			r := runCLI(t, env, "", "publish", "--tenant", "acme", "--topic", "files", "--id", "blob", "--file", path, "--chunk", "100000", "--json")
			var res struct {
				Key    string `json:"partition_key"`
				Chunks int    `json:"chunks"`
				Bytes  int64  `json:"bytes"`
			}
			if r.code != 0 || json.Unmarshal([]byte(r.stdout), &res) != nil || res.Bytes != int64(len(data)) || res.Chunks != len(data)/100000+1 {
				t.Fatalf("publish --file: %+v (%+v)", r, res)
			}
			r = runCLI(t, env, "", "consume", "--tenant", "acme", "--topic", "files", "--group", "g", "--key", res.Key, "--assemble", "--max", "1")
			if r.code != 0 || r.stdout != string(data) || !strings.Contains(r.stderr, `"id":"blob"`) {
				t.Fatalf("consume --assemble: exit %d, %d bytes out of %d, stderr %s", r.code, len(r.stdout), len(data), r.stderr)
			}
			// With --idle-exit and --next-group each receive has a deadline,
			// and the body is read after it: the whole message still comes.
			for group, mode := range map[string][]string{"idle": {"--key", res.Key}, "next": {"--next-group"}} {
				args := append([]string{"consume", "--tenant", "acme", "--topic", "files", "--group", group, "--assemble", "--idle-exit", "2s"}, mode...)
				if r := runCLI(t, env, "", args...); r.code != 0 || r.stdout != string(data) {
					t.Fatalf("consume %v: exit %d, %d bytes out of %d, stderr %s", mode, r.code, len(r.stdout), len(data), r.stderr)
				}
			}
			if r := runCLI(t, env, "", "consume", "--tenant", "acme", "--topic", "files", "--group", "g", "--assemble"); r.code != 2 {
				t.Fatalf("--assemble without --key: %+v", r)
			}
		})
	}
}

// A large message whose stored chunk was altered: consume --assemble says
// on stderr before the first byte that the check comes at the end, fails
// with an error naming the message, and nacks it, so the next run
// delivers it as its second attempt (dead-lettered after the last one)
// instead of writing the same bad bytes as a first delivery for ever.
func TestAssembleCorruptLargeMessage(t *testing.T) {
	for _, db := range databases {
		t.Run(db.name, func(t *testing.T) {
			url := db.dsn(t)
			env := map[string]string{"SHARDQ_DSN": url}
			if r := runCLI(t, env, "", "migrate"); r.code != 0 {
				t.Fatal(r)
			}
			path := filepath.Join(t.TempDir(), "blob.bin")
			if err := os.WriteFile(path, bytes.Repeat([]byte("x"), 300000), 0o600); err != nil {
				t.Fatal(err)
			}
			r := runCLI(t, env, "", "publish", "--tenant", "acme", "--topic", "files", "--id", "blob", "--key", "k", "--file", path, "--chunk", "100000")
			if r.code != 0 {
				t.Fatal(r)
			}
			sp, err := dsn.Parse(url)
			if err != nil {
				t.Fatal(err)
			}
			name, source := "mysql", sp.MySQL
			if sp.Driver == "sqlite" {
				name, source = "sqlite", sp.Path
			}
			raw, err := sql.Open(name, source)
			if err != nil {
				t.Fatal(err)
			}
			defer raw.Close()
			// Every chunk altered: same sizes, other bytes.
			if _, err := raw.Exec("UPDATE queue_messages SET payload = ? WHERE tenant = 'acme' AND topic = 'files' AND partition_key = 'k' AND id <> 'blob'",
				bytes.Repeat([]byte("y"), 100000)); err != nil {
				t.Fatal(err)
			}
			for attempt := 1; attempt <= 2; attempt++ {
				r = runCLI(t, env, "", "consume", "--tenant", "acme", "--topic", "files", "--group", "g", "--key", "k", "--assemble", "--max", "1")
				if r.code == 0 || !strings.Contains(r.stderr, "checked at the end") || !strings.Contains(r.stderr, `large message "blob"`) ||
					!strings.Contains(r.stderr, "SHA-256") || strings.Contains(r.stderr, "write stdout") {
					t.Fatalf("attempt %d: exit %d, stderr %s; want the notice, then an error naming blob's checksum", attempt, r.code, r.stderr)
				}
			}
			drv, err := dsn.Open(sp)
			if err != nil {
				t.Fatal(err)
			}
			defer drv.Close()
			states, err := drv.DeliveryStates(context.Background(), driver.PartitionRef{Tenant: "acme", Topic: "files", ConsumerGroup: "g", PartitionKey: "k"}, 0, 10)
			if err != nil || states[1].Attempts != 2 {
				t.Fatalf("delivery states %+v, %v; want two failed attempts recorded at offset 1", states, err)
			}
		})
	}
}

// consume in every mode writes a large message whole to --output-dir
// (one file, renamed into place only once checked) and its JSON line to
// stdout, and never prints a chunk; without --output-dir it refuses a
// large message with an error that says what to give, leaving it unacked.
func TestConsumeLargeToOutputDir(t *testing.T) {
	for _, db := range databases {
		t.Run(db.name, func(t *testing.T) {
			env := map[string]string{"SHARDQ_DSN": db.dsn(t)}
			if r := runCLI(t, env, "", "migrate"); r.code != 0 {
				t.Fatal(r)
			}
			data := make([]byte, 700000)
			rand.NewChaCha8([32]byte{3}).Read(data)
			path := filepath.Join(t.TempDir(), "blob.bin")
			if err := os.WriteFile(path, data, 0o600); err != nil {
				t.Fatal(err)
			}
			if r := runCLI(t, env, "", "publish", "--tenant", "acme", "--topic", "files", "--key", "k", "--id", "../blob", "--file", path, "--chunk", "100000"); r.code != 0 {
				t.Fatal(r)
			}
			if r := runCLI(t, env, "", "publish", "--tenant", "acme", "--topic", "files", "--key", "k", "--id", "note", "hello"); r.code != 0 {
				t.Fatal(r)
			}
			r := runCLI(t, env, "", "consume", "--tenant", "acme", "--topic", "files", "--group", "plain", "--idle-exit", "3s")
			if r.code == 0 || !strings.Contains(r.stderr, "--output-dir") || strings.Contains(r.stdout, "shardq-large") {
				t.Fatalf("consume of a large message without --output-dir: %+v", r)
			}
			for group, mode := range map[string][]string{"sub": nil, "key": {"--key", "k"}, "next": {"--next-group"}} {
				dir := t.TempDir()
				args := append([]string{"consume", "--tenant", "acme", "--topic", "files", "--group", group, "--output-dir", dir, "--max", "2", "--idle-exit", "10s"}, mode...)
				r := runCLI(t, env, "", args...)
				lines := jsonLines[map[string]any](t, r.stdout)
				if r.code != 0 || len(lines) != 2 || lines[0]["id"] != "../blob" || lines[0]["bytes"] != float64(len(data)) || lines[1]["id"] != "note" {
					t.Fatalf("consume %v --output-dir: %+v", mode, r)
				}
				want := filepath.Join(dir, "acme", "k", "%2E.%2Fblob")
				if lines[0]["file"] != want {
					t.Fatalf("file %v, want %s", lines[0]["file"], want)
				}
				if got, err := os.ReadFile(want); err != nil || !bytes.Equal(got, data) {
					t.Fatalf("%s: %d bytes, %v; want the large message whole", want, len(got), err)
				}
				if got, err := os.ReadFile(filepath.Join(dir, "acme", "k", "note")); err != nil || string(got) != "hello" {
					t.Fatalf("note: %q, %v", got, err)
				}
				left, _ := filepath.Glob(filepath.Join(dir, "acme", "k", ".shardq-*"))
				if len(left) != 0 {
					t.Fatalf("temporary files left: %v", left)
				}
			}
			if r := runCLI(t, env, "", "consume", "--tenant", "acme", "--topic", "files", "--group", "g", "--key", "k", "--assemble", "--output-dir", t.TempDir()); r.code != 2 {
				t.Fatalf("--assemble with --output-dir: %+v", r)
			}
		})
	}
}

func TestFileName(t *testing.T) {
	for in, want := range map[string]string{"": "%", "%": "%25", ".": "%2E", "..": "%2E.", "a/b": "a%2Fb", "x.y": "x.y", "ok-_9": "ok-_9", "é": "%C3%A9"} {
		if got, long := fileName(in); got != want || long {
			t.Errorf("fileName(%q) = %q, %t; want %q", in, got, long, want)
		}
	}
	// A key of 200 '/' escapes to 600 bytes, past what a file system
	// takes: it is hashed, and distinct long names stay distinct.
	a, longA := fileName(strings.Repeat("/", 200))
	b, longB := fileName(strings.Repeat("/", 199) + "x")
	if !longA || !longB || a == b || len(a) > maxFileName || !strings.HasPrefix(a, "%%") {
		t.Fatalf("long names %q (%t), %q (%t)", a, longA, b, longB)
	}
}

// A message whose key and id escape past a file name's length is written
// under their hashes, with each name in a side file, and its line names
// the file: nothing retries for ever on "file name too long".
func TestOutputDirLongNames(t *testing.T) {
	env := map[string]string{"SHARDQ_DSN": "sqlite://" + filepath.Join(t.TempDir(), "q.db")}
	if r := runCLI(t, env, "", "migrate"); r.code != 0 {
		t.Fatal(r)
	}
	key, id := strings.Repeat("/", 200), strings.Repeat("é", 100)
	if r := runCLI(t, env, "", "publish", "--tenant", "acme", "--topic", "files", "--key", key, "--id", id, "hello"); r.code != 0 {
		t.Fatal(r)
	}
	dir := t.TempDir()
	r := runCLI(t, env, "", "consume", "--tenant", "acme", "--topic", "files", "--group", "g", "--output-dir", dir, "--max", "1", "--idle-exit", "10s")
	lines := jsonLines[map[string]any](t, r.stdout)
	if r.code != 0 || len(lines) != 1 {
		t.Fatalf("consume --output-dir of a long key: %+v", r)
	}
	keyName, _ := fileName(key)
	idName, _ := fileName(id)
	want := filepath.Join(dir, "acme", keyName, idName)
	if lines[0]["file"] != want {
		t.Fatalf("file %v, want %s", lines[0]["file"], want)
	}
	if got, err := os.ReadFile(want); err != nil || string(got) != "hello" {
		t.Fatalf("%s: %q, %v", want, got, err)
	}
	for path, name := range map[string]string{filepath.Join(dir, "acme", keyName) + ".name": key, want + ".name": id} {
		if got, err := os.ReadFile(path); err != nil || string(got) != name {
			t.Fatalf("%s: %q, %v; want %q", path, got, err, name)
		}
	}
}
