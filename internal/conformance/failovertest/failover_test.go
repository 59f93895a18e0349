// SPDX-License-Identifier: Apache-2.0

//go:build failover

package failovertest

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"os"
	osexec "os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver/mysqldriver"
)

const (
	database = "shardq_failover"
	keys     = 16
	// The kill lands once killAfter publishes are acknowledged and
	// runFor has passed (group "live" has committed cursors by then); the
	// publishers go on meanwhile, so some are in flight when it lands.
	killAfter = 3000
	runFor    = 3 * time.Second
	// lagFor is how long the replica receives nothing before the kill
	// (its I/O thread stopped, as a slow link would): asynchronous
	// replication then loses what the primary acknowledged meanwhile,
	// and semi-synchronous replication acknowledges nothing meanwhile.
	lagFor = 300 * time.Millisecond
)

// ack is a publish the primary acknowledged.
type ack struct {
	id     string
	offset int64
}

// TestPrimaryKilledUnderPublishers: 16 publishers, one key each, publish
// until the primary's mariadbd is killed (SIGKILL, by the command
// SHARDQ_FAILOVER_KILL) mid-stream; the replica is promoted once it
// applied what it received, as an external failover tool does, and then
// SHARDQ_FAILOVER_PROMOTED is run, if set (it tells Vitess). For the last
// lagFor before the kill the replica receives nothing, as over a slow
// link. On it, every acknowledged publish must be stored at
// its acknowledged offset, each key's in the order acknowledged, and a
// subscriber must receive all that is stored, each key in order, and
// what is published after the failover after it. With semi-synchronous
// replication (AFTER_SYNC: a commit returns once the replica has its
// events) nothing acknowledged may be lost; with asynchronous
// replication the test reports what was, and fails if nothing was: it
// would not see a loss.
//
// The queue's clients use the primary and then the promoted replica
// (database shardq_failover, created here), or, with
// SHARDQ_FAILOVER_QUEUE set, that DSN throughout (vtgate), the servers
// holding the tables in database SHARDQ_FAILOVER_SCHEMA. The messages are
// tenant SHARDQ_FAILOVER_TENANT's ["t"]: through Vitess, one of the
// killed shard.
func TestPrimaryKilledUnderPublishers(t *testing.T) {
	mode := env(t, "SHARDQ_FAILOVER_MODE")
	primary := withDatabase(t, env(t, "SHARDQ_FAILOVER_PRIMARY"), "")
	replica := withDatabase(t, env(t, "SHARDQ_FAILOVER_REPLICA"), "")
	killCmd := env(t, "SHARDQ_FAILOVER_KILL")
	schema := cmp.Or(os.Getenv("SHARDQ_FAILOVER_SCHEMA"), database)
	tenant := cmp.Or(os.Getenv("SHARDQ_FAILOVER_TENANT"), "t")
	before, after := withDatabase(t, primary, database), withDatabase(t, replica, database)
	if q := os.Getenv("SHARDQ_FAILOVER_QUEUE"); q != "" {
		before, after = q, q
	} else {
		exec(t, primary, "CREATE DATABASE "+database+" CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
	}
	ctx := context.Background()
	quiet := slog.New(slog.DiscardHandler)

	pd, err := mysqldriver.Open(before)
	if err != nil {
		t.Fatal(err)
	}
	pc, err := shardq.NewClient(pd, &shardq.Config{ChangeFeed: shardq.FeedOff, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if err := pc.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the schema on the replica", func() bool {
		var n int
		return query(t, replica, "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = ? AND table_name = 'queue_messages'", schema).Scan(&n) == nil && n == 1
	})

	// Group "live" reads on the primary while it runs, and goes on on the
	// promoted replica from the cursors that reached it.
	live := newRecorder()
	liveSub, err := pc.Subscribe(ctx, shardq.SubscriberConfig{ConsumerGroup: "live", Topic: "x", Tenants: []string{tenant}, Handler: live.handle})
	if err != nil {
		t.Fatal(err)
	}

	acked := make([][]ack, keys) // acked[k] is written by key k's publisher only
	var total atomic.Int64
	var killed atomic.Bool
	early := make(chan string, keys) // publishers that failed before the kill
	var wg sync.WaitGroup
	payload := []byte(strings.Repeat("p", 256))
	for k := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ; n++ {
				id := fmt.Sprintf("k%02d-%06d", k, n)
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				res, err := pc.Publish(cctx, shardq.Message{Tenant: tenant, Topic: "x", PartitionKey: key(k), ID: id, Payload: payload})
				cancel()
				if err != nil {
					if !killed.Load() {
						early <- fmt.Sprintf("%s: %v", id, err)
					}
					return // the primary is gone: this key's acknowledged run ends
				}
				acked[k] = append(acked[k], ack{id, res[0].Offset})
				total.Add(1)
			}
		}()
	}
	start := time.Now()
	waitFor(t, fmt.Sprintf("%d acknowledged publishes", killAfter), func() bool { return total.Load() >= killAfter && time.Since(start) >= runFor })
	if mode == "semisync" {
		st := status(t, primary, "Rpl_semi_sync_master_status", "Rpl_semi_sync_master_clients", "Rpl_semi_sync_master_yes_tx", "Rpl_semi_sync_master_no_tx")
		if st["Rpl_semi_sync_master_status"] != "ON" || st["Rpl_semi_sync_master_clients"] != "1" || st["Rpl_semi_sync_master_no_tx"] != "0" || st["Rpl_semi_sync_master_yes_tx"] == "0" {
			t.Fatalf("the primary is not semi-synchronous: %v", st)
		}
		t.Logf("semisync: %v", st)
	}
	exec(t, replica, "STOP SLAVE IO_THREAD")
	atLag := total.Load()
	time.Sleep(lagFor)
	killed.Store(true)
	run(t, killCmd)
	killedAt := time.Now()
	wg.Wait()
	close(early)
	for e := range early {
		t.Errorf("a publisher failed before the kill: %s", e)
	}
	t.Logf("%s: %d publishes acknowledged while the replica received nothing", mode, total.Load()-atLag)
	stopCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	_ = liveSub.Stop(stopCtx) // its last commits fail: the primary is gone
	cancel()
	live.check(t, "live, on the primary")
	live.mark()
	pc.Close()
	pd.Close()
	promote(t, replica)
	if c := os.Getenv("SHARDQ_FAILOVER_PROMOTED"); c != "" {
		run(t, c)
	}
	promotedAt := time.Now()

	// On the new primary: each acknowledged publish where it was
	// acknowledged.
	stored := map[string]int64{}
	rows, err := open(t, withDatabase(t, replica, schema)).QueryContext(ctx,
		"SELECT id, `offset` FROM queue_messages WHERE tenant = ? AND topic = 'x'", tenant)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		var off int64
		if err := rows.Scan(&id, &off); err != nil {
			t.Fatal(err)
		}
		stored[id] = off
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	lost, moved, ackedN := 0, 0, 0
	var firstLost []string
	for k := range keys {
		for i, a := range acked[k] {
			ackedN++
			if i > 0 && a.offset <= acked[k][i-1].offset {
				t.Errorf("%s acknowledged at offset %d, after %s at %d", a.id, a.offset, acked[k][i-1].id, acked[k][i-1].offset)
			}
			switch off, ok := stored[a.id]; {
			case !ok:
				lost++
				if len(firstLost) < 5 {
					firstLost = append(firstLost, a.id)
				}
			case off != a.offset:
				moved++
				t.Errorf("%s acknowledged at offset %d, stored at %d", a.id, a.offset, off)
			}
		}
	}
	t.Logf("%s: %d publishes acknowledged before the kill, %d stored on the promoted replica (publishes in flight at the kill included), %d acknowledged and lost %v",
		mode, ackedN, len(stored), lost, firstLost)
	switch {
	case mode == "semisync" && lost > 0:
		t.Errorf("semi-synchronous replication lost %d acknowledged publishes", lost)
	case mode == "async" && lost == 0:
		t.Errorf("asynchronous replication with the replica %v behind lost nothing acknowledged: the test would not see a loss", lagFor)
	}

	// Publishing goes on after them, and a subscriber receives everything
	// stored, each key in order.
	rd, err := mysqldriver.Open(after)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	rc, err := shardq.NewClient(rd, &shardq.Config{ChangeFeed: shardq.FeedOff, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	reused := 0 // keys whose new message took an offset at or below an acknowledged one
	for k := range keys {
		// Through vtgate the first may fail while it learns of the new
		// primary: again, under the same id, for up to 30 s.
		var res []shardq.PublishResult
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			res, err = rc.Publish(cctx, shardq.Message{Tenant: tenant, Topic: "x", PartitionKey: key(k), ID: fmt.Sprintf("k%02d-after", k), Payload: payload})
			cancel()
			if err == nil || time.Now().After(deadline) {
				break
			}
			t.Logf("key %s: publish on the promoted replica: %v; again", key(k), err)
		}
		if err != nil {
			t.Fatalf("publish on the promoted replica: %v", err)
		}
		if k == 0 {
			t.Logf("%s: first publish accepted on the promoted replica %v after its promotion, %v after the kill", mode,
				time.Since(promotedAt).Round(time.Millisecond), time.Since(killedAt).Round(time.Millisecond))
		}
		if n := len(acked[k]); n > 0 && res[0].Offset <= acked[k][n-1].offset {
			// Only after a loss: the lost messages' offsets are drawn
			// again, and a reader whose cursor passed them on the old
			// primary would skip the new ones.
			reused++
			if mode == "semisync" || lost == 0 {
				t.Errorf("key %s: published after the failover at offset %d, not after its last acknowledged %d", key(k), res[0].Offset, acked[k][n-1].offset)
			}
		}
		stored[res[0].ID] = res[0].Offset
	}
	if reused > 0 {
		t.Logf("%s: %d keys' first message after the failover took an offset at or below an acknowledged one of theirs", mode, reused)
	}
	// A new group from the start, and group "live" from its cursors.
	fresh := newRecorder()
	for _, g := range []struct {
		name string
		rec  *recorder
	}{{"fresh", fresh}, {"live", live}} {
		sub, err := rc.Subscribe(ctx, shardq.SubscriberConfig{ConsumerGroup: g.name, Topic: "x", Tenants: []string{tenant}, Handler: g.rec.handle})
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Stop(ctx)
	}
	for _, g := range []struct {
		name string
		rec  *recorder
	}{{"fresh", fresh}, {"live", live}} {
		waitFor(t, fmt.Sprintf("group %s: %d stored messages delivered", g.name, len(stored)), func() bool { return g.rec.has(stored) })
		g.rec.check(t, g.name)
	}
	t.Logf("%s: group live received %d messages on the primary, %d again on the promoted replica", mode, live.before, live.again())
}

