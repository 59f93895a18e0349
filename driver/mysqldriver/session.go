// SPDX-License-Identifier: Apache-2.0

package mysqldriver

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"
)

// Session bounds applied to every connection Open makes (unless the DSN
// sets the variable itself). A transaction left idle (a frozen or stopped
// process holding row locks) is killed by the server, and a statement
// waiting for a row lock gives up, so that a lease held by a frozen member
// passes to its heir once it expires. See docs/leases.md, "Bounded waits".
const (
	lockWaitTimeoutSeconds = 5  // innodb_lock_wait_timeout
	idleTxTimeoutSeconds   = 10 // MariaDB idle_transaction_timeout; MySQL wait_timeout
)

// paramSeconds is the shortest bound params sets among names, in whole
// seconds (quoted or not), or def when it names none of them. A value of 0
// sets no bound; when every one named is 0 the result is -1 (unbounded).
// A value that is not a whole number of seconds counts as unknown (0).
func paramSeconds(params map[string]string, def int, names ...string) time.Duration {
	var named bool
	var shortest time.Duration
	for _, n := range names {
		v, ok := params[n]
		if !ok {
			continue
		}
		named = true
		sec, err := strconv.ParseInt(strings.Trim(strings.TrimSpace(v), `'"`), 10, 64)
		if err != nil || sec < 0 {
			return 0
		}
		if d := time.Duration(min(sec, 1<<31)) * time.Second; sec > 0 && (shortest == 0 || d < shortest) {
			shortest = d
		}
	}
	switch {
	case !named:
		return time.Duration(def) * time.Second
	case shortest == 0:
		return -1
	}
	return shortest
}

// ErrUnsafeCharset is returned when a connection's character set is not
// utf8mb4. Keys, ids and headers are utf8mb4 text; another character set
// would garble them, and with a multibyte one such as gbk, big5, sjis or
// cp932 (whose second byte can be a backslash) any client-side escaping
// would stop keeping a value a value.
var ErrUnsafeCharset = errors.New("connection character set must be utf8mb4")

// checkDSNCharset refuses a DSN whose charset or collation parameter names
// anything but utf8mb4, before any connection is made.
func checkDSNCharset(dsn string, cfg *mysql.Config) error {
	// go-sql-driver keeps charset out of Params: read it from the DSN.
	var params url.Values
	if i := strings.LastIndex(dsn, "/"); i >= 0 {
		if _, query, ok := strings.Cut(dsn[i:], "?"); ok {
			params, _ = url.ParseQuery(query) // ParseDSN accepted it already
		}
	}
	if cs, ok := params["charset"]; ok {
		cs := strings.Join(cs, ",")
		for _, c := range strings.Split(cs, ",") {
			if !strings.EqualFold(strings.TrimSpace(c), "utf8mb4") {
				return fmt.Errorf("mysql dsn: charset=%s: %w (remove the parameter or set charset=utf8mb4)", cs, ErrUnsafeCharset)
			}
		}
	}
	if cfg.Collation != "" && !strings.HasPrefix(strings.ToLower(cfg.Collation), "utf8mb4_") {
		return fmt.Errorf("mysql dsn: collation=%s: %w (use a utf8mb4_ collation)", cfg.Collation, ErrUnsafeCharset)
	}
	for k := range cfg.Params {
		switch strings.ToLower(k) {
		case "character_set_client", "character_set_connection", "character_set_results", "names":
			return fmt.Errorf("mysql dsn: %s: %w (shardq sets the character set itself; remove the parameter)", k, ErrUnsafeCharset)
		}
	}
	return nil
}

// sessionConnector checks every new connection before the pool hands it
// out: its character set must be utf8mb4 (a later SET in the DSN, a server
// default or init_connect could have changed it), and on MariaDB and MySQL
// it gets the session bounds above. Through vtgate (Vitess) the bounds are
// vttablet's (its transaction and query timeouts), so none are set.
type sessionConnector struct {
	base   sqldriver.Connector
	limits *serverLimits // filled from the first connection
	// The DSN sets these bounds itself.
	skipLockWait, skipIdle bool
	// implicitBegin turns the session's autocommit off, for the pool of
	// the driver's own write transactions (txConn).
	implicitBegin bool
}

func (c *sessionConnector) Driver() sqldriver.Driver { return c.base.Driver() }

func (c *sessionConnector) Connect(ctx context.Context) (sqldriver.Conn, error) {
	conn, err := c.base.Connect(ctx)
	if err != nil {
		return nil, err
	}
	vtgate, err := c.prepare(ctx, conn)
	if err == nil && (vtgate || c.implicitBegin) {
		var tc *txConn
		if tc, err = newTxConn(conn, !vtgate); err == nil {
			return tc, nil
		}
	}
	if err != nil {
		conn.Close()
		return nil, err
	}
	return conn, nil
}

