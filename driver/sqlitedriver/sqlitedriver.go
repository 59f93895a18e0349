// SPDX-License-Identifier: Apache-2.0

// Package sqlitedriver is shardq's driver for an embedded SQLite file, on
// the pure-Go modernc.org/sqlite (no cgo). It is the default when there is
// no server: local development, tests, small deployments.
//
// The file runs in WAL mode, so readers never wait for the writer. Writes go
// through a pool of one connection and begin with BEGIN IMMEDIATE: goroutines
// of one process queue for it in Go, and another process on the same file
// waits in SQLite's busy handler (busy_timeout). Reads use a separate pool.
package sqlitedriver

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/migrate"
	"github.com/shardq/shardq/internal/sqlcommon"
	"github.com/shardq/shardq/internal/testhook"
)

func init() {
	testhook.TrimMigrations["sqlite"] = func(d any) {
		x := d.(*Driver)
		x.migrations = x.migrations[:len(x.migrations)-1]
	}
}

//go:embed migrations/*.sql
var migrationFS embed.FS

// Options tune Open. The zero value is the default.
type Options struct {
	// BusyTimeout is how long a writer waits for another process's write
	// lock before failing with SQLITE_BUSY. Default 10 s.
	BusyTimeout time.Duration
	// Synchronous is SQLite's synchronous pragma. Default "FULL": a
	// published message survives a power loss once Publish returned.
	// "NORMAL" is faster and still safe against a process crash.
	Synchronous string
	// ReadConns bounds the read pool. Default max(4, GOMAXPROCS).
	ReadConns int
	// FeedInterval is how often the change feed checks whether another
	// connection (of any process) committed to the file. Default 1 ms;
	// each check is one PRAGMA on the feed's own connection.
	FeedInterval time.Duration
}

// Driver is a SQLite file holding the queue's tables.
type Driver struct {
	sqlcommon.Store // leases, bookkeeping, reads: the SQL shared with MySQL

	write      *sql.DB // one connection; every transaction is BEGIN IMMEDIATE
	read       *sql.DB
	migrations []migrate.Migration
	readDSN    string        // the read pool's, for the feed's own connection
	feedEvery  time.Duration // Options.FeedInterval
}

var _ driver.Driver = (*Driver)(nil)

// Migrations lists the schema changes this driver embeds, in version
// order: what Migrate runs.
func Migrations() ([]driver.Migration, error) {
	ms, err := migrate.Load(migrationFS, "migrations")
	return migrate.Public(ms), err
}