// recorder is what a group received: each key's offsets in the order
// delivered, since the last mark (a failover) and before it.
type recorder struct {
	mu     sync.Mutex
	seen   map[string]bool    // ids received, across the failover
	offs   map[string][]int64 // key → offsets since the mark
	early  map[string]bool    // ids received before the mark
	before int
	redo   int // ids received before the mark and again after it
}

func newRecorder() *recorder {
	return &recorder{seen: map[string]bool{}, offs: map[string][]int64{}, early: map[string]bool{}}
}

func (r *recorder) handle(_ context.Context, d *shardq.Delivery) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.early[d.ID] {
		r.redo++
		delete(r.early, d.ID)
	}
	r.seen[d.ID] = true
	r.offs[d.PartitionKey] = append(r.offs[d.PartitionKey], d.Offset)
	return nil
}

// mark starts a new run of deliveries: each key's order is checked
// within a run, since the failover may deliver again what the last
// commits did not cover.
func (r *recorder) mark() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.offs = map[string][]int64{}
	for id := range r.seen {
		r.early[id] = true
	}
	r.before = len(r.seen)
}

func (r *recorder) again() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.redo
}

// has reports whether every stored id was received.
func (r *recorder) has(stored map[string]int64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for id := range stored {
		if !r.seen[id] {
			return false
		}
	}
	return true
}

