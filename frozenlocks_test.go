// SPDX-License-Identifier: Apache-2.0

package shardq_test

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/testdb"
)

// lockHelperEnv (a go-sql-driver DSN) makes the test binary a process
// that connects, prints "READY", reads a line of comma-separated keys
// from its input, opens a transaction, locks the lease rows of tenant t,
// group g, topic x at those keys (as an acquisition's locking read does),
// prints "LOCKED" and stops itself (SIGSTOP): a member frozen inside a
// transaction, holding rows that another member needs. Connecting first
// keeps the lock's moment close to the line's.
const lockHelperEnv = "SHARDQ_LOCK_HELPER_DSN"

func runLockHelper(dsn string) int {
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "lock helper:", err)
		return 1
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return fail(err)
	}
	db.SetMaxOpenConns(1)
	ctx := context.Background()
	if err := db.PingContext(ctx); err != nil {
		return fail(err)
	}
	fmt.Println("READY")
	keys, err := bufio.NewReader(os.Stdin).ReadString('\n')
	if err != nil {
		return fail(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fail(err)
	}
	for _, k := range strings.Split(strings.TrimSpace(keys), ",") {
		var owner string
		if err := tx.QueryRowContext(ctx, "SELECT owner FROM queue_partition_leases WHERE tenant = 't' AND consumer_group = 'g' "+
			"AND topic = 'x' AND partition_key = ? FOR UPDATE", k).Scan(&owner); err != nil {
			return fail(err)
		}
	}
	fmt.Println("LOCKED")
	if err := syscall.Kill(os.Getpid(), syscall.SIGSTOP); err != nil {
		return fail(err)
	}
	select {} // until killed
}

// lockHelper starts the lock helper on dsn and waits for it to connect.
func lockHelper(t *testing.T, dsn string) (*exec.Cmd, io.Writer, *bufio.Reader) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), lockHelperEnv+"="+dsn)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	lines := bufio.NewReader(out)
	if line, err := lines.ReadString('\n'); err != nil || line != "READY\n" {
		t.Fatalf("lock helper: %q, %v", line, err)
	}
	return cmd, in, lines
}

