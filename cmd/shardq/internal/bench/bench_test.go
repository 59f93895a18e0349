// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/driver/mysqldriver"
	"github.com/shardq/shardq/driver/sqlitedriver"
	"github.com/shardq/shardq/internal/testdb"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"))
}

// databases returns an opener per database, each on its own fresh database.
func databases(t *testing.T) map[string]func() (driver.Driver, error) {
	path := filepath.Join(t.TempDir(), "bench.db")
	dsn := testdb.MySQLDatabase(t)
	return map[string]func() (driver.Driver, error){
		"sqlite": func() (driver.Driver, error) { return sqlitedriver.Open(path, nil) },
		"mysql":  func() (driver.Driver, error) { return mysqldriver.Open(dsn) },
	}
}

var small = Params{Messages: 600, Size: 64, Publishers: 4, Batch: 1, Partitions: 8, Tenants: 2, Subscribers: 2, Handlers: 2,
	Rate: 200, Duration: 500 * time.Millisecond, Reps: 1, PollInterval: 20 * time.Millisecond, History: 500, Active: 8, LargeBytes: 1 << 20}

// Every scenario runs, is checked, reports its baseline and ratio, and
// leaves nothing behind.
func TestScenarios(t *testing.T) {
	for name, open := range databases(t) {
		t.Run(name, func(t *testing.T) {
			r := &Runner{Open: open}
			cases := []struct {
				scenario string
				params   func(Params) Params
				want     []string
			}{
				{"raw", func(p Params) Params { p.Batch = 50; return p },
					[]string{"raw-insert-1conn", "raw-append-1conn", "raw-insert-4conn", "raw-append-4conn", "raw-multirow-50", "raw-ordered-consume"}},
				{"publish", func(p Params) Params { return p }, []string{"raw-insert-4conn", "raw-append-4conn", "publish"}},
				{"publish", func(p Params) Params { p.Batch = 50; return p }, []string{"raw-multirow-50", "publish"}},
				{"async", func(p Params) Params { return p }, []string{"raw-insert-1conn", "raw-multirow-100", "publish-async"}},
				{"consume", func(p Params) Params { return p }, []string{"raw-ordered-consume", "consume"}},
				{"latency", func(p Params) Params { return p }, []string{"raw-insert-1conn", "latency"}},
				{"ungrouped", func(p Params) Params { p.HandlerDelay = time.Millisecond; return p }, []string{"raw-claim-delete", "ungrouped"}},
				{"discovery", func(p Params) Params { return p }, []string{"consume-without-history", "discovery"}},
				{"api", func(p Params) Params { p.Batch = 10; return p }, []string{"publish", "api-publish", "consume", "api-consume", "api-large", "api-attack"}},
				{"large", func(p Params) Params { p.LargeBytes = 3<<20 + 5; return p }, []string{"raw-large", "large", "large-http"}},
				// Handlers of 10 ms: the backlog (75 a partition) outlasts the window.
				{"noisy", func(p Params) Params { p.HandlerDelay, p.Rate = 10*time.Millisecond, 40; return p },
					[]string{"noisy-quiet-alone", "noisy-quiet", "noisy-busy-alone", "noisy-busy"}},
			}
			for _, c := range cases {
				results, err := r.Run(context.Background(), c.scenario, c.params(small))
				if err != nil {
					t.Fatalf("%s: %v", c.scenario, err)
				}
				var names []string
				for _, res := range results {
					names = append(names, res.Scenario)
					if res.Failed() || res.Duplicates != 0 {
						t.Errorf("%s/%s: lost %d, duplicates %d, out of order %d", c.scenario, res.Scenario, res.Lost, res.Duplicates, res.OutOfOrder)
					}
					if res.MsgsPerSec <= 0 || res.Driver != name || res.Msgs <= 0 {
						t.Errorf("%s/%s: %+v", c.scenario, res.Scenario, res)
					}
				}
				if strings.Join(names, ",") != strings.Join(c.want, ",") {
					t.Fatalf("%s ran %v, want %v", c.scenario, names, c.want)
				}
				// Each measurement has its baseline before it, in the same
				// run (api: two pairs; publish: the raw append floor and
				// publish both against raw-insert).
				seen := map[string]bool{}
				for i, res := range results {
					if c.scenario != "raw" && c.scenario != "async" && c.scenario != "api" && i%2 == 1 || c.scenario == "publish" && i > 0 ||
						c.scenario == "async" && i == 2 || c.scenario == "api" && (i == 1 || i == 3) {
						if !seen[res.Baseline] || res.Ratio <= 0 {
							t.Errorf("%s/%s: baseline %q ratio %v", c.scenario, res.Scenario, res.Baseline, res.Ratio)
						}
					}
					seen[res.Scenario] = true
				}
				if last := results[len(results)-1]; c.scenario == "latency" && (last.P99Ms <= 0 || last.Msgs != 100) {
					t.Errorf("latency: %d msgs, p99 %v ms", last.Msgs, last.P99Ms)
				}
				if last := results[len(results)-1]; c.scenario == "api" {
					// Hostile bodies are refused by their bounds, holding
					// no more than the server's budget.
					p := last.Params
					for _, attack := range []string{"publish_body", "receipts_body"} {
						if live := p[attack+"_live_mib"].(float64); p[attack+"_peak_mib"].(float64) <= 0 || live > float64(p["inflight_budget_mib"].(int)) {
							t.Errorf("api-attack %s: %v MiB live, budget %v MiB", attack, live, p["inflight_budget_mib"])
						}
					}
				}
				if last := results[len(results)-2]; c.scenario == "api" {
					// Each response stops at the byte budget (plus at most
					// one message of 1.5 MiB).
					p := last.Params
					if p["peak_heap_mib"].(float64) <= 0 || p["largest_response_mib"].(float64) > float64(p["budget_mib"].(int))+1.6 || p["receives"].(int) < 3 {
						t.Errorf("api-large: %v", p)
					}
				}
				if last := results[len(results)-1]; c.scenario == "discovery" {
					// The history went; the active partitions' rows (head,
					// cursor, lease) stay, as they are younger than the idle age.
					p := last.Params
					if p["history_rows_after"] != int64(0) || p["metadata_rows_after"] != int64(3*small.Active) ||
						p["metadata_rows_before"].(int64) < int64(3*small.History) || p["retention_removed"] != int64(small.History) ||
						p["tick_p50_ms"].(float64) <= 0 || p["tick_first_ms"].(float64) <= 0 {
						t.Errorf("discovery: %v", p)
					}
				}
			}
			assertClean(t, open)
		})
	}
}