// check fails t where a key's offsets went back within the run.
func (r *recorder) check(t *testing.T, group string) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for k, offs := range r.offs {
		for i := 1; i < len(offs); i++ {
			if offs[i] <= offs[i-1] {
				t.Errorf("group %s, key %s: offset %d delivered after %d", group, k, offs[i], offs[i-1])
				break
			}
		}
	}
}

func key(k int) string { return fmt.Sprintf("k%02d", k) }

func env(t *testing.T, name string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		t.Fatalf("%s is not set: run scripts/mariadb-failover or scripts/vitess-failover --unplanned", name)
	}
	return v
}

// withDatabase is dsn naming database, with the bounds a test needs.
func withDatabase(t *testing.T, dsn, database string) string {
	t.Helper()
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.DBName = database
	cfg.Timeout, cfg.ReadTimeout, cfg.WriteTimeout = 2*time.Second, 10*time.Second, 10*time.Second
	return cfg.FormatDSN()
}

var (
	poolsMu sync.Mutex
	pools   = map[string]*sql.DB{}
)

func open(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	poolsMu.Lock()
	defer poolsMu.Unlock()
	if db := pools[dsn]; db != nil {
		return db
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	pools[dsn] = db
	return db
}

func exec(t *testing.T, dsn, stmt string) {
	t.Helper()
	if _, err := open(t, dsn).Exec(stmt); err != nil {
		t.Fatalf("%s: %v", stmt, err)
	}
}

func query(t *testing.T, dsn, q string, args ...any) *sql.Row {
	t.Helper()
	return open(t, dsn).QueryRow(q, args...)
}

// run runs command with sh -c, from the module's root, and logs its output.
func run(t *testing.T, command string) {
	t.Helper()
	cmd := osexec.Command("sh", "-c", command)
	cmd.Dir = "../../.."
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", command, err, out)
	}
	if len(out) > 0 {
		t.Log(strings.TrimSpace(string(out)))
	}
}

