// SPDX-License-Identifier: Apache-2.0

package shardq_test

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/driver/mysqldriver"
	"github.com/shardq/shardq/internal/testdb"
)

// feedPair is a publishing client and a consuming client over drivers of
// their own, as two processes have: only the change feed (or a poll) can
// tell the consumer of the publisher's messages.
type feedPair struct {
	pub, sub *shardq.Client
	log      *testdb.LogLines
}

func openFeedPair(t *testing.T, db string) feedPair {
	t.Helper()
	pubDrv, subDrv := testdb.TwoDrivers(t, db)
	p := feedPair{log: &testdb.LogLines{}}
	p.pub = newTestClient(t, pubDrv, nil)
	if err := p.pub.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	p.sub = newTestClient(t, subDrv, &shardq.Config{Logger: slog.New(p.log)})
	return p
}

func openMySQL(t *testing.T, dsn string) *mysqldriver.Driver {
	t.Helper()
	d, err := mysqldriver.Open(dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func newTestClient(t *testing.T, d driver.Driver, cfg *shardq.Config) *shardq.Client {
	t.Helper()
	c, err := shardq.NewClient(d, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// never is a poll interval no test lasts: what arrives came by the feed.
const never = time.Hour

// waitFor polls cond until it holds or 30 s pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A subscriber, a group receiver and an ungrouped consumer that never
// poll still get every message another client publishes, one at a time,
// in order: the change feed wakes them.
func TestFeedWakesAcrossClients(t *testing.T) {
	for _, db := range []string{"sqlite", "mysql"} {
		t.Run(db, func(t *testing.T) {
			ctx := context.Background()
			p := openFeedPair(t, db)
			var mu sync.Mutex
			var got []string
			record := func(_ context.Context, d *shardq.Delivery) error {
				mu.Lock()
				defer mu.Unlock()
				got = append(got, string(d.Payload))
				return nil
			}
			received := func() []string {
				mu.Lock()
				defer mu.Unlock()
				return append([]string(nil), got...)
			}
			sub, err := p.sub.Subscribe(ctx, shardq.SubscriberConfig{ConsumerGroup: "g", Topic: "x", Tenants: []string{"t"}, Handler: record,
				DiscoveryInterval: 20 * time.Millisecond, PollInterval: never, FeedPollInterval: never})
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Stop(ctx)
			waitFor(t, "the feed to come up", p.sub.FeedUp)

			publish := func(key, payload string) {
				t.Helper()
				if _, err := p.pub.Publish(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: key, Payload: []byte(payload)}); err != nil {
					t.Fatal(err)
				}
			}
			// The first message is found by discovery, which leases the
			// partition; every later one finds its worker idle, and only
			// a wake-up can start it.
			var want []string
			for i := range 20 {
				msg := fmt.Sprintf("grouped %d", i)
				want = append(want, msg)
				publish("k", msg)
				waitFor(t, msg, func() bool { return len(received()) == len(want) })
			}
			// Ungrouped messages: the claimers' only poll is at start.
			for i := range 5 {
				msg := fmt.Sprintf("ungrouped %d", i)
				want = append(want, msg)
				publish("", msg)
				waitFor(t, msg, func() bool { return len(received()) == len(want) })
			}
			if g := received(); strings.Join(g, ",") != strings.Join(want, ",") {
				t.Fatalf("delivered %q; want %q", g, want)
			}

			// A group receiver waiting in Receive.
			r, err := p.sub.AcceptGroup(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "receivers"}, "r", &shardq.ReceiverOptions{PollInterval: never, FeedPollInterval: never})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Stop(ctx)
			for i := range 5 {
				msg := fmt.Sprintf("received %d", i)
				done := make(chan error, 1)
				go func() {
					rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
					defer cancel()
					d, err := r.Receive(rctx)
					if err == nil && string(d.Payload) != msg {
						err = fmt.Errorf("received %q, want %q", d.Payload, msg)
					}
					if err == nil {
						err = r.Ack(rctx, d)
					}
					done <- err
				}()
				publish("r", msg)
				if err := <-done; err != nil {
					t.Fatal(err)
				}
			}
			if n := p.log.Count("change feed unavailable"); n != 0 {
				t.Fatalf("the feed said it was unavailable %d times", n)
			}
		})
	}
}

// The feed's connection is cut again and again while messages flow: the
// poll takes over while it is down, it reconnects from where it was, and
// nothing is lost or reordered.
func TestFeedSurvivesCuts(t *testing.T) {
	ctx := context.Background()
	direct, proxied, proxy := proxiedDatabase(t)
	pub := newTestClient(t, openMySQL(t, direct), nil)
	if err := pub.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	log := &testdb.LogLines{}
	subClient := newTestClient(t, openMySQL(t, proxied), &shardq.Config{Logger: slog.New(log)})

	var mu sync.Mutex
	last := map[string]int{}
	var disorder []string
	delivered := 0
	sc := faultSubscriberConfig(func(_ context.Context, d *shardq.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		var seq int
		fmt.Sscan(string(d.Payload), &seq)
		if seq < last[d.PartitionKey] {
			disorder = append(disorder, fmt.Sprintf("%s: %d after %d", d.PartitionKey, seq, last[d.PartitionKey]))
		}
		if seq > last[d.PartitionKey] {
			delivered++
			last[d.PartitionKey] = seq
		}
		return nil
	})
	sc.FeedPollInterval = never
	sub, err := subClient.Subscribe(ctx, sc)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Stop(ctx)
	waitFor(t, "the feed to come up", subClient.FeedUp)

	const keys, perKey = 4, 60
	for i := 1; i <= perKey; i++ {
		for k := range keys {
			if _, err := pub.Publish(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: fmt.Sprint("k", k), Payload: []byte(fmt.Sprint(i))}); err != nil {
				t.Fatal(err)
			}
		}
		if i%10 == 0 {
			// Each cut hits a live connection: the one before has been
			// noticed and replaced (on a loaded machine the reconnect can
			// outlast the publishes between two cuts).
			ups := log.Count("change feed up")
			proxy.Cut()
			time.Sleep(20 * time.Millisecond) // let messages flow while it is down
			waitFor(t, "the feed back after a cut", func() bool { return log.Count("change feed up") > ups })
		}
	}
	waitFor(t, "every message", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return delivered == keys*perKey
	})
	mu.Lock()
	defer mu.Unlock()
	if len(disorder) > 0 {
		t.Fatalf("out of order: %v", disorder)
	}
	waitFor(t, "the feed to come back", subClient.FeedUp)
	if down, up := log.Count("change feed down"), log.Count("change feed up"); down < 2 || up < 3 {
		t.Fatalf("feed went down %d and up %d times over six cuts; want it to notice and reconnect", down, up)
	}
}

