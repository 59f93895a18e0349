// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
)

// On a terminal, publish --lines shows its progress on stderr and ends
// with a summary; in a pipe (every other test) or with --json it says
// nothing there.
func TestPublishProgressOnATerminal(t *testing.T) {
	env := map[string]string{"SHARDQ_DSN": databases[0].dsn(t)}
	if r := runCLI(t, env, "", "migrate"); r.code != 0 {
		t.Fatal(r)
	}
	lines := strings.Repeat("x\n", 2500)
	run := func(args ...string) (string, int) {
		var out, errb bytes.Buffer
		code := Main(context.Background(), args, Env{Stdin: strings.NewReader(lines), Stdout: &out, Stderr: &errb,
			Getenv: func(k string) string { return env[k] }, StderrTerminal: true})
		return errb.String(), code
	}
	stderr, code := run("publish", "--tenant", "acme", "--topic", "orders", "--lines")
	if code != 0 || !strings.Contains(stderr, "\rpublished 2500 messages (0 duplicates) in ") {
		t.Fatalf("exit %d, stderr %q; want a summary of 2500 messages", code, stderr)
	}
	if stderr, code := run("publish", "--tenant", "acme", "--topic", "orders", "--lines", "--json"); code != 0 || stderr != "" {
		t.Fatalf("--json: exit %d, stderr %q; want nothing on stderr", code, stderr)
	}
	if r := runCLI(t, env, lines, "publish", "--tenant", "acme", "--topic", "orders", "--lines"); r.code != 0 || r.stderr != "" {
		t.Fatalf("not a terminal: %+v; want nothing on stderr", r)
	}
}

// dlq requeue --all and retention run report progress and a summary on a
// terminal, through Admin.WithProgress.
func TestAdminProgressOnATerminal(t *testing.T) {
	env := map[string]string{"SHARDQ_DSN": databases[0].dsn(t)}
	if r := runCLI(t, env, "", "migrate"); r.code != 0 {
		t.Fatal(r)
	}
	if r := runCLI(t, env, "a\nb\nc\n", "publish", "--tenant", "acme", "--topic", "orders.dlq", "--key", "k", "--lines"); r.code != 0 {
		t.Fatal(r)
	}
	run := func(args ...string) (string, int) {
		var out, errb bytes.Buffer
		code := Main(context.Background(), args, Env{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errb,
			Getenv: func(k string) string { return env[k] }, StderrTerminal: true})
		return errb.String(), code
	}
	if stderr, code := run("admin", "dlq", "requeue", "--tenant", "acme", "--topic", "orders", "--all"); code != 0 ||
		!strings.Contains(stderr, "\rrequeued 3 dead letters in ") {
		t.Fatalf("requeue --all: exit %d, stderr %q", code, stderr)
	}
	if stderr, code := run("admin", "retention", "run", "--tenant", "acme", "--min", "1ns", "--max", "1ns", "--dedup-window", "0"); code != 0 ||
		!strings.Contains(stderr, "\rdeleted 3 messages in ") {
		t.Fatalf("retention run: exit %d, stderr %q", code, stderr)
	}
}

// /dev/null is a character device, not a terminal: progress lines must
// not go there (nor to a pipe or a file).
func TestIsTerminalRefusesDevNull(t *testing.T) {
	f, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if IsTerminal(f) {
		t.Fatalf("IsTerminal(%s) = true", os.DevNull)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if IsTerminal(w) {
		t.Fatal("IsTerminal(pipe) = true")
	}
}
