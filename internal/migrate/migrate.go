// SPDX-License-Identifier: Apache-2.0

// Package migrate loads a driver's embedded, versioned migrations. Each file
// is NNNN_name.sql; its statements end with a semicolon at the end of a line.
// Which versions are applied is kept in the table shardq_schema_migrations;
// each driver applies them under its own lock.
package migrate

import (
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"
)

// Table records the applied versions.
const Table = "shardq_schema_migrations"

// Migration is one versioned file.
type Migration struct {
	Version    int
	Name       string
	Statements []string
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

// Latest is the highest version in ms (0 when empty).
// NotNewer refuses a database whose applied version is above latest (the
// highest this binary embeds): it was migrated by a newer shardq. newer is
// the error to wrap (driver.ErrSchemaNewer).
func NotNewer(current, latest int, newer error) error {
	if current > latest {
		return fmt.Errorf("%w: the database is at schema version %d, this shardq knows versions up to %d: upgrade shardq", newer, current, latest)
	}
	return nil
}

func Latest(ms []Migration) int {
	if len(ms) == 0 {
		return 0
	}
	return ms[len(ms)-1].Version
}
