// SPDX-License-Identifier: Apache-2.0

// Package testdb gives each test its own database: a fresh MariaDB/MySQL
// schema (dropped when the test ends) or a SQLite file in the test's temp
// directory.
//
// MySQL tests read SHARDQ_TEST_MYSQL_DSN (a go-sql-driver DSN without a
// database name; default "root@tcp(127.0.0.1:3316)/", the server of the
// tests' own that scripts/mariadb starts: never the default port, where a
// server of someone else's may run). An unreachable server fails the test. Outside CI, SHARDQ_TEST_MYSQL=skip skips them instead
// (with CI=true it is ignored: CI never skips).
package testdb

import (
	"context"
	"crypto/rand"
	"database/sql"
	sqldriver "database/sql/driver"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/driver/mysqldriver"
	"github.com/shardq/shardq/driver/sqlitedriver"
)

// MySQLServerDSN is the DSN of the test server, without a database.
func MySQLServerDSN() string {
	if v := os.Getenv("SHARDQ_TEST_MYSQL_DSN"); v != "" {
		return v
	}
	return "root@tcp(127.0.0.1:3316)/" // scripts/mariadb's own server

}

// MySQLDatabase creates an empty database and returns a go-sql-driver DSN
// for it; the database is dropped when t ends.
func MySQLDatabase(t testing.TB) string {
	t.Helper()
	if os.Getenv("CI") != "true" && os.Getenv("SHARDQ_TEST_MYSQL") == "skip" {
		t.Skip("SHARDQ_TEST_MYSQL=skip: MySQL tests skipped (never in CI)")
	}
	admin, err := sql.Open("mysql", MySQLServerDSN())
	if err != nil {
		t.Fatalf("mysql: %v", err)
	}
	defer admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := admin.PingContext(ctx); err != nil {
		t.Fatalf("mysql test server %s unreachable: %v (run scripts/test, or scripts/mariadb up, which start the tests' own MariaDB; "+
			"outside CI, SHARDQ_TEST_MYSQL=skip skips these tests)", MySQLServerDSN(), err)
	}
	b := make([]byte, 6)
	rand.Read(b)
	name := "shardq_test_" + hex.EncodeToString(b)
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name+" CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"); err != nil {
		t.Fatalf("create database: %v", err)
	}
	t.Cleanup(func() {
		db, err := sql.Open("mysql", MySQLServerDSN())
		if err != nil {
			t.Errorf("drop database %s: %v", name, err)
			return
		}
		defer db.Close()
		if _, err := db.Exec("DROP DATABASE IF EXISTS " + name); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	cfg, err := mysql.ParseDSN(MySQLServerDSN())
	if err != nil {
		t.Fatalf("SHARDQ_TEST_MYSQL_DSN: %v", err)
	}
	cfg.DBName = name
	return cfg.FormatDSN()
}

// MySQLConnector is a go-sql-driver connector on dsn that binds
// parameters on the server (as mysqldriver.Open sets it) or, with
// interpolate, splices them into the statement text.
func MySQLConnector(t testing.TB, dsn string, interpolate bool) sqldriver.Connector {
	t.Helper()
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.InterpolateParams = interpolate
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return conn
}

// MySQL opens a driver on a fresh database, not migrated.
func MySQL(t testing.TB) *mysqldriver.Driver {
	t.Helper()
	d, err := mysqldriver.Open(MySQLDatabase(t))
	if err != nil {
		t.Fatalf("open mysql driver: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// SQLite opens a driver on a new file in t's temp directory, not migrated.
func SQLite(t testing.TB) *sqlitedriver.Driver {
	t.Helper()
	d, err := sqlitedriver.Open(filepath.Join(t.TempDir(), "shardq.db"), nil)
	if err != nil {
		t.Fatalf("open sqlite driver: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// TwoDrivers opens two drivers (connection pools) on one fresh database
// of db, "mysql" or "sqlite", as two processes would; t closes them.
func TwoDrivers(t testing.TB, db string) (driver.Driver, driver.Driver) {
	t.Helper()
	open := func(o func() (driver.Driver, error)) driver.Driver {
		d, err := o()
		if err != nil {
			t.Fatalf("open %s driver: %v", db, err)
		}
		t.Cleanup(func() { d.Close() })
		return d
	}
	switch db {
	case "mysql":
		dsn := MySQLDatabase(t)
		o := func() (driver.Driver, error) { return mysqldriver.Open(dsn) }
		return open(o), open(o)
	case "sqlite":
		path := filepath.Join(t.TempDir(), "shardq.db")
		o := func() (driver.Driver, error) { return sqlitedriver.Open(path, nil) }
		return open(o), open(o)
	}
	t.Fatalf("no database %q", db)
	return nil, nil
}

// Migrated migrates d or fails t.
func Migrated[D driver.Driver](t testing.TB, d D) D {
	t.Helper()
	if _, err := d.Migrate(context.Background()); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return d
}

// MySQLURL turns a go-sql-driver DSN into the mysql:// URL the CLI takes.
func MySQLURL(t testing.TB, dsn string) string {
	t.Helper()
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u := url.URL{Scheme: "mysql", Host: cfg.Addr, Path: "/" + cfg.DBName, User: url.User(cfg.User)}
	if cfg.Passwd != "" {
		u.User = url.UserPassword(cfg.User, cfg.Passwd)
	}
	return u.String()
}

// VitessDSN is the go-sql-driver DSN of the test vtgate's keyspace
// (SHARDQ_TEST_VITESS_DSN; default the one scripts/vitess starts).
func VitessDSN() string {
	if v := os.Getenv("SHARDQ_TEST_VITESS_DSN"); v != "" {
		return v
	}
	return "root@tcp(127.0.0.1:15003)/shardq"
}

// VitessGRPCAddr is the test vtgate's gRPC address (SHARDQ_TEST_VITESS_GRPC;
// default the one scripts/vitess starts: vttestserver's port + 1).
func VitessGRPCAddr() string {
	if v := os.Getenv("SHARDQ_TEST_VITESS_GRPC"); v != "" {
		return v
	}
	return "127.0.0.1:15001"
}

// SkipVitess skips t outside CI when SHARDQ_TEST_VITESS=skip; every test
// that needs vtgate calls it (Vitess does).
func SkipVitess(t testing.TB) {
	t.Helper()
	if os.Getenv("CI") != "true" && os.Getenv("SHARDQ_TEST_VITESS") == "skip" {
		t.Skip("SHARDQ_TEST_VITESS=skip: Vitess tests skipped (never in CI)")
	}
}

// Vitess opens a driver on the test vtgate's keyspace (VitessDSN) with
// every table dropped: Vitess cannot create a database per test, so the
// tests that take it run one after another, holding it as VitessIn holds
// its keyspaces (VitessIn gives a test a keyspace of its own). An
// unreachable vtgate fails the test; outside CI, SHARDQ_TEST_VITESS=skip
// skips (CI never skips).
func Vitess(t testing.TB) *mysqldriver.Driver {
	t.Helper()
	SkipVitess(t)
	cfg, err := mysql.ParseDSN(VitessDSN())
	if err != nil {
		t.Fatal(err)
	}
	dsn, _ := vitessKeyspaceNamed(t, cfg.DBName)
	return vitessOn(t, dsn)
}

// vitessPool holds the test vtgate's keyspaces that VitessIn hands out:
// VitessDSN's and those named after it with "_2", "_3"... (scripts/vitess
// starts shardq and shardq_2 to shardq_4), one test each at a time. A
// keyspace is held across processes too (a lock file each, see
// lockKeyspace): the test binaries of several packages that go test runs
// side by side share the one vtgate.
var vitessPool struct {
	once sync.Once
	err  error
	held sync.Map // testing.TB -> its keyspace

	mu   sync.Mutex
	free []string // the keyspaces no test of this process holds

	tables []string // a migrated keyspace's, once one was migrated
}

// VitessIn is Vitess on a keyspace of t's own from the pool, held until t
// ends (another call of t gets the same one, cleaned again), so that
// tests of it run side by side; it returns the driver and the keyspace's
// DSN.
func VitessIn(t testing.TB) (*mysqldriver.Driver, string) {
	t.Helper()
	dsn, _ := vitessKeyspace(t)
	return vitessOn(t, dsn), dsn
}

// VitessMigrated is VitessIn with the keyspace at the latest schema
// version and no rows in it. It keeps the tables a test before it
// migrated and truncates them (which also restarts their AUTO_INCREMENT
// counters, as in a fresh table): through vtgate a test's migration
// costs seconds, its truncation a tenth of that. A keyspace at another version, or with a table more or
// less than the schema's, is dropped and migrated again. The first call
// of t cleans; another gets the same keyspace as it is.
func VitessMigrated(t testing.TB) (*mysqldriver.Driver, string) {
	t.Helper()
	dsn, first := vitessKeyspace(t)
	d, err := mysqldriver.Open(dsn)
	if err != nil {
		t.Fatalf("open vitess driver: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	if !first {
		return d, dsn
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	tables, err := showTables(ctx, d.DB())
	if err != nil {
		t.Fatalf("vtgate %s: list tables: %v", dsn, err)
	}
	cur, latest, err := d.SchemaVersion(ctx)
	if err != nil {
		t.Fatalf("vtgate %s: schema version: %v", dsn, err)
	}
	vitessPool.mu.Lock()
	want := vitessPool.tables
	vitessPool.mu.Unlock()
	if cur != latest || want == nil || !slices.Equal(tables, want) {
		vitessOn(t, dsn)
		if _, err := d.Migrate(ctx); err != nil {
			t.Fatalf("vtgate %s: migrate: %v", dsn, err)
		}
		if tables, err = showTables(ctx, d.DB()); err != nil {
			t.Fatalf("vtgate %s: list tables: %v", dsn, err)
		}
		vitessPool.mu.Lock()
		vitessPool.tables = tables
		vitessPool.mu.Unlock()
		return d, dsn
	}
	for _, name := range tables {
		if name == "shardq_schema_migrations" {
			continue
		}
		if _, err := d.DB().ExecContext(ctx, "TRUNCATE TABLE "+name); err != nil {
			t.Fatalf("vtgate %s: empty %s: %v", dsn, name, err)
		}
	}
	return d, dsn
}

// vitessKeyspace takes a keyspace from the pool for t, or the one t
// holds, and says whether t took it now.
func vitessKeyspace(t testing.TB) (dsn string, first bool) {
	t.Helper()
	return vitessKeyspaceNamed(t, "")
}

// vitessKeyspaceNamed is vitessKeyspace taking the keyspace name, or any
// when name is "".
func vitessKeyspaceNamed(t testing.TB, name string) (dsn string, first bool) {
	t.Helper()
	SkipVitess(t)
	base, err := mysql.ParseDSN(VitessDSN())
	if err != nil {
		t.Fatal(err)
	}
	vitessPool.once.Do(func() {
		vitessPool.free, vitessPool.err = vitessKeyspaces(base)
	})
	if vitessPool.err != nil {
		t.Fatalf("vtgate %s: list keyspaces: %v (scripts/test starts it with scripts/vitess up; "+
			"outside CI, SHARDQ_TEST_VITESS=skip skips these tests)", VitessDSN(), vitessPool.err)
	}
	ks, ok := vitessPool.held.Load(t)
	switch {
	case ok && name != "" && ks != name:
		t.Fatalf("vtgate %s: the test holds keyspace %s and asks for %s", VitessDSN(), ks, name)
	case !ok:
		ks = takeKeyspace(t, base.Addr, name)
		vitessPool.held.Store(t, ks)
	}
	cfg := base.Clone()
	cfg.DBName = ks.(string)
	return cfg.FormatDSN(), !ok
}

// takeKeyspace waits until a keyspace of the pool (name, or any when name
// is "") is free in this process and in every other, takes it for t and
// gives it back when t ends.
func takeKeyspace(t testing.TB, addr, name string) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Minute) // every test holds its keyspace for less
	for {
		vitessPool.mu.Lock()
		for i, ks := range vitessPool.free {
			if name != "" && ks != name {
				continue
			}
			release, err := lockKeyspace(addr, ks)
			if err != nil {
				vitessPool.mu.Unlock()
				t.Fatalf("vtgate %s: lock keyspace %s: %v", VitessDSN(), ks, err)
			}
			if release == nil {
				continue // another process holds it
			}
			vitessPool.free = slices.Delete(vitessPool.free, i, i+1)
			vitessPool.mu.Unlock()
			t.Cleanup(func() {
				vitessPool.held.Delete(t)
				release()
				vitessPool.mu.Lock()
				vitessPool.free = append(vitessPool.free, ks)
				vitessPool.mu.Unlock()
			})
			return ks
		}
		vitessPool.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatalf("vtgate %s: no keyspace of the pool came free in 10 minutes", VitessDSN())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// showTables lists the tables of db's keyspace, sorted.
func showTables(ctx context.Context, db *sql.DB) ([]string, error) {
	rows, err := db.QueryContext(ctx, "SHOW TABLES")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var tables []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return nil, err
		}
		tables = append(tables, name)
	}
	slices.Sort(tables)
	return tables, rows.Err()
}

// vitessKeyspaces lists the pool's keyspaces that vtgate serves.
func vitessKeyspaces(base *mysql.Config) ([]string, error) {
	db, err := sql.Open("mysql", base.FormatDSN())
	if err != nil {
		return nil, err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rows, err := db.QueryContext(ctx, "SHOW DATABASES")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var names []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return nil, err
		}
		if n, ok := strings.CutPrefix(name, base.DBName+"_"); name == base.DBName || ok && n != "" && strings.Trim(n, "0123456789") == "" {
			names = append(names, name)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if !slices.Contains(names, base.DBName) {
		return nil, fmt.Errorf("keyspace %q is not served", base.DBName)
	}
	return names, nil
}

// vitessOn opens a driver on the keyspace of dsn with every table dropped.
func vitessOn(t testing.TB, dsn string) *mysqldriver.Driver {
	t.Helper()
	d, err := mysqldriver.Open(dsn)
	if err != nil {
		t.Fatalf("open vitess driver: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := d.DB().PingContext(ctx); err != nil {
		t.Fatalf("vtgate %s unreachable: %v (scripts/test starts it with scripts/vitess up; "+
			"outside CI, SHARDQ_TEST_VITESS=skip skips these tests)", dsn, err)
	}
	tables, err := showTables(ctx, d.DB())
	if err != nil {
		t.Fatalf("list tables: %v", err)
	}
	for _, name := range tables {
		if _, err := d.DB().ExecContext(ctx, "DROP TABLE IF EXISTS "+name); err != nil {
			t.Fatalf("drop %s: %v", name, err)
		}
	}
	return d
}
