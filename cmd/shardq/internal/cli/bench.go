// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/shardq/shardq/cmd/shardq/internal/bench"
	"github.com/shardq/shardq/driver"
)

func (a *app) benchCmd() *cobra.Command {
	p := bench.Defaults
	var asJSON bool
	var cpuProfile string
	cmd := &cobra.Command{
		Use:   "bench publish|consume|latency|ungrouped|discovery|idle|api|large|noisy|raw [flags]",
		Short: "Measure publish, consume, competing consumers and end-to-end latency against the database's own ceiling",
		Long: "Runs a scenario --reps times, each in a fresh namespace that is removed afterwards, and reports\n" +
			"medians next to the matching raw baseline measured in the same run:\n" +
			"  raw      the database alone: single-row autocommit INSERTs with 1 and --publishers connections,\n" +
			"           multi-row INSERTs of --batch rows, and the ordered-consume ceiling (--subscribers workers\n" +
			"           each owning their share of --partitions: begin; select 100 after the cursor; update it; commit)\n" +
			"  publish  --publishers concurrent publishers, --batch messages per call (baseline: raw INSERTs)\n" +
			"  async    --messages over --partitions keys handed to one Producer by one goroutine, then every\n" +
			"           future awaited (baselines: one connection's single-row INSERTs and its INSERTs of 100 rows)\n" +
			"  consume  --messages published beforehand, then --subscribers in one consumer group with a\n" +
			"           per-message handler (baseline: the raw ordered-consume ceiling)\n" +
			"  latency  --rate msg/s for --duration while subscribers run; publish-due to handler time\n" +
			"           (baseline: the p99 of one raw autocommit INSERT)\n" +
			"  ungrouped --messages ungrouped messages published beforehand, then --subscribers competing\n" +
			"           consumers with --handlers handlers of --handler-delay each (baseline: --subscribers\n" +
			"           workers looping { select 100 FOR UPDATE SKIP LOCKED; delete them; commit })\n" +
			"  discovery --history drained partitions (built through the schema directly) and --active ones holding\n" +
			"           --messages: the discovery tick's cost (the first, the sweep's, and p50/p99 after it), the consume rate of the\n" +
			"           active partitions (baseline: the same without the history), and metadata rows before and\n" +
			"           after a retention pass (idle age 1h; the history is aged 2h), with each pass's time\n" +
			"  idle     --subscribers members serving --tenants tenants of a topic nobody publishes to: the\n" +
			"           statements per member per second the server counts (MySQL's Questions) over --duration,\n" +
			"           with the change feed (baseline: the same polling, --feed off)\n" +
			"  api      publish and consume through the HTTP API of shardq serve (in this process, on loopback):\n" +
			"           --publishers POSTs of --batch messages, then --subscribers loops of receive (the next\n" +
			"           free message group, up to 1,000) and ack (baselines: the library's publish and consume)\n" +
			"  large    one message of --large-bytes written and read back whole (MiB/s of the round trip, each\n" +
			"           direction's rate and the peak heap): PublishLarge and a receiver's Body, and the HTTP API's\n" +
			"           upload and body_url (baseline: the database alone, one INSERT per 256 KiB BLOB chunk in\n" +
			"           transactions of 16, then a read in order, one row at a time)\n" +
			"  noisy    a noisy neighbour: --subscribers members of one group serve a busy tenant holding --messages\n" +
			"           over --partitions keys and a quiet tenant publishing --rate msg/s over 16 keys for --duration\n" +
			"           (from a client of its own), handlers of --handler-delay, MaxPartitions 64 (fewer when the\n" +
			"           partitions are few, so that the backlog fills them): the quiet tenant's p99 from publish to\n" +
			"           handler (baseline: the same without the backlog), and the busy tenant's rate during the\n" +
			"           window (baseline: the same without the quiet tenant)\n" +
			"Every scenario counts lost, duplicated and out-of-order messages; the command exits 1 when any\n" +
			"message is lost or out of order.",
		Args:      oneOf("scenario", bench.Scenarios...),
		ValidArgs: bench.Scenarios,
		RunE: run(func(cmd *cobra.Command, args []string) error {
			p.Feed = a.feedFlag
			if err := p.Validate(); err != nil {
				return usageError{err}
			}
			if !slices.Contains(bench.Scenarios, args[0]) {
				return usagef("scenario %q: must be one of %s", args[0], strings.Join(bench.Scenarios, ", "))
			}
			// Progress, logs and worker processes all write to stderr.
			a.env.Stderr = &lockedWriter{w: a.env.Stderr}
			if cpuProfile != "" {
				f, err := os.Create(cpuProfile)
				if err != nil {
					return fmt.Errorf("--cpuprofile: %w", err)
				}
				defer f.Close()
				if err := pprof.StartCPUProfile(f); err != nil {
					return fmt.Errorf("--cpuprofile: %w", err)
				}
				defer pprof.StopCPUProfile()
			}
			return a.bench(cmd.Context(), args[0], p, asJSON)
		}),
	}
	fl := cmd.Flags()
	fl.IntVar(&p.Messages, "messages", p.Messages, "messages per repetition (publish, consume, raw)")
	fl.IntVar(&p.Size, "size", p.Size, "payload bytes")
	fl.IntVar(&p.Publishers, "publishers", p.Publishers, "concurrent publishers (connections for raw)")
	fl.IntVar(&p.Batch, "batch", p.Batch, "messages per Publish call (rows per raw multi-row INSERT)")
	fl.IntVar(&p.Partitions, "partitions", p.Partitions, "partitions (partition keys)")
	fl.IntVar(&p.Tenants, "tenants", p.Tenants, "tenants the partitions are spread over")
	fl.IntVar(&p.Subscribers, "subscribers", p.Subscribers, "subscribers in one consumer group (raw consume workers)")
	fl.IntVar(&p.Handlers, "handlers", p.Handlers, "ungrouped: handlers per consumer (UngroupedConcurrency)")
	durationFlag(fl, &p.HandlerDelay, "handler-delay", 0, "ungrouped: how long each handler call takes")
	fl.BoolVar(&p.Processes, "processes", false, "run each subscriber as a separate process")
	fl.IntVar(&p.Rate, "rate", p.Rate, "latency: messages per second")
	durationFlag(fl, &p.Duration, "duration", p.Duration, "latency: how long to publish")
	fl.IntVar(&p.Reps, "reps", p.Reps, "repetitions; medians are reported")
	fl.IntVar(&p.History, "history", p.History, "discovery: drained historical partitions")
	fl.IntVar(&p.Active, "active", p.Active, "discovery: active partitions (--messages are spread over them)")
	fl.Int64Var(&p.LargeBytes, "large-bytes", p.LargeBytes, "large: the message's size in bytes")
	durationFlag(fl, &p.PollInterval, "poll", 0, "subscribers' idle poll interval (default: the subscriber default)")
	fl.StringVar(&p.VtgateVars, "vtgate-vars", "", "idle through vtgate: vtgate's /debug/vars URL, whose statement count replaces MySQL's Questions")
	fl.BoolVar(&asJSON, "json", false, "print one JSON line per scenario instead of a table")
	fl.StringVar(&cpuProfile, "cpuprofile", "", "write this process's CPU profile (go tool pprof) to the file")
	cmdLineOnly(fl, "cpuprofile") // it replaces the file
	cmd.AddCommand(a.benchWorkerCmd())
	return cmd
}

