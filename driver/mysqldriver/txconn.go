// SPDX-License-Identifier: Apache-2.0

package mysqldriver

import (
	"context"
	sqldriver "database/sql/driver"
	"errors"
	"fmt"
	"strings"
)

// txConn is a connection whose transactions reach the server at their
// first execution, not at BeginTx. It serves two pools.
//
// Through vtgate, it sends START TRANSACTION just before the first
// execution. vtgate answers the prepare of a SELECT by running its field
// query on a shard: in a transaction that has touched no shard yet, on
// any shard, inside the transaction. A shardq transaction most often
// starts with a prepared SELECT … FOR UPDATE routed to its tenant's
// shard, so with the BEGIN sent first it would hold transactions on two
// shards: refused under vtgate's transaction_mode=SINGLE, and under MULTI
// each member holding one tablet's transaction-pool slot while it waits
// for the other's, which stalls every member once the pools (20 per
// tablet by default, 4 in vttestserver) are full. Sent just before the
// first execution, the BEGIN follows the first prepare, which vtgate then
// runs outside any transaction, and every later prepare finds the
// tenant's shard in the transaction.
//
// On MariaDB and MySQL, the driver's own write transactions run on a
// pool whose sessions have autocommit off (implicit): the server begins
// a transaction at the first statement, so a transaction costs no round
// trip for its BEGIN, only its COMMIT (a lone publish: three round trips,
// not four). Such a connection runs nothing outside a transaction, where
// a statement would open one that nothing commits.
//
// Nothing else changes: START TRANSACTION takes no snapshot (the first
// read does), and a transaction that executed nothing has nothing to
// commit. database/sql uses a connection from one goroutine at a time,
// so the state needs no lock.
type txConn struct {
	conn     sqldriver.Conn // go-sql-driver's
	implicit bool           // the session's autocommit is off

	pending  bool // BeginTx called, the transaction not yet begun
	opts     sqldriver.TxOptions
	tx       sqldriver.Tx // the server's transaction once begun
	beginErr error        // its START TRANSACTION failed: nothing more may run
	broken   bool         // a transaction's end failed with autocommit off: discard
}

var (
	_ sqldriver.Conn               = (*txConn)(nil)
	_ sqldriver.ConnBeginTx        = (*txConn)(nil)
	_ sqldriver.ConnPrepareContext = (*txConn)(nil)
	_ sqldriver.ExecerContext      = (*txConn)(nil)
	_ sqldriver.QueryerContext     = (*txConn)(nil)
	_ sqldriver.Pinger             = (*txConn)(nil)
	_ sqldriver.SessionResetter    = (*txConn)(nil)
	_ sqldriver.Validator          = (*txConn)(nil)
	_ sqldriver.NamedValueChecker  = (*txConn)(nil)
)

// newTxConn wraps one of go-sql-driver's connections, which implement
// every interface the wrapper forwards to; implicit says its session's
// autocommit is off.
func newTxConn(conn sqldriver.Conn, implicit bool) (*txConn, error) {
	switch conn.(type) {
	case interface {
		sqldriver.ConnBeginTx
		sqldriver.ConnPrepareContext
		sqldriver.ExecerContext
		sqldriver.QueryerContext
		sqldriver.Pinger
		sqldriver.SessionResetter
		sqldriver.Validator
		sqldriver.NamedValueChecker
	}:
		return &txConn{conn: conn, implicit: implicit}, nil
	}
	return nil, fmt.Errorf("mysql: connection %T lacks an interface of go-sql-driver's", conn)
}

// begin begins the pending transaction, before a statement runs.
func (c *txConn) begin(ctx context.Context) error {
	if c.beginErr != nil {
		return c.beginErr
	}
	if !c.pending {
		if c.implicit && c.tx == nil {
			return errOutsideTx
		}
		return nil
	}
	c.pending = false
	if c.implicit && c.opts == (sqldriver.TxOptions{}) {
		c.tx = implicitTx{c} // the statement about to run begins it
		return nil
	}
	tx, err := c.conn.(sqldriver.ConnBeginTx).BeginTx(ctx, c.opts)
	if err != nil {
		// Never run the transaction's statements on their own.
		c.beginErr = fmt.Errorf("begin: %w", err)
		return c.beginErr
	}
	c.tx = tx
	return nil
}

// errOutsideTx is returned for a statement outside a transaction on a
// session whose autocommit is off: it would open one that nothing commits.
var errOutsideTx = errors.New("mysql: the write-transaction pool runs statements only inside transactions")

// end forgets the transaction, whatever became of it.
func (c *txConn) end() (tx sqldriver.Tx, beginErr error) {
	tx, beginErr = c.tx, c.beginErr
	c.pending, c.tx, c.beginErr = false, nil, nil
	return tx, beginErr
}

