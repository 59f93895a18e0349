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

// ContractSuffix ends the name of a migration that removes or changes
// what an older binary reads. Every other migration only adds (tables,
// columns, indexes), so that a binary runs on a database migrated past
// what it knows (expand, then contract: docs/operations.md).
const ContractSuffix = "_contract"

// Compatible refuses a database whose applied version is above latest
// (the highest this binary embeds) when one of the migrations past latest,
// named in beyond, is a contract migration: it was migrated by a newer
// shardq whose schema this binary cannot use. newer is the error to wrap
// (driver.ErrSchemaNewer).
func Compatible(current, latest int, beyond []string, newer error) error {
	if current <= latest {
		return nil
	}
	for _, name := range beyond {
		if strings.HasSuffix(name, ContractSuffix) {
			return fmt.Errorf("%w: the database is at schema version %d, this shardq knows versions up to %d, and migration %s removes or changes what it reads: upgrade shardq",
				newer, current, latest, name)
		}
	}
	return nil
}

// Querier reads: a pool, a connection or a transaction.
type Querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// beyond lists the applied migrations above version, oldest first, by
// "version_name".
func beyond(ctx context.Context, q Querier, version int) ([]string, error) {
	rows, err := q.QueryContext(ctx, "SELECT version, name FROM "+Table+" WHERE version > ? ORDER BY version", version)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var v int
		var name string
		if err := rows.Scan(&v, &name); err != nil {
			return nil, err
		}
		out = append(out, fmt.Sprintf("%04d_%s", v, name))
	}
	return out, rows.Err()
}

// Latest is the highest version in ms (0 when empty).
func Latest(ms []Migration) int {
	if len(ms) == 0 {
		return 0
	}
	return ms[len(ms)-1].Version
}

// Check is Compatible for a database at current, its migrations past
// latest read through q.
func Check(ctx context.Context, q Querier, current, latest int, newer error) error {
	if current <= latest {
		return nil
	}
	names, err := beyond(ctx, q, latest)
	if err != nil {
		return fmt.Errorf("schema version: %w", err)
	}
	return Compatible(current, latest, names, newer)
}

// Execer runs a statement: a connection or a transaction.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// Apply runs, in order, the migrations of ms above current and records
// each in Table as applied at appliedAt (in the column's type), and
// returns the versions applied before any failure. The caller has Checked
// a database newer than ms.
func Apply(ctx context.Context, db Execer, ms []Migration, current int, appliedAt any) ([]int, error) {
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
