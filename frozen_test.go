// SPDX-License-Identifier: Apache-2.0

package shardq_test

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/driver/mysqldriver"
	"github.com/shardq/shardq/internal/testdb"
)

// memberHelperEnv makes the test binary a member process (a subscriber,
// or a receiver of group "k" with SHARDQ_MEMBER_MODE=receiver, named by
// SHARDQ_MEMBER_NAME) that prints "S key offset id" as it hands each
// message to its handler, which takes 50 ms, until it is killed.
const memberHelperEnv = "SHARDQ_MEMBER_HELPER_DSN"

// frozenTTL is the lease TTL of the frozen-member tests.
const frozenTTL = 3 * time.Second

// freezeOutsideWrites SIGSTOPs p. On SQLite it does so while this
// process holds the file's write lock, so that p is not frozen inside a
// write transaction of its own: that would block every writer until it
// resumes (docs/leases.md), which no lease can change. MySQL's row locks
// are bounded by the server instead (TestFrozenTransactionIsBounded).
func freezeOutsideWrites(t *testing.T, drv driver.Driver, p *os.Process) {
	t.Helper()
	var tx *sql.Tx
	if drv.Name() == "sqlite" {
		var err error
		if tx, err = drv.DB().BeginTx(context.Background(), nil); err != nil { // BEGIN IMMEDIATE
			t.Fatal(err)
		}
	}
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// The lock goes only once every thread of p has stopped.
	waitUntil(t, "the holder stopped", 10*time.Second, func() bool { return processStopped(p.Pid) })
	if tx != nil {
		if err := tx.Rollback(); err != nil {
			t.Fatal(err)
		}
	}
}

func frozenConfig(name string, h shardq.Handler) shardq.SubscriberConfig {
	return shardq.SubscriberConfig{ConsumerGroup: "g", Topic: "x", Tenants: []string{"t"}, Name: name, Handler: h, Take: shardq.TakeGrouped,
		LeaseTTL: frozenTTL, HeartbeatInterval: 500 * time.Millisecond, StaleAfter: 1500 * time.Millisecond,
		DiscoveryInterval: 50 * time.Millisecond, PollInterval: 10 * time.Millisecond, CommitInterval: 20 * time.Millisecond, IdleRelease: time.Hour}
}

func runMemberHelper(url string) int {
	c, _, err := openURL(url)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	name := os.Getenv("SHARDQ_MEMBER_NAME")
	handle := func(_ context.Context, d *shardq.Delivery) error {
		fmt.Fprintf(os.Stdout, "S %s %d %s\n", d.PartitionKey, d.Offset, d.ID) // unbuffered
		time.Sleep(50 * time.Millisecond)
		return nil
	}
	ctx := context.Background()
	if os.Getenv("SHARDQ_MEMBER_MODE") != "receiver" {
		if _, err := c.Subscribe(ctx, frozenConfig(name, handle)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		select {} // until killed
	}
	r, err := c.AcceptGroup(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, "k", &shardq.ReceiverOptions{Name: name, LeaseTTL: frozenTTL, PollInterval: 10 * time.Millisecond})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	for {
		d, err := r.Receive(ctx)
		if err != nil {
			fmt.Fprintln(os.Stderr, "receiver ends:", err)
			select {} // until killed
		}
		handle(ctx, d)
		if err := r.Ack(ctx, d); err != nil {
			fmt.Fprintln(os.Stderr, "receiver ends:", err)
			select {}
		}
	}
}

// memberLines reads a helper's "S" lines as they come, with the time each
// was read.
type memberLines struct {
	mu    sync.Mutex
	lines []string
	at    []time.Time
	done  chan struct{}
}

func readMemberLines(t *testing.T, env []string, url string) (*memberLines, func() *os.Process) {
	t.Helper()
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	cmd, stdout := startHelper(t, memberHelperEnv, url)
	ml := &memberLines{done: make(chan struct{})}
	go func() {
		defer close(ml.done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			ml.mu.Lock()
			ml.lines = append(ml.lines, sc.Text())
			ml.at = append(ml.at, time.Now())
			ml.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGCONT)
		cmd.Process.Kill()
		cmd.Wait()
		<-ml.done
	})
	return ml, func() *os.Process { return cmd.Process }
}

