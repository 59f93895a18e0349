// SPDX-License-Identifier: Apache-2.0

package shardq_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/dsn"
	"github.com/shardq/shardq/internal/testdb"
)

func TestMain(m *testing.M) {
	if dsn := os.Getenv(killHelperEnv); dsn != "" {
		os.Exit(runKillHelper(dsn))
	}
	if dsn := os.Getenv(memberHelperEnv); dsn != "" {
		os.Exit(runMemberHelper(dsn))
	}
	if dsn := os.Getenv(feedHelperEnv); dsn != "" {
		os.Exit(runFeedHelper(dsn))
	}
	if dsn := os.Getenv(txKillHelperEnv); dsn != "" {
		os.Exit(runTxKillHelper(dsn))
	}
	if dsn := os.Getenv(staticHelperEnv); dsn != "" {
		os.Exit(runStaticHelper(dsn))
	}
	if dsn := os.Getenv(ackTxHelperEnv); dsn != "" {
		os.Exit(runAckTxHelper(dsn))
	}
	if dsn := os.Getenv(lockHelperEnv); dsn != "" {
		os.Exit(runLockHelper(dsn))
	}
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"))
}

// TestHashSelectorMapping pins the documented mapping, FNV-1a (32-bit) of
// the key's bytes modulo n, computed here with the standard library.
func TestHashSelectorMapping(t *testing.T) {
	sel := shardq.HashSelector(16)
	for _, arg := range []any{"customer-1", []byte("customer-1"), 12345, int64(-7), uint64(99)} {
		var key string
		switch v := arg.(type) {
		case string:
			key = v
		case []byte:
			key = string(v)
		case int:
			key = strconv.Itoa(v)
		case int64:
			key = strconv.FormatInt(v, 10)
		case uint64:
			key = strconv.FormatUint(v, 10)
		}
		h := fnv.New32a()
		h.Write([]byte(key))
		want := strconv.FormatUint(uint64(h.Sum32()%16), 10)
		got, err := sel.SelectPartition(&shardq.Message{}, arg)
		if err != nil || got != want {
			t.Errorf("HashSelector(16)(%v) = %q, %v; want %q", arg, got, err, want)
		}
	}
	if _, err := shardq.HashSelector(0).SelectPartition(&shardq.Message{}, "x"); err == nil {
		t.Error("HashSelector(0) accepted")
	}
	if _, err := sel.SelectPartition(&shardq.Message{}, 1.5); err == nil || !strings.Contains(err.Error(), "float64") {
		t.Errorf("float argument: %v", err)
	}
}

func TestClosedClientRefuses(t *testing.T) {
	d := testdb.Migrated(t, testdb.SQLite(t))
	c, err := shardq.NewClient(d, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if _, err := c.Publish(context.Background(), shardq.Message{Tenant: "t", Topic: "x"}); !errors.Is(err, shardq.ErrClosed) {
		t.Fatalf("Publish after Close = %v, want ErrClosed", err)
	}
	if _, err := shardq.NewClient(nil, nil); err == nil {
		t.Fatal("NewClient(nil) accepted")
	}
}

// publishSpread publishes total messages of tenant t, topic x, ids m0000
// on, over parts partitions p0, p1, … (one partition "k" when parts is 0),
// in one call, and returns them.
func publishSpread(t *testing.T, c *shardq.Client, parts, total int) []shardq.Message {
	t.Helper()
	batch := make([]shardq.Message, total)
	for i := range batch {
		key := "k"
		if parts > 0 {
			key = "p" + strconv.Itoa(i%parts)
		}
		batch[i] = shardq.Message{Tenant: "t", Topic: "x", PartitionKey: key, ID: fmt.Sprintf("m%04d", i)}
	}
	if _, err := c.Publish(context.Background(), batch...); err != nil {
		t.Fatal(err)
	}
	return batch
}

// openURL opens a migrated client on a shardq database URL; helper
// processes use it too.
func openURL(url string) (*shardq.Client, driver.Driver, error) {
	spec, err := dsn.Parse(url)
	if err != nil {
		return nil, nil, err
	}
	drv, err := dsn.Open(spec)
	if err != nil {
		return nil, nil, err
	}
	c, err := shardq.NewClient(drv, nil)
	if err != nil {
		drv.Close()
		return nil, nil, err
	}
	if err := c.Migrate(context.Background()); err != nil {
		c.Close()
		drv.Close()
		return nil, nil, err
	}
	return c, drv, nil
}

// eachDatabase runs fn on a fresh SQLite file and on a fresh MariaDB
// database, both migrated; url lets fn start helper processes on the same
// database.
func eachDatabase(t *testing.T, fn func(t *testing.T, url string, drv driver.Driver, c *shardq.Client)) {
	for _, db := range []struct {
		name string
		url  func(t *testing.T) string
	}{
		{"sqlite", func(t *testing.T) string { return "sqlite://" + filepath.Join(t.TempDir(), "q.db") }},
		{"mysql", func(t *testing.T) string { return testdb.MySQLURL(t, testdb.MySQLDatabase(t)) }},
	} {
		t.Run(db.name, func(t *testing.T) {
			url := db.url(t)
			c, drv, err := openURL(url)
			if err != nil {
				t.Fatal(err)
			}
			defer drv.Close()
			defer c.Close()
			fn(t, url, drv, c)
		})
	}
}