// prepare checks and bounds a new connection and reports whether it is
// one through vtgate.
func (c *sessionConnector) prepare(ctx context.Context, conn sqldriver.Conn) (vtgate bool, err error) {
	q, ok := conn.(sqldriver.QueryerContext)
	e, ok2 := conn.(sqldriver.ExecerContext)
	if !ok || !ok2 {
		return false, fmt.Errorf("mysql: connection %T cannot run statements", conn)
	}
	vals, err := queryRow(ctx, q, "SELECT @@version, @@character_set_client, @@character_set_connection, @@character_set_results, "+
		"@@auto_increment_increment, @@max_allowed_packet")
	if err != nil {
		return false, fmt.Errorf("mysql: read session settings: %w", err)
	}
	if err := checkSessionCharset(vals[1], vals[2], vals[3]); err != nil {
		return false, err
	}
	if c.limits.step.Load() == 0 {
		step, err1 := strconv.ParseInt(vals[4], 10, 64)
		packet, err2 := strconv.ParseInt(vals[5], 10, 64)
		if err := errors.Join(err1, err2); err != nil {
			return false, fmt.Errorf("mysql: read session settings: %w", err)
		}
		if err := c.limits.store(step, packet); err != nil {
			return false, err
		}
	}
	var set []string
	version := strings.ToLower(vals[0])
	if strings.Contains(version, "vitess") {
		c.limits.noteServer(version, "")
		return true, nil
	}
	format, err := queryRow(ctx, q, "SELECT @@binlog_format")
	if err != nil {
		return false, fmt.Errorf("mysql: read session settings: %w", err)
	}
	c.limits.noteServer(version, format[0])
	switch {
	case strings.Contains(version, "mariadb"):
		if !c.skipIdle {
			set = append(set, fmt.Sprintf("idle_transaction_timeout = %d", idleTxTimeoutSeconds))
		}
	default: // MySQL has no idle-transaction timeout; an idle session is closed instead
		if !c.skipIdle {
			set = append(set, fmt.Sprintf("wait_timeout = %d", idleTxTimeoutSeconds))
		}
	}
	if !c.skipLockWait {
		set = append(set, fmt.Sprintf("innodb_lock_wait_timeout = %d", lockWaitTimeoutSeconds))
	}
	if c.implicitBegin { // last: the reads above opened no transaction
		set = append(set, "autocommit = 0")
	}
	if len(set) == 0 {
		return false, nil
	}
	if _, err := e.ExecContext(ctx, "SET SESSION "+strings.Join(set, ", "), nil); err != nil {
		return false, fmt.Errorf("mysql: set session bounds: %w", err)
	}
	return false, nil
}

// checkSessionCharset accepts a session whose client, connection and
// results character sets are all utf8mb4.
func checkSessionCharset(client, connection, results string) error {
	for _, v := range [][2]string{{"character_set_client", client}, {"character_set_connection", connection}, {"character_set_results", results}} {
		if !strings.EqualFold(v[1], "utf8mb4") {
			return fmt.Errorf("mysql: session %s is %s: %w", v[0], v[1], ErrUnsafeCharset)
		}
	}
	return nil
}

// queryRow reads the one row of query as text.
func queryRow(ctx context.Context, q sqldriver.QueryerContext, query string) ([]string, error) {
	rows, err := q.QueryContext(ctx, query, nil)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	dest := make([]sqldriver.Value, len(rows.Columns()))
	if err := rows.Next(dest); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("no row")
		}
		return nil, err
	}
	out := make([]string, len(dest))
	for i, v := range dest {
		switch v := v.(type) {
		case []byte:
			out[i] = string(v)
		case string:
			out[i] = v
		case nil:
		default:
			out[i] = fmt.Sprint(v)
		}
	}
	return out, nil
}

// ErrInterpolatedParams is returned by New for a pool that splices
// parameters into the statement text on the client (go-sql-driver's
// interpolateParams=true): shardq sends values only as bound parameters
// of server-side prepared statements.
var ErrInterpolatedParams = errors.New("pool interpolates parameters into SQL text (interpolateParams=true); shardq needs them bound on the server")

// interpolationProbe is the value checkPool selects as a parameter. A
// column takes its name from the expression's text: a bound parameter is
// named "?", an interpolated literal by its value.
const interpolationProbe = "shardq-parameter-probe"

