// SPDX-License-Identifier: Apache-2.0

package mysqldriver_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/driver/drivertest"
	"github.com/shardq/shardq/driver/mysqldriver"
	"github.com/shardq/shardq/internal/sqlrecord"
	"github.com/shardq/shardq/internal/testdb"
)

// statementLog collects the distinct statement texts sent through vtgate.
type statementLog struct {
	mu   sync.Mutex
	seen map[string]bool
}

func (l *statementLog) record(q string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seen == nil {
		l.seen = map[string]bool{}
	}
	l.seen[strings.Join(strings.Fields(q), " ")] = true
}

func (l *statementLog) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]string, 0, len(l.seen))
	for q := range l.seen {
		out = append(out, q)
	}
	slices.Sort(out)
	return out
}

// openRecordedBy is testdb.Vitess with record called on every statement
// the driver sends: connections as Open makes them through vtgate
// (transactions begun at their first execution) under a recorder.
func openRecordedBy(t *testing.T, record func(string)) *mysqldriver.Driver {
	testdb.Vitess(t) // a clean keyspace (or a skip/fail with the reason)
	return openRecordedOn(t, testdb.VitessDSN(), record)
}

// openRecordedOn is openRecordedBy on the keyspace of dsn, cleaned by the
// caller.
func openRecordedOn(t *testing.T, dsn string, record func(string)) *mysqldriver.Driver {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	inner, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(sqlrecord.Connector(mysqldriver.VTGateConnector(inner), record))
	t.Cleanup(func() { db.Close() })
	d, err := mysqldriver.New(db)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestVitess runs the whole conformance suite (publish, leases,
// subscribers, message groups, transactions, admin) through vtgate: one
// keyspace of two shards, sharded by tenant (vschema.json). It records
// every statement the driver sends meanwhile, and then proves the routing.
func TestVitess(t *testing.T) {
	var log statementLog
	t.Run("Conformance", func(t *testing.T) {
		drivertest.RunParallel(t, func(t *testing.T) driver.Driver {
			_, dsn := testdb.VitessIn(t) // a clean keyspace of t's own
			return openRecordedOn(t, dsn, log.record)
		}, func(t *testing.T) driver.Driver {
			_, dsn := testdb.VitessMigrated(t) // migrated, no rows
			return openRecordedOn(t, dsn, log.record)
		})
	})
	t.Run("RoutingProof", func(t *testing.T) { testRoutingProof(t, log.all()) })
}

var (
	queueTable = regexp.MustCompile(`\bqueue_[a-z_]+\b`)
	ddl        = regexp.MustCompile(`(?i)^(CREATE|DROP|ALTER) `)
	limitParam = regexp.MustCompile(`(?i)\bLIMIT \?`)
	// The migrations table is sharded by version: Migrate's statements on
	// it are operator-run DDL bookkeeping, not the hot path.
	migrationsTable = regexp.MustCompile(`\bshardq_schema_migrations\b`)
)

// allTenantReads are the only statements that may scatter: admin reads an
// operator asked for with --all-tenants (driver.Scope.AllTenants renders
// "1 = 1" for the tenant condition), each named by its driver method.
var allTenantReads = map[string]string{
	"Topics":         "SELECT tenant, topic, COUNT(*), MAX(head_offset) FROM queue_partitions WHERE 1 = 1",
	"OffsetReport":   "SELECT o.tenant, o.topic, o.partition_key, o.consumer_group,",
	"AllLeases":      "FROM queue_partition_leases WHERE 1 = 1",
	"AllSubscribers": "FROM queue_subscriber_heartbeats WHERE 1 = 1",
	"TopicMessages":  "FROM queue_messages WHERE 1 = 1",
	"ListHalves":     "FROM queue_half_messages",
	"ListTokens":     "FROM queue_api_tokens WHERE 1 = 1",
	"ListTenants":    "SELECT DISTINCT tenant FROM queue_partitions WHERE 1 = 1",
	"ListTenantsSet": "SELECT tenant FROM queue_tenants WHERE 1 = 1",
}

// crossTenantReads may scatter as well, each named by its driver method:
// a token id names one token in every tenant, so creating a token reads
// the id's rows in all of them.
var crossTenantReads = map[string]string{
	"CreateToken": "SELECT tenant, secret_hash FROM queue_api_tokens WHERE token_id = ?",
}

func exemptAllTenantRead(q string) (string, bool) {
	for name, stmt := range crossTenantReads {
		if q == stmt {
			return name, true
		}
	}
	if !strings.Contains(q, "1 = 1") || !strings.HasPrefix(q, "SELECT") {
		return "", false
	}
	for name, fragment := range allTenantReads {
		if strings.Contains(q, fragment) {
			return name, true
		}
	}
	return "", false
}

// testRoutingProof asks vtgate for the plan of every recorded statement on
// a queue table (VEXPLAIN PLAN, placeholders replaced by literals) and
// requires every route in it to reach one shard by the tenant vindex, or
// the shards of an explicit tenant list. A new unscoped statement fails
// here.
func testRoutingProof(t *testing.T, statements []string) {
	testdb.SkipVitess(t)
	db, err := sql.Open("mysql", testdb.VitessDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	// The checker itself: statements without a tenant condition must be
	// caught, as reads and as writes.
	for _, q := range []string{
		"SELECT tenant, partition_key FROM queue_partitions WHERE topic = ?",
		"UPDATE queue_partition_leases SET owner = '' WHERE consumer_group = ?",
		"DELETE FROM queue_message_claims WHERE topic = ?",
		"SELECT p.tenant FROM queue_partitions p JOIN queue_offsets o ON o.topic = p.topic WHERE p.tenant = ?",
	} {
		statements = append(statements, "CHECKER "+q)
	}
	checked, exempt, caught := 0, map[string]int{}, 0
	for _, q := range statements {
		probe := strings.HasPrefix(q, "CHECKER ")
		q = strings.TrimPrefix(q, "CHECKER ")
		if !queueTable.MatchString(q) || ddl.MatchString(q) || migrationsTable.MatchString(q) {
			continue
		}
		if name, ok := exemptAllTenantRead(q); ok {
			exempt[name]++
			continue
		}
		literal := strings.ReplaceAll(limitParam.ReplaceAllString(q, "LIMIT 10"), "?", "'v'")
		var plan string
		if err := db.QueryRowContext(context.Background(), "VEXPLAIN PLAN "+literal).Scan(&plan); err != nil {
			t.Errorf("VEXPLAIN PLAN failed: %v\n%s", err, q)
			continue
		}
		var root map[string]any
		if err := json.Unmarshal([]byte(plan), &root); err != nil {
			t.Fatalf("plan is not JSON: %v\n%s", err, plan)
		}
		bad := scattered(root)
		switch {
		case probe && bad == "":
			t.Errorf("the checker let an unscoped statement pass:\n%s\nplan: %s", q, plan)
		case probe:
			caught++
		case bad != "":
			t.Errorf("statement is not routed by tenant (%s):\n%s\nplan: %s", bad, q, plan)
		default:
			checked++
		}
	}
	if checked < 50 {
		t.Fatalf("only %d statements checked; the conformance run did not record its SQL", checked)
	}
	t.Logf("the checker caught %d unscoped probes; %d statements route to one shard by tenant (or the shards of a tenant list); all-tenant admin reads exempt: %v", caught, checked, exempt)
}

// scattered walks a plan and describes the first primitive that does not
// route by the tenant vindex ("" when every one does).
func scattered(node map[string]any) string {
	op, _ := node["OperatorType"].(string)
	variant, _ := node["Variant"].(string)
	switch op {
	case "Route", "Update", "Delete":
		switch variant {
		case "EqualUnique", "Equal", "IN", "MultiEqual":
			if v, _ := node["Vindex"].(string); v != "tenant_xxhash" {
				return op + " by vindex " + v
			}
		default:
			return op + " " + variant
		}
	case "Insert", "Upsert":
		if variant != "Sharded" && variant != "" {
			return op + " " + variant
		}
	}
	for _, key := range []string{"Inputs", "Sources"} {
		children, _ := node[key].([]any)
		for _, c := range children {
			if m, ok := c.(map[string]any); ok {
				if bad := scattered(m); bad != "" {
					return bad
				}
			}
		}
	}
	return ""
}

var shards = testdb.VitessShards

// vitessShardDSN reaches the shards' MySQL directly (vttestserver's one
// mysqld; SHARDQ_TEST_VITESS_SHARD_DSN), to break a shard.
func vitessShardDSN() string {
	if v := os.Getenv("SHARDQ_TEST_VITESS_SHARD_DSN"); v != "" {
		return v
	}
	return "vt_dba@unix(/tmp/shardq-vitess/data/vt_0000000001/mysql.sock)/"
}

// onShard opens vtgate targeted at one shard of the keyspace.
func onShard(t *testing.T, shard string) *sql.DB { return testdb.VitessShard(t, shard) }

// tenantsByShard publishes one message to each of n tenants and reads
// back, shard by shard, which tenants each one holds.
func tenantsByShard(t *testing.T, c *shardq.Client, n int) map[string][]string {
	return testdb.VitessTenantsByShard(t, n, func(tenant string) error {
		_, err := c.Publish(context.Background(), shardq.Message{Tenant: tenant, Topic: "x", PartitionKey: "k", ID: "probe"})
		return err
	})
}

// vitessClient migrates a clean keyspace and opens a client on it.
func vitessClient(t *testing.T) *shardq.Client {
	t.Helper()
	d := testdb.Vitess(t)
	if _, err := d.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	c, err := shardq.NewClient(d, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// vitessOnBothShards migrates a clean keyspace, opens a client with cfg
// on it and places 8 tenants, failing unless each shard holds one.
func vitessOnBothShards(t *testing.T, cfg *shardq.Config) (*mysqldriver.Driver, *shardq.Client, map[string][]string) {
	t.Helper()
	d := testdb.Vitess(t)
	if _, err := d.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	c, err := shardq.NewClient(d, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	placed := tenantsByShard(t, c, 8)
	if len(placed["-80"]) == 0 || len(placed["80-"]) == 0 {
		t.Fatalf("placement %v: want a tenant on each shard", placed)
	}
	return d, c, placed
}

// Tenants spread over both shards, each on one; a partition's offsets
// come from its shard alone; a dead-lettered message stays on its
// tenant's shard.
func TestVitessPlacement(t *testing.T) {
	c := vitessClient(t)
	ctx := context.Background()
	const n = 16
	placed := tenantsByShard(t, c, n)
	where := map[string]string{}
	for shard, tenants := range placed {
		for _, tenant := range tenants {
			if other, dup := where[tenant]; dup {
				t.Fatalf("tenant %s on shards %s and %s", tenant, other, shard)
			}
			where[tenant] = shard
		}
	}
	if len(where) != n || len(placed["-80"]) == 0 || len(placed["80-"]) == 0 {
		t.Fatalf("placement %v: want all %d tenants, each on one shard, both shards used", placed, n)
	}
	// Each shard numbers its own messages: its highest offset is its own
	// count, not the keyspace's.
	for _, shard := range shards {
		var count, highest int
		if err := onShard(t, shard).QueryRowContext(ctx, "SELECT COUNT(*), MAX(`offset`) FROM queue_messages").Scan(&count, &highest); err != nil {
			t.Fatal(err)
		}
		if highest != count || count == n {
			t.Fatalf("shard %s: %d messages, highest offset %d; offsets must be the shard's own", shard, count, highest)
		}
	}
	// A dead-lettered message stays on its tenant's shard.
	tenant := placed["80-"][0]
	cfg := shardq.SubscriberConfig{ConsumerGroup: "g", Topic: "x", Tenants: []string{tenant}, DiscoveryInterval: 50 * time.Millisecond,
		PollInterval: 10 * time.Millisecond, Handler: func(context.Context, *shardq.Delivery) error { return shardq.DeadLetter(errors.New("poison")) }}
	s, err := c.Subscribe(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop(ctx)
	deadline := time.Now().Add(30 * time.Second)
	for {
		var here, there int
		onShard(t, "80-").QueryRowContext(ctx, "SELECT COUNT(*) FROM queue_messages WHERE tenant = ? AND topic = 'x.dlq'", tenant).Scan(&here)
		onShard(t, "-80").QueryRowContext(ctx, "SELECT COUNT(*) FROM queue_messages WHERE tenant = ? AND topic = 'x.dlq'", tenant).Scan(&there)
		if there != 0 {
			t.Fatalf("the dead-letter copy of tenant %s landed on the other shard", tenant)
		}
		if here == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("tenant %s: no dead-letter copy on its shard", tenant)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// One shard failing (its tables renamed away under vttestserver's
// mysqld: every statement there errors, as it would with the shard down)
// stops only its tenants: the subscriber keeps discovering and delivering
// the other shard's, and picks the failed ones up on a later tick once the
// shard is back.
func TestVitessShardDown(t *testing.T) {
	c := vitessClient(t)
	ctx := context.Background()
	placed := tenantsByShard(t, c, 8)
	up, down := placed["-80"][0], placed["80-"][0]
	var mu sync.Mutex
	got := map[string]bool{}
	delivered := func(tenant, id string) func() bool {
		return func() bool { mu.Lock(); defer mu.Unlock(); return got[tenant+"/"+id] }
	}
	s, err := c.Subscribe(ctx, shardq.SubscriberConfig{ConsumerGroup: "g", Topic: "x", Tenants: []string{up, down},
		DiscoveryInterval: 50 * time.Millisecond, PollInterval: 10 * time.Millisecond, HeartbeatInterval: 100 * time.Millisecond,
		StaleAfter: 20 * time.Second, Handler: func(_ context.Context, dl *shardq.Delivery) error {
			mu.Lock()
			got[dl.Tenant+"/"+dl.ID] = true
			mu.Unlock()
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop(ctx)
	waitUntil(t, "both probes delivered", delivered(up, "probe"), delivered(down, "probe"))

	shardDB, err := sql.Open("mysql", vitessShardDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer shardDB.Close()
	tables := []string{"queue_messages", "queue_partitions", "queue_offsets", "queue_partition_leases", "queue_subscriber_heartbeats"}
	rename := func(from, to string) {
		t.Helper()
		var pairs []string
		for _, table := range tables {
			pairs = append(pairs, fmt.Sprintf("`vt_shardq_80-`.%s%s TO `vt_shardq_80-`.%s%s", table, from, table, to))
		}
		if _, err := shardDB.ExecContext(ctx, "RENAME TABLE "+strings.Join(pairs, ", ")); err != nil {
			t.Fatalf("rename on shard 80-: %v", err)
		}
	}
	rename("", "_down")
	restored := false
	defer func() {
		if !restored {
			rename("_down", "")
		}
	}()
	if _, err := c.Publish(ctx, shardq.Message{Tenant: down, Topic: "x", PartitionKey: "k2", ID: "while-down"}); err == nil {
		t.Fatalf("publishing to tenant %s on the failed shard succeeded", down)
	}
	if _, err := c.Publish(ctx, shardq.Message{Tenant: up, Topic: "x", PartitionKey: "new", ID: "while-down"}); err != nil {
		t.Fatalf("publishing to tenant %s on the healthy shard: %v", up, err)
	}
	waitUntil(t, "a new partition of the healthy shard discovered and delivered while the other is down", delivered(up, "while-down"))

	rename("_down", "")
	restored = true
	if _, err := c.Publish(ctx, shardq.Message{Tenant: down, Topic: "x", PartitionKey: "k2", ID: "after"}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the recovered shard's tenant delivered again", delivered(down, "after"))
}

func waitUntil(t *testing.T, what string, conds ...func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ok := true
		for _, c := range conds {
			ok = ok && c()
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A tenant's life across shards: the listing merges both shards in order;
// a suspension, an export and a deletion stay on the tenant's shard, and
// a deletion stopped midway and run again leaves the tenant's neighbours
// on its shard and the other shard's tenants as they were.
func TestVitessTenantLifecycle(t *testing.T) {
	drv := testdb.Vitess(t)
	ctx := context.Background()
	if _, err := drv.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	c, err := shardq.NewClient(drv, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	placed := tenantsByShard(t, c, 8)
	if len(placed["-80"]) < 2 || len(placed["80-"]) == 0 {
		t.Fatalf("placement %v: want two tenants on -80 and one on 80-", placed)
	}
	gone, neighbour := placed["-80"][0], placed["-80"][1]
	var all []string
	for after := ""; ; {
		page, err := c.Admin().Tenants(ctx, after, 3)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		for _, ti := range page {
			all = append(all, ti.Tenant)
			if ti.Messages != 1 {
				t.Fatalf("tenant %s: %d messages, want its probe", ti.Tenant, ti.Messages)
			}
		}
		after = page[len(page)-1].Tenant
	}
	if want := slices.Sorted(slices.Values(slices.Concat(placed["-80"], placed["80-"]))); !slices.Equal(all, want) {
		t.Fatalf("tenants in pages of 3: %v, want %v", all, want)
	}
	for i := range 5 {
		if _, err := c.Publish(ctx, shardq.Message{Tenant: gone, Topic: "x", PartitionKey: fmt.Sprintf("k%d", i), ID: fmt.Sprintf("m%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Admin().SuspendTenant(ctx, gone); err != nil {
		t.Fatal(err)
	}
	var export strings.Builder
	if n, err := c.Admin().ExportTenant(ctx, gone, &export, shardq.ExportOptions{BatchSize: 2}); err != nil || n != 6 {
		t.Fatalf("export of %s: %d messages, %v", gone, n, err)
	}
	counts := func(shard string) map[string]int {
		t.Helper()
		out := map[string]int{}
		for _, table := range []string{"queue_messages", "queue_partitions", "queue_tenants"} {
			rows, err := onShard(t, shard).QueryContext(ctx, "SELECT tenant, COUNT(*) FROM "+table+" GROUP BY tenant")
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				var tenant string
				var n int
				if err := rows.Scan(&tenant, &n); err != nil {
					t.Fatal(err)
				}
				out[table+"/"+tenant] = n
			}
			rows.Close()
		}
		return out
	}
	before := map[string]map[string]int{"-80": counts("-80"), "80-": counts("80-")}
	if before["-80"]["queue_tenants/"+gone] != 1 || before["-80"]["queue_messages/"+gone] != 6 {
		t.Fatalf("shard -80 before the delete: %v", before["-80"])
	}
	// Stopped after two batches of one row, then run again.
	for range 2 {
		if _, n, err := drv.DeleteTenantBatch(ctx, gone, 1); err != nil || n != 1 {
			t.Fatalf("one batch: %d rows, %v", n, err)
		}
	}
	if _, err := c.Admin().DeleteTenant(ctx, gone, shardq.DeleteTenantOptions{Apply: true, BatchSize: 2}); err != nil {
		t.Fatal(err)
	}
	for shard, was := range before {
		now := counts(shard)
		for k, n := range was {
			if strings.HasSuffix(k, "/"+gone) {
				if now[k] != 0 {
					t.Errorf("shard %s keeps %d rows of %s", shard, now[k], k)
				}
			} else if now[k] != n {
				t.Errorf("shard %s: %s has %d rows, had %d", shard, k, now[k], n)
			}
		}
	}
	if _, err := c.Publish(ctx, shardq.Message{Tenant: neighbour, Topic: "x", PartitionKey: "k", ID: "after"}); err != nil {
		t.Fatalf("the neighbour on the same shard: %v", err)
	}
}

// A member's heartbeat rows are written, refreshed and removed in one
// statement however many tenants it serves, through vtgate too (each
// shard's part committed on its own, so they need not go tenant by
// tenant as locks in a transaction do): a member's idle cost does not
// grow with its tenants.
func TestVitessHeartbeatsOneStatementOverShards(t *testing.T) {
	var mu sync.Mutex
	var beats []string
	d := openRecordedBy(t, func(q string) {
		if strings.Contains(q, "queue_subscriber_heartbeats") {
			mu.Lock()
			beats = append(beats, q)
			mu.Unlock()
		}
	})
	if _, err := d.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, now := context.Background(), time.Now()
	var tenants []string
	for i := range 8 {
		tenants = append(tenants, fmt.Sprintf("t%02d", i))
	}
	g := driver.GroupScope{Tenants: tenants, ConsumerGroup: "g", Topic: "x"}
	count := func(what string, call func() error) {
		t.Helper()
		mu.Lock()
		beats = nil
		mu.Unlock()
		if err := call(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(beats) != 1 {
			t.Errorf("%s over %d tenants: %d statements, want 1: %q", what, len(tenants), len(beats), beats)
		}
	}
	count("heartbeat", func() error { return d.Heartbeat(ctx, g, "m", now) })
	for _, shard := range []string{"-80", "80-"} {
		var n int
		if err := testdb.VitessShard(t, shard).QueryRowContext(ctx, "SELECT COUNT(*) FROM queue_subscriber_heartbeats").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			t.Fatalf("shard %s holds no heartbeat row: the tenants must span both shards", shard)
		}
	}
	count("refresh", func() error {
		n, err := d.RefreshHeartbeat(ctx, g, "m", now.Add(time.Second))
		if err == nil && n != int64(len(tenants)) {
			err = fmt.Errorf("refreshed %d rows, want %d", n, len(tenants))
		}
		return err
	})
	count("remove", func() error { return d.RemoveHeartbeat(ctx, g, "m") })
	subs, err := d.Subscribers(ctx, g)
	if err != nil || len(subs) != 0 {
		t.Fatalf("after the remove: %v, %v; want none", subs, err)
	}
}

// A transaction that locks rows of two shards takes them tenant after
// tenant. A renewal of one member's leases on both shards, racing a
// commit that holds the first tenant's lease and then needs the second's,
// waits on the first and lets the commit finish. In one statement over
// both shards the renewal held the second shard's row while it waited on
// the first, the commit waited on it, and neither shard's database saw
// the cycle: both waited out the lock wait timeout (found by the chaos
// runner, docs/chaos.md).
func TestVitessCrossShardLocksTakenInOrder(t *testing.T) {
	d, _, placed := vitessOnBothShards(t, nil)
	ctx := context.Background()
	first, second, firstShard := placed["-80"][0], placed["80-"][0], "-80"
	if second < first {
		first, second, firstShard = second, first, "80-"
	}
	now := time.Now()
	lease := func(tenant string) driver.Lease {
		l, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: driver.PartitionRef{Tenant: tenant, ConsumerGroup: "g", Topic: "x", PartitionKey: "k"}, Owner: "m", Now: now, TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	l1, l2 := lease(first), lease(second)

	tx, err := d.BeginWrite(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if err := d.InTx(tx).CommitOffset(ctx, l1, 1, now); err != nil {
		t.Fatal(err)
	}
	type renewal struct {
		renewed, lost []driver.Lease
		err           error
	}
	done := make(chan renewal, 1)
	go func() {
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		r, l, err := d.RenewLeases(rctx, []driver.Lease{l1, l2}, now, time.Minute)
		done <- renewal{r, l, err}
	}()
	// The renewal waits on the first tenant's row before the commit goes on.
	shard := onShard(t, firstShard)
	for deadline := time.Now().Add(20 * time.Second); ; {
		var waiting int
		if err := shard.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.processlist WHERE info LIKE 'update queue_partition_leases set expires_at%'").Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting > 0 {
			break
		}
		select {
		case r := <-done:
			t.Fatalf("the renewal did not wait for the commit's lock: renewed %v, lost %v, err %v", r.renewed, r.lost, r.err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the renewal never waited on the first tenant's lease")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := d.InTx(tx).CommitOffset(cctx, l2, 1, now); err != nil {
		t.Fatalf("the commit could not lock the second tenant's lease (the renewal holds it while it waits on the first): %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || len(r.renewed) != 2 || len(r.lost) != 0 {
		t.Fatalf("renewal after the commit: renewed %v, lost %v, err %v", r.renewed, r.lost, r.err)
	}
}

// TestVitessTransactionsStayOnTheirTenantsShard begins transactions whose
// first statement is a prepared SELECT … FOR UPDATE (the lease fence), each
// on a new connection, which has not prepared it, under vtgate's
// transaction_mode=SINGLE (which refuses a transaction over two shards),
// for tenants on both shards. vtgate runs a prepare's field query on any
// shard of a transaction that has touched none: with the BEGIN sent
// before that prepare, about half these transactions would span two
// shards.
func TestVitessTransactionsStayOnTheirTenantsShard(t *testing.T) {
	d, _, placed := vitessOnBothShards(t, nil)
	ctx := context.Background()
	now := time.Now()
	var leases []driver.Lease
	for _, tenant := range []string{placed["-80"][0], placed["80-"][0]} {
		l, err := d.AcquireLease(ctx, driver.AcquireLeaseParams{Partition: driver.PartitionRef{Tenant: tenant, ConsumerGroup: "g", Topic: "x", PartitionKey: "k"}, Owner: "m", Now: now, TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
	}
	d.DB().SetMaxIdleConns(0) // a connection closed goes: each Conn below is new
	for i := range 16 {
		l := leases[i%2]
		err := func() error {
			conn, err := d.DB().Conn(ctx)
			if err != nil {
				return err
			}
			defer conn.Close()
			if _, err := conn.ExecContext(ctx, "SET transaction_mode = 'single'"); err != nil {
				return err
			}
			tx, err := conn.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			defer tx.Rollback()
			if err := d.InTx(tx).CommitOffset(ctx, l, int64(i+1), now); err != nil {
				return err
			}
			return tx.Commit()
		}()
		if err != nil {
			t.Fatalf("transaction %d (tenant %s): %v", i, l.Tenant, err)
		}
	}
}

// TestVitessAcceptNextGroupAcrossShards takes, of two tenants' groups on
// two shards, the one whose next message is older, though its offset is
// higher: each shard numbers its messages on its own, so offsets of two
// shards say nothing about which came first.
func TestVitessAcceptNextGroupAcrossShards(t *testing.T) {
	ctx := context.Background()
	var mu sync.Mutex
	now := time.Now()
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	_, c, placed := vitessOnBothShards(t, &shardq.Config{Clock: clock})
	busy, quiet := placed["-80"][0], placed["80-"][0]
	for i := range 20 { // the busy tenant's shard numbers past the quiet one's
		if _, err := c.Publish(ctx, shardq.Message{Tenant: busy, Topic: "other", PartitionKey: "k", ID: fmt.Sprint("f", i)}); err != nil {
			t.Fatal(err)
		}
	}
	older, err := c.Publish(ctx, shardq.Message{Tenant: busy, Topic: "sessions", PartitionKey: "older", ID: "o1"})
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	now = now.Add(time.Second)
	mu.Unlock()
	newer, err := c.Publish(ctx, shardq.Message{Tenant: quiet, Topic: "sessions", PartitionKey: "newer", ID: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	if older[0].Offset <= newer[0].Offset {
		t.Fatalf("offsets: the older message %d, the newer %d; want the older's higher (its shard numbered past the other's)", older[0].Offset, newer[0].Offset)
	}
	for _, want := range []string{"older", "newer"} {
		r, err := c.AcceptNextGroup(ctx, shardq.NextGroupRequest{Tenants: []string{busy, quiet}, Topic: "sessions", ConsumerGroup: "g"},
			&shardq.ReceiverOptions{Name: "r-" + want})
		if err != nil {
			t.Fatalf("accept next (want %q): %v", want, err)
		}
		defer func() {
			if err := r.Stop(ctx); err != nil {
				t.Errorf("stop %s: %v", r.Name(), err)
			}
		}()
		if r.PartitionKey() != want {
			t.Fatalf("accepted %q, want %q (the group whose next message is older)", r.PartitionKey(), want)
		}
	}
}
