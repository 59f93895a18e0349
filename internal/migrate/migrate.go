// SPDX-License-Identifier: Apache-2.0

// Package migrate loads a driver's embedded, versioned migrations. Each file
// is NNNN_name.sql; its statements end with a semicolon at the end of a line.
// Which versions are applied is kept in the table shardq_schema_migrations;
// each driver applies them under its own lock.
package migrate

import (
	"context"
	"database/sql"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/shardq/shardq/driver"
)

// Table records the applied versions.
const Table = "shardq_schema_migrations"

// Migration is one versioned file.
type Migration struct {
	Version    int
	Name       string
	Statements []string
}

// Public is ms as the driver package's type.
func Public(ms []Migration) []driver.Migration {
	out := make([]driver.Migration, len(ms))
	for i, m := range ms {
		out[i] = driver.Migration(m)
	}
	return out
}

// Load reads every *.sql file of dir in fsys, ordered by version.
func Load(fsys fs.FS, dir string) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("read migrations: %w", err)
	}
	var out []Migration
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || path.Ext(name) != ".sql" {
			continue
		}
		num, rest, ok := strings.Cut(strings.TrimSuffix(name, ".sql"), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("migration %s: name must be NNNN_name.sql", name)
		}
		body, err := fs.ReadFile(fsys, path.Join(dir, name))
		if err != nil {
			return nil, fmt.Errorf("migration %s: %w", name, err)
		}
		out = append(out, Migration{Version: v, Name: rest, Statements: split(string(body))})
	}
	slices.SortFunc(out, func(a, b Migration) int { return a.Version - b.Version })
	for i := 1; i < len(out); i++ {
		if out[i].Version == out[i-1].Version {
			return nil, fmt.Errorf("migration version %d appears twice", out[i].Version)
		}
	}
	return out, nil
}

// split cuts a file into statements at semicolons that end a line, and
// drops "--" comment lines.
func split(body string) []string {
	var stmts []string
	var cur strings.Builder
	for _, line := range strings.Split(body, "\n") {
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "--") {
			continue
		}
		cur.WriteString(line)
		cur.WriteString("\n")
		if strings.HasSuffix(trimmed, ";") {
			stmts = append(stmts, strings.TrimSuffix(strings.TrimSpace(cur.String()), ";"))
			cur.Reset()
		}
	}
	if s := strings.TrimSpace(cur.String()); s != "" {
		stmts = append(stmts, s)
	}
	return stmts
}

// NotNewer refuses a database whose applied version is above latest (the
// highest this binary embeds): it was migrated by a newer shardq. newer is
// the error to wrap (driver.ErrSchemaNewer).
func NotNewer(current, latest int, newer error) error {
	if current > latest {
		return fmt.Errorf("%w: the database is at schema version %d, this shardq knows versions up to %d: upgrade shardq", newer, current, latest)
	}
	return nil
}

// Latest is the highest version in ms (0 when empty).
func Latest(ms []Migration) int {
	if len(ms) == 0 {
		return 0
	}
	return ms[len(ms)-1].Version
}

// Execer runs a statement: a connection or a transaction.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// Apply runs, in order, the migrations of ms above current and records
// each in Table as applied at appliedAt (in the column's type). It refuses
// a database newer than ms (NotNewer, wrapping newer), and returns the
// versions applied before any failure.
func Apply(ctx context.Context, db Execer, ms []Migration, current int, appliedAt any, newer error) ([]int, error) {
	if err := NotNewer(current, Latest(ms), newer); err != nil {
		return nil, err
	}
	var applied []int
	for _, m := range ms {
		if m.Version <= current {
			continue
		}
		for _, stmt := range m.Statements {
			if _, err := db.ExecContext(ctx, stmt); err != nil {
				return applied, fmt.Errorf("migrate %04d_%s: %w", m.Version, m.Name, err)
			}
		}
		if _, err := db.ExecContext(ctx, "INSERT INTO "+Table+" (version, name, applied_at) VALUES (?, ?, ?)", m.Version, m.Name, appliedAt); err != nil {
			return applied, fmt.Errorf("migrate %04d_%s: record: %w", m.Version, m.Name, err)
		}
		applied = append(applied, m.Version)
	}
	return applied, nil
}
