// SPDX-License-Identifier: Apache-2.0

// Package mysqldriver is shardq's driver for MariaDB 10.6+ and MySQL 8.0+,
// on go-sql-driver/mysql. Every statement names its tenant by equality or by
// an explicit IN list, so that Vitess can route it to one shard (or to the
// shards of that list).
//
// Offsets come from queue_messages' AUTO_INCREMENT, which is allocated in
// insert order, not commit order. To make one partition's offsets visible in
// increasing order, a publisher first locks the partition's head row in
// queue_partitions and holds it until commit: the next publisher of that
// partition inserts (and so draws its offsets) only after the previous one
// committed. See docs/publish.md.
package mysqldriver

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/migrate"
	"github.com/shardq/shardq/internal/sqlcommon"
	"github.com/shardq/shardq/internal/testhook"
)

func init() {
	testhook.TrimMigrations["mysql"] = func(d any) {
		x := d.(*Driver)
		x.migrations = x.migrations[:len(x.migrations)-1]
	}
}

//go:embed migrations/*.sql
var migrationFS embed.FS

// VSchema is the Vitess VSchema of the queue's keyspace: every queue table
// sharded by an xxhash vindex on tenant (a partition, and everything about
// it, lives on its tenant's shard), and the migrations table by version.
// Apply it with `vtctldclient ApplyVSchema --vschema-file vschema.json KEYSPACE`.
//
//go:embed vschema.json
var VSchema []byte

// Driver is a MariaDB/MySQL database holding the queue's tables.
type Driver struct {
	sqlcommon.Store // leases, bookkeeping, reads: the SQL shared with SQLite

	db         *sql.DB
	owned      bool
	txdb       *sql.DB                // Open's pool for write transactions, sessions with autocommit off; nil with New
	txPool     atomic.Pointer[sql.DB] // the pool write transactions begin on, chosen at the first
	migrations []migrate.Migration
	server     *serverLimits   // auto_increment_increment and max_allowed_packet, read with the first connection
	heads      *knownHeads     // partitions whose head row this driver locked
	feedCfg    *mysql.Config   // the connection settings the change feed uses (Open's DSN, or FeedDSN's); nil with New
	feedSchema string          // the database whose head rows the feed reads (Open's DSN's)
	feedDB     *sql.DB         // FeedDSN's pool, for the binary log position; nil: db
	feedMax    uint32          // FeedMaxEventBytes
	feed       driver.HeadFeed // HeadFeed's, run instead of the binary log; nil: the binary log
	logs       *logSink        // the driver's own log lines: go-sql-driver's (with Open) and the feed's
	idleBound  time.Duration   // Open's sessions' idle-transaction bound; 0 with New
	lockWait   time.Duration   // Open's sessions' lock-wait bound; 0 with New
}

// DefaultFeedMaxEventBytes is the largest binary log event the change
// feed reads unless FeedMaxEventBytes says otherwise.
const DefaultFeedMaxEventBytes = 16 << 20

// Option configures Open.
type Option func(*options)

type options struct {
	feedDSN string
	feedMax int64
	feed    driver.HeadFeed
}

// HeadFeed makes FeedHeads run f instead of reading the binary log: on
// Vitess, whose binary logs vtgate does not serve,
// github.com/shardq/shardq/vitessfeed streams each shard's head changes
// through vtgate's VStream (docs/vitess.md, "Change feed"). f must feed
// the head changes of Open's database.
func HeadFeed(f driver.HeadFeed) Option { return func(o *options) { o.feed = f } }

// FeedDSN makes the change feed connect with this go-sql-driver DSN
// instead of Open's: a user with only the replication privileges
// (REPLICATION SLAVE and REPLICATION CLIENT, MariaDB: BINLOG MONITOR, on
// *.*), so that the queue's own user needs neither. Its database name,
// if any, is not used: the feed reads the head rows of Open's database
// (docs/feed.md).
func FeedDSN(dsn string) Option { return func(o *options) { o.feedDSN = dsn } }

// FeedMaxEventBytes bounds the binary log events the change feed reads
// [DefaultFeedMaxEventBytes]. The server streams every database's row
// events to the feed; a larger one (another application's huge row, say)
// is passed over as it arrives, never held in memory whole, and consumers
// rescan, since it might have carried a head change.
func FeedMaxEventBytes(n int64) Option { return func(o *options) { o.feedMax = n } }

var _ driver.Logged = (*Driver)(nil)