func (ml *memberLines) count() int {
	ml.mu.Lock()
	defer ml.mu.Unlock()
	return len(ml.lines)
}

// after lists the lines read after t.
func (ml *memberLines) after(t time.Time) []string {
	ml.mu.Lock()
	defer ml.mu.Unlock()
	var out []string
	for i, at := range ml.at {
		if at.After(t) {
			out = append(out, ml.lines[i])
		}
	}
	return out
}

// frozenURL bounds the MySQL session's idle transactions and lock waits
// below frozenTTL (the defaults, 10 s and 5 s, suit 30 s leases).
func frozenURL(url string) string {
	if strings.HasPrefix(url, "mysql://") {
		return url + "?idle_transaction_timeout=1&innodb_lock_wait_timeout=1"
	}
	return url
}

// TestFrozenMemberIsReplaced is the frozen holder (a SIGSTOP past the
// lease TTL) for subscribers and for receivers: the heir delivers while
// the holder is still frozen, the holder hands out nothing after it
// resumes, and nothing is lost.
func TestFrozenMemberIsReplaced(t *testing.T) {
	for _, mode := range []string{"subscriber", "receiver"} {
		t.Run(mode, func(t *testing.T) {
			eachDatabase(t, func(t *testing.T, url string, drv driver.Driver, c *shardq.Client) {
				ctx := context.Background()
				batch := publishSpread(t, c, 0, 300)
				frozen, proc := readMemberLines(t, []string{"SHARDQ_MEMBER_MODE=" + mode, "SHARDQ_MEMBER_NAME=frozen"}, frozenURL(url))
				waitUntil(t, "the holder delivering", 30*time.Second, func() bool { return frozen.count() >= 5 })
				freezeOutsideWrites(t, drv, proc())
				stoppedAt := time.Now()

				var mu sync.Mutex
				heirGot := map[string]bool{}
				var heirFirst time.Time
				record := func(d *shardq.Delivery) {
					mu.Lock()
					defer mu.Unlock()
					if heirFirst.IsZero() {
						heirFirst = time.Now()
					}
					heirGot[d.ID] = true
				}
				if mode == "subscriber" {
					s, err := c.Subscribe(ctx, frozenConfig("heir", func(_ context.Context, d *shardq.Delivery) error { record(d); return nil }))
					if err != nil {
						t.Fatal(err)
					}
					defer s.Stop(ctx)
				} else {
					r, err := c.AcceptGroup(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, "k", &shardq.ReceiverOptions{Name: "heir", LeaseTTL: frozenTTL,
						Wait: time.Minute, PollInterval: 10 * time.Millisecond})
					if err != nil {
						t.Fatalf("the heir's accept: %v", err)
					}
					rctx, stop := context.WithCancel(ctx)
					done := make(chan struct{})
					go func() {
						defer close(done)
						for {
							d, err := r.Receive(rctx)
							if err != nil {
								return
							}
							record(d)
							if r.Ack(ctx, d) != nil {
								return
							}
						}
					}()
					defer func() {
						stop()
						<-done
						r.Stop(ctx)
					}()
				}
				// The heir must get the partition while the holder is
				// still frozen: its transactions and lock waits are
				// bounded, and its lease expires.
				waitUntil(t, "the heir's first delivery", 30*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return !heirFirst.IsZero() })
				mu.Lock()
				tookOver := heirFirst.Sub(stoppedAt)
				mu.Unlock()
				t.Logf("heir delivered %s after the freeze (lease TTL %s)", tookOver.Round(time.Millisecond), frozenTTL)
				time.Sleep(time.Until(stoppedAt.Add(2 * frozenTTL))) // frozen well past its lease
				if err := proc().Signal(syscall.SIGCONT); err != nil {
					t.Fatal(err)
				}
				resumedAt := time.Now()
				frozenBefore := map[string]bool{}
				for _, l := range frozen.after(time.Time{}) {
					frozenBefore[strings.Fields(l)[3]] = true
				}
				waitUntil(t, "every message delivered", time.Minute, func() bool {
					mu.Lock()
					defer mu.Unlock()
					for _, m := range batch {
						if !heirGot[m.ID] && !frozenBefore[m.ID] {
							return false
						}
					}
					return true
				})
				time.Sleep(time.Second) // time for a resumed holder to misbehave
				if late := frozen.after(resumedAt); len(late) > 0 {
					t.Fatalf("the frozen holder handed out %d messages after it resumed: %v", len(late), late[:min(5, len(late))])
				}
			})
		})
	}
}