func (a *app) bench(ctx context.Context, scenario string, p bench.Params, asJSON bool) error {
	spec, err := a.spec(false)
	if err != nil {
		return err
	}
	r := &bench.Runner{
		Open:   func() (driver.Driver, error) { return a.openDriver(spec) },
		Worker: a.startWorker,
		Logger: a.logger(),
	}
	if !asJSON && a.env.StderrTerminal {
		r.Progress = a.env.Stderr // quiet in pipes and logs
	}
	results, err := r.Run(ctx, scenario, p)
	if err != nil {
		return err
	}
	if asJSON {
		enc := json.NewEncoder(a.env.Stdout)
		for _, res := range results {
			if err := enc.Encode(res); err != nil {
				return err
			}
		}
	} else {
		printResults(a.env.Stdout, results)
	}
	for _, res := range results {
		if res.Failed() {
			return fmt.Errorf("bench %s: %d lost, %d out of order", res.Scenario, res.Lost, res.OutOfOrder)
		}
	}
	return nil
}

func printResults(w io.Writer, results []bench.Result) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\tdriver\tmsgs\tseconds\tmsg/s\tp50 ms\tp99 ms\tidle stmt/member/s\tlost\tdup\tout of order\tbaseline\tratio\t")
	for _, r := range results {
		ratio := "-"
		if r.Ratio > 0 {
			ratio = fmt.Sprintf("%.2fx", r.Ratio)
		}
		base := "-"
		if r.Baseline != "" {
			base = r.Baseline
		}
		idle := "-"
		if r.StatementsPerMemberSec > 0 {
			idle = fmt.Sprintf("%.2f", r.StatementsPerMemberSec)
		}
		p50, p99 := "-", "-" // not measured: the scenario has no latency
		if len(r.Latency) > 0 {
			p50, p99 = fmt.Sprintf("%.2f", r.P50Ms), fmt.Sprintf("%.2f", r.P99Ms)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.2f\t%.0f\t%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\t\n", r.Scenario, r.Driver, r.Msgs, r.Seconds,
			r.MsgsPerSec, p50, p99, idle, r.Lost, r.Duplicates, r.OutOfOrder, base, ratio)
	}
	tw.Flush()
	for _, r := range results {
		if len(r.Latency) > 0 {
			fmt.Fprintf(w, "%s (%s) latency, all repetitions: %s\n", r.Scenario, r.Driver, histogramLine(r.Latency))
		}
	}
}