// UseLogger sends the driver's own log lines (go-sql-driver's, the change
// feed's replication library's) to l; shardq.NewClient gives it the
// client's Config.Logger.
func (d *Driver) UseLogger(l *slog.Logger) { d.logs.p.Store(l) }

var _ driver.Driver = (*Driver)(nil)

// New uses an existing pool, after checking (two queries, bounded by
// 10 s) that its connections use utf8mb4 (ErrUnsafeCharset) and bind
// parameters on the server (a DSN with interpolateParams=true is refused
// with ErrInterpolatedParams). Open adds the settings shardq prefers (UTC,
// bounded lock waits and idle transactions); a caller's own pool should
// bound them in its DSN (docs/safety.md, "Connections"). Through vtgate
// use Open, and begin your own transactions (PublishTx) on its DB(): its
// connections send BEGIN at a transaction's first statement, which keeps
// the transaction on its tenant's shard (docs/vitess.md, "Transactions on
// one shard"); a pool of your own does not.
func New(db *sql.DB) (*Driver, error) {
	limits := &serverLimits{}
	if err := checkPool(db, limits); err != nil {
		return nil, err
	}
	return newDriver(db, limits)
}

// Migrations lists the schema changes this driver embeds, in version
// order: what Migrate runs on MariaDB and MySQL (through Vitess, a table
// that gained a column is also rebuilt with ALTER TABLE … FORCE).
func Migrations() ([]driver.Migration, error) {
	ms, err := migrate.Load(migrationFS, "migrations")
	return migrate.Public(ms), err
}

func newDriver(db *sql.DB, limits *serverLimits) (*Driver, error) {
	ms, err := migrate.Load(migrationFS, "migrations")
	if err != nil {
		return nil, err
	}
	d := &Driver{db: db, migrations: ms, server: limits, logs: &logSink{}, heads: &knownHeads{}}
	d.Store = sqlcommon.Store{Dialect: dialect, Begin: d.beginWrite, Read: db, Write: db, Insert: d.InsertMessages, Sharded: limits.sharded.Load,
		TxPool: func() *sql.DB { return d.txPool.Load() }}
	return d, nil
}