// TestFrozenTransactionStallsNoHealthyMember: a process frozen inside a
// transaction that holds a healthy member's lease rows (an acquisition
// racing the holder's, an older release beside a newer one, an operator's
// command) keeps them locked until the server ends its session. The
// holder's renewals wait (and may fail) meanwhile, but its heartbeat does
// not wait behind them: it is not swept, keeps every lease under the same
// token, and nothing is delivered twice. On the defaults, with 1 s
// heartbeats and 3 s staleness (well under one lock wait), and on the
// shortest lease the rule of docs/leases.md ("Bounded waits") allows for
// bounds of 1 s.
func TestFrozenTransactionStallsNoHealthyMember(t *testing.T) {
	for _, c := range []struct {
		name, params          string
		idle, wait            time.Duration
		ttl, heartbeat, stale time.Duration
	}{
		{"defaults", "", 10 * time.Second, 5 * time.Second, shardq.DefaultLeaseTTL, shardq.DefaultHeartbeatInterval, 3 * shardq.DefaultHeartbeatInterval},
		// Staleness well under one lock wait: a heartbeat that waited
		// behind a renewal would go stale.
		{"fast heartbeats", "", 10 * time.Second, 5 * time.Second, shardq.DefaultLeaseTTL, time.Second, 3 * time.Second},
		{"shortest", "idle_transaction_timeout=1&innodb_lock_wait_timeout=1", time.Second, time.Second, 6 * time.Second, 500 * time.Millisecond, time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel() // each on a database of its own; most of the time is waiting
			base := testdb.MySQLDatabase(t)
			url := testdb.MySQLURL(t, base)
			if c.params != "" {
				url += "?" + c.params
			}
			ctx := context.Background()
			var mu sync.Mutex
			got := map[string]int{}
			handle := func(_ context.Context, d *shardq.Delivery) error {
				mu.Lock()
				got[d.ID]++
				mu.Unlock()
				return nil
			}
			member := func(name string) (*shardq.Client, driver.Driver) {
				cl, drv, err := openURL(url)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { cl.Close(); drv.Close() })
				sub, err := cl.Subscribe(ctx, shardq.SubscriberConfig{ConsumerGroup: "g", Topic: "x", Tenants: []string{"t"}, Name: name,
					Handler: handle, Take: shardq.TakeGrouped, LeaseTTL: c.ttl, HeartbeatInterval: c.heartbeat, StaleAfter: c.stale,
					DiscoveryInterval: 100 * time.Millisecond, PollInterval: 20 * time.Millisecond, IdleRelease: time.Hour})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { sub.Stop(context.Background()) })
				return cl, drv
			}
			pub, drv := member("h1")
			member("h2")
			// The bounds mysqldriver.Open sets, or the case's, as a member's session has them.
			cmd, locks, lines := lockHelper(t, fmt.Sprintf("%s?idle_transaction_timeout=%d&innodb_lock_wait_timeout=%d",
				base, int(c.idle.Seconds()), int(c.wait.Seconds())))

			// A publisher keeps every partition busy for the whole run.
			pubCtx, stopPub := context.WithCancel(ctx)
			var published sync.WaitGroup
			published.Go(func() {
				for i := 0; pubCtx.Err() == nil && i < 20_000; i++ {
					m := shardq.Message{Tenant: "t", Topic: "x", PartitionKey: fmt.Sprintf("p%d", i%8), ID: fmt.Sprintf("m%05d", i)}
					if _, err := pub.Publish(pubCtx, m); err != nil && pubCtx.Err() == nil {
						t.Errorf("publish: %v", err)
						return
					}
					time.Sleep(10 * time.Millisecond)
				}
			})
			defer func() { stopPub(); published.Wait() }()

			scope := driver.GroupScope{Tenants: []string{"t"}, Topic: "x", ConsumerGroup: "g"}
			held := func(member string) map[string]driver.Lease {
				ls, err := drv.HeldLeases(ctx, scope)
				if err != nil {
					t.Fatal(err)
				}
				out := map[string]driver.Lease{}
				for _, l := range ls {
					if strings.HasPrefix(l.Owner, member+"#") && l.ExpiresAt.After(time.Now()) {
						out[l.PartitionKey] = l
					}
				}
				return out
			}
			// Fair share settled: four partitions each, the same twice in a row.
			var last string
			waitUntil(t, "h1 and h2 holding four partitions each", time.Minute, func() bool {
				h1, h2 := held("h1"), held("h2")
				now := fmt.Sprint(h1, h2)
				settled := len(h1) == 4 && len(h2) == 4 && now == last
				last = now
				time.Sleep(500 * time.Millisecond)
				return settled
			})
			before := held("h1")
			var keys []string
			due := time.Now().Add(time.Hour)
			for k, l := range before {
				keys = append(keys, k)
				if d := l.ExpiresAt.Add(-c.ttl * 2 / 3); d.Before(due) {
					due = d
				}
			}
			// Freeze half the idle bound before h1's next renewal is due:
			// the renewal then waits on the rows for as long as the
			// server lets the frozen session live.
			time.Sleep(time.Until(due) - c.idle/2)

			if _, err := fmt.Fprintln(locks, strings.Join(keys, ",")); err != nil {
				t.Fatal(err)
			}
			if line, err := lines.ReadString('\n'); err != nil || line != "LOCKED\n" {
				t.Fatalf("lock helper: %q, %v", line, err)
			}
			frozenAt := time.Now()
			waitUntil(t, "the lock holder stopped", 10*time.Second, func() bool { return processStopped(cmd.Process.Pid) })

			// The rows are locked: a locking read that will not wait fails.
			probe := func() error {
				tx, err := drv.DB().BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback()
				var owner string
				return tx.QueryRowContext(ctx, "SELECT owner FROM queue_partition_leases WHERE tenant = 't' AND consumer_group = 'g' "+
					"AND topic = 'x' AND partition_key = ? FOR UPDATE NOWAIT", keys[0]).Scan(&owner)
			}
			if err := probe(); err == nil {
				t.Fatal("h1's lease row was not locked by the frozen transaction")
			}
			// Past the heartbeat's staleness, and past the bound after
			// which the server ends the frozen session.
			waitUntil(t, "the server ending the frozen transaction", c.idle+c.wait+10*time.Second, func() bool { return probe() == nil })
			// The first renewal attempt after due (at a heartbeat) found
			// the rows locked.
			if frozenAt.After(due) || time.Now().Before(due.Add(c.heartbeat)) {
				t.Fatalf("the rows were locked from %s to %s, not over h1's renewal due at %s (heartbeats every %s)",
					frozenAt.Format(time.StampMilli), time.Now().Format(time.StampMilli), due.Format(time.StampMilli), c.heartbeat)
			}
			time.Sleep(c.stale + c.heartbeat) // a sweep that the freeze caused would have run by now

			after := held("h1")
			for k, l := range before {
				if a, ok := after[k]; !ok || a.Token != l.Token || a.Owner != l.Owner {
					t.Errorf("partition %s: h1 held it under token %d before the freeze; after it, held %v by %q under token %d", k, l.Token, ok, a.Owner, a.Token)
				}
			}
			stopPub()
			published.Wait()
			mu.Lock()
			defer mu.Unlock()
			for id, n := range got {
				if n > 1 {
					t.Errorf("message %s delivered %d times", id, n)
				}
			}
			if len(got) == 0 {
				t.Fatal("nothing was delivered")
			}
		})
	}
}

// processStopped reports whether every thread of pid is stopped (state
// T in /proc).
func processStopped(pid int) bool {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil || len(tasks) == 0 {
		return false
	}
	for _, task := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
		_, rest, ok := strings.Cut(string(b), ") ")
		if err != nil || !ok || !strings.HasPrefix(rest, "T") {
			return false
		}
	}
	return true
}

