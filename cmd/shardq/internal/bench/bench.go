// SPDX-License-Identifier: Apache-2.0

// Package bench measures shardq against the database's own ceiling in the
// same run: the scenarios behind `shardq bench`.
//
// Every scenario runs in a fresh namespace (tenants named bench-<run>-<n>,
// raw tables named bench_raw_*_<run>) and removes it afterwards. Every
// scenario also checks what it measures: messages lost, delivered twice, or
// delivered before an earlier message of their partition.
package bench

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
)

// Scenarios are the names Run accepts.
var Scenarios = []string{"raw", "publish", "async", "consume", "latency", "ungrouped", "discovery", "idle", "api", "large", "noisy"}

// Params are a run's knobs; zero values take the defaults of Defaults.
type Params struct {
	Messages    int `json:"messages"`
	Size        int `json:"size"`
	Publishers  int `json:"publishers"`
	Batch       int `json:"batch"`
	Partitions  int `json:"partitions"`
	Tenants     int `json:"tenants"`
	Subscribers int `json:"subscribers"`
	// Handlers is each ungrouped consumer's UngroupedConcurrency;
	// HandlerDelay is how long each of its handler calls takes.
	Handlers     int           `json:"handlers"`
	HandlerDelay time.Duration `json:"-"`
	Processes    bool          `json:"processes"`
	Rate         int           `json:"rate"`
	Duration     time.Duration `json:"-"`
	Reps         int           `json:"reps"`
	// PollInterval is the subscribers' idle poll interval (0: the
	// subscriber default).
	PollInterval time.Duration `json:"-"`
	// History and Active are the discovery scenario's drained and active
	// partitions (Active replaces Partitions there).
	History int `json:"history"`
	Active  int `json:"active"`
	// Feed is the clients' change feed: "auto" (the driver's, when it has
	// one; "" too) or "off" (poll only).
	Feed string `json:"feed"`
	// LargeBytes is the large scenario's message size.
	LargeBytes int64 `json:"large_bytes"`
	// VtgateVars, for idle through vtgate, is vtgate's /debug/vars URL:
	// its VtgateApi count of statements replaces MySQL's Questions, which
	// vtgate answers for one shard only.
	VtgateVars string `json:"vtgate_vars,omitempty"`
}

// Defaults are the parameters of the targets.
var Defaults = Params{Messages: 20_000, Size: 256, Publishers: 16, Batch: 1, Partitions: 64, Tenants: 1,
	Subscribers: 4, Handlers: 4, Rate: 500, Duration: 10 * time.Second, Reps: 3, History: 100_000, Active: 1000, Feed: "auto",
	LargeBytes: 1 << 30}

// headerLen is the payload prefix every bench message carries: sequence in
// its partition, the time it was meant to be published, its publisher.
const headerLen = 20

// Validate checks p, naming the flag and the rule.
func (p Params) Validate() error {
	type rule struct {
		flag string
		ok   bool
		want string
	}
	for _, r := range []rule{
		{"--messages", p.Messages >= 1, "at least 1"},
		{"--size", p.Size >= headerLen && p.Size <= 1<<20, fmt.Sprintf("between %d and 1048576 bytes", headerLen)},
		{"--publishers", p.Publishers >= 1 && p.Publishers <= 1024, "between 1 and 1024"},
		{"--batch", p.Batch >= 1 && p.Batch <= 10_000, "between 1 and 10000"},
		{"--partitions", p.Partitions >= 1 && p.Partitions <= 100_000, "between 1 and 100000"},
		{"--tenants", p.Tenants >= 1 && p.Tenants <= p.Partitions, "between 1 and --partitions"},
		{"--subscribers", p.Subscribers >= 1 && p.Subscribers <= 256, "between 1 and 256"},
		{"--handlers", p.Handlers >= 1 && p.Handlers <= 1024, "between 1 and 1024"},
		{"--handler-delay", p.HandlerDelay >= 0 && p.HandlerDelay <= time.Minute, "between 0 and 1m"},
		{"--rate", p.Rate >= 1 && p.Rate <= 1_000_000, "between 1 and 1000000 msg/s"},
		{"--duration", p.Duration >= 100*time.Millisecond, "at least 100ms"},
		{"--reps", p.Reps >= 1 && p.Reps <= 100, "between 1 and 100"},
		{"--poll", p.PollInterval >= 0, "not negative"},
		{"--history", p.History >= 0 && p.History <= 10_000_000, "between 0 and 10000000"},
		{"--active", p.Active >= 1 && p.Active <= 100_000, "between 1 and 100000"},
		{"--feed", p.Feed == "" || p.Feed == "auto" || p.Feed == "off", "auto or off"},
		{"--large-bytes", p.LargeBytes >= 1 && p.LargeBytes <= 64<<30, "between 1 and 68719476736"},
	} {
		if !r.ok {
			return fmt.Errorf("%s: must be %s", r.flag, r.want)
		}
	}
	return nil
}