// Open opens a pool from a go-sql-driver/mysql DSN
// ("user:pass@tcp(host:3306)/db?param=value"), with parameters bound on
// the server (prepared statements; interpolateParams in the DSN is
// ignored), UTC times, and at most 32 connections (DB().SetMaxOpenConns
// changes that). The driver owns the pool. On MariaDB and MySQL its own
// write transactions (publishes, acks, leases) run on a second pool of
// at most 32 connections (WriteDB) whose sessions have autocommit off, so that a
// transaction begins with its first statement and saves a round trip
// (docs/publish.md, "No BEGIN"); through vtgate they run on DB().
//
// Every connection is checked before use: its character set must be
// utf8mb4 (a DSN naming another charset or collation is refused here, with
// ErrUnsafeCharset), and on MariaDB/MySQL its lock waits (5 s) and idle
// transactions (10 s) are bounded unless the DSN sets
// innodb_lock_wait_timeout, idle_transaction_timeout or wait_timeout
// itself. go-sql-driver's own log lines go to slog at debug level.
// Options configure the change feed (FeedDSN, FeedMaxEventBytes).
func Open(dsn string, opts ...Option) (*Driver, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("mysql dsn: %w", err)
	}
	if err := checkDSNCharset(dsn, cfg); err != nil {
		return nil, err
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	feedCfg, feedMax := cfg, uint32(DefaultFeedMaxEventBytes)
	switch {
	case o.feedMax < 0 || o.feedMax > math.MaxUint32:
		return nil, fmt.Errorf("mysql feed max event bytes %d: must be between 1 and 4 GiB - 1 (0: the default, %d)", o.feedMax, DefaultFeedMaxEventBytes)
	case o.feedMax > 0:
		feedMax = uint32(o.feedMax)
	}
	logs := &logSink{}
	if o.feedDSN != "" {
		if feedCfg, err = mysql.ParseDSN(o.feedDSN); err != nil {
			return nil, fmt.Errorf("mysql feed dsn: %w", err)
		}
		feedCfg.DBName = "" // the feed's user needs no database
		feedCfg.Logger = logs
	}
	cfg.Logger = logs
	cfg.InterpolateParams = false // values never become SQL text
	cfg.Loc = time.UTC
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	if _, ok := cfg.Params["time_zone"]; !ok {
		cfg.Params["time_zone"] = "'+00:00'"
	}
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, fmt.Errorf("mysql dsn: %w", err)
	}
	_, skipLockWait := cfg.Params["innodb_lock_wait_timeout"]
	_, skipIdle := cfg.Params["idle_transaction_timeout"]
	if _, ok := cfg.Params["wait_timeout"]; ok {
		skipIdle = true
	}
	limits := &serverLimits{}
	db := sql.OpenDB(&sessionConnector{base: conn, limits: limits, skipLockWait: skipLockWait, skipIdle: skipIdle})
	// Bounded: one connection per busy partition worker would exhaust the
	// server's max_connections and thrash a small one (measured: consuming
	// 64 partitions ran 40% faster capped at 16 than unbounded on 2 cores).
	// Tune with DB().SetMaxOpenConns.
	db.SetMaxOpenConns(32)
	db.SetMaxIdleConns(32)
	db.SetConnMaxLifetime(10 * time.Minute)
	// Below the idle bound: on MySQL, wait_timeout closes idle sessions.
	db.SetConnMaxIdleTime(idleTxTimeoutSeconds * time.Second / 2)
	d, err := newDriver(db, limits)
	if err != nil {
		db.Close()
		return nil, err
	}
	d.owned = true
	d.idleBound = paramSeconds(cfg.Params, idleTxTimeoutSeconds, "idle_transaction_timeout", "wait_timeout")
	d.lockWait = paramSeconds(cfg.Params, lockWaitTimeoutSeconds, "innodb_lock_wait_timeout")
	d.txdb = sql.OpenDB(&sessionConnector{base: conn, limits: limits, skipLockWait: skipLockWait, skipIdle: skipIdle, implicitBegin: true})
	d.txdb.SetMaxOpenConns(32)
	d.txdb.SetMaxIdleConns(32)
	d.txdb.SetConnMaxLifetime(10 * time.Minute)
	d.txdb.SetConnMaxIdleTime(idleTxTimeoutSeconds * time.Second / 2)
	d.feedCfg, d.feedSchema, d.feedMax, d.feed = feedCfg, cfg.DBName, feedMax, o.feed
	if o.feedDSN != "" {
		fconn, err := mysql.NewConnector(feedCfg)
		if err != nil {
			d.Close()
			return nil, fmt.Errorf("mysql feed dsn: %w", err)
		}
		// Read only for the binary log position, when the feed starts or
		// lost its position: no connection is kept.
		d.feedDB = sql.OpenDB(fconn)
		d.feedDB.SetMaxOpenConns(1)
		d.feedDB.SetMaxIdleConns(0)
	}
	d.logs = logs // go-sql-driver writes to it too
	return d, nil
}

func (d *Driver) Name() string { return "mysql" }
func (d *Driver) DB() *sql.DB  { return d.db }

// LockBounds reports the bounds Open's sessions run with (a DSN's own
// values, or 10 s and 5 s); nothing with New, whose pool is the caller's,
// or through vtgate, where vttablet bounds transactions itself.
func (d *Driver) LockBounds() (idleTransaction, lockWait time.Duration) {
	if d.server.sharded.Load() {
		return 0, 0
	}
	return d.idleBound, d.lockWait
}

// DatabaseTime reads the server's clock, in microseconds since the Unix
// epoch, from UTC_TIMESTAMP: the session's time zone (and its daylight
// saving hour) does not enter. Through vtgate it is vtgate's clock or a
// shard's; with hosts kept by NTP they agree to milliseconds.
func (d *Driver) DatabaseTime(ctx context.Context) (time.Time, error) {
	var us int64
	if err := d.db.QueryRowContext(ctx, "SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))").Scan(&us); err != nil {
		return time.Time{}, fmt.Errorf("mysql: read the server's clock: %w", err)
	}
	return time.UnixMicro(us).UTC(), nil
}

func (d *Driver) Close() error {
	var err error
	if d.feedDB != nil {
		err = d.feedDB.Close()
	}
	if d.txdb != nil {
		err = errors.Join(d.txdb.Close(), err)
	}
	if d.owned {
		err = errors.Join(d.db.Close(), err)
	}
	return err
}