// histogramLine is a latency histogram on one line: "≤1ms 12  ≤2ms 40 …
// >1000ms 0", empty buckets at either end left out.
func histogramLine(h []bench.Bucket) string {
	lo, hi := 0, len(h)-1
	for lo < hi && h[lo].Count == 0 {
		lo++
	}
	for hi > lo && h[hi].Count == 0 {
		hi--
	}
	var parts []string
	for i := lo; i <= hi; i++ {
		if i == len(h)-1 {
			parts = append(parts, fmt.Sprintf(">%gms %d", h[i-1].LeMs, h[i].Count))
			continue
		}
		parts = append(parts, fmt.Sprintf("≤%gms %d", h[i].LeMs, h[i].Count))
	}
	return strings.Join(parts, "  ")
}

// startWorker runs `shardq bench worker` as a child process of this
// binary against the same database.
func (a *app) startWorker(ctx context.Context, args []string) (io.Reader, io.Closer, func() error, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, nil, nil, err
	}
	// The DSN goes through the environment: a command line, which any
	// local user can read, would show its password.
	cmd := exec.CommandContext(ctx, self, append([]string{"bench", "worker"}, args...)...)
	cmd.Env = append(os.Environ(), "SHARDQ_DSN="+a.dsn())
	if feed, _ := a.feedDSN(); feed != "" {
		cmd.Env = append(cmd.Env, "SHARDQ_FEED_DSN="+feed)
	}
	if a.vtgateGRPC != "" {
		cmd.Env = append(cmd.Env, "SHARDQ_VTGATE_GRPC="+a.vtgateGRPC)
	}
	cmd.Stderr = a.env.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, nil, nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, nil, fmt.Errorf("start bench worker: %w", err)
	}
	return stdout, stdin, func() error {
		if err := cmd.Wait(); err != nil {
			return fmt.Errorf("bench worker %v: %w", args, err)
		}
		return nil
	}, nil
}

func (a *app) benchWorkerCmd() *cobra.Command {
	var cfg bench.WorkerConfig
	cmd := &cobra.Command{
		Use:    "worker",
		Short:  "A subscriber process of `shardq bench --processes` (internal)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: run(func(cmd *cobra.Command, _ []string) error {
			if len(cfg.Tenants) == 0 {
				return usagef("--tenant: at least one is required")
			}
			c, done, err := a.client()
			if err != nil {
				return err
			}
			defer done()
			return bench.Work(cmd.Context(), c, cfg, a.env.Stdin, a.env.Stdout)
		}),
	}
	fl := cmd.Flags()
	fl.StringVar(&cfg.Name, "name", "", "subscriber name")
	fl.StringVar(&cfg.Topic, "topic", "", "topic")
	fl.StringArrayVar(&cfg.Tenants, "tenant", nil, "tenant (repeatable)")
	durationFlag(fl, &cfg.PollInterval, "poll", 0, "idle poll interval")
	fl.BoolVar(&cfg.Latency, "latency", false, "report due times")
	fl.BoolVar(&cfg.Ungrouped, "ungrouped", false, "take ungrouped messages only")
	fl.IntVar(&cfg.Handlers, "handlers", 1, "with --ungrouped, handlers at once")
	durationFlag(fl, &cfg.Delay, "delay", 0, "how long each handler call takes")
	// --feed is the root's flag (the client's change feed).
	return cmd
}

// lockedWriter serialises writes from several goroutines.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