// TestFrozenTransactionIsBounded: a holder frozen inside a transaction that
// locked its lease row (here: a transaction left open) does not block its
// heir for longer than the server's idle-transaction bound. Open sets that
// bound and the lock-wait bound on every MariaDB session.
func TestFrozenTransactionIsBounded(t *testing.T) {
	base := testdb.MySQLDatabase(t)
	d := testdb.Migrated(t, mustOpenMySQL(t, base))
	defer d.Close()
	ctx := context.Background()
	var idle, lockWait int
	if err := d.DB().QueryRowContext(ctx, "SELECT @@idle_transaction_timeout, @@innodb_lock_wait_timeout").Scan(&idle, &lockWait); err != nil {
		t.Fatal(err)
	}
	if idle != 10 || lockWait != 5 {
		t.Fatalf("session bounds idle_transaction_timeout=%d innodb_lock_wait_timeout=%d; want 10 and 5", idle, lockWait)
	}
	fast, err := mysqldriver.Open(base + "?idle_transaction_timeout=2&innodb_lock_wait_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	defer fast.Close()
	p := driver.PartitionRef{Tenant: "t", ConsumerGroup: "g", Topic: "x", PartitionKey: "k"}
	now := time.Now()
	if _, err := fast.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: p, Owner: "frozen#1", Now: now, TTL: time.Second}); err != nil {
		t.Fatal(err)
	}
	tx, err := fast.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var one int
	if err := tx.QueryRowContext(ctx, "SELECT 1 FROM queue_partition_leases WHERE tenant = ? AND consumer_group = ? AND topic = ? AND partition_key = ? FOR UPDATE",
		p.Tenant, p.ConsumerGroup, p.Topic, p.PartitionKey).Scan(&one); err != nil {
		t.Fatal(err)
	}
	// The "frozen" transaction now sits idle, holding the row lock. The
	// heir retries as a subscriber's tick would, and must get the lease.
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := fast.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: p, Owner: "heir#1", Now: time.Now().Add(2 * time.Second), TTL: time.Minute})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the heir never got the lease from a frozen transaction: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := tx.Commit(); err == nil {
		t.Fatal("the frozen transaction committed after the server should have ended it")
	}
}

func waitUntil(t *testing.T, what string, limit time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", limit, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestOneNameTwoProcesses: two subscriber processes started with the same
// --name are two members (their identities differ): they split the
// partitions and no message is delivered by both.
func TestOneNameTwoProcesses(t *testing.T) {
	eachDatabase(t, func(t *testing.T, url string, drv driver.Driver, c *shardq.Client) {
		ctx := context.Background()
		const total = 200
		publishSpread(t, c, 4, total)
		env := []string{"SHARDQ_MEMBER_MODE=subscriber", "SHARDQ_MEMBER_NAME=worker"}
		a, _ := readMemberLines(t, env, url)
		b, _ := readMemberLines(t, env, url)
		seen := func() map[string]int {
			n := map[string]int{}
			for _, ml := range []*memberLines{a, b} {
				for _, l := range ml.after(time.Time{}) {
					n[strings.Fields(l)[3]]++
				}
			}
			return n
		}
		waitUntil(t, "every message", time.Minute, func() bool { return len(seen()) == total })
		subs, err := drv.Subscribers(ctx, driver.GroupScope{Tenants: []string{"t"}, Topic: "x", ConsumerGroup: "g"})
		if err != nil || len(subs) != 2 || subs[0].Name == subs[1].Name || !strings.HasPrefix(subs[0].Name, "worker#") {
			t.Fatalf("members %+v, %v; want two identities of the name worker", subs, err)
		}
		time.Sleep(500 * time.Millisecond) // time for a double delivery to show
		for id, n := range seen() {
			if n > 1 {
				t.Fatalf("%s delivered %d times by two processes of one name", id, n)
			}
		}
		if a.count() == 0 || b.count() == 0 {
			t.Logf("one process delivered everything (a %d, b %d): the other joined late", a.count(), b.count())
		}
	})
}