// Result is one scenario's outcome: medians over the repetitions, and
// correctness counts summed over them. Its JSON form is one line of
// `shardq bench --json`.
type Result struct {
	Scenario   string         `json:"scenario"`
	Driver     string         `json:"driver"`
	Params     map[string]any `json:"params"`
	Msgs       int64          `json:"msgs"`
	Seconds    float64        `json:"seconds"`
	MsgsPerSec float64        `json:"msgs_per_sec"`
	// P50Ms and P99Ms are the latency percentiles of the scenarios that
	// measure one (publish, latency, raw); absent from the others.
	P50Ms float64 `json:"p50_ms,omitempty"`
	P99Ms float64 `json:"p99_ms,omitempty"`
	// Latency counts every repetition's latencies in buckets (upper bound
	// in ms; the last bucket is everything above the bound before it).
	Latency            []Bucket `json:"latency_histogram,omitempty"`
	Lost               int64    `json:"lost"`
	Duplicates         int64    `json:"duplicates"`
	OutOfOrder         int64    `json:"out_of_order"`
	BaselineMsgsPerSec float64  `json:"baseline_msgs_per_sec"`
	// Ratio is MsgsPerSec / BaselineMsgsPerSec; for latency it is
	// P99Ms / BaselineP99Ms (lower is better).
	Ratio         float64 `json:"ratio"`
	Baseline      string  `json:"baseline,omitempty"`
	BaselineP99Ms float64 `json:"baseline_p99_ms,omitempty"`
	// StatementsPerMemberSec is the idle scenario's measure (its ratio is
	// this over the baseline's).
	StatementsPerMemberSec float64 `json:"statements_per_member_sec,omitempty"`
}

// Failed reports whether the result breaks the queue's guarantees: a lost
// or out-of-order message. Duplicates are at-least-once's right.
func (r Result) Failed() bool { return r.Lost > 0 || r.OutOfOrder > 0 }

// Runner runs scenarios against one database.
type Runner struct {
	// Open opens a fresh driver for the database (migrated or not: Run
	// migrates). Each subscriber and publisher shares it.
	Open func() (driver.Driver, error)
	// Worker starts a subscriber process for --processes: it must run
	// `shardq bench worker` with the given arguments against the same
	// database and return the process's stdout and stdin, and a wait
	// function for its exit (called after stdout reached EOF).
	Worker func(ctx context.Context, args []string) (stdout io.Reader, stdin io.Closer, wait func() error, err error)
	Logger *slog.Logger
	// Progress receives one line per finished repetition (may be nil).
	Progress io.Writer
}

