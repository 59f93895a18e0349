// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/shardq/shardq/cmd/shardq/internal/chaos"
	"github.com/shardq/shardq/cmd/shardq/internal/chaoscheck"
	"github.com/shardq/shardq/driver"
)

func (a *app) chaosCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "chaos", Short: "Run clients of every kind under injected faults and judge what they saw (docs/chaos.md)"}
	cmd.AddCommand(a.chaosRunCmd(), a.chaosCheckCmd(), a.chaosClientCmd())
	return cmd
}

func (a *app) chaosRunCmd() *cobra.Command {
	cfg := chaos.RunConfig{}
	var seed uint64
	var faults []string
	cmd := &cobra.Command{
		Use:   "run --dir DIR [--duration D] [--seed N]",
		Short: "Start publishers and consumers as processes, inject faults on a seeded schedule, drain, and check",
		Long: "Runs publishers (single, batched, large, transactional with check-back), fair-share subscribers, ungrouped competing consumers and\n" +
			"group receivers as processes of this binary against --dsn, each appending what it did to a history in\n" +
			"DIR; kills, stops and resumes them, restarts them with their clocks off, and on MySQL cuts, holds and delays their connections through a\n" +
			"loopback proxy, (with --db-restart) restarts the server and (with --reparent) moves its primary. Then the publishers stop, the consumers\n" +
			"drain, the tenant's messages are dumped, and the independent checker reads it all. Exit 1 on any\n" +
			"violation; DIR/summary.txt lists them. Only the tenants of --tenants (\"chaos\") are written.",
		Args: cobra.NoArgs,
		RunE: run(func(cmd *cobra.Command, _ []string) error {
			if cfg.Dir == "" {
				return usagef("--dir: required")
			}
			if entries, err := os.ReadDir(cfg.Dir); err == nil && len(entries) > 0 {
				return usagef("--dir: %s is not empty; a run writes a new directory", cfg.Dir)
			}
			if !cmd.Flags().Changed("seed") {
				seed = rand.Uint64N(1 << 31)
			}
			for _, f := range faults {
				switch f {
				case chaoscheck.FaultKill, chaoscheck.FaultStop, chaoscheck.FaultCut, chaoscheck.FaultBlackhole, chaoscheck.FaultDelay,
					chaoscheck.FaultDBRestart, chaoscheck.FaultDiskFull, chaoscheck.FaultClock, chaoscheck.FaultReparent:
				default:
					return usagef("--faults: %q: want kill, stop, cut, blackhole, delay, db-restart, disk-full, clock or reparent", f)
				}
			}
			cfg.Seed, cfg.Faults, cfg.DSN, cfg.Log, cfg.Out = seed, faults, a.dsn(), a.logger(), a.env.Stdout
			fmt.Fprintf(a.env.Stderr, "chaos: seed %d\n", seed)
			c, drv, done, err := a.open(true)
			if err != nil {
				return err
			}
			defer done()
			tokens, ok := drv.(driver.Tokens)
			if !ok {
				return fmt.Errorf("chaos: the %s driver stores no tokens, which the run's servers need", drv.Name())
			}
			cfg.Tokens = tokens
			probe := driver.GroupScope{Tenants: []string{"chaos-probe"}, Topic: "probe", ConsumerGroup: "probe"}
			cfg.Probe = func(ctx context.Context) error { return drv.Heartbeat(ctx, probe, "chaos-runner", time.Now()) }
			_, err = chaos.Run(cmd.Context(), c, cfg)
			return err
		}),
	}
	fl := cmd.Flags()
	fl.StringVar(&cfg.Dir, "dir", "", "a new directory for the histories, logs and summary (required)")
	positiveDurationFlag(fl, &cfg.Duration, "duration", 2*time.Minute, "how long faults are injected")
	positiveDurationFlag(fl, &cfg.Drain, "drain", 2*time.Minute, "the drain's bound (it ends once nothing moved for 15s)")
	fl.Uint64Var(&seed, "seed", 0, "the fault schedule's seed [random, printed]")
	fl.StringVar(&cfg.DBRestart, "db-restart", "", "a shell command that kills the database server and starts it again (a server of the run's own)")
	fl.StringVar(&cfg.Reparent, "reparent", "", "a shell command that moves the database's primary (a Vitess shard's planned reparent, scripts/vitess-cluster); it runs once, halfway through the faults")
	fl.StringVar(&cfg.FullDisk, "full-disk", "", "a directory on the database's own small file system, which the disk-full fault fills")
	fl.StringSliceVar(&faults, "faults", nil, "fault kinds to inject [all that apply]: kill, stop, cut, blackhole, delay, db-restart, disk-full, clock, reparent")
	fl.StringSliceVar(&cfg.Tenants, "tenants", []string{chaos.Tenant}, "the tenants the run writes (each must hold no messages); on Vitess, name tenants of different shards")
	fl.DurationVar(&cfg.ClockSync, "clock-sync", chaos.ClockSync, "the clients' ClockSync; negative leaves the clock fault's clients on their own clocks (to see what it does without the database's clock)")
	// They kill the database server, move its primary, fill a disk.
	cmdLineOnly(fl, "db-restart", "reparent", "full-disk")
	return cmd
}

