// SPDX-License-Identifier: Apache-2.0

package sqlitedriver_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"

	"go.uber.org/goleak"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/driver/drivertest"
	"github.com/shardq/shardq/driver/sqlitedriver"
	"github.com/shardq/shardq/internal/testdb"
)

// helperEnv makes the test binary act as a second publisher process.
const helperEnv = "SHARDQ_SQLITE_HELPER_DB"

func TestMain(m *testing.M) {
	if path := os.Getenv(helperEnv); path != "" {
		if err := publishFromHelper(path, os.Getenv("SHARDQ_SQLITE_HELPER_NAME")); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"))
}

func TestConformance(t *testing.T) {
	drivertest.RunParallel(t, func(t *testing.T) driver.Driver { return testdb.SQLite(t) }, nil)
}

const perProcess = 300

func publishFromHelper(path, name string) error {
	d, err := sqlitedriver.Open(path, nil)
	if err != nil {
		return err
	}
	defer d.Close()
	for i := range perProcess {
		if _, err := drivertest.Insert(context.Background(), d, driver.InsertMessage{Tenant: "t", Topic: "x", PartitionKey: "shared",
			ID: name + "-" + strconv.Itoa(i)}); err != nil {
			return fmt.Errorf("%s message %d: %w", name, i, err)
		}
	}
	return nil
}

// TestTwoProcessesOneFile runs publishers in two processes on one file
// while this process reads: every message arrives once, in offset order.
func TestTwoProcessesOneFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "shared.db")
	d := testdb.Migrated(t, must(sqlitedriver.Open(path, nil)))
	defer d.Close()

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+path, "SHARDQ_SQLITE_HELPER_NAME=child")
	out := make(chan error, 1)
	var stderr []byte
	go func() {
		var err error
		stderr, err = cmd.CombinedOutput()
		out <- err
	}()
	parent := make(chan error, 1)
	go func() { parent <- publishFromHelper(path, "parent") }()

	ctx := context.Background()
	var cursor int64
	var offsets []int64
	seen := map[string]bool{}
	for pending := 2; ; {
		select {
		case err := <-out:
			if err != nil {
				t.Fatalf("child process: %v\n%s", err, stderr)
			}
			pending--
		case err := <-parent:
			if err != nil {
				t.Fatalf("parent publisher: %v", err)
			}
			pending--
		default:
		}
		msgs, err := d.FetchAfter(ctx, driver.TopicPartition{Tenant: "t", Topic: "x", PartitionKey: "shared"}, cursor, 50)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			if seen[m.ID] {
				t.Fatalf("%s read twice", m.ID)
			}
			seen[m.ID] = true
			offsets = append(offsets, m.Offset)
			cursor = m.Offset
		}
		if pending == 0 && len(msgs) == 0 {
			break
		}
	}
	if len(seen) != 2*perProcess {
		t.Fatalf("read %d messages, want %d", len(seen), 2*perProcess)
	}
	if !slices.IsSorted(offsets) {
		t.Fatal("offsets out of order across processes")
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// A new database file, and its -wal and -shm companions, are readable by
// their owner only, whatever the umask lets through; an existing file
// keeps the mode its owner gave it.
func TestNewFileIsPrivate(t *testing.T) {
	old := syscall.Umask(0o022) // the usual umask, which left SQLite's files 0644
	defer syscall.Umask(old)
	dir := t.TempDir()
	mode := func(path string) os.FileMode {
		t.Helper()
		st, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		return st.Mode().Perm()
	}
	path := filepath.Join(dir, "new.db")
	testdb.Migrated(t, openPath(t, path)) // open (WAL mode) and written: all three files exist
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		if m := mode(p); m != 0o600 {
			t.Errorf("%s: mode %v; want 0600", filepath.Base(p), m)
		}
	}

	existing := filepath.Join(dir, "existing.db")
	if err := os.WriteFile(existing, nil, 0o640); err != nil {
		t.Fatal(err)
	}
	testdb.Migrated(t, openPath(t, existing))
	if m := mode(existing); m != 0o640 {
		t.Errorf("existing file: mode %v; want its own 0640", m)
	}
}

func openPath(t *testing.T, path string) *sqlitedriver.Driver {
	t.Helper()
	d, err := sqlitedriver.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}