// A lease too short for the database's lock bounds (docs/leases.md, the
// rule in "Bounded waits") is allowed, with one warning naming LeaseTTL
// however often a member of that timing starts; the defaults warn of
// nothing.
func TestShortLeaseWarnsOnce(t *testing.T) {
	d := testdb.Migrated(t, mustOpenMySQL(t, testdb.MySQLDatabase(t)))
	defer d.Close()
	logs := &testdb.LogLines{}
	c, err := shardq.NewClient(d, &shardq.Config{Logger: slog.New(logs)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	g := shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}
	for _, ttl := range []time.Duration{0, 0, 6 * time.Second, 6 * time.Second} { // 0: the default
		r, err := c.AcceptGroup(ctx, g, "k", &shardq.ReceiverOptions{LeaseTTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Stop(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := logs.Count("lease shorter than the database's lock bounds allow"); n != 1 || logs.Count("LeaseTTL") != 1 {
		t.Fatalf("%d warnings for a 6 s lease accepted twice and the default twice; want 1 naming LeaseTTL: %q", n, logs.All())
	}
}

// TestLockedSQLiteFileCostsNoRedelivery: on SQLite a process frozen
// inside a write holds the file's write lock, and no server ends it. Two
// healthy members, busy with a backlog, can neither heartbeat, renew nor
// commit meanwhile; they stop handing out before their heartbeats could
// count as stale (as they must: a member that judges them may exist), and
// the lock outlasts their busy_timeout. Once the file is free, what they
// handled is committed before anyone takes their partitions (the final
// commit is tried again while it fails, and a member whose own heartbeat
// was late spares the peers held up with it), so nothing is delivered
// twice. The long form (not -short) holds the file past a call's 15 s
// bound on the default busy_timeout, where the members' writes queue
// for their one connection and fail with their deadline, not SQLITE_BUSY.
func TestLockedSQLiteFileCostsNoRedelivery(t *testing.T) {
	const heartbeat, stale = 250 * time.Millisecond, time.Second
	type lockCase struct {
		name       string
		busy, lock time.Duration // busy 0: the driver's default
	}
	cases := []lockCase{{"busy_timeout 300ms", 300 * time.Millisecond, 2*stale + 300*time.Millisecond}}
	if !testing.Short() {
		cases = append(cases, lockCase{"default busy_timeout", 0, 25 * time.Second})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "shardq.db")
			url := "sqlite://" + path
			if c.busy > 0 {
				url += fmt.Sprintf("?busy_timeout=%s", c.busy)
			}
			ctx := context.Background()
			var mu sync.Mutex
			got := map[string]int{}
			handle := func(_ context.Context, d *shardq.Delivery) error {
				time.Sleep(10 * time.Millisecond) // a backlog outlasts the lock's start
				mu.Lock()
				got[d.ID]++
				mu.Unlock()
				return nil
			}
			var pub *shardq.Client
			for _, name := range []string{"h1", "h2"} {
				cl, drv, err := openURL(url)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { cl.Close(); drv.Close() })
				pub = cl
				if name == "h1" {
					var ms []shardq.Message
					for i := range 2000 {
						ms = append(ms, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: fmt.Sprintf("p%d", i%8), ID: fmt.Sprintf("m%05d", i)})
					}
					if _, err := cl.Publish(ctx, ms...); err != nil {
						t.Fatal(err)
					}
				}
				sub, err := cl.Subscribe(ctx, shardq.SubscriberConfig{ConsumerGroup: "g", Topic: "x", Tenants: []string{"t"}, Name: name,
					Handler: handle, Take: shardq.TakeGrouped, LeaseTTL: 6 * time.Second, HeartbeatInterval: heartbeat, StaleAfter: stale,
					DiscoveryInterval: 100 * time.Millisecond, PollInterval: 20 * time.Millisecond, IdleRelease: time.Hour})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { sub.Stop(context.Background()) })
			}
			delivered := func() int {
				mu.Lock()
				defer mu.Unlock()
				return len(got)
			}
			waitUntil(t, "deliveries under way", time.Minute, func() bool { return delivered() >= 200 })

			// The frozen process: a write transaction that holds the file.
			raw, err := sql.Open("sqlite", path+"?_pragma=busy_timeout(5000)") // wait out a member's write
			if err != nil {
				t.Fatal(err)
			}
			defer raw.Close()
			conn, err := raw.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
				t.Fatal(err)
			}
			atLock := delivered()
			time.Sleep(c.lock)
			during := delivered()
			if _, err := conn.ExecContext(ctx, "ROLLBACK"); err != nil {
				t.Fatal(err)
			}
			if during == atLock || during >= 2000 {
				t.Fatalf("%d delivered when the file was locked, %d when it was freed: the lock must fall in the middle of the backlog", atLock, during)
			}
			waitUntil(t, "every message delivered", time.Minute, func() bool { return delivered() == 2000 })
			// A redelivery of what was handled under the lock would come now.
			if _, err := pub.Publish(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "p0", ID: "last"}); err != nil {
				t.Fatal(err)
			}
			waitUntil(t, "the last message", time.Minute, func() bool { return delivered() == 2001 })
			mu.Lock()
			defer mu.Unlock()
			for id, n := range got {
				if n > 1 {
					t.Errorf("message %s delivered %d times", id, n)
				}
			}
			t.Logf("%d delivered before the lock, %d while it was held for %s", atLock, during-atLock, c.lock)
		})
	}
}
