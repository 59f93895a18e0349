// Package cli holds the shardq command's commands; cmd/shardq only calls
// Main. Exit codes: 0 success, 1 failure, 2 usage error (bad flags or
// arguments, invalid identifiers).
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime/debug"

	"github.com/spf13/cobra"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/internal/dsn"
	"github.com/shardq/shardq/internal/ident"
)

// DefaultDSN is the database used when neither --dsn nor SHARDQ_DSN is set.
const DefaultDSN = "sqlite://shardq.db"

// Env is what a command reads from its process.
type Env struct {
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	Getenv func(string) string
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
	root.SetArgs(args)
	root.SetIn(env.Stdin)
	root.SetOut(env.Stdout)
	root.SetErr(env.Stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	fmt.Fprintln(env.Stderr, "error:", err)
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
	env Env
	dsn string
}

func newRoot(env Env) *cobra.Command {
	a := &app{env: env}
	defaultDSN := DefaultDSN
	if v := env.Getenv("SHARDQ_DSN"); v != "" {
		defaultDSN = v
	}
	root := &cobra.Command{
		Use:           "shardq",
		Short:         "An ordered, tenant-sharded message queue on MySQL or SQLite",
		SilenceErrors: true,
		SilenceUsage:  true,
	}
	root.PersistentFlags().StringVar(&a.dsn, "dsn", defaultDSN,
		"database: sqlite://PATH, sqlite:///ABS/PATH or mysql://USER:PASS@HOST:PORT/DB (env SHARDQ_DSN)")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.AddCommand(a.migrateCmd(), a.publishCmd(), a.consumeCmd(), a.txCmd(), a.adminCmd(), a.benchCmd(), a.versionCmd())
	return root
}

// run adapts a command body: its errors are run errors unless marked as
// usage errors.
func run(fn func(cmd *cobra.Command, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		err := fn(cmd, args)
		var ue usageError
		if err == nil || errors.As(err, &ue) || errors.Is(err, shardq.ErrInvalid) {
			return err
		}
		return runError{err}
	}
}

// client opens the database named by --dsn.
func (a *app) client() (*shardq.Client, func(), error) {
	spec, err := dsn.Parse(a.dsn)
	if err != nil {
		return nil, nil, usageError{fmt.Errorf("--dsn: %w", err)}
	}
	drv, err := dsn.Open(spec)
	if err != nil {
		return nil, nil, err
	}
	cfg := &shardq.Config{Logger: a.logger()}
	if v := a.env.Getenv("MQ_TENANTS"); v != "" {
		// The served tenants: publishing elsewhere is refused before SQL.
		ts, err := ident.TenantList("MQ_TENANTS", v)
		if err != nil {
			drv.Close()
			return nil, nil, usageError{err}
		}
		cfg.Tenants = ts
	}
	c, err := shardq.NewClient(drv, cfg)
	if err != nil {
		drv.Close()
		return nil, nil, err
	}
	return c, func() { c.Close(); drv.Close() }, nil
}

// logger writes warnings and errors to stderr.
func (a *app) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(a.env.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

func (a *app) migrateCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "migrate",
		Short: "Create or upgrade the queue's tables",
		Args:  cobra.NoArgs,
		RunE: run(func(cmd *cobra.Command, _ []string) error {
			c, done, err := a.client()
			if err != nil {
				return err
			}
			defer done()
			applied, err := c.Driver().Migrate(cmd.Context())
			if err != nil {
				return err
			}
			current, _, err := c.Driver().SchemaVersion(cmd.Context())
			if err != nil {
				return err
			}
			if len(applied) == 0 {
				fmt.Fprintf(a.env.Stdout, "schema up to date at version %d (%s)\n", current, c.Driver().Name())
			} else {
				fmt.Fprintf(a.env.Stdout, "applied migrations %v; schema at version %d (%s)\n", applied, current, c.Driver().Name())
			}
			return nil
		}),
	}
}

func (a *app) versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		RunE: run(func(*cobra.Command, []string) error {
			version, goVersion := "(devel)", ""
			if bi, ok := debug.ReadBuildInfo(); ok {
				if bi.Main.Version != "" {
					version = bi.Main.Version
				}
				goVersion = bi.GoVersion
			}
			fmt.Fprintf(a.env.Stdout, "shardq %s %s\n", version, goVersion)
			return nil
		}),
	}
}