// promote makes the replica the primary, as an external failover tool
// does: it waits until the replica applied every event it received
// (gtid_slave_pos reaches Gtid_IO_Pos), then stops replicating and
// becomes writable (Vitess's mysqlds start read-only).
func promote(t *testing.T, dsn string) {
	t.Helper()
	db := open(t, dsn)
	var received, applied string
	waitFor(t, "the replica to apply what it received", func() bool {
		received = slaveStatus(t, db)["Gtid_IO_Pos"]
		return db.QueryRow("SELECT @@gtid_slave_pos").Scan(&applied) == nil && applied == received
	})
	t.Logf("promoting the replica at GTID %s", applied)
	for _, stmt := range []string{"STOP SLAVE", "RESET SLAVE ALL", "SET GLOBAL read_only = OFF"} {
		if _, err := db.Exec(stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
}

// status reads the named status variables of the server at dsn.
func status(t *testing.T, dsn string, names ...string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, n := range names {
		var v string
		if err := query(t, dsn, "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = ?", strings.ToUpper(n)).Scan(&v); err != nil {
			t.Fatalf("%s: %v", n, err)
		}
		out[n] = v
	}
	return out
}

func slaveStatus(t *testing.T, db *sql.DB) map[string]string {
	t.Helper()
	rows, err := db.Query("SHOW SLAVE STATUS")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	if !rows.Next() {
		return out
	}
	vals := make([]sql.NullString, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	if err := rows.Scan(ptrs...); err != nil {
		t.Fatal(err)
	}
	for i, c := range cols {
		out[c] = vals[i].String
	}
	return out
}

// waitFor polls cond until it holds, or fails t after a minute.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
