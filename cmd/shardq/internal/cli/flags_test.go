// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// Every flag of every command that takes one value refuses a second one
// (exit 2, naming the flag) instead of keeping the last; repeatable flags
// stay repeatable. The command tree is walked, so a new command or flag
// is covered without a new test. --help keeps any command body from
// running, should a repeat be accepted.
func TestFlagGivenTwice(t *testing.T) {
	var walk func(c *cobra.Command)
	single, repeatable := 0, 0
	walk = func(c *cobra.Command) {
		path := strings.Fields(c.CommandPath())[1:] // without "shardq"
		check := func(f *pflag.Flag) {
			if f.Name == "help" {
				return
			}
			_, slice := f.Value.(pflag.SliceValue)
			v := f.DefValue // valid for the flag, whatever its type
			if slice {
				v = "a"
				if strings.HasPrefix(f.Value.Type(), "int") { // --offset
					v = "1"
				}
			}
			args := append(append([]string(nil), path...), "--"+f.Name+"="+v, "--"+f.Name+"="+v, "--help")
			r := runCLI(t, nil, "", args...)
			switch {
			case slice:
				repeatable++
				if r.code != 0 || strings.Contains(r.stderr, "given twice") {
					t.Errorf("%v: exit %d, %q; want the repeatable flag accepted", args, r.code, r.stderr)
				}
			default:
				single++
				if want := "error: --" + f.Name + " given twice (it takes one value)\n"; r.code != 2 || r.stderr != want {
					t.Errorf("%v: exit %d, %q; want 2, %q", args, r.code, r.stderr, want)
				}
			}
		}
		c.LocalFlags().VisitAll(check)
		c.InheritedFlags().VisitAll(check)
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(newRoot(Env{Getenv: func(string) string { return "" }}))
	if single < 50 || repeatable < 3 {
		t.Fatalf("checked %d single-valued and %d repeatable flags; the walk missed the command tree", single, repeatable)
	}
	t.Logf("%d single-valued and %d repeatable flags checked", single, repeatable)
	// The value given once is the value used.
	if r := runCLI(t, nil, "", "publish", "--tenant", "acme", "--topic", "t", "--tenant", "other", "x"); r.code != 2 || !strings.Contains(r.stderr, "--tenant given twice") {
		t.Fatalf("publish --tenant twice: %+v", r)
	}
}

// Every flag takes its value from SHARDQ_<FLAG> when the command line
// does not give it (a required flag included); the command line wins; a
// value the flag refuses names the variable; --help names each variable.
func TestFlagsFromEnvironment(t *testing.T) {
	dsn := "sqlite://" + filepath.Join(t.TempDir(), "q.db")
	env := map[string]string{"SHARDQ_DSN": dsn, "SHARDQ_TENANT": "acme", "SHARDQ_TOPIC": "orders", "SHARDQ_IDLE_EXIT": "1s"}
	if r := runCLI(t, env, "", "migrate"); r.code != 0 {
		t.Fatal(r)
	}
	if r := runCLI(t, env, "", "publish", "--id", "m1", "from-env"); r.code != 0 || !strings.Contains(r.stdout, "tenant=acme topic=orders") {
		t.Fatalf("publish with tenant and topic from the environment: %+v", r)
	}
	if r := runCLI(t, env, "", "publish", "--topic", "other", "--id", "m2", "flag-wins"); r.code != 0 || !strings.Contains(r.stdout, "topic=other") {
		t.Fatalf("the command line's --topic over SHARDQ_TOPIC: %+v", r)
	}
	if r := runCLI(t, env, "", "consume", "--group", "g"); r.code != 0 || !strings.Contains(r.stdout, `"from-env"`) || strings.Contains(r.stdout, "flag-wins") {
		t.Fatalf("consume with --idle-exit from the environment: %+v", r)
	}
	// admin dlq requeue marks --tenant and --topic required: the
	// environment satisfies them.
	if r := runCLI(t, env, "", "admin", "dlq", "requeue", "--all"); r.code != 0 {
		t.Fatalf("required flags from the environment: %+v", r)
	}
	bad := map[string]string{"SHARDQ_DSN": dsn, "SHARDQ_IDLE_EXIT": "soon"}
	if r := runCLI(t, bad, "", "consume", "--tenant", "acme", "--topic", "orders", "--group", "g"); r.code != 2 || !strings.Contains(r.stderr, "$SHARDQ_IDLE_EXIT") {
		t.Fatalf("a refused value from the environment: %+v", r)
	}
	if r := runCLI(t, nil, "", "consume", "--help"); !strings.Contains(r.stdout, "[$SHARDQ_IDLE_EXIT]") || !strings.Contains(r.stdout, "$SHARDQ_DSN") {
		t.Fatalf("--help names the variables: %s", r.stdout)
	}
}

// --log-format and --log-level (or their variables) shape every
// command's log lines on stderr; a value they do not know is a usage
// error naming the flag.
func TestLogFlags(t *testing.T) {
	dir := t.TempDir()
	env := map[string]string{"SHARDQ_DSN": "sqlite://" + filepath.Join(dir, "q.db")}
	if r := runCLI(t, env, "", "migrate"); r.code != 0 {
		t.Fatal(r)
	}
	consume := []string{"consume", "--tenant", "acme", "--topic", "x", "--group", "g", "--idle-exit", "100ms"}
	r := runCLI(t, env, "", append([]string{"--log-format", "json", "--log-level", "info"}, consume...)...)
	var line map[string]any
	first, _, _ := strings.Cut(r.stderr, "\n")
	if r.code != 0 || json.Unmarshal([]byte(first), &line) != nil || line["level"] != "INFO" || !strings.Contains(fmt.Sprint(line["msg"]), "change feed") {
		t.Fatalf("consume --log-format json --log-level info: %+v", r)
	}
	if r := runCLI(t, env, "", consume...); r.code != 0 || r.stderr != "" {
		t.Fatalf("consume at the default level (warn): %+v", r)
	}
	env["SHARDQ_LOG_LEVEL"] = "info"
	if r := runCLI(t, env, "", consume...); r.code != 0 || !strings.Contains(r.stderr, "level=INFO") {
		t.Fatalf("consume with SHARDQ_LOG_LEVEL=info: %+v", r)
	}
	for _, args := range [][]string{{"--log-level", "loud", "version"}, {"--log-format", "xml", "version"}} {
		if r := runCLI(t, nil, "", args...); r.code != 2 || !strings.Contains(r.stderr, args[0]) {
			t.Errorf("%v: %+v", args, r)
		}
	}
}