// beginWrite starts a transaction at the server's default isolation.
// Publishers lock head rows in key order, so the gap locks of REPEATABLE
// READ cannot close a cycle; asking for another level would cost a round
// trip per transaction.
//
// The server's auto_increment step, needed for offsets, is already known
// here: every connection's session check reads it before the pool hands
// the connection out (New reads it from the caller's pool), never inside
// a transaction, where through vtgate such a read can hang while holding
// head-row locks.
func (d *Driver) beginWrite(ctx context.Context) (*sql.Tx, error) {
	pool, err := d.writePool(ctx)
	if err != nil {
		return nil, wrap("begin", err)
	}
	d.BeforeWrite(ctx)
	tx, err := pool.BeginTx(ctx, nil)
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

// WriteDB is the pool BeginWrite's transactions run on: DB(), or with
// Open on MariaDB and MySQL a pool of its own whose sessions have
// autocommit off. A statement prepared on it can be bound to those
// transactions (Tx.StmtContext); it runs nothing outside a transaction.
func (d *Driver) WriteDB(ctx context.Context) (*sql.DB, error) { return d.writePool(ctx) }

// writePool chooses, once, the pool write transactions begin on: Open's
// write-transaction pool, unless the server is vtgate, where DB()'s
// connections already begin at the first execution and a second pool
// would only hold more of vttablet's connections. The choice needs a
// connection of DB()'s, which says what the server is; it is made before
// the first transaction and never changes, since that transaction's
// prepared statements belong to the pool it chose.
func (d *Driver) writePool(ctx context.Context) (*sql.DB, error) {
	if p := d.txPool.Load(); p != nil {
		return p, nil
	}
	pool := d.db
	if d.txdb != nil {
		if !d.server.known.Load() {
			if err := d.db.PingContext(ctx); err != nil {
				return nil, err
			}
		}
		if !d.server.sharded.Load() {
			pool = d.txdb
		}
	}
	d.txPool.CompareAndSwap(nil, pool)
	return d.txPool.Load(), nil
}

// MySQL server error numbers this driver acts on.
const (
	errDuplicateKey     = 1062
	errDuplicateKeyName = 1061
	errDuplicateColumn  = 1060 // ER_DUP_FIELDNAME
	errBadField         = 1054 // ER_BAD_FIELD_ERROR
	errCantDropKey      = 1091 // ER_CANT_DROP_FIELD_OR_KEY
	errNoSuchTable      = 1146
	errDeadlock         = 1213
)

func isDuplicateKey(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == errDuplicateKey
}

// Retryable reports a deadlock: InnoDB rolled the transaction back and
// running it again is the documented remedy.
func (d *Driver) Retryable(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == errDeadlock
}

// wrap names the operation and turns a missing table or column (a schema
// behind the code) into ErrNotMigrated.
func wrap(op string, err error) error {
	var me *mysql.MySQLError
	if errors.As(err, &me) && (me.Number == errNoSuchTable || me.Number == errBadField) {
		return fmt.Errorf("%s: %w (%s)", op, driver.ErrNotMigrated, me.Message)
	}
	return fmt.Errorf("%s: %w", op, err)
}

var dialect = sqlcommon.Dialect{
	Syntax: sqlcommon.MySQL,
	// Each text is prepared on every connection that runs it, so a pool
	// holds up to 32 × 128 server-side statements: within the server's
	// max_prepared_stmt_count (16382 by default) for four processes
	// even if every connection ran every text. Past the bound a statement
	// is prepared, run and closed (one more round trip).
	PreparedStatements: 128,
	// Lists of any length are prepared: a batch's text recurs (a
	// publisher's batch size, a full claim), and unprepared it costs a
	// round trip more.
	PreparedListMax: 0,
	Wrap:            wrap,
	EncodeTime:      func(t time.Time) any { return t.UTC().Format("2006-01-02 15:04:05.000000") },
	DecodeTime:      decodeTime,
}

// decodeTime reads a DATETIME whichever way the pool's DSN returns it
// (parseTime=true gives time.Time, otherwise text).
func decodeTime(v any) (time.Time, error) {
	var s string
	switch v := v.(type) {
	case time.Time:
		return v.UTC(), nil
	case []byte:
		s = string(v)
	case string:
		s = v
	default:
		return time.Time{}, fmt.Errorf("created_at: unsupported %T", v)
	}
	t, err := time.ParseInLocation("2006-01-02 15:04:05.999999", s, time.UTC)
	if err != nil {
		return time.Time{}, fmt.Errorf("created_at: %w", err)
	}
	return t, nil
}
