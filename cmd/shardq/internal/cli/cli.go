// SPDX-License-Identifier: Apache-2.0

// Package cli holds the shardq command's commands; cmd/shardq only calls
// Main. Exit codes: 0 success, 1 failure, 2 usage error (bad flags or
// arguments, invalid identifiers).
package cli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/driver/mysqldriver"
	"github.com/shardq/shardq/driver/sqlitedriver"
	"github.com/shardq/shardq/internal/dsn"
	"github.com/shardq/shardq/internal/ident"
	"github.com/shardq/shardq/internal/receiptkey"
	"github.com/shardq/shardq/internal/settings"
)

// DefaultDSN is the database used when neither --dsn nor SHARDQ_DSN is set.
const DefaultDSN = "sqlite://shardq.db"

// Env is what a command reads from its process.
type Env struct {
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	Getenv func(string) string
	// StderrTerminal says Stderr is a terminal: long work then shows its
	// progress there (progress.go).
	StderrTerminal bool
}

// usageError marks an error as the caller's mistake (exit code 2).
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// runError marks an error returned by a command's body, as opposed to one
// cobra found while parsing (which is a usage error).
type runError struct{ err error }

func (e runError) Error() string { return e.err.Error() }
func (e runError) Unwrap() error { return e.err }

// Main runs the command line args (without the program name) and returns
// the exit code.
func Main(ctx context.Context, args []string, env Env) int {
	root := newRoot(env)
	e := withEnv(root, args, env.Getenv)
	for _, name := range e.ignored {
		fmt.Fprintf(env.Stderr, "warning: $%s is ignored: --%s is taken from the command line only (docs/cli.md)\n", envName(name), name)
	}
	root.SetArgs(e.args)
	root.SetIn(env.Stdin)
	root.SetOut(env.Stdout)
	root.SetErr(env.Stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	err = fromEnv(err, e.set)
	// One line, whatever the error carries (an identifier with control
	// bytes, a driver message with a newline).
	fmt.Fprintln(env.Stderr, "error:", display(err.Error()))
	var re runError
	var ue usageError
	switch {
	case errors.As(err, &ue), errors.Is(err, shardq.ErrInvalid):
		return 2
	case errors.As(err, &re):
		return 1
	default: // cobra's own parse errors: unknown command, bad flag
		return 2
	}
}

type app struct {
	// tune, when set, adjusts the client's configuration: a chaos
	// client's (chaos.ClientConfig.Tune).
	tune     func(*shardq.Config)
	env      Env
	dsnFlag  string // --dsn as given; see dsn()
	feedFlag string // --feed: auto or off
	// --feed-dsn as given; see feedDSN (feeddsn.go)
	feedDSNFlag string
	// vtgateGRPC is --vtgate-grpc: vtgate's gRPC address for the Vitess
	// change feed (openDriver, feeddsn.go).
	vtgateGRPC string
	// feedMaxEvent is --feed-max-event: the change feed passes over binary
	// log events larger than this (with a rescan).
	feedMaxEvent int64
	// --metrics-addr and --otlp-endpoint (telemetry.go)
	metricsAddr, otlpEndpoint string
	// serveMetrics asks open for a Prometheus registry even without
	// --metrics-addr (serve answers /metrics itself); metrics is its
	// handler once open made one.
	serveMetrics bool
	// metricsSeries caps the series of one instrument (--metrics-series).
	metricsSeries int
	// meterProvider is startTelemetry's (nil: the no-op global).
	meterProvider metric.MeterProvider
	// tracerProvider is startTelemetry's under OTLP (nil: otel's global).
	tracerProvider trace.TracerProvider
	metrics        http.Handler
	// --log-format and --log-level, and the logger they make (logflags.go).
	logFormat logFormatFlag
	logLevel  logLevelFlag
	logOnce   sync.Once
	log       *slog.Logger
	// tenantsWarning says once that MQ_TENANTS is deprecated (servedTenants).
	tenantsWarning sync.Once
}

// servedTenants is the command's served tenant list: SHARDQ_TENANTS, else
// (for one release, with a warning on stderr) MQ_TENANTS; nil when
// neither is set. A variable set to "" counts as unset, as for flags.
func (a *app) servedTenants() ([]string, error) {
	ts, _, warning, err := settings.LookupTenants(func(k string) (string, bool) {
		v := a.env.Getenv(k)
		return v, v != ""
	})
	if warning != "" {
		a.tenantsWarning.Do(func() { fmt.Fprintln(a.env.Stderr, "warning:", warning) })
	}
	return ts, err
}

// dsn is --dsn, else SHARDQ_DSN, else DefaultDSN. The environment is not
// the flag's default: help would print a password it holds.
func (a *app) dsn() string {
	if a.dsnFlag != "" {
		return a.dsnFlag
	}
	if v := a.env.Getenv("SHARDQ_DSN"); v != "" {
		return v
	}
	return DefaultDSN
}

func newRoot(env Env) *cobra.Command {
	a := &app{env: env, logFormat: "text", logLevel: logLevelFlag(slog.LevelWarn)}
	root := &cobra.Command{
		Use:           "shardq",
		Short:         "An ordered, tenant-sharded message queue on MySQL or SQLite",
		SilenceErrors: true,
		SilenceUsage:  true,
	}
	bi, _ := debug.ReadBuildInfo()
	root.Version = versionLine(bi) // --version prints what the version command does
	root.SetVersionTemplate("{{.Version}}\n")
	root.PersistentFlags().StringVar(&a.dsnFlag, "dsn", "",
		"database: sqlite://PATH, sqlite:///ABS/PATH or mysql://USER:PASS@HOST:PORT/DB (default $SHARDQ_DSN, else "+DefaultDSN+")")
	root.PersistentFlags().StringVar(&a.feedFlag, "feed", "auto",
		"how consumers hear of messages other processes publish: auto (the database's change feed, where it has one; docs/feed.md) or off (poll only)")
	root.PersistentFlags().IntVar(&a.metricsSeries, "metrics-series", 2000,
		"series kept per metric (tenants and topics come from clients); past it, one series labelled otel.metric.overflow")
	root.PersistentFlags().StringVar(&a.feedDSNFlag, "feed-dsn", "", feedDSNHelp)
	root.PersistentFlags().StringVar(&a.vtgateGRPC, "vtgate-grpc", "",
		"on Vitess: vtgate's gRPC address HOST:PORT, for the change feed through VStream (without it consumers poll; docs/vitess.md)")
	root.PersistentFlags().Int64Var(&a.feedMaxEvent, "feed-max-event", mysqldriver.DefaultFeedMaxEventBytes,
		"the MySQL change feed passes over binary log events larger than this many bytes, unread, and has consumers rescan (docs/feed.md)")
	root.PersistentFlags().StringVar(&a.metricsAddr, "metrics-addr", "",
		"serve Prometheus metrics at http://HOST:PORT/metrics while the command runs (for consume and other long-running commands)")
	root.PersistentFlags().StringVar(&a.otlpEndpoint, "otlp-endpoint", "",
		"send traces and metrics over OTLP/HTTP to this URL (like http://localhost:4318); the OTEL_EXPORTER_OTLP_* variables work too")
	root.PersistentFlags().Var(&a.logFormat, "log-format", "log lines on stderr as text (key=value) or json")
	root.PersistentFlags().Var(&a.logLevel, "log-level", "the least severe log lines written: debug, info (serve's access log), warn or error")
	root.SetFlagErrorFunc(flagError)
	root.AddCommand(a.migrateCmd(), a.publishCmd(), a.consumeCmd(), a.txCmd(), a.adminCmd(), a.benchCmd(), a.serveCmd(), a.tokenCmd(), a.receiptKeyCmd(), a.backupCmd(), a.healthcheckCmd(), a.chaosCmd(), a.versionCmd())
	singleValued(root)
	envFlags(root)
	return root
}

// run adapts a command body: its errors are run errors unless marked as
// usage errors.
func run(fn func(cmd *cobra.Command, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		err := fn(cmd, args)
		if err == nil || refused(err) {
			return err
		}
		return runError{err}
	}
}

// refused reports an error of the command's input, which trying again
// cannot cure: a usage error or an invalid value.
func refused(err error) bool {
	var ue usageError
	return errors.As(err, &ue) || errors.Is(err, shardq.ErrInvalid)
}

// spec parses the DSN. Every command validates its other flags before it
// calls spec (or client), so a refused command touches no database.
func (a *app) spec(create bool) (dsn.Spec, error) {
	spec, err := dsn.Parse(a.dsn())
	if err != nil {
		return spec, usageError{fmt.Errorf("--dsn: %w", err)}
	}
	if spec.Driver == "sqlite" && !create {
		// Only migrate creates a database: a typo'd path is an error,
		// not a new empty file.
		if _, err := os.Stat(spec.Path); errors.Is(err, fs.ErrNotExist) {
			return spec, usagef("--dsn: SQLite file %q does not exist (run `shardq migrate` to create it)", spec.Path)
		}
	}
	return spec, nil
}

// client opens the database named by --dsn; it must exist and must not be
// migrated past what this binary knows.
func (a *app) client() (*shardq.Client, func(), error) {
	c, _, done, err := a.open(false)
	return c, done, err
}

// open opens the driver (which the CLI owns) and a client over it.
func (a *app) open(create bool) (*shardq.Client, driver.Driver, func(), error) {
	if err := a.checkTelemetryFlags(); err != nil {
		return nil, nil, nil, err
	}
	spec, err := a.spec(create)
	if err != nil {
		return nil, nil, nil, err
	}
	drv, err := a.openDriver(spec)
	if err != nil {
		return nil, nil, nil, err
	}
	if err := checkSchema(drv); err != nil {
		drv.Close()
		return nil, nil, nil, err
	}
	cfg := &shardq.Config{Logger: a.logger()}
	if a.tune != nil {
		a.tune(cfg)
	}
	switch a.feedFlag {
	case "auto":
	case "off":
		cfg.ChangeFeed = shardq.FeedOff
	default:
		drv.Close()
		return nil, nil, nil, usagef("--feed: %q must be auto or off", a.feedFlag)
	}
	// The served tenants: publishing elsewhere is refused before SQL.
	ts, err := a.servedTenants()
	if err != nil {
		drv.Close()
		return nil, nil, nil, usageError{err}
	}
	cfg.Tenants = ts
	tel, err := a.startTelemetry(context.Background(), cfg)
	if err != nil {
		drv.Close()
		return nil, nil, nil, err
	}
	c, err := shardq.NewClient(drv, cfg)
	if err != nil {
		drv.Close()
		tel.shutdown()
		return nil, nil, nil, err
	}
	return c, drv, func() {
		c.Close()
		drv.Close()
		if err := tel.shutdown(); err != nil {
			a.logger().Warn("shardq: flushing telemetry failed", "err", err)
		}
	}, nil
}

// firstErr returns the first failed check: flags are validated, in order,
// before any command opens the database.
func firstErr(checks ...error) error {
	for _, err := range checks {
		if err != nil {
			return err
		}
	}
	return nil
}

// refErr checks a message's full identity.
func refErr(ref shardq.MessageRef) error {
	return firstErr(ident.Tenant(ref.Tenant), ident.Topic(ref.Topic), ident.PartitionKey(ref.PartitionKey), ident.MessageID(ref.ID))
}

// stampedVersion is set by scripts/release (-ldflags -X): the binary
// says the version its archive is named by, where the go command would
// stamp a pseudo-version of the checkout's commit.
var stampedVersion string

// versionLine is "shardq VERSION GOVERSION": the version the release
// script stamped, else the module version (go install ...@vX.Y.Z, or the
// checkout's pseudo-version), else the VCS revision and commit time the
// build stamped (with "+dirty" for uncommitted changes), else "(devel)".
func versionLine(bi *debug.BuildInfo) string {
	if bi == nil {
		bi = &debug.BuildInfo{}
	}
	version := cmp.Or(stampedVersion, bi.Main.Version)
	if version == "" || version == "(devel)" {
		version = "(devel)"
		var rev, at, dirty string
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.time":
				at = s.Value
			case "vcs.modified":
				if s.Value == "true" {
					dirty = "+dirty"
				}
			}
		}
		if rev != "" {
			version = rev[:min(12, len(rev))] + dirty
			if at != "" {
				version += " (" + at + ")"
			}
		}
	}
	if bi.GoVersion == "" {
		return "shardq " + version
	}
	return "shardq " + version + " " + bi.GoVersion
}

