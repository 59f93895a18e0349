// SPDX-License-Identifier: Apache-2.0

package vitessfeed_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"go.uber.org/goleak"
	binlogdatapb "vitess.io/vitess/go/vt/proto/binlogdata"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/driver/mysqldriver"
	"github.com/shardq/shardq/internal/testdb"
	"github.com/shardq/shardq/vitessfeed"
)

// These tests run against the local two-shard Vitess (scripts/vitess up);
// they share its keyspace, so they run one after another.

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// keyspace is the test keyspace: the database name of the vtgate DSN.
func keyspace(t *testing.T) string {
	t.Helper()
	cfg, err := mysql.ParseDSN(testdb.VitessDSN())
	if err != nil {
		t.Fatal(err)
	}
	return cfg.DBName
}

// placed migrates a clean keyspace, opens a client without a feed of its
// own, and finds a tenant on each shard.
func placed(t *testing.T) (c *shardq.Client, tenants map[string]string) {
	t.Helper()
	d := testdb.Vitess(t)
	if _, err := d.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	c, err := shardq.NewClient(d, &shardq.Config{ChangeFeed: shardq.FeedOff})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	byShard := testdb.VitessTenantsByShard(t, 8, func(tenant string) error {
		_, err := c.Publish(context.Background(), shardq.Message{Tenant: tenant, Topic: "probe", PartitionKey: "k", ID: "probe"})
		return err
	})
	tenants = map[string]string{}
	for _, shard := range testdb.VitessShards {
		if len(byShard[shard]) == 0 {
			t.Fatalf("placement %v: want a tenant on each shard", byShard)
		}
		tenants[shard] = byShard[shard][0]
	}
	return c, tenants
}

// run runs f from start until the test ends; the feed must end with nil.
func run(t *testing.T, f *vitessfeed.Feed, start *binlogdatapb.VGtid) sink {
	t.Helper()
	events := make(sink, 1000)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- vitessfeed.FeedFrom(ctx, f, events, start) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("feed: %v", err)
		}
	})
	return events
}

func feedAt(t *testing.T, addr string) *vitessfeed.Feed {
	t.Helper()
	return newFeed(t, vitessfeed.Config{Addr: addr, Keyspace: keyspace(t)})
}

// publishEach publishes one message to each tenant's partition and
// returns the moved lines the feed must say, sorted.
func publishEach(t *testing.T, c *shardq.Client, tenants map[string]string, key string) []string {
	t.Helper()
	var want []string
	for _, tenant := range tenants {
		res, err := c.Publish(context.Background(), shardq.Message{Tenant: tenant, Topic: "x", PartitionKey: key})
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, fmt.Sprintf("moved %s/x/%s@%d", tenant, key, res[0].Offset))
	}
	slices.Sort(want)
	return want
}

// nextMoved waits for n moved lines of partition key, sorted.
func nextMoved(t *testing.T, events sink, key string, n int) []string {
	t.Helper()
	var got []string
	for len(got) < n {
		if ev := events.Next(t, "moved "); strings.Contains(ev, "/"+key+"@") {
			got = append(got, ev)
		}
	}
	slices.Sort(got)
	return got
}

// The feed streams both shards' head changes through vtgate: each
// commit names its partition and new head, whichever shard holds it.
func TestVitessFeedNamesHeadsOfBothShards(t *testing.T) {
	c, tenants := placed(t)
	events := run(t, feedAt(t, testdb.VitessGRPCAddr()), nil)
	events.Next(t, "up names=true")
	var lat []time.Duration
	for i := range 5 {
		key := fmt.Sprint("k", i)
		start := time.Now()
		want := publishEach(t, c, tenants, key)
		got := nextMoved(t, events, key, len(want))
		lat = append(lat, time.Since(start))
		if !slices.Equal(got, want) {
			t.Fatalf("feed said %q, want %q", got, want)
		}
	}
	slices.Sort(lat)
	t.Logf("publish to both shards to both wake-ups, 5 rounds: median %s, max %s", lat[len(lat)/2], lat[len(lat)-1])
}

// A cut stream is said (Down), opened again from the last position (Up,
// which makes consumers rescan), and what committed meanwhile is named.
func TestVitessFeedReconnectsAfterCut(t *testing.T) {
	c, tenants := placed(t)
	proxy := testdb.NewCutProxy(t, testdb.VitessGRPCAddr())
	events := run(t, feedAt(t, proxy.Addr()), nil)
	events.Next(t, "up names=true")
	want := publishEach(t, c, tenants, "before")
	if got := nextMoved(t, events, "before", len(want)); !slices.Equal(got, want) {
		t.Fatalf("before the cut: feed said %q, want %q", got, want)
	}
	if n := proxy.Cut(); n == 0 {
		t.Fatal("the proxy had no connection to cut")
	}
	// Published while the feed waits to reconnect (100 ms): the stream
	// resumes from the position before it, so the feed names it.
	want = publishEach(t, c, tenants, "during")
	events.Next(t, "down ")
	events.Next(t, "up names=true")
	if got := nextMoved(t, events, "during", len(want)); !slices.Equal(got, want) {
		t.Fatalf("after the cut: feed said %q, want %q", got, want)
	}
}

