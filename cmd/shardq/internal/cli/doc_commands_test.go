// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode"
)

// docMarker precedes a ```sh or ```go block of the README or docs that
// must run as written.
const docMarker = "<!-- runs in TestDocCommands -->"

// docBlock is a marked block: shell lines, or a Go program.
type docBlock struct {
	lang, text string
}

// docBlocks returns the marked blocks of a Markdown file, in order.
func docBlocks(t *testing.T, path string) []docBlock {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var blocks []docBlock
	var cur *strings.Builder
	var lang string
	marked, fence := false, false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case cur != nil && line == "```":
			blocks = append(blocks, docBlock{lang, cur.String()})
			cur = nil
		case cur != nil:
			cur.WriteString(line + "\n")
		case marked && (line == "```sh" || line == "```go"):
			cur, lang, marked = &strings.Builder{}, strings.TrimPrefix(line, "```"), false
		case marked:
			t.Fatalf("%s: %q follows %s; want a ```sh or ```go block", path, line, docMarker)
		case line == docMarker:
			marked = true
		case strings.HasPrefix(line, "```"):
			fence = !fence
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if cur != nil || marked {
		t.Fatalf("%s: a marked block does not end", path)
	}
	return blocks
}

// The README's and the docs' marked blocks run as written, each file's
// in order in one shell in an empty directory, with the shardq command on
// PATH: every command must succeed, and any HTTP answer of 400 or more
// fails the run (curl is run with --fail-with-body). A Go block is a
// program, built in the library's module and run there in its turn. The
// one change: the ports they name (8080, 9464) become free ones.
func TestDocCommands(t *testing.T) {
	for _, tool := range []string{"bash", "curl", "jq", "openssl", "base64", "cmp", "stat", "head", "seq"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s is needed to run the docs' commands: %v", tool, err)
			}
			t.Skipf("%s is not installed: %v", tool, err)
		}
	}
	bin := t.TempDir()
	wrapper := fmt.Sprintf("#!/bin/sh\nSHARDQ_TEST_RUN_AS_CLI=1 exec %q \"$@\"\n", os.Args[0])
	if err := os.WriteFile(filepath.Join(bin, "shardq"), []byte(wrapper), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, doc := range []string{"README.md", "docs/server.md", "docs/large.md", "docs/observability.md"} {
		t.Run(doc, func(t *testing.T) {
			blocks := docBlocks(t, filepath.Join("../../../..", doc))
			if len(blocks) == 0 {
				t.Fatalf("%s has no block marked %s", doc, docMarker)
			}
			// The ports the blocks name become free ones.
			ports := strings.NewReplacer("127.0.0.1:8080", "127.0.0.1:"+freePort(t), "127.0.0.1:9464", "127.0.0.1:"+freePort(t))
			var lines []string
			for i, b := range blocks {
				if b.lang == "go" {
					lines = append(lines, buildDocProgram(t, doc, i, b.text))
					continue
				}
				lines = append(lines, b.text)
			}
			script := "set -euo pipefail\n" +
				// A server left running by a failed line is stopped.
				"trap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n" +
				"curl() { command curl --fail-with-body \"$@\"; }\n" +
				ports.Replace(strings.Join(lines, "\n")) +
				"wait\n"
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, "bash", "-c", script)
			// Past the deadline the whole group goes, a server in the
			// background too, whose output would hold the pipe open.
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
			cmd.WaitDelay = 5 * time.Second
			cmd.Dir = t.TempDir()
			cmd.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))
			// As a new user's shell: none of the command's settings.
			cmd.Env = slicesWithout(cmd.Env, "SHARDQ_", "OTEL_", "MQ_TENANTS=")
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("%s's commands failed: %v\n--- script\n%s\n--- output\n%s", doc, err, script, out)
			}
		})
	}
}

// freePort is a port nothing listens on now.
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return fmt.Sprint(ln.Addr().(*net.TCPAddr).Port)
}

// buildDocProgram builds a Go block as a program of the library's
// module and returns the shell line that runs it.
func buildDocProgram(t *testing.T, doc string, i int, src string) string {
	t.Helper()
	root, err := filepath.Abs("../../../..")
	if err != nil {
		t.Fatal(err)
	}
	// Inside the module, so that its imports resolve from the checkout; a
	// leading dot keeps the directory out of ./... patterns.
	dir, err := os.MkdirTemp(root, ".doc-program-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), fmt.Sprintf("program-%d", i))
	cmd := exec.Command("go", "build", "-o", bin, filepath.Join(dir, "main.go"))
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: Go block %d does not build: %v\n%s\n--- the block\n%s", doc, i, err, out, src)
	}
	return fmt.Sprintf("%q", bin)
}

// slicesWithout drops the variables whose entries start with any of
// prefixes.
func slicesWithout(env []string, prefixes ...string) []string {
	var out []string
	for _, e := range env {
		keep := true
		for _, p := range prefixes {
			if strings.HasPrefix(e, p) {
				keep = false
			}
		}
		if keep {
			out = append(out, e)
		}
	}
	return out
}

// mdLink is a Markdown link's target: [text](target).
var mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// anchorOf is a heading's anchor as GitHub makes it: lower case, spaces
// to hyphens, and every character but letters, digits, '-' and '_'
// dropped.
func anchorOf(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchorsOf lists a Markdown file's heading anchors (a repeated heading
// gets -1, -2, ... as on GitHub), outside code blocks.
func anchorsOf(t *testing.T, path string) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	anchors, seen := map[string]bool{}, map[string]int{}
	fence := false
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "```") {
			fence = !fence
		}
		if fence || !strings.HasPrefix(line, "#") {
			continue
		}
		a := anchorOf(strings.TrimLeft(line, "#"))
		if n := seen[a]; n > 0 {
			anchors[fmt.Sprintf("%s-%d", a, n)] = true
		} else {
			anchors[a] = true
		}
		seen[a]++
	}
	return anchors
}

// Every relative link of the README and the docs names a file that
// exists, and an anchor, when it has one, that a heading of that file
// makes.
func TestDocLinks(t *testing.T) {
	root := "../../../.."
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, extra := range []string{"README.md", "CHANGELOG.md", "CONTRIBUTING.md", "SECURITY.md", "deploy/helm/shardq/README.md"} {
		if _, err := os.Stat(filepath.Join(root, extra)); err == nil {
			files = append(files, filepath.Join(root, extra))
		}
	}
	anchors := map[string]map[string]bool{}
	checked := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		fence := false
		for n, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "```") {
				fence = !fence
			}
			if fence {
				continue
			}
			for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				file, anchor, _ := strings.Cut(target, "#")
				dest := f
				if file != "" {
					dest = filepath.Join(filepath.Dir(f), file)
					if _, err := os.Stat(dest); err != nil {
						t.Errorf("%s:%d: %s: no such file", f, n+1, target)
						continue
					}
				}
				checked++
				if anchor == "" || !strings.HasSuffix(dest, ".md") {
					continue
				}
				if anchors[dest] == nil {
					anchors[dest] = anchorsOf(t, dest)
				}
				if !anchors[dest][anchor] {
					t.Errorf("%s:%d: %s: no heading makes #%s", f, n+1, target, anchor)
				}
			}
		}
	}
	if checked < 100 {
		t.Fatalf("only %d links checked: the scan is broken", checked)
	}
}