// A user without the replication privileges gets one log line naming
// what is missing, and its consumers poll as without a feed: without any
// (the position cannot be read), and with the position but without the
// right to read the log.
func TestFeedWithoutPrivilegeFallsBack(t *testing.T) {
	for _, tc := range []struct{ name, grant, names string }{
		{"none", "", "REPLICATION CLIENT"},
		{"monitor only", "GRANT BINLOG MONITOR ON *.* TO ", "REPLICATION SLAVE"},
	} {
		t.Run(tc.name, func(t *testing.T) { testFeedWithoutPrivilege(t, tc.grant, tc.names) })
	}
}

func testFeedWithoutPrivilege(t *testing.T, grant, names string) {
	ctx := context.Background()
	dsn := testdb.MySQLDatabase(t)
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	user := "'nofeed_" + strings.TrimPrefix(cfg.DBName, "shardq_test_") + "'@'%'"
	stmts := []string{"CREATE USER " + user + " IDENTIFIED BY 'pw'", "GRANT ALL PRIVILEGES ON `" + cfg.DBName + "`.* TO " + user}
	if grant != "" {
		stmts = append(stmts, grant+user)
	}
	for _, stmt := range stmts {
		if _, err := admin.ExecContext(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	t.Cleanup(func() { admin.ExecContext(context.Background(), "DROP USER "+user) })
	pub := newTestClient(t, openMySQL(t, dsn), nil)
	if err := pub.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	cfg.User, cfg.Passwd = strings.Trim(strings.Split(user, "@")[0], "'"), "pw"
	log := &testdb.LogLines{}
	c := newTestClient(t, openMySQL(t, cfg.FormatDSN()), &shardq.Config{Logger: slog.New(log)})
	got := make(chan string, 10)
	sub, err := c.Subscribe(ctx, shardq.SubscriberConfig{ConsumerGroup: "g", Topic: "x", Tenants: []string{"t"},
		DiscoveryInterval: 20 * time.Millisecond, PollInterval: 20 * time.Millisecond,
		Handler: func(_ context.Context, d *shardq.Delivery) error { got <- string(d.Payload); return nil }})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Stop(ctx)
	waitFor(t, "the fallback line", func() bool { return log.Count("change feed unavailable") > 0 })
	for i := range 3 {
		if _, err := pub.Publish(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", Payload: []byte(fmt.Sprint(i))}); err != nil {
			t.Fatal(err)
		}
		select {
		case m := <-got:
			if m != fmt.Sprint(i) {
				t.Fatalf("got %q, want %d", m, i)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("message %d not delivered by polling", i)
		}
	}
	if n := log.Count("change feed unavailable"); n != 1 || c.FeedUp() {
		t.Fatalf("%d fallback lines, feed up %v; want one line and no feed", n, c.FeedUp())
	}
	if log.Count(names) != 1 {
		t.Fatalf("the fallback line does not name %s: %q", names, log.All())
	}
}

// feedHelperEnv makes the test binary a subscriber process whose polls
// are an hour apart: it prints "up" once its feed streams, then each
// payload it is handed, until killed.
const feedHelperEnv = "SHARDQ_FEED_HELPER_DSN"

func runFeedHelper(url string) int {
	c, _, err := openURL(url)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	var mu sync.Mutex
	_, err = c.Subscribe(context.Background(), shardq.SubscriberConfig{ConsumerGroup: "g", Topic: "x", Tenants: []string{"t"},
		DiscoveryInterval: 20 * time.Millisecond, PollInterval: never, FeedPollInterval: never,
		Handler: func(_ context.Context, d *shardq.Delivery) error {
			mu.Lock()
			defer mu.Unlock()
			fmt.Fprintln(os.Stdout, string(d.Payload)) // unbuffered
			return nil
		}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	for !c.FeedUp() {
		time.Sleep(5 * time.Millisecond)
	}
	mu.Lock()
	fmt.Fprintln(os.Stdout, "up")
	mu.Unlock()
	select {} // until killed
}

// A subscriber in another process, which never polls, is handed every
// message this process publishes, one at a time, in order.
func TestFeedWakesAcrossProcesses(t *testing.T) {
	eachDatabase(t, func(t *testing.T, url string, _ driver.Driver, c *shardq.Client) {
		ctx := context.Background()
		cmd, stdout := startHelper(t, feedHelperEnv, url)
		defer func() {
			cmd.Process.Kill()
			cmd.Wait()
		}()
		lines := make(chan string, 100)
		go func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				lines <- sc.Text()
			}
			close(lines)
		}()
		next := func(want string) {
			t.Helper()
			select {
			case got, ok := <-lines:
				if !ok || got != want {
					t.Fatalf("the subscriber process said %q (open %v), want %q", got, ok, want)
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("the subscriber process did not say %q within 30 s", want)
			}
		}
		next("up")
		// The first message is found by discovery; each later one finds
		// the partition's worker idle, and only the feed can wake it.
		for i := range 10 {
			msg := fmt.Sprint("m", i)
			if _, err := c.Publish(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", Payload: []byte(msg)}); err != nil {
				t.Fatal(err)
			}
			next(msg)
		}
	})
}

// A message to a key that no member holds runs the control loop's next
// tick early: with rebalancing an hour apart, each new key published by
// another client is still leased and delivered.
func TestFeedLeasesNewKeysEarly(t *testing.T) {
	for _, db := range []string{"sqlite", "mysql"} {
		t.Run(db, func(t *testing.T) {
			ctx := context.Background()
			p := openFeedPair(t, db)
			got := make(chan string, 10)
			sub, err := p.sub.Subscribe(ctx, shardq.SubscriberConfig{ConsumerGroup: "g", Topic: "x", Tenants: []string{"t"},
				DiscoveryInterval: never, JoinWindow: 10 * time.Millisecond, PollInterval: never, FeedPollInterval: never,
				Handler: func(_ context.Context, d *shardq.Delivery) error { got <- d.PartitionKey; return nil }})
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Stop(ctx)
			waitFor(t, "the feed to come up", p.sub.FeedUp)
			time.Sleep(50 * time.Millisecond) // past the first tick, which found nothing
			for i := range 3 {
				key := fmt.Sprint("new-", i)
				if _, err := p.pub.Publish(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: key, Payload: []byte("x")}); err != nil {
					t.Fatal(err)
				}
				select {
				case k := <-got:
					if k != key {
						t.Fatalf("delivered key %q, want %q", k, key)
					}
				case <-time.After(30 * time.Second):
					t.Fatalf("key %q not leased within 30 s: the wake-up did not run a tick", key)
				}
			}
		})
	}
}

// A ChangeFeed that is neither FeedAuto nor FeedOff is refused, naming
// the field.
func TestChangeFeedModeIsChecked(t *testing.T) {
	_, err := shardq.NewClient(testdb.SQLite(t), &shardq.Config{ChangeFeed: 7})
	var ve *shardq.ValidationError
	if !errors.As(err, &ve) || !strings.Contains(err.Error(), "change feed") {
		t.Fatalf("NewClient with ChangeFeed 7: %v; want a validation error naming the change feed", err)
	}
}

// fetchRecorder notes when a group receiver reads its group.
type fetchRecorder struct {
	driver.Driver
	at chan time.Time
}

func (r fetchRecorder) FetchWithin(ctx context.Context, p driver.FetchWithinParams) ([]driver.Message, bool, error) {
	select {
	case r.at <- time.Now():
	default:
	}
	return r.Driver.FetchWithin(ctx, p)
}

// Without a change feed, a group receiver that handed a message out looks
// again soon (a twentieth of PollInterval), not a whole PollInterval
// later, so that the next message of a busy group arrives within
// milliseconds of its commit in another process; while none comes, it
// backs off to PollInterval.
func TestReceiverLooksSoonAfterAMessage(t *testing.T) {
	const every = time.Second // a floor of 50 ms
	pubDrv, subDrv := testdb.TwoDrivers(t, "sqlite")
	pub := newTestClient(t, pubDrv, nil)
	if err := pub.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	fetches := make(chan time.Time, 64)
	sub := newTestClient(t, fetchRecorder{subDrv, fetches}, &shardq.Config{ChangeFeed: shardq.FeedOff})
	ctx := context.Background()
	if _, err := pub.Publish(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "m1"}); err != nil {
		t.Fatal(err)
	}
	r, err := sub.AcceptGroup(ctx, shardq.GroupRef{Tenant: "t", Topic: "x", ConsumerGroup: "g"}, "k", &shardq.ReceiverOptions{PollInterval: every})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop(ctx)
	d, err := r.Receive(ctx)
	if err != nil || d.ID != "m1" {
		t.Fatalf("Receive: %v, %v", d, err)
	}
	if err := r.Ack(ctx, d); err != nil {
		t.Fatal(err)
	}
	for len(fetches) > 0 {
		<-fetches
	}
	got := make(chan error, 1)
	go func() {
		d, err := r.Receive(ctx)
		if err == nil && d.ID != "m2" {
			err = fmt.Errorf("received %s, want m2", d.ID)
		}
		if err == nil {
			err = r.Ack(ctx, d)
		}
		got <- err
	}()
	look := func() time.Time {
		t.Helper()
		select {
		case at := <-fetches:
			return at
		case <-time.After(10 * time.Second):
			t.Fatal("the receiver stopped looking")
			return time.Time{}
		}
	}
	from := time.Now()
	var at []time.Time
	for range 11 { // at once, 4 × 50 ms, then 100, 200, 400, 800, 1000, 1000 ms
		at = append(at, look())
	}
	if took := at[3].Sub(from); took >= every {
		t.Fatalf("4 looks after a message took %v: not sooner than PollInterval (%v)", took, every)
	}
	if tail := at[10].Sub(at[7]); tail < every*6/10 {
		t.Fatalf("the last 3 of 10 looks with no message took %v: not backing off towards PollInterval (%v)", tail, every)
	}
	if _, err := pub.Publish(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "m2"}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("m2 was not received")
	}
}
