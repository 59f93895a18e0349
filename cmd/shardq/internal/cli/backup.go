// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/shardq/shardq/driver/sqlitedriver"
)

func (a *app) backupCmd() *cobra.Command {
	var to string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "backup --to FILE",
		Short: "Write a consistent copy of a SQLite database to a new file, while it serves (MySQL: docs/operations.md)",
		Long: "Copies the SQLite database of --dsn to FILE (SQLite's VACUUM INTO) in one read transaction: publishers\n" +
			"and consumers go on meanwhile, and the copy holds what was committed when it began. FILE must not exist.\n" +
			"Restore: stop every process of the database, then put FILE in its place (removing the old -wal and -shm).\n" +
			"A MySQL or MariaDB database is backed up with the server's tools (mariadb-dump --single-transaction, or\n" +
			"mariabackup): docs/operations.md.",
		Args: cobra.NoArgs,
		RunE: run(func(cmd *cobra.Command, _ []string) error {
			if to == "" {
				return usagef("--to: required")
			}
			spec, err := a.spec(false)
			if err != nil {
				return err
			}
			if spec.Driver != "sqlite" {
				return usagef("--dsn: backup copies a SQLite database; back up %s with its server's tools (mariadb-dump --single-transaction, mariabackup; docs/operations.md)", spec.Driver)
			}
			drv, err := sqlitedriver.Open(spec.Path, nil)
			if err != nil {
				return err
			}
			defer drv.Close()
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			start := time.Now()
			if err := drv.Backup(ctx, to); err != nil {
				return err
			}
			fmt.Fprintf(a.env.Stdout, "backed up %s to %s in %s\n", spec.Path, to, time.Since(start).Round(time.Millisecond))
			return nil
		}),
	}
	cmd.Flags().StringVar(&to, "to", "", "the new file to write (required)")
	positiveDurationFlag(cmd.Flags(), &timeout, "timeout", time.Hour, "give up after this long")
	return cmd
}
