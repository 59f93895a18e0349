// SPDX-License-Identifier: Apache-2.0

package shardq_test

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver/mysqldriver"
)

// privateMariaDB is a mariadbd of the test's own, on a free port over a
// temporary data directory, so that crashing it disturbs no other test.
type privateMariaDB struct {
	dir  string
	port int
	cmd  *exec.Cmd
}

func startPrivateMariaDB(t *testing.T) *privateMariaDB {
	t.Helper()
	for _, bin := range []string{"/usr/sbin/mariadbd", "/usr/bin/mariadb-install-db"} {
		if _, err := os.Stat(bin); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s missing: scripts/test installs mariadb-server", bin)
			}
			t.Skipf("%s missing (never skipped in CI)", bin)
		}
	}
	m := &privateMariaDB{dir: t.TempDir()}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m.port = ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	install := exec.Command("/usr/bin/mariadb-install-db", "--no-defaults", "--datadir="+filepath.Join(m.dir, "data"),
		"--auth-root-authentication-method=normal", "--skip-test-db")
	if os.Geteuid() == 0 {
		install.Args = append(install.Args, "--user=root")
	}
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("mariadb-install-db: %v\n%s", err, out)
	}
	m.start(t)
	t.Cleanup(func() { m.crash(t) })
	return m
}

func (m *privateMariaDB) start(t *testing.T) {
	t.Helper()
	m.cmd = exec.Command("/usr/sbin/mariadbd", "--no-defaults", "--datadir="+filepath.Join(m.dir, "data"),
		"--socket="+filepath.Join(m.dir, "sock"), "--port="+strconv.Itoa(m.port), "--bind-address=127.0.0.1",
		"--pid-file="+filepath.Join(m.dir, "pid"), "--skip-log-bin", "--innodb-buffer-pool-size=32M")
	if os.Geteuid() == 0 {
		m.cmd.Args = append(m.cmd.Args, "--user=root")
	}
	log, err := os.Create(filepath.Join(m.dir, "server.log"))
	if err != nil {
		t.Fatal(err)
	}
	m.cmd.Stdout, m.cmd.Stderr = log, log
	if err := m.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", m.port)); err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			out, _ := os.ReadFile(filepath.Join(m.dir, "server.log"))
			t.Fatalf("private mariadbd did not listen within 30 s:\n%s", out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// crash kills the server with SIGKILL: no clean shutdown, InnoDB recovers
// at the next start.
func (m *privateMariaDB) crash(t *testing.T) {
	if m.cmd == nil || m.cmd.Process == nil {
		return
	}
	m.cmd.Process.Kill()
	m.cmd.Wait()
	m.cmd = nil
}

// TestDatabaseCrashMidRun is invariant 4 of docs/design.md for the database: the
// server is killed and restarted while a publisher and a subscriber run.
// Every publish that returned success is delivered, and each message's
// first delivery comes in offset order within its partition (a message
// may come again after a lease lapsed during the outage).
func TestDatabaseCrashMidRun(t *testing.T) {
	m := startPrivateMariaDB(t)
	ctx := context.Background()
	admin, err := sql.Open("mysql", fmt.Sprintf("root@tcp(127.0.0.1:%d)/", m.port))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec("CREATE DATABASE shardq"); err != nil {
		t.Fatal(err)
	}
	admin.Close()
	drv, err := mysqldriver.Open(fmt.Sprintf("root@tcp(127.0.0.1:%d)/shardq?timeout=2s&readTimeout=5s&writeTimeout=5s", m.port))
	if err != nil {
		t.Fatal(err)
	}
	defer drv.Close()
	c, err := shardq.NewClient(drv, &shardq.Config{PublishTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Migrate(ctx); err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	firstSeen := map[string]bool{}
	lastFirst := map[string]int64{}
	var disorder []string
	sub, err := c.Subscribe(ctx, faultSubscriberConfig(func(_ context.Context, d *shardq.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		if firstSeen[d.ID] {
			return nil // redelivery after the outage: allowed
		}
		if d.Offset <= lastFirst[d.PartitionKey] {
			disorder = append(disorder, fmt.Sprintf("%s: first delivery of offset %d after %d", d.PartitionKey, d.Offset, lastFirst[d.PartitionKey]))
		}
		firstSeen[d.ID], lastFirst[d.PartitionKey] = true, d.Offset
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}

	// The publisher retries a failed batch with the same ids until it is
	// acknowledged: safe, because publish is idempotent by id.
	var acked []string
	failed := 0 // publish attempts refused while the server was down
	publishBatch := func(from int) {
		var batch []shardq.Message
		for i := from; i < from+10; i++ {
			batch = append(batch, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: fmt.Sprintf("p%d", i%8), ID: fmt.Sprintf("m%05d", i)})
		}
		for attempt := 0; ; attempt++ {
			if _, err := c.Publish(ctx, batch...); err == nil {
				break
			}
			failed++
			if attempt == 600 {
				t.Fatalf("batch at %d never acknowledged", from)
			}
			time.Sleep(50 * time.Millisecond)
		}
		for _, msg := range batch {
			acked = append(acked, msg.ID)
		}
	}
	for i := 0; i < 400; i += 10 {
		publishBatch(i)
	}
	m.crash(t)
	done := make(chan struct{})
	go func() { // publishing goes on (failing, retrying) while the server is down
		defer close(done)
		for i := 400; i < 800; i += 10 {
			publishBatch(i)
		}
	}()
	time.Sleep(time.Second)
	m.start(t)
	<-done

	deadline := time.Now().Add(time.Minute)
	for {
		mu.Lock()
		n := len(firstSeen)
		mu.Unlock()
		if n >= len(acked) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d acknowledged messages delivered a minute after the restart", n, len(acked))
		}
		time.Sleep(50 * time.Millisecond)
	}
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := sub.Stop(stopCtx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, id := range acked {
		if !firstSeen[id] {
			t.Fatalf("acknowledged message %s never delivered", id)
		}
	}
	if len(disorder) > 0 {
		t.Fatalf("out of order: %v", disorder)
	}
	if failed == 0 {
		t.Fatal("no publish failed: the test did not exercise the outage")
	}
	t.Logf("%d acknowledged messages delivered across a crash and restart; %d publish attempts failed during the outage and were retried",
		len(acked), failed)
}