// checkSchema refuses a database migrated by a newer shardq past a
// contract migration: its tables mean something this binary does not
// know. Additive migrations past it are fine.
func checkSchema(drv driver.Driver) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return drv.SchemaCompatible(ctx)
}

// display is s for a terminal: as it is when every character is
// printable, else quoted with Go escapes, so that control bytes in an
// identifier cannot move the cursor, color the screen or forge a line.
func display(s string) string {
	for _, r := range s {
		if r == utf8.RuneError || !unicode.IsPrint(r) {
			return strconv.Quote(s)
		}
	}
	return s
}

func (a *app) migrateCmd() *cobra.Command {
	var dryRun, printSQL bool
	cmd := &cobra.Command{
		Use:   "migrate [--dry-run | --print-sql]",
		Short: "Create or upgrade the queue's tables",
		Long: "Applies the migrations the database lacks and creates the receipt key.\n" +
			"--dry-run prints the pending migrations and their SQL and changes nothing;\n" +
			"--print-sql prints every migration of the DSN's dialect without connecting (for change review).\n" +
			"`shardq migrate status` compares the database's schema version with this binary's.",
		Args: cobra.NoArgs,
		RunE: run(func(cmd *cobra.Command, _ []string) error {
			if dryRun && printSQL {
				return usagef("--dry-run and --print-sql: give one")
			}
			if printSQL {
				spec, err := a.spec(true)
				if err != nil {
					return err
				}
				ms, err := migrationsOf(spec)
				if err != nil {
					return err
				}
				a.printMigrations(spec.Driver, ms)
				return nil
			}
			if dryRun {
				st, err := a.schemaStatus(cmd.Context())
				if err != nil {
					return err
				}
				if len(st.pending) == 0 {
					fmt.Fprintf(a.env.Stdout, "-- schema up to date at version %d (%s): nothing would run\n", st.current, st.driver)
					return nil
				}
				fmt.Fprintf(a.env.Stdout, "-- schema at version %d (%s); migrate would apply:\n", st.current, st.driver)
				a.printMigrations(st.driver, st.pending)
				return nil
			}
			_, drv, done, err := a.open(true)
			if err != nil {
				return err
			}
			defer done()
			applied, err := drv.Migrate(cmd.Context())
			if err != nil {
				return err
			}
			if _, err := receiptkey.Ensure(cmd.Context(), drv, time.Now()); err != nil {
				return fmt.Errorf("create the receipt key: %w", err)
			}
			current, _, err := drv.SchemaVersion(cmd.Context())
			if err != nil {
				return err
			}
			if len(applied) == 0 {
				fmt.Fprintf(a.env.Stdout, "schema up to date at version %d (%s)\n", current, drv.Name())
			} else {
				fmt.Fprintf(a.env.Stdout, "applied migrations %v; schema at version %d (%s)\n", applied, current, drv.Name())
			}
			return nil
		}),
	}
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "print the pending migrations and their SQL; change nothing")
	cmd.Flags().BoolVar(&printSQL, "print-sql", false, "print every migration's SQL for the DSN's dialect, without connecting")
	cmd.AddCommand(&cobra.Command{
		Use:   "status",
		Short: "Compare the database's schema version with this binary's",
		Args:  cobra.NoArgs,
		RunE: run(func(cmd *cobra.Command, _ []string) error {
			st, err := a.schemaStatus(cmd.Context())
			if err != nil {
				return err
			}
			state := "up to date"
			switch {
			case st.current > st.latest && st.compatible != nil:
				state = "the database is past a contract migration newer than this binary: upgrade shardq before using it"
			case st.current > st.latest:
				state = "the database is newer than this binary, by additive migrations only: this binary runs on it"
			case len(st.pending) > 0:
				names := make([]string, len(st.pending))
				for i, m := range st.pending {
					names[i] = fmt.Sprintf("%04d_%s", m.Version, m.Name)
				}
				state = "pending: " + strings.Join(names, ", ") + " (run shardq migrate)"
			}
			fmt.Fprintf(a.env.Stdout, "driver:   %s\ndatabase: schema version %d\nbinary:   schema version %d\nstate:    %s\n",
				st.driver, st.current, st.latest, state)
			return nil
		}),
	})
	return cmd
}