func (c *txConn) BeginTx(ctx context.Context, opts sqldriver.TxOptions) (sqldriver.Tx, error) {
	if c.pending || c.tx != nil || c.beginErr != nil {
		return nil, errors.New("mysql: a transaction is already open on this connection")
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c.pending, c.opts = true, opts
	return lazyTx{c}, nil
}

func (c *txConn) Begin() (sqldriver.Tx, error) {
	return c.BeginTx(context.Background(), sqldriver.TxOptions{})
}

func (c *txConn) PrepareContext(ctx context.Context, query string) (sqldriver.Stmt, error) {
	s, err := c.conn.(sqldriver.ConnPrepareContext).PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	return txStmt{s, c}, nil
}

func (c *txConn) Prepare(query string) (sqldriver.Stmt, error) {
	return c.PrepareContext(context.Background(), query)
}

// ExecContext and QueryContext run a statement without parameters; one
// with parameters is skipped back to database/sql, which prepares it (the
// pool never interpolates), so the BEGIN waits for its execution.
func (c *txConn) ExecContext(ctx context.Context, query string, args []sqldriver.NamedValue) (sqldriver.Result, error) {
	if len(args) > 0 {
		return nil, sqldriver.ErrSkip
	}
	if err := c.begin(ctx); err != nil {
		return nil, err
	}
	return c.conn.(sqldriver.ExecerContext).ExecContext(ctx, query, args)
}

func (c *txConn) QueryContext(ctx context.Context, query string, args []sqldriver.NamedValue) (sqldriver.Rows, error) {
	if len(args) > 0 {
		return nil, sqldriver.ErrSkip
	}
	if err := c.begin(ctx); err != nil {
		return nil, err
	}
	return c.conn.(sqldriver.QueryerContext).QueryContext(ctx, query, args)
}

func (c *txConn) Close() error { return c.conn.Close() }

func (c *txConn) Ping(ctx context.Context) error {
	return c.conn.(sqldriver.Pinger).Ping(ctx)
}

func (c *txConn) ResetSession(ctx context.Context) error {
	if c.broken {
		return sqldriver.ErrBadConn
	}
	if tx, _ := c.end(); tx != nil { // database/sql ends transactions first; be sure
		if err := tx.Rollback(); err != nil {
			return sqldriver.ErrBadConn
		}
	}
	return c.conn.(sqldriver.SessionResetter).ResetSession(ctx)
}

func (c *txConn) IsValid() bool { return !c.broken && c.conn.(sqldriver.Validator).IsValid() }

func (c *txConn) CheckNamedValue(nv *sqldriver.NamedValue) error {
	return c.conn.(sqldriver.NamedValueChecker).CheckNamedValue(nv)
}

// lazyTx ends a transaction: one that executed nothing never reached
// the server.
type lazyTx struct{ c *txConn }

func (t lazyTx) Commit() error {
	tx, beginErr := t.c.end()
	if beginErr != nil {
		return beginErr
	}
	if tx == nil {
		return nil
	}
	return t.c.ended(tx.Commit())
}

// ended marks the connection broken when a transaction begun explicitly
// on a session with autocommit off failed to end: the session may hold
// it still, and the next transaction there would begin inside it.
func (c *txConn) ended(err error) error {
	if err != nil && c.implicit {
		c.broken = true
	}
	return err
}

func (t lazyTx) Rollback() error {
	tx, _ := t.c.end()
	if tx == nil {
		return nil
	}
	return t.c.ended(tx.Rollback())
}

// txStmt sends its connection's pending BEGIN before it executes.
type txStmt struct {
	s sqldriver.Stmt
	c *txConn
}

var (
	_ sqldriver.StmtExecContext   = txStmt{}
	_ sqldriver.StmtQueryContext  = txStmt{}
	_ sqldriver.NamedValueChecker = txStmt{}
)

func (s txStmt) Close() error  { return s.s.Close() }
func (s txStmt) NumInput() int { return s.s.NumInput() }

func (s txStmt) ExecContext(ctx context.Context, args []sqldriver.NamedValue) (sqldriver.Result, error) {
	if err := s.c.begin(ctx); err != nil {
		return nil, err
	}
	return s.s.(sqldriver.StmtExecContext).ExecContext(ctx, args)
}

func (s txStmt) QueryContext(ctx context.Context, args []sqldriver.NamedValue) (sqldriver.Rows, error) {
	if err := s.c.begin(ctx); err != nil {
		return nil, err
	}
	return s.s.(sqldriver.StmtQueryContext).QueryContext(ctx, args)
}

// Exec and Query are the pre-context forms database/sql no longer calls
// when the context forms exist; they are here to satisfy driver.Stmt.
func (s txStmt) Exec(args []sqldriver.Value) (sqldriver.Result, error) {
	return s.ExecContext(context.Background(), named(args))
}

func (s txStmt) Query(args []sqldriver.Value) (sqldriver.Rows, error) {
	return s.QueryContext(context.Background(), named(args))
}

func (s txStmt) CheckNamedValue(nv *sqldriver.NamedValue) error {
	if c, ok := s.s.(sqldriver.NamedValueChecker); ok {
		return c.CheckNamedValue(nv)
	}
	return s.c.CheckNamedValue(nv)
}

func named(args []sqldriver.Value) []sqldriver.NamedValue {
	out := make([]sqldriver.NamedValue, len(args))
	for i, v := range args {
		out[i] = sqldriver.NamedValue{Ordinal: i + 1, Value: v}
	}
	return out
}

// implicitTx is a transaction the server began at its first statement
// (autocommit off). Its end is a COMMIT or ROLLBACK statement; if that
// fails, lazyTx marks the connection broken (ended).
type implicitTx struct{ c *txConn }

func (t implicitTx) Commit() error   { return t.end("COMMIT") }
func (t implicitTx) Rollback() error { return t.end("ROLLBACK") }

// end runs stmt as go-sql-driver's own Commit and Rollback do: bounded by
// the connection's timeouts, not by a context the transaction's may have
// outlived.
func (t implicitTx) end(stmt string) error {
	if _, err := t.c.conn.(sqldriver.ExecerContext).ExecContext(context.Background(), stmt, nil); err != nil {
		return fmt.Errorf("%s: %w", strings.ToLower(stmt), err)
	}
	return nil
}