// assertClean fails unless no bench tenant's row and no raw table remain.
func assertClean(t *testing.T, open func() (driver.Driver, error)) {
	t.Helper()
	d, err := open()
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ctx := context.Background()
	tables, err := queueTables(ctx, d)
	if err != nil || len(tables) < 8 {
		t.Fatalf("queue tables %v: %v", tables, err)
	}
	for _, table := range tables {
		var n int
		if err := d.DB().QueryRowContext(ctx, "SELECT COUNT(*) FROM "+table+" WHERE tenant LIKE 'bench-%'").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Errorf("%s keeps %d rows of bench tenants", table, n)
		}
	}
	q := `SELECT COUNT(*) FROM sqlite_master WHERE name LIKE 'bench_raw%'`
	if d.Name() == "mysql" {
		q = `SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name LIKE 'bench_raw%'`
	}
	var n int
	if err := d.DB().QueryRowContext(ctx, q).Scan(&n); err != nil || n != 0 {
		t.Errorf("%d raw tables left (%v)", n, err)
	}
}

// The checks count what they claim: a skipped message is out of order, a
// replay is a duplicate, an undelivered one is lost.
func TestRecorderCounts(t *testing.T) {
	base := time.Now()
	r := newRecorder(6, 2)
	for i, ev := range []struct {
		key string
		seq uint64
	}{
		{"a", 0}, {"a", 1}, {"a", 0}, {"a", 1}, {"a", 2}, // replay from the cursor: 2 duplicates
		{"b", 1}, {"b", 0}, // 1 before 0: out of order; b/2 never arrives: lost
	} {
		r.record(event{tenant: "t", key: ev.key, seq: ev.seq, at: base.Add(time.Duration(i))})
	}
	got := r.rep(time.Second)
	if got.lost != 1 || got.dups != 2 || got.outOfOrder != 1 {
		t.Fatalf("lost %d duplicates %d out of order %d, want 1 2 1", got.lost, got.dups, got.outOfOrder)
	}
}

// readBack finds a publisher's messages stored out of its order, and twice.
func TestReadBackCounts(t *testing.T) {
	d := testdb.Migrated(t, testdb.SQLite(t))
	e := &env{d: d, p: Params{Messages: 4, Size: headerLen, Tenants: 1}}
	ns, _ := e.newNamespace(context.Background())
	c, err := shardq.NewClient(d, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tenant, key := ns.partition(0)
	for _, seq := range []uint64{0, 2, 1, 2} {
		if _, err := c.Publish(context.Background(), shardq.Message{Tenant: tenant, Topic: ns.topic, PartitionKey: key,
			Payload: payload(headerLen, seq, time.Now(), 7)}); err != nil {
			t.Fatal(err)
		}
	}
	got, err := e.readBack(context.Background(), ns)
	if err != nil {
		t.Fatal(err)
	}
	if got.lost != 1 || got.dups != 1 || got.outOfOrder != 1 {
		t.Fatalf("lost %d duplicates %d out of order %d, want 1 1 1", got.lost, got.dups, got.outOfOrder)
	}
}

func TestParamsValidate(t *testing.T) {
	for flag, p := range map[string]Params{
		"--messages": func() Params { p := Defaults; p.Messages = 0; return p }(),
		"--size":     func() Params { p := Defaults; p.Size = 4; return p }(),
		"--tenants":  func() Params { p := Defaults; p.Tenants = 65; return p }(),
		"--reps":     func() Params { p := Defaults; p.Reps = 0; return p }(),
	} {
		err := p.Validate()
		if err == nil || !strings.HasPrefix(err.Error(), flag+": must be") {
			t.Errorf("%s: %v", flag, err)
		}
	}
	if err := Defaults.Validate(); err != nil {
		t.Fatal(err)
	}
}

// Worker lines round-trip, and malformed ones are errors, never panics.
func FuzzReadEvents(f *testing.F) {
	f.Add("t\tp00001\t3\t1700000000000000000\t0\n")
	f.Add("t\tk\tx\t1\t2\n")
	f.Add("\t\t\t\t\n")
	f.Fuzz(func(t *testing.T, s string) {
		var evs []event
		if err := readEvents(strings.NewReader(s), func(ev event) { evs = append(evs, ev) }); err != nil {
			return
		}
		for _, ev := range evs {
			if strings.ContainsAny(ev.tenant+ev.key, "\t\n") {
				t.Fatalf("field with a separator: %+v", ev)
			}
		}
	})
}