// Run runs scenario with p and returns its results: for raw, one per
// baseline; otherwise the baseline first, then the scenario with its ratio.
func (r *Runner) Run(ctx context.Context, scenario string, p Params) ([]Result, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	if !slices.Contains(Scenarios, scenario) {
		return nil, fmt.Errorf("scenario %q: must be one of %s", scenario, strings.Join(Scenarios, ", "))
	}
	if p.Processes && r.Worker == nil {
		return nil, errors.New("--processes: this runner cannot start worker processes")
	}
	if r.Logger == nil {
		r.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	d, err := r.Open()
	if err != nil {
		return nil, err
	}
	defer d.Close()
	if _, err := d.Migrate(ctx); err != nil {
		return nil, err
	}
	e := &env{Runner: r, d: d, p: p}
	if e.vitess, err = isVitess(ctx, d); err != nil {
		return nil, err
	}
	switch scenario {
	case "raw":
		var out []Result
		for _, c := range e.rawCases() {
			res, err := e.repeat(ctx, c)
			if err != nil {
				return nil, err
			}
			out = append(out, res)
		}
		return out, nil
	case "publish":
		base := e.rawInsertCase(p.Publishers)
		if p.Batch > 1 {
			base = e.rawMultiRowCase()
		}
		out, err := e.compare(ctx, base, scenCase{"publish", e.publish}, false)
		if err != nil || p.Batch > 1 {
			return out, err
		}
		// The floor of any publish that keeps a head row: its ratio to
		// the same baseline is the most a publish can reach.
		floor, err := e.repeat(ctx, e.rawAppendCase(p.Publishers))
		if err != nil {
			return nil, err
		}
		floor.Baseline, floor.BaselineMsgsPerSec = out[0].Scenario, out[0].MsgsPerSec
		if out[0].MsgsPerSec > 0 {
			floor.Ratio = floor.MsgsPerSec / out[0].MsgsPerSec
		}
		return []Result{out[0], floor, out[1]}, nil
	case "async":
		// One goroutine through a Producer, against one connection's
		// single-row INSERT loop and one connection's INSERTs of 100 rows.
		e.p.Publishers = 1
		single, err := e.repeat(ctx, e.rawInsertCase(1))
		if err != nil {
			return nil, err
		}
		batch := e.p.Batch
		e.p.Batch = 100
		multi, err := e.repeat(ctx, e.rawMultiRowCase())
		e.p.Batch = batch
		if err != nil {
			return nil, err
		}
		async, err := e.repeat(ctx, scenCase{"publish-async", e.publishAsync})
		if err != nil {
			return nil, err
		}
		async.Baseline, async.BaselineMsgsPerSec = single.Scenario, single.MsgsPerSec
		if single.MsgsPerSec > 0 && multi.MsgsPerSec > 0 {
			async.Ratio = async.MsgsPerSec / single.MsgsPerSec
			async.Params["vs_raw_multirow_100"] = math.Round(async.MsgsPerSec/multi.MsgsPerSec*100) / 100
		}
		return []Result{single, multi, async}, nil
	case "consume":
		return e.compare(ctx, e.rawConsumeCase(), scenCase{"consume", e.consume}, false)
	case "ungrouped":
		return e.compare(ctx, e.rawClaimCase(), scenCase{"ungrouped", e.ungrouped}, false)
	case "discovery":
		e.p.Partitions = p.Active
		if e.p.Tenants > e.p.Partitions {
			return nil, fmt.Errorf("--tenants: must be at most --active")
		}
		base, c := e.discoveryCases()
		return e.compare(ctx, base, c, false)
	case "api":
		pub, err := e.compare(ctx, scenCase{"publish", e.publish}, scenCase{"api-publish", e.apiPublish}, false)
		if err != nil {
			return nil, err
		}
		con, err := e.compare(ctx, scenCase{"consume", e.consume}, scenCase{"api-consume", e.apiConsume}, false)
		if err != nil {
			return nil, err
		}
		large, err := e.repeat(ctx, scenCase{"api-large", e.apiLarge})
		if err != nil {
			return nil, err
		}
		attack, err := e.repeat(ctx, scenCase{"api-attack", e.apiAttack})
		return append(append(pub, con...), large, attack), err
	case "large":
		lib, err := e.compare(ctx, scenCase{"raw-large", e.rawLarge}, scenCase{"large", e.libraryLarge}, false)
		if err != nil {
			return nil, err
		}
		over, err := e.repeat(ctx, scenCase{"large-http", e.httpLarge})
		over.Baseline, over.BaselineMsgsPerSec = lib[0].Scenario, lib[0].MsgsPerSec
		if lib[0].MsgsPerSec > 0 {
			over.Ratio = over.MsgsPerSec / lib[0].MsgsPerSec
		}
		return append(lib, over), err
	case "noisy":
		e.p.Tenants = 2 // the busy tenant and the quiet one
		quietAlone, quiet, busyAlone, busy := e.noisyCases()
		lat, err := e.compare(ctx, quietAlone, quiet, true)
		if err != nil {
			return nil, err
		}
		rate, err := e.compare(ctx, busyAlone, busy, false)
		return append(lat, rate...), err
	case "idle":
		e.p.Partitions = max(e.p.Partitions, e.p.Tenants)
		return e.compare(ctx, scenCase{"idle-poll", e.idle(shardq.FeedOff)}, scenCase{"idle-feed", e.idle(shardq.FeedAuto)}, false)
	default:
		return e.compare(ctx, e.rawInsertCase(1), scenCase{"latency", e.latency}, true)
	}
}

// env is one Run: the database and the parameters.
type env struct {
	*Runner
	d driver.Driver
	p Params
	// vitess: the database is vtgate, whose sharded keyspace routes only
	// tables its VSchema names, so the raw tables join it (vitess.go).
	vitess bool
}

// scenCase is a named measurement: one repetition in a fresh namespace.
type scenCase struct {
	name string
	run  func(ctx context.Context, ns namespace) (rep, error)
}

// rep is one repetition's measurement.
type rep struct {
	msgs                   int64
	elapsed                time.Duration
	latencies              []time.Duration
	lost, dups, outOfOrder int64
	extraParams            map[string]any
	perMemberSec           float64 // idle: statements per member per second
}

func (e *env) compare(ctx context.Context, base, c scenCase, byLatency bool) ([]Result, error) {
	b, err := e.repeat(ctx, base)
	if err != nil {
		return nil, err
	}
	res, err := e.repeat(ctx, c)
	if err != nil {
		return nil, err
	}
	res.Baseline, res.BaselineMsgsPerSec = b.Scenario, b.MsgsPerSec
	if b.StatementsPerMemberSec > 0 {
		res.Ratio = res.StatementsPerMemberSec / b.StatementsPerMemberSec
		return []Result{b, res}, nil
	}
	if byLatency {
		res.BaselineP99Ms = b.P99Ms
		if b.P99Ms > 0 {
			res.Ratio = res.P99Ms / b.P99Ms
		}
	} else if b.MsgsPerSec > 0 {
		res.Ratio = res.MsgsPerSec / b.MsgsPerSec
	}
	return []Result{b, res}, nil
}

// repeat runs c p.Reps times, each in its own namespace, and reports
// medians.
func (e *env) repeat(ctx context.Context, c scenCase) (Result, error) {
	res := Result{Scenario: c.name, Driver: e.d.Name(), Params: e.paramsMap()}
	var rates, secs, p50s, p99s, stmts []float64
	for i := range e.p.Reps {
		ns, err := e.newNamespace(ctx)
		if err != nil {
			return res, err
		}
		r, err := c.run(ctx, ns)
		if cerr := ns.cleanup(context.WithoutCancel(ctx)); cerr != nil {
			err = errors.Join(err, fmt.Errorf("clean up namespace %s: %w", ns.id, cerr))
		}
		if err != nil {
			return res, fmt.Errorf("%s: %w", c.name, err)
		}
		res.Msgs = r.msgs
		res.Lost += r.lost
		res.Duplicates += r.dups
		res.OutOfOrder += r.outOfOrder
		for k, v := range r.extraParams {
			res.Params[k] = v
		}
		rate := float64(r.msgs) / r.elapsed.Seconds()
		rates = append(rates, rate)
		secs = append(secs, r.elapsed.Seconds())
		p50, p99 := percentile(r.latencies, 0.50), percentile(r.latencies, 0.99)
		if len(r.latencies) > 0 {
			p50s, p99s = append(p50s, p50), append(p99s, p99)
			res.Latency = histogram(res.Latency, r.latencies)
		}
		stmts = append(stmts, r.perMemberSec)
		if e.Progress != nil && r.perMemberSec > 0 {
			fmt.Fprintf(e.Progress, "%s rep %d/%d: %.2f statements per member per second\n", c.name, i+1, e.p.Reps, r.perMemberSec)
		} else if e.Progress != nil {
			fmt.Fprintf(e.Progress, "%s rep %d/%d: %.0f msg/s, p99 %.2f ms, lost %d, dup %d, out of order %d\n",
				c.name, i+1, e.p.Reps, rate, p99, r.lost, r.dups, r.outOfOrder)
		}
	}
	res.MsgsPerSec, res.Seconds, res.P50Ms, res.P99Ms = median(rates), median(secs), median(p50s), median(p99s)
	res.StatementsPerMemberSec = median(stmts)
	return res, nil
}

// Bucket is one bar of a latency histogram: latencies up to LeMs (the
// last bucket: above the previous bound, LeMs 0).
type Bucket struct {
	LeMs  float64 `json:"le_ms"`
	Count int     `json:"count"`
}

// latencyBounds are the histogram's upper bounds, in ms.
var latencyBounds = []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000}

