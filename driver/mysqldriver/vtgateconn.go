// SPDX-License-Identifier: Apache-2.0

package mysqldriver

import (
	"context"
	sqldriver "database/sql/driver"
	"errors"
	"fmt"
)

// vtgateConn is a connection through vtgate whose transactions begin on
// the server at their first execution, not at BeginTx.
//
// vtgate answers the prepare of a SELECT by running its field query on a
// shard: in a transaction that has touched no shard yet, on any shard,
// inside the transaction. A shardq transaction most often starts with a
// prepared SELECT … FOR UPDATE routed to its tenant's shard, so with the
// BEGIN sent first it would hold transactions on two shards: refused
// under vtgate's transaction_mode=SINGLE, and under MULTI each member
// holding one tablet's transaction-pool slot while it waits for the
// other's, which stalls every member once the pools (20 per tablet by
// default, 4 in vttestserver) are full. Sent just before the first
// execution, the BEGIN follows the first prepare, which vtgate then runs
// outside any transaction, and every later prepare finds the tenant's
// shard in the transaction. Nothing else changes: START TRANSACTION takes
// no snapshot (the first read does), and a transaction that executed
// nothing has nothing to commit.
//
// database/sql uses a connection from one goroutine at a time, so the
// state needs no lock.
type vtgateConn struct {
	conn sqldriver.Conn // go-sql-driver's

	pending  bool // BeginTx called, START TRANSACTION not yet sent
	opts     sqldriver.TxOptions
	tx       sqldriver.Tx // the server's transaction once begun
	beginErr error        // its START TRANSACTION failed: nothing more may run
}

var (
	_ sqldriver.Conn               = (*vtgateConn)(nil)
	_ sqldriver.ConnBeginTx        = (*vtgateConn)(nil)
	_ sqldriver.ConnPrepareContext = (*vtgateConn)(nil)
	_ sqldriver.ExecerContext      = (*vtgateConn)(nil)
	_ sqldriver.QueryerContext     = (*vtgateConn)(nil)
	_ sqldriver.Pinger             = (*vtgateConn)(nil)
	_ sqldriver.SessionResetter    = (*vtgateConn)(nil)
	_ sqldriver.Validator          = (*vtgateConn)(nil)
	_ sqldriver.NamedValueChecker  = (*vtgateConn)(nil)
)

// newVTGateConn wraps one of go-sql-driver's connections, which implement
// every interface the wrapper forwards to.
func newVTGateConn(conn sqldriver.Conn) (*vtgateConn, error) {
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
		return &vtgateConn{conn: conn}, nil
	}
	return nil, fmt.Errorf("mysql: connection %T lacks an interface of go-sql-driver's", conn)
}

// begin sends the pending START TRANSACTION, before a statement runs.
func (c *vtgateConn) begin(ctx context.Context) error {
	if c.beginErr != nil {
		return c.beginErr
	}
	if !c.pending {
		return nil
	}
	c.pending = false
	tx, err := c.conn.(sqldriver.ConnBeginTx).BeginTx(ctx, c.opts)
	if err != nil {
		// Never run the transaction's statements on their own.
		c.beginErr = fmt.Errorf("begin: %w", err)
		return c.beginErr
	}
	c.tx = tx
	return nil
}

// end forgets the transaction, whatever became of it.
func (c *vtgateConn) end() (tx sqldriver.Tx, beginErr error) {
	tx, beginErr = c.tx, c.beginErr
	c.pending, c.tx, c.beginErr = false, nil, nil
	return tx, beginErr
}