// Open opens (creating if needed) the SQLite file at path.
func Open(path string, opts *Options) (*Driver, error) {
	if path == "" {
		return nil, errors.New("sqlite: path must not be empty")
	}
	if strings.ContainsAny(path, "?#") {
		return nil, fmt.Errorf("sqlite: path %q: '?' and '#' are not allowed", path)
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.BusyTimeout <= 0 {
		o.BusyTimeout = 10 * time.Second
	}
	if o.Synchronous == "" {
		o.Synchronous = "FULL"
	}
	if o.ReadConns <= 0 {
		o.ReadConns = max(4, runtime.GOMAXPROCS(0))
	}
	if o.FeedInterval <= 0 {
		o.FeedInterval = time.Millisecond
	}
	ms, err := migrate.Load(migrationFS, "migrations")
	if err != nil {
		return nil, err
	}
	q := url.Values{}
	q.Set("_busy_timeout", fmt.Sprint(o.BusyTimeout.Milliseconds()))
	q.Set("_journal_mode", "WAL")
	q.Set("_synchronous", o.Synchronous)
	q.Set("_txlock", "immediate")
	if err := createPrivate(path); err != nil {
		return nil, err
	}
	write, err := sql.Open("sqlite", path+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	write.SetMaxOpenConns(1)
	write.SetMaxIdleConns(1)
	write.SetConnMaxLifetime(0)
	// The write connection creates the file and switches it to WAL before
	// any reader opens it.
	if err := write.Ping(); err != nil {
		write.Close()
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	q.Del("_txlock")
	q.Del("_journal_mode") // persistent in the file; setting it needs the write lock
	q.Set("_query_only", "true")
	readDSN := path + "?" + q.Encode()
	read, err := sql.Open("sqlite", readDSN)
	if err != nil {
		write.Close()
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	read.SetMaxOpenConns(o.ReadConns)
	read.SetMaxIdleConns(o.ReadConns)
	d := &Driver{write: write, read: read, migrations: ms, readDSN: readDSN, feedEvery: o.FeedInterval}
	d.Store = sqlcommon.Store{Dialect: dialect, Begin: d.beginWrite, Read: read, Write: write, Insert: d.InsertMessages}
	return d, nil
}

// createPrivate creates the file at path, mode 0600, when there is none:
// it holds every payload, so only its owner may read it, as a database
// server keeps its files (SQLite would make it 0644 under the usual
// umask). SQLite gives the -wal and -shm files the database file's mode,
// so they follow. An existing file keeps its mode.
func createPrivate(path string) error {
	if path == ":memory:" || strings.HasPrefix(path, "file:") {
		return nil // no file, or a URI: SQLite's to open
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	switch {
	case errors.Is(err, fs.ErrExist):
		return nil
	case err != nil:
		return fmt.Errorf("sqlite: create %s: %w", path, err)
	}
	return f.Close()
}

func (d *Driver) Name() string { return "sqlite" }

// DatabaseTime is this host's clock: SQLite runs in its callers'
// processes, all on the host that has the file, and its own 'now' is
// that clock.
func (d *Driver) DatabaseTime(context.Context) (time.Time, error) { return time.Now().UTC(), nil }

// DB is the write pool (one connection, BEGIN IMMEDIATE). Begin PublishTx
// transactions on it. While such a transaction is open, other writers of
// this process wait for it, so do not call Client.Publish inside one.
func (d *Driver) DB() *sql.DB { return d.write }

func (d *Driver) Close() error {
	d.CloseStatements()
	return errors.Join(d.read.Close(), d.write.Close())
}

// beginWrite takes the file's write lock (BEGIN IMMEDIATE).
func (d *Driver) beginWrite(ctx context.Context) (*sql.Tx, error) {
	d.BeforeWrite(ctx)
	tx, err := d.write.BeginTx(ctx, nil)
	if err != nil {
		return nil, wrap("begin", err)
	}
	return tx, nil
}

// BeginWrite is beginWrite for the driver's callers.
func (d *Driver) BeginWrite(ctx context.Context) (driver.Tx, error) {
	tx, err := d.beginWrite(ctx)
	if err != nil {
		return nil, err
	}
	return tx, nil
}

// Retryable reports SQLITE_BUSY (another process held the write lock past
// busy_timeout) and SQLITE_LOCKED.
func (d *Driver) Retryable(err error) bool {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return false
	}
	code := se.Code() & 0xff // primary result code
	return code == sqlite3.SQLITE_BUSY || code == sqlite3.SQLITE_LOCKED
}

// wrap names the operation and turns a missing table or column (a schema
// behind the code) into ErrNotMigrated.
func wrap(op string, err error) error {
	var se *sqlite.Error
	if errors.As(err, &se) && (strings.Contains(se.Error(), "no such table") || strings.Contains(se.Error(), "no such column")) {
		return fmt.Errorf("%s: %w (%s)", op, driver.ErrNotMigrated, se.Error())
	}
	return fmt.Errorf("%s: %w", op, err)
}

func nowMicros() int64 { return time.Now().UnixMicro() }

// Times are INTEGER microseconds since the Unix epoch, UTC.
var dialect = sqlcommon.Dialect{
	Syntax:             sqlcommon.SQLite,
	PreparedStatements: 1024, // parsing is a fifth of a short statement's cost
	// A longer list's parse is shared by its many values, and its texts
	// (one per length: batches of claims, acks, messages) would be
	// prepared one by one on the one write connection, ahead of the
	// transactions waiting for it.
	PreparedListMax: 8,
	Wrap:            wrap,
	EncodeTime:      func(t time.Time) any { return t.UnixMicro() },
	DecodeTime: func(v any) (time.Time, error) {
		us, ok := v.(int64)
		if !ok {
			return time.Time{}, fmt.Errorf("created_at: unsupported %T", v)
		}
		return time.UnixMicro(us).UTC(), nil
	},
}

// Backup writes a consistent copy of the database to the new file dst
// (SQLite's VACUUM INTO, one read transaction: writers go on meanwhile,
// and the copy holds what was committed when it began). The copy is
// written to a private temporary file beside dst (mode 0600, as the
// database: it holds every payload), synced, and linked to dst only
// once whole, so dst never names a partial copy; dst must not exist.
// Restore by stopping every process of the database and putting the copy
// in its place (without the old file's -wal and -shm).
func (d *Driver) Backup(ctx context.Context, dst string) (err error) {
	if strings.HasPrefix(dst, "file:") || strings.ContainsAny(dst, "?#") {
		return fmt.Errorf("sqlite: backup to %q: a plain file path, not a URI", dst)
	}
	if _, err := os.Lstat(dst); err == nil {
		return fmt.Errorf("sqlite: backup to %s: %w", dst, fs.ErrExist)
	}
	tmp, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".*.part")
	if err != nil {
		return fmt.Errorf("sqlite: backup: %w", err)
	}
	defer func() {
		tmp.Close()
		os.Remove(tmp.Name()) // after the link, only the temporary name goes
	}()
	// A connection of its own: the readers are query-only (VACUUM INTO
	// writes), and the one writer must stay free for publishers.
	path, query, _ := strings.Cut(d.readDSN, "?")
	q, err := url.ParseQuery(query)
	if err != nil {
		return fmt.Errorf("sqlite: backup: %w", err)
	}
	q.Del("_query_only")
	db, err := sql.Open("sqlite", path+"?"+q.Encode())
	if err != nil {
		return fmt.Errorf("sqlite: backup: %w", err)
	}
	defer db.Close()
	// The file name is bound, as every value is: VACUUM INTO takes an
	// expression (and an empty file, as CreateTemp made it).
	if _, err := db.ExecContext(ctx, "VACUUM INTO ?", tmp.Name()); err != nil {
		return wrap("backup to "+dst, err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("sqlite: backup: %w", err)
	}
	if err := os.Link(tmp.Name(), dst); err != nil { // fails, rather than overwrite, if dst appeared meanwhile
		return fmt.Errorf("sqlite: backup: %w", err)
	}
	if dir, err := os.Open(filepath.Dir(dst)); err == nil {
		err = dir.Sync()
		dir.Close()
		if err != nil {
			return fmt.Errorf("sqlite: backup: sync %s: %w", filepath.Dir(dst), err)
		}
	}
	return nil
}