// histogram adds lat to h (made on first use).
func histogram(h []Bucket, lat []time.Duration) []Bucket {
	if h == nil {
		h = make([]Bucket, len(latencyBounds)+1)
		for i, b := range latencyBounds {
			h[i].LeMs = b
		}
	}
	for _, l := range lat {
		ms := float64(l) / float64(time.Millisecond)
		i, _ := slices.BinarySearch(latencyBounds, ms)
		h[i].Count++
	}
	return h
}

func (e *env) paramsMap() map[string]any {
	p := e.p
	return map[string]any{"messages": p.Messages, "size": p.Size, "publishers": p.Publishers, "batch": p.Batch,
		"partitions": p.Partitions, "tenants": p.Tenants, "subscribers": p.Subscribers, "processes": p.Processes, "feed": p.Feed,
		"handlers": p.Handlers, "handler_delay": p.HandlerDelay.String(),
		"rate": p.Rate, "duration": p.Duration.String(), "reps": p.Reps, "history": p.History, "active": p.Active}
}

// percentile of ds in milliseconds (0 when empty).
func percentile(ds []time.Duration, q float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(q*float64(len(s))+0.5) - 1
	i = min(max(i, 0), len(s)-1)
	return float64(s[i]) / float64(time.Millisecond)
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// namespace is one repetition's private names.
type namespace struct {
	e       *env
	id      string
	tenants []string
	topic   string
}

func (e *env) newNamespace(ctx context.Context) (namespace, error) {
	b := make([]byte, 4)
	rand.Read(b)
	ns := namespace{e: e, id: hex.EncodeToString(b), topic: "bench"}
	for t := range e.p.Tenants {
		ns.tenants = append(ns.tenants, fmt.Sprintf("bench-%s-%d", ns.id, t))
	}
	return ns, nil
}

// partition is partition k of the namespace: its tenant and key.
func (ns namespace) partition(k int) (tenant, key string) {
	return ns.tenants[k%len(ns.tenants)], fmt.Sprintf("p%05d", k)
}

func (ns namespace) rawMessages() string { return "bench_raw_messages_" + ns.id }
func (ns namespace) rawOffsets() string  { return "bench_raw_offsets_" + ns.id }
func (ns namespace) rawHeads() string    { return "bench_raw_heads_" + ns.id }

// cleanup deletes the namespace's rows from every queue table and drops
// its raw tables.
func (ns namespace) cleanup(ctx context.Context) error {
	db := ns.e.d.DB()
	tables, err := queueTables(ctx, ns.e.d)
	if err != nil {
		return err
	}
	in := "(" + strings.TrimSuffix(strings.Repeat("?, ", len(ns.tenants)), ", ") + ")"
	args := make([]any, len(ns.tenants))
	for i, t := range ns.tenants {
		args[i] = t
	}
	var errs []error
	for _, t := range tables {
		if ns.e.vitess {
			if err := ns.e.deleteTenants(ctx, t, ns.tenants); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		if _, err := db.ExecContext(ctx, "DELETE FROM "+t+" WHERE tenant IN "+in, args...); err != nil {
			errs = append(errs, fmt.Errorf("delete from %s: %w", t, err))
		}
	}
	for _, t := range []string{ns.rawMessages(), ns.rawOffsets(), ns.rawHeads()} {
		if err := ns.e.unroute(ctx, t); err != nil {
			errs = append(errs, err)
		}
		if _, err := db.ExecContext(ctx, "DROP TABLE IF EXISTS "+t); err != nil {
			errs = append(errs, fmt.Errorf("drop %s: %w", t, err))
		}
	}
	return errors.Join(errs...)
}

// queueTables lists the queue's tables (every one has a tenant column).
func queueTables(ctx context.Context, d driver.Driver) ([]string, error) {
	q := `SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'queue\_%' ESCAPE '\'`
	if d.Name() == "mysql" {
		q = `SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name LIKE 'queue\_%'`
	}
	rows, err := d.DB().QueryContext(ctx, q)
	if err != nil {
		return nil, fmt.Errorf("list queue tables: %w", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var t string
		if err := rows.Scan(&t); err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, rows.Err()
}

// payload builds a bench message body of size bytes.
func payload(size int, seq uint64, at time.Time, publisher uint32) []byte {
	b := make([]byte, size)
	binary.BigEndian.PutUint64(b[0:8], seq)
	binary.BigEndian.PutUint64(b[8:16], uint64(at.UnixNano()))
	binary.BigEndian.PutUint32(b[16:20], publisher)
	for i := headerLen; i < size; i++ {
		b[i] = 'x'
	}
	return b
}

// parsePayload reads what payload wrote.
func parsePayload(b []byte) (seq uint64, at time.Time, publisher uint32, err error) {
	if len(b) < headerLen {
		return 0, time.Time{}, 0, fmt.Errorf("bench payload of %d bytes: shorter than its %d-byte header", len(b), headerLen)
	}
	return binary.BigEndian.Uint64(b[0:8]), time.Unix(0, int64(binary.BigEndian.Uint64(b[8:16]))),
		binary.BigEndian.Uint32(b[16:20]), nil
}