// checkPool checks a caller's pool (New) once: its connections' character
// set must be utf8mb4, like those Open makes, and its parameters must be
// bound on the server. The server's limits come with it.
func checkPool(db *sql.DB, limits *serverLimits) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var version, client, connection, results string
	var step, packet int64
	if err := db.QueryRowContext(ctx, "SELECT @@version, @@character_set_client, @@character_set_connection, @@character_set_results, "+
		"@@auto_increment_increment, @@max_allowed_packet").Scan(&version, &client, &connection, &results, &step, &packet); err != nil {
		return fmt.Errorf("mysql: read session settings: %w", err)
	}
	format := ""
	if !strings.Contains(strings.ToLower(version), "vitess") {
		if err := db.QueryRowContext(ctx, "SELECT @@binlog_format").Scan(&format); err != nil {
			return fmt.Errorf("mysql: read session settings: %w", err)
		}
	}
	limits.noteServer(strings.ToLower(version), format)
	if err := checkSessionCharset(client, connection, results); err != nil {
		return err
	}
	rows, err := db.QueryContext(ctx, "SELECT ?", interpolationProbe)
	if err != nil {
		return fmt.Errorf("mysql: probe parameter binding: %w", err)
	}
	cols, err := rows.Columns()
	if err = errors.Join(err, rows.Close()); err != nil {
		return fmt.Errorf("mysql: probe parameter binding: %w", err)
	}
	if len(cols) == 1 && cols[0] == interpolationProbe {
		return fmt.Errorf("mysql: %w", ErrInterpolatedParams)
	}
	return limits.store(step, packet)
}

// serverLimits are the server settings publishing needs, read once:
// auto_increment_increment spaces the offsets one multi-row INSERT
// receives, max_allowed_packet bounds a statement, and insertSelect tells
// whether a lone publish may lock its head row in an INSERT ... SELECT
// (publish.go).
type serverLimits struct {
	step, packet atomic.Int64
	insertSelect atomic.Bool
	sharded      atomic.Bool // vtgate: tenants on shards of their own
	known        atomic.Bool // noteServer has run
}

// noteServer records, from a connection's @@version (lower case) and
// @@binlog_format, whether an INSERT ... SELECT is one statement on the
// server (through vtgate, whose version names Vitess, it is not) and is
// safe for the binary log: under STATEMENT format a replica would draw its
// own AUTO_INCREMENT values for it.
func (l *serverLimits) noteServer(version, binlogFormat string) {
	l.insertSelect.Store(!strings.Contains(version, "vitess") && !strings.EqualFold(binlogFormat, "STATEMENT"))
	l.sharded.Store(strings.Contains(version, "vitess"))
	l.known.Store(true)
}

func (l *serverLimits) store(step, packet int64) error {
	if step < 1 {
		return fmt.Errorf("mysql: auto_increment_increment is %d", step)
	}
	l.packet.Store(packet)
	l.step.Store(step)
	return nil
}

// logSink is where the driver's own log lines go: the client's logger
// once it gives one (UseLogger), slog.Default() until then.
type logSink struct{ p atomic.Pointer[slog.Logger] }

func (s *logSink) logger() *slog.Logger {
	if l := s.p.Load(); l != nil {
		return l
	}
	return slog.Default()
}

// Print is go-sql-driver's logger: its own messages (a broken connection
// it retries, say) go at debug level, since the error that matters
// reaches the caller through database/sql, once.
func (s *logSink) Print(v ...any) {
	s.logger().Debug("shardq: mysql driver: "+strings.TrimSpace(fmt.Sprint(v...)), "driver", "mysql")
}

// quieter is the replication library's handler: its lines (each
// connection and position) one level lower, Info becoming Debug, since
// the feed itself says once what matters; and never its configuration,
// which holds the password.
type quieter struct{ slog.Handler }

func quieterLevel(l slog.Level) slog.Level {
	if l < slog.LevelError {
		return l - 4
	}
	return l
}

func (q quieter) Enabled(ctx context.Context, l slog.Level) bool {
	return q.Handler.Enabled(ctx, quieterLevel(l))
}

func (q quieter) Handle(ctx context.Context, r slog.Record) error {
	out := slog.NewRecord(r.Time, quieterLevel(r.Level), r.Message, r.PC)
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "config" {
			a = slog.String("config", "(not logged: it holds the password)")
		}
		out.AddAttrs(a)
		return true
	})
	return q.Handler.Handle(ctx, out)
}

func (q quieter) WithAttrs(as []slog.Attr) slog.Handler { return quieter{q.Handler.WithAttrs(as)} }
func (q quieter) WithGroup(name string) slog.Handler    { return quieter{q.Handler.WithGroup(name)} }
