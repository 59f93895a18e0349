// SPDX-License-Identifier: Apache-2.0

package vitesstest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/driver/mysqldriver"
	"github.com/shardq/shardq/internal/conformance"
	"github.com/shardq/shardq/internal/testdb"
)

// TestVitess runs the client's conformance suite through vtgate: one
// keyspace of two shards, sharded by tenant (vschema.json), a keyspace of
// the pool per test. It records every statement the driver sends
// meanwhile, and then proves the routing.
//
// With -short (CI) it runs vitessShort. The long form (scripts/test
// --long) runs every scenario, and fails when a statement shape of the
// whole suite is missing from what vitessShort sends, naming the
// scenarios that send it.
func TestVitess(t *testing.T) {
	var log testdb.StatementLog
	var mu sync.Mutex
	shapes := map[string]map[string]bool{} // statement shape -> the scenarios that send it
	record := func(t *testing.T) func(string) {
		scenario := strings.SplitN(t.Name(), "/", 4)[2] // TestVitess/Conformance/<scenario>[/…]
		return func(q string) {
			log.Record(q)
			if shape, ok := testdb.StatementShape(q); ok {
				mu.Lock()
				if shapes[shape] == nil {
					shapes[shape] = map[string]bool{}
				}
				shapes[shape][scenario] = true
				mu.Unlock()
			}
		}
	}
	var only []string
	floor := 290 // the whole suite sends about 363 distinct statements that route by tenant (IN lists vary with timing)
	if testing.Short() {
		only, floor = vitessShort, 220 // about 275
	}
	t.Run("Conformance", func(t *testing.T) {
		conformance.RunParallel(t, func(t *testing.T) driver.Driver {
			_, dsn := testdb.VitessIn(t) // a clean keyspace of t's own
			return testdb.VitessRecorded(t, dsn, record(t))
		}, func(t *testing.T) driver.Driver {
			_, dsn := testdb.VitessMigrated(t) // migrated, no rows
			return testdb.VitessRecorded(t, dsn, record(t))
		}, only...)
	})
	// A floor near the count catches a recording that lost most of them.
	t.Run("RoutingProof", func(t *testing.T) { testdb.RoutingProof(t, log.All(), floor) })
	if !testing.Short() {
		t.Run("ShortFormSendsEveryShape", func(t *testing.T) {
			for shape, scenarios := range shapes {
				if !slices.ContainsFunc(vitessShort, func(s string) bool { return scenarios[s] }) {
					t.Errorf("no scenario of vitessShort sends this statement; add one of %v:\n%s", slices.Sorted(maps.Keys(scenarios)), shape)
				}
			}
		})
	}
}

// vitessShort is the conformance suite's CI form through vtgate: the
// fewest scenarios, cheapest first, that send every statement shape the
// whole suite sends (31, 45 s of the suite's 212 s when chosen), and the
// scenarios of the ordering and idempotency invariants, whose interleavings
// through vtgate matter beyond the statements' routing. Every scenario
// runs on SQLite and MariaDB in CI, and through vtgate in the long form.
var vitessShort = []string{
	// Every statement shape.
	"AdminInspectAndDeleteOneRow", "AdminListingsArePaged", "AdminListingsAreScoped", "AdminRequeueDeadLetter",
	"AdminResetOffsets", "DedupWindow", "Deferral", "DeferralReceipts", "DeleteTenant", "ExportTenant",
	"IdempotentAcrossCalls", "LapsedClaimNotDelivered", "ListTenants", "LostLeaseCancelsHandler", "MessagesExpire",
	"MixedSubscribers", "NotMigratedSaysSo", "PublishDuringLargeWrite", "ReceiptsBytesBoundedByDefault",
	"ReceiptsChangeVisibility", "ReceiptsNextGroupAndWait", "ReceiptsUngrouped", "RemovalKeepsWhatAGroupHasNotPassed",
	"RemovalWaitsForLiveLeases", "RetentionRemovesDrainedPartitions", "StaticMembership", "SuspendGivesBackClaims",
	"TenantRetention", "TxChecksExhausted", "TxUnknownThenChecked", "UngroupedReplayAfterOffsetReset",
	// Ordering and idempotency under concurrent commits.
	"IdempotentUnderRace", "LaterCommitNeverHidesBehindOpenOne", "NoSkipWithSlowConcurrentCommits",
	"PublishTxCommitAndRollback", "SubscribersDeliverInOrder", "TxConcurrentSendsInCommitOrder",
}

// vitessShardDSN reaches the shards' MySQL directly (vttestserver's one
// mysqld; SHARDQ_TEST_VITESS_SHARD_DSN), to break a shard.
func vitessShardDSN() string {
	if v := os.Getenv("SHARDQ_TEST_VITESS_SHARD_DSN"); v != "" {
		return v
	}
	return "vt_dba@unix(/tmp/shardq-vitess/data/vt_0000000001/mysql.sock)/"
}

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

var shards = testdb.VitessShards

// onShard opens vtgate targeted at one shard of the keyspace.
func onShard(t *testing.T, shard string) *sql.DB { return testdb.VitessShard(t, shard) }

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