func (c *vtgateConn) BeginTx(ctx context.Context, opts sqldriver.TxOptions) (sqldriver.Tx, error) {
	if c.pending || c.tx != nil || c.beginErr != nil {
		return nil, errors.New("mysql: a transaction is already open on this connection")
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c.pending, c.opts = true, opts
	return vtgateTx{c}, nil
}

func (c *vtgateConn) Begin() (sqldriver.Tx, error) {
	return c.BeginTx(context.Background(), sqldriver.TxOptions{})
}

func (c *vtgateConn) PrepareContext(ctx context.Context, query string) (sqldriver.Stmt, error) {
	s, err := c.conn.(sqldriver.ConnPrepareContext).PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	return vtgateStmt{s, c}, nil
}

func (c *vtgateConn) Prepare(query string) (sqldriver.Stmt, error) {
	return c.PrepareContext(context.Background(), query)
}

// ExecContext and QueryContext run a statement without parameters; one
// with parameters is skipped back to database/sql, which prepares it (the
// pool never interpolates), so the BEGIN waits for its execution.
func (c *vtgateConn) ExecContext(ctx context.Context, query string, args []sqldriver.NamedValue) (sqldriver.Result, error) {
	if len(args) > 0 {
		return nil, sqldriver.ErrSkip
	}
	if err := c.begin(ctx); err != nil {
		return nil, err
	}
	return c.conn.(sqldriver.ExecerContext).ExecContext(ctx, query, args)
}

func (c *vtgateConn) QueryContext(ctx context.Context, query string, args []sqldriver.NamedValue) (sqldriver.Rows, error) {
	if len(args) > 0 {
		return nil, sqldriver.ErrSkip
	}
	if err := c.begin(ctx); err != nil {
		return nil, err
	}
	return c.conn.(sqldriver.QueryerContext).QueryContext(ctx, query, args)
}

func (c *vtgateConn) Close() error { return c.conn.Close() }

func (c *vtgateConn) Ping(ctx context.Context) error {
	return c.conn.(sqldriver.Pinger).Ping(ctx)
}

func (c *vtgateConn) ResetSession(ctx context.Context) error {
	if tx, _ := c.end(); tx != nil { // database/sql ends transactions first; be sure
		if err := tx.Rollback(); err != nil {
			return sqldriver.ErrBadConn
		}
	}
	return c.conn.(sqldriver.SessionResetter).ResetSession(ctx)
}

func (c *vtgateConn) IsValid() bool { return c.conn.(sqldriver.Validator).IsValid() }

func (c *vtgateConn) CheckNamedValue(nv *sqldriver.NamedValue) error {
	return c.conn.(sqldriver.NamedValueChecker).CheckNamedValue(nv)
}

// vtgateTx ends a transaction: one that executed nothing never reached
// the server.
type vtgateTx struct{ c *vtgateConn }

func (t vtgateTx) Commit() error {
	tx, beginErr := t.c.end()
	if beginErr != nil {
		return beginErr
	}
	if tx == nil {
		return nil
	}
	return tx.Commit()
}

func (t vtgateTx) Rollback() error {
	tx, _ := t.c.end()
	if tx == nil {
		return nil
	}
	return tx.Rollback()
}

// vtgateStmt sends its connection's pending BEGIN before it executes.
type vtgateStmt struct {
	s sqldriver.Stmt
	c *vtgateConn
}

var (
	_ sqldriver.StmtExecContext   = vtgateStmt{}
	_ sqldriver.StmtQueryContext  = vtgateStmt{}
	_ sqldriver.NamedValueChecker = vtgateStmt{}
)

func (s vtgateStmt) Close() error  { return s.s.Close() }
func (s vtgateStmt) NumInput() int { return s.s.NumInput() }

func (s vtgateStmt) ExecContext(ctx context.Context, args []sqldriver.NamedValue) (sqldriver.Result, error) {
	if err := s.c.begin(ctx); err != nil {
		return nil, err
	}
	return s.s.(sqldriver.StmtExecContext).ExecContext(ctx, args)
}

func (s vtgateStmt) QueryContext(ctx context.Context, args []sqldriver.NamedValue) (sqldriver.Rows, error) {
	if err := s.c.begin(ctx); err != nil {
		return nil, err
	}
	return s.s.(sqldriver.StmtQueryContext).QueryContext(ctx, args)
}

// Exec and Query are the pre-context forms database/sql no longer calls
// when the context forms exist; they are here to satisfy driver.Stmt.
func (s vtgateStmt) Exec(args []sqldriver.Value) (sqldriver.Result, error) {
	return s.ExecContext(context.Background(), named(args))
}

func (s vtgateStmt) Query(args []sqldriver.Value) (sqldriver.Rows, error) {
	return s.QueryContext(context.Background(), named(args))
}

func (s vtgateStmt) CheckNamedValue(nv *sqldriver.NamedValue) error {
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