// schemaState is a database's schema against this binary's migrations.
type schemaState struct {
	driver          string
	current, latest int
	pending         []driver.Migration
	compatible      error // when current > latest: nil if this binary runs on it (SchemaCompatible)
}

// schemaStatus reads the database's schema version, changing nothing (a
// SQLite file must exist already).
func (a *app) schemaStatus(ctx context.Context) (schemaState, error) {
	spec, err := a.spec(false)
	if err != nil {
		return schemaState{}, err
	}
	ms, err := migrationsOf(spec)
	if err != nil {
		return schemaState{}, err
	}
	drv, err := a.openDriver(spec)
	if err != nil {
		return schemaState{}, err
	}
	defer drv.Close()
	current, latest, err := drv.SchemaVersion(ctx)
	if err != nil {
		return schemaState{}, err
	}
	st := schemaState{driver: drv.Name(), current: current, latest: latest}
	if current > latest {
		st.compatible = drv.SchemaCompatible(ctx)
	}
	for _, m := range ms {
		if m.Version > current {
			st.pending = append(st.pending, m)
		}
	}
	return st, nil
}

// migrationsOf lists the migrations of spec's driver.
func migrationsOf(spec dsn.Spec) ([]driver.Migration, error) {
	if spec.Driver == "sqlite" {
		return sqlitedriver.Migrations()
	}
	return mysqldriver.Migrations()
}

// printMigrations writes ms as SQL, each under a comment naming it.
func (a *app) printMigrations(dialect string, ms []driver.Migration) {
	for _, m := range ms {
		fmt.Fprintf(a.env.Stdout, "\n-- %04d_%s (%s)\n", m.Version, m.Name, dialect)
		for _, st := range m.Statements {
			fmt.Fprintf(a.env.Stdout, "%s;\n", strings.TrimSpace(st))
		}
	}
}

func (a *app) versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		RunE: run(func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintln(a.env.Stdout, cmd.Root().Version)
			return nil
		}),
	}
}
