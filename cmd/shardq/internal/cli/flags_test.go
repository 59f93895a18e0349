// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
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

// destructiveName matches the names of flags that, by their name, act,
// delete, overwrite, force or widen a command: each must be marked
// commandLineOnly, wherever it appears.
var destructiveName = regexp.MustCompile(`^(execute|force|create|yes|overwrite|delete|drop(-.+)?|purge|clear|wipe|truncate|remove|reset|apply|confirm|all|all-tenants|ack|dead-letter)$`)

// deletionThresholds are flags that decide what a command deletes, by
// command: command-line only, whatever their names.
var deletionThresholds = map[string][]string{
	"admin retention run": {"min", "max", "dlq-max", "partition-idle", "dedup-window"},
}

// No destructive flag takes its value from the environment: the command
// tree is walked with every SHARDQ_ variable set, and every flag marked
// commandLineOnly or named as destructive must be left unset (and its
// variable reported, to be warned about), with --help saying so; the other
// flags still take their variables.
func TestDestructiveFlagsNotFromEnvironment(t *testing.T) {
	root := newRoot(Env{Getenv: func(string) string { return "" }})
	every := func(name string) string {
		if strings.HasPrefix(name, "SHARDQ_") {
			return "1"
		}
		return ""
	}
	var walk func(c *cobra.Command)
	destructive, bound := map[string]bool{}, 0
	walk = func(c *cobra.Command) {
		path := strings.Fields(c.CommandPath())[1:] // without "shardq"
		e := withEnv(root, path, every)
		check := func(f *pflag.Flag) {
			if f.Name == "help" {
				return
			}
			where := strings.Join(append(path, "--"+f.Name), " ")
			if slices.Contains(deletionThresholds[strings.Join(path, " ")], f.Name) && !isCmdLineOnly(f) {
				t.Errorf("%s: decides what is deleted but is not marked commandLineOnly", where)
			}
			if !isCmdLineOnly(f) && !destructiveName.MatchString(f.Name) {
				if slices.Contains(e.set, f.Name) {
					bound++
				}
				return
			}
			destructive[where] = true
			if !isCmdLineOnly(f) {
				t.Errorf("%s: named as destructive but not marked commandLineOnly", where)
			}
			if slices.Contains(e.set, f.Name) {
				t.Errorf("%s: set from $%s", where, envName(f.Name))
			}
			if !slices.Contains(e.ignored, f.Name) {
				t.Errorf("%s: $%s is set but not reported as ignored", where, envName(f.Name))
			}
			if strings.Contains(f.Usage, "$"+envName(f.Name)) || !strings.HasSuffix(f.Usage, cmdLineOnlyNote) {
				t.Errorf("%s: help %q; want it to end %q, naming no variable", where, f.Usage, cmdLineOnlyNote)
			}
		}
		c.LocalFlags().VisitAll(check)
		c.InheritedFlags().VisitAll(check)
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	for _, want := range []string{"admin tenant delete --execute", "admin tenant delete --force", "admin reset-offsets --execute",
		"admin reset-offsets --force", "admin reset-offsets --create", "admin groups delete --force", "admin dlq requeue --all",
		"admin retention run --all-tenants", "admin pause --all-tenants", "receipt-key rotate --drop-previous", "admin tenant limits --max-bytes"} {
		if !destructive[want] {
			t.Errorf("%s: not among the destructive flags the walk found", want)
		}
	}
	if len(destructive) < 30 || bound < 100 {
		t.Fatalf("%d destructive flags and %d bound ones; the walk missed the command tree", len(destructive), bound)
	}
	t.Logf("%d destructive flags left to the command line; %d others bound to their variables", len(destructive), bound)
}

// SHARDQ_EXECUTE, SHARDQ_FORCE and SHARDQ_CREATE make no preview act: each
// is ignored with a warning naming it, and only --execute on the command
// line deletes or moves a cursor.
func TestDestructiveVariablesIgnored(t *testing.T) {
	env := map[string]string{"SHARDQ_DSN": "sqlite://" + filepath.Join(t.TempDir(), "q.db")}
	if r := runCLI(t, env, "", "migrate"); r.code != 0 {
		t.Fatal(r)
	}
	for _, key := range []string{"a", "b"} {
		if r := runCLI(t, env, "", "publish", "--tenant", "acme", "--topic", "orders", "--key", key, "p"); r.code != 0 {
			t.Fatal(r)
		}
	}
	if r := runCLI(t, env, "", "consume", "--tenant", "acme", "--topic", "orders", "--group", "g", "--max", "2"); r.code != 0 {
		t.Fatal(r)
	}
	env["SHARDQ_EXECUTE"], env["SHARDQ_FORCE"], env["SHARDQ_CREATE"] = "1", "true", "1"
	warned := func(r result, vars ...string) bool {
		for _, v := range vars {
			if !strings.Contains(r.stderr, "warning: $"+v+" is ignored: --") {
				return false
			}
		}
		return true
	}
	r := runCLI(t, env, "", "admin", "tenant", "delete", "--tenant", "acme")
	if r.code != 0 || !strings.Contains(r.stdout, "preview: nothing changed; run again with --execute to delete the") ||
		!warned(r, "SHARDQ_EXECUTE", "SHARDQ_FORCE") {
		t.Fatalf("admin tenant delete with SHARDQ_EXECUTE=1: %+v; want the preview and a warning per variable", r)
	}
	messages := func() int {
		t.Helper()
		r := runCLI(t, env, "", "admin", "messages", "--tenant", "acme", "--topic", "orders", "--json")
		if r.code != 0 {
			t.Fatal(r)
		}
		return len(jsonLines[map[string]any](t, r.stdout))
	}
	if n := messages(); n != 2 {
		t.Fatalf("%d messages of acme after the preview; want 2", n)
	}
	reset := []string{"admin", "reset-offsets", "--tenant", "acme", "--topic", "orders", "--group", "g", "--to-earliest"}
	if r := runCLI(t, env, "", reset...); r.code != 0 || !strings.Contains(r.stdout, "preview: nothing changed") || !warned(r, "SHARDQ_EXECUTE", "SHARDQ_FORCE", "SHARDQ_CREATE") {
		t.Fatalf("reset-offsets with SHARDQ_EXECUTE=1: %+v", r)
	}
	if r := runCLI(t, env, "", "admin", "offsets", "--tenant", "acme", "--group", "g", "--json"); strings.Contains(r.stdout, `"committed_offset":0`) {
		t.Fatalf("the preview moved a cursor: %+v", r)
	}
	typo := []string{"admin", "reset-offsets", "--tenant", "acme", "--topic", "orders", "--group", "typo", "--to-earliest", "--execute"}
	if r := runCLI(t, env, "", typo...); r.code != 2 || !strings.Contains(r.stderr, `"typo" has never read`) {
		t.Fatalf("reset of a group never seen with SHARDQ_CREATE=1: %+v; want it refused", r)
	}
	// The command line still acts.
	if r := runCLI(t, env, "", "admin", "tenant", "delete", "--tenant", "acme", "--execute"); r.code != 0 || !strings.Contains(r.stdout, "\ndeleted ") || strings.Contains(r.stdout, "preview") {
		t.Fatalf("admin tenant delete --execute: %+v", r)
	}
	if n := messages(); n != 0 {
		t.Fatalf("%d messages of acme after --execute; want 0", n)
	}
}
