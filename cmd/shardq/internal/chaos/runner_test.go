// SPDX-License-Identifier: Apache-2.0

package chaos

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPanicsFailTheRun: a server's recovered handler panic, or a crash
// (a panic, a fatal error), at the start of a line of any process's log
// fails the run, naming the log; lines longer than a read are skipped
// whole.
func TestPanicsFailTheRun(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("serve-0.1.log", `{"level":"INFO","msg":"a receive's panic is a bug, not a log line"}`+"\n")
	write("sub-0.1.log", "chaos: handled\n"+strings.Repeat("x", 20<<10)+"panic: in a long line, not at its start\n")
	if err := panics(dir); err != nil {
		t.Fatalf("clean logs: %v", err)
	}
	write("serve-1.2.log", "2026/12/06 21:00:00 http: panic serving 127.0.0.1:4242: runtime error: index out of range\n")
	write("sub-1.1.log", "goroutine 1 [running]:\npanic: boom\n")
	write("ung-0.1.log", strings.Repeat("y", 20<<10)+"\nfatal error: concurrent map writes")
	err := panics(dir)
	for _, name := range []string{"serve-1.2.log", "sub-1.1.log", "ung-0.1.log"} {
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Fatalf("panics: %v, want %s named", err, name)
		}
	}
	if strings.Contains(err.Error(), "serve-0.1.log") || strings.Contains(err.Error(), "sub-0.1.log") {
		t.Fatalf("panics: %v, names a clean log", err)
	}
}

// TestDiskFullLastsUntilTheDatabaseWrites: the disk-full fault's window
// ends only once the runner's probe write commits again, not when the
// fill is freed: MariaDB holds writers for up to a minute after, and a
// lease that lapses meanwhile is the fault's doing.
func TestDiskFullLastsUntilTheDatabaseWrites(t *testing.T) {
	probes := 0
	r := &runner{cfg: RunConfig{Probe: func(context.Context) error {
		if probes++; probes < 3 {
			return errors.New("injected: the binary log waits for free space")
		}
		return nil
	}}}
	if err := r.untilWritable(context.Background()); err != nil || probes != 3 {
		t.Fatalf("untilWritable = %v after %d probes, want nil after the third", err, probes)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r.cfg.Probe = func(context.Context) error { return errors.New("injected: still full") }
	if err := r.untilWritable(ctx); err == nil {
		t.Fatal("untilWritable returned nil while the probe never wrote")
	}
}
