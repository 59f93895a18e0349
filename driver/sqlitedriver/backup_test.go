// SPDX-License-Identifier: Apache-2.0

package sqlitedriver_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/driver/drivertest"
	"github.com/shardq/shardq/driver/sqlitedriver"
)

// A backup taken while a publisher writes is a whole database: it passes
// SQLite's integrity check, and holds the publisher's messages up to some
// point, each once and in order, nothing after a gap. It is private (mode
// 0600, as the database), leaves no temporary file, and never overwrites
// a file.
func TestBackupWhileWriting(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	d, err := sqlitedriver.Open(filepath.Join(dir, "q.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, err := d.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	published := 0
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := drivertest.Insert(ctx, d, driver.InsertMessage{Tenant: "t", Topic: "x", PartitionKey: "k", ID: fmt.Sprint(i), Payload: []byte(fmt.Sprint(i))}); err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			published = i + 1
			mu.Unlock()
		}
	})
	waitPublished := func(n int) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Millisecond) {
			mu.Lock()
			p := published
			mu.Unlock()
			if p >= n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the publisher published %d of %d", p, n)
			}
		}
	}
	waitPublished(20)
	if err := d.Backup(ctx, filepath.Join(dir, "a.db")); err != nil { // while the publisher runs
		t.Fatal(err)
	}
	mu.Lock()
	after := published
	mu.Unlock()
	waitPublished(after + 20) // it went on
	if err := d.Backup(ctx, filepath.Join(dir, "b.db")); err != nil {
		t.Fatal(err)
	}
	close(stop)
	wg.Wait()
	if left, _ := filepath.Glob(filepath.Join(dir, ".*.part")); len(left) != 0 {
		t.Fatalf("temporary files left: %v", left)
	}
	for _, name := range []string{"a.db", "b.db"} {
		if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v, %v; want mode 0600", name, fi.Mode(), err)
		}
	}
	if err := d.Backup(ctx, filepath.Join(dir, "a.db")); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("a backup onto an existing file: %v", err)
	}
	for _, name := range []string{"a.db", "b.db"} {
		b, err := sqlitedriver.Open(filepath.Join(dir, name), nil)
		if err != nil {
			t.Fatal(err)
		}
		var ok string
		if err := b.DB().QueryRowContext(ctx, "PRAGMA integrity_check").Scan(&ok); err != nil || ok != "ok" {
			t.Fatalf("%s: integrity check %q, %v", name, ok, err)
		}
		ms, err := b.FetchAfter(ctx, driver.TopicPartition{Tenant: "t", Topic: "x", PartitionKey: "k"}, 0, 1_000_000)
		if err != nil {
			t.Fatal(err)
		}
		for i, m := range ms {
			if m.ID != fmt.Sprint(i) {
				t.Fatalf("%s: message %d is %q: the copy is not a prefix of what was published", name, i, m.ID)
			}
		}
		if len(ms) < 20 || len(ms) > published {
			t.Fatalf("%s holds %d messages; at least 20 were published before it began, %d in all", name, len(ms), published)
		}
		b.Close()
	}
}