// A position vtgate refuses (one that does not parse, as a position
// from another flavour would not), or one that shows no position of its
// own within three heartbeats (ahead of each shard's binary log, as after
// a failover that lost transactions: MariaDB waits for it silently), is
// said once; the feed goes on from the current positions with Up, which
// makes consumers rescan, and names what commits next.
func TestVitessFeedRefusedPositionRescans(t *testing.T) {
	c, tenants := placed(t)
	ks := keyspace(t)
	var current string // a shard's own position, as the shard reports it
	if err := testdb.VitessShard(t, "80-").QueryRow("SELECT @@global.gtid_binlog_pos").Scan(&current); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, gtid, other, why string }{
		{"refused", "MariaDB/not-a-gtid", "", "could not decode position"},
		{"ahead of the log", "MariaDB/0-1-999999999", "", "shards -80, 80- showed no position within three heartbeats"},
		// Only the stuck shard starts again from its current position:
		// the other's commits would otherwise hide it.
		{"one shard ahead of its log", "MariaDB/0-1-999999999", "MariaDB/" + current, "shards -80 showed no position within three heartbeats"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var gtids []*binlogdatapb.ShardGtid
			for _, shard := range testdb.VitessShards {
				gtid := tc.gtid
				if shard == "80-" && tc.other != "" {
					gtid = tc.other
				}
				gtids = append(gtids, &binlogdatapb.ShardGtid{Keyspace: ks, Shard: shard, Gtid: gtid})
			}
			events := run(t, feedAt(t, testdb.VitessGRPCAddr()), &binlogdatapb.VGtid{ShardGtids: gtids})
			if tc.other != "" {
				// The shard at its own position moves on a commit there.
				events.Next(t, "up names=true")
				if _, err := c.Publish(context.Background(), shardq.Message{Tenant: tenants["80-"], Topic: "x", PartitionKey: "moves"}); err != nil {
					t.Fatal(err)
				}
			}
			if ev := events.Next(t, "down "); !strings.Contains(ev, tc.why) {
				t.Fatalf("the stream from %s ended with %q, want %q", tc.gtid, ev, tc.why)
			}
			events.Next(t, "note shardq: vitess change feed position refused")
			events.Next(t, "up names=true")
			key := "after-" + strings.ReplaceAll(tc.name, " ", "-")
			want := publishEach(t, c, tenants, key)
			if got := nextMoved(t, events, key, len(want)); !slices.Equal(got, want) {
				t.Fatalf("feed said %q, want %q", got, want)
			}
		})
	}
}

// A keyspace vtgate does not have is said (Down names it) and asked for
// again with backoff, since it may yet be created; the feed ends cleanly
// when its context does.
func TestVitessFeedUnknownKeyspace(t *testing.T) {
	testdb.SkipVitess(t)
	f := newFeed(t, vitessfeed.Config{Addr: testdb.VitessGRPCAddr(), Keyspace: "no_such_keyspace"})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	events := make(sink, 100)
	done := make(chan error, 1)
	go func() { done <- f.FeedHeads(ctx, events) }()
	ev := events.Next(t, "down ")
	if !strings.Contains(ev, "no_such_keyspace") {
		t.Fatalf("feed said %q, want the unknown keyspace named", ev)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("feed ended with %v, want nil at cancellation", err)
	}
}

// A client on vtgate with the feed: a subscriber in another client hears
// of each message through the feed, not its poll (its polls are 30 s apart here),
// for tenants on both shards.
func TestVitessClientWakesThroughFeed(t *testing.T) {
	publisher, tenants := placed(t)
	f := feedAt(t, testdb.VitessGRPCAddr())
	d, err := mysqldriver.Open(testdb.VitessDSN(), mysqldriver.HeadFeed(f))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	c, err := shardq.NewClient(d, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var mu sync.Mutex
	got := map[string]time.Time{}
	arrived := make(chan struct{}, 100)
	ts := []string{tenants["-80"], tenants["80-"]}
	sub, err := c.Subscribe(context.Background(), shardq.SubscriberConfig{ConsumerGroup: "g", Topic: "x", Tenants: ts,
		PollInterval: 30 * time.Second, FeedPollInterval: 30 * time.Second, DiscoveryInterval: 30 * time.Second,
		Handler: func(ctx context.Context, m *shardq.Delivery) error {
			mu.Lock()
			got[m.ID] = time.Now()
			mu.Unlock()
			arrived <- struct{}{}
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Stop(context.Background())
	// Each tenant's partition is known to the subscriber (its first
	// message read by its first poll) before the feed is up.
	for _, tenant := range ts {
		if _, err := publisher.Publish(context.Background(), shardq.Message{Tenant: tenant, Topic: "x", PartitionKey: "k", ID: "first-" + tenant}); err != nil {
			t.Fatal(err)
		}
	}
	for range ts {
		select {
		case <-arrived:
		case <-time.After(30 * time.Second):
			t.Fatal("the first messages were not delivered within 30 s")
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for !c.FeedUp() {
		if time.Now().After(deadline) {
			t.Fatal("the client's feed is not up after 30 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// From here a message reaches the idle subscriber only through the
	// feed, well inside its 30 s poll.
	sent := map[string]time.Time{}
	for i := range 10 {
		tenant := ts[i%2]
		id := fmt.Sprint("m", i)
		sent[id] = time.Now()
		if _, err := publisher.Publish(context.Background(), shardq.Message{Tenant: tenant, Topic: "x", PartitionKey: "k", ID: id}); err != nil {
			t.Fatal(err)
		}
		select {
		case <-arrived:
		case <-time.After(5 * time.Second):
			t.Fatalf("message %s (tenant %s) not delivered within 5 s: the feed did not wake the subscriber", id, tenant)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	var lat []time.Duration
	for id, at := range got {
		if s, ok := sent[id]; ok {
			lat = append(lat, at.Sub(s))
		}
	}
	slices.Sort(lat)
	t.Logf("publish to delivery through the Vitess feed, 10 messages over 2 shards: median %s, max %s", lat[len(lat)/2], lat[len(lat)-1])
}

var _ driver.HeadFeed = (*vitessfeed.Feed)(nil)