func (a *app) chaosCheckCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "check DIR",
		Short: "Judge a chaos run's histories again (the checker alone)",
		Args:  cobra.ExactArgs(1),
		RunE: run(func(cmd *cobra.Command, args []string) error {
			evs, err := chaoscheck.ReadDir(args[0])
			if err != nil {
				return err
			}
			rep := chaoscheck.Check(evs)
			fmt.Fprintf(a.env.Stdout, "%d sent, %d acknowledged, %d stored; violations: %d\n", rep.Sent, rep.Published, rep.Stored, len(rep.Violations))
			for _, v := range rep.Violations {
				fmt.Fprintf(a.env.Stdout, "  %s\n", v)
			}
			if len(rep.Violations) > 0 {
				return fmt.Errorf("chaos check: %d violations in %s", len(rep.Violations), filepath.Clean(args[0]))
			}
			return nil
		}),
	}
}

func (a *app) chaosClientCmd() *cobra.Command {
	var cfg chaos.ClientConfig
	var sendUntil int64
	cmd := &cobra.Command{
		Use:    "client",
		Short:  "One client process of `shardq chaos run` (internal)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: run(func(cmd *cobra.Command, _ []string) error {
			if cfg.Name == "" || cfg.History == "" {
				return usagef("--name and --history: required")
			}
			cfg.SendUntil = time.Unix(0, sendUntil)
			cfg.Token = a.env.Getenv(chaos.TokenEnv)
			a.tune = cfg.Tune
			// Started again after a kill, a client may meet its database
			// restarting (db-restart; through Vitess, a shard's primary):
			// it waits for it, as a supervisor would start it again.
			c, done, err := a.client()
			for deadline := time.Now().Add(time.Minute); err != nil && !refused(err) && time.Now().Before(deadline); {
				time.Sleep(500 * time.Millisecond)
				c, done, err = a.client()
			}
			if err != nil {
				return err
			}
			defer done()
			stop := make(chan struct{})
			go func() {
				buf := make([]byte, 1)
				for {
					if _, err := a.env.Stdin.Read(buf); err != nil {
						close(stop) // the runner closed stdin, or died
						return
					}
				}
			}()
			return chaos.RunClient(cmd.Context(), c, cfg, stop, a.logger())
		}),
	}
	fl := cmd.Flags()
	fl.StringVar(&cfg.Role, "role", "", "publish, large, tx, subscribe, ungrouped or receive")
	fl.StringVar(&cfg.Name, "name", "", "the process's name")
	fl.StringVar(&cfg.History, "history", "", "the history file")
	fl.IntVar(&cfg.Batch, "batch", 1, "messages per publish call")
	durationFlag(fl, &cfg.Interval, "interval", 100*time.Millisecond, "between publish calls")
	fl.Uint64Var(&cfg.Seed, "seed", 0, "the run's seed")
	fl.Int64Var(&sendUntil, "send-until", 0, "tx: when sending ends, Unix nanoseconds (the check-back runs on)")
	fl.StringSliceVar(&cfg.Tenants, "tenants", []string{chaos.Tenant}, "the run's tenants")
	fl.StringSliceVar(&cfg.Servers, "servers", nil, "HTTP roles: the base URLs of the run's serve processes (the token in "+chaos.TokenEnv+")")
	// Either sign: a clock behind or ahead; ClockSync off.
	fl.DurationVar(&cfg.ClockOffset, "clock-offset", 0, "how far this process's clock is off (the clock fault)")
	fl.DurationVar(&cfg.ClockSync, "clock-sync", chaos.ClockSync, "the client's ClockSync (negative: keep to the process's clock)")
	return cmd
}
