// SPDX-License-Identifier: Apache-2.0

// Package sqlrecord wraps a database/sql connector and reports every
// statement text run through it (as a text query, or as a prepared
// statement each time it executes), before passing it on unchanged. Tests use
// it to check properties of the SQL a driver really sends (tenant scoping);
// the database behind it is the real one.
package sqlrecord

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
)

// Connector wraps inner; record is called with each statement's text.
func Connector(inner driver.Connector, record func(query string)) driver.Connector {
	return New(inner, Hooks{Statement: record})
}

// Hooks are called as the connection does each thing; nil ones are not.
type Hooks struct {
	Statement func(query string) // a statement runs (text or prepared)
	Begin     func()             // a transaction starts (its BEGIN is not a statement here)
	Prepare   func(query string) // a statement is prepared on the server
}

// New wraps inner with hooks.
func New(inner driver.Connector, hooks Hooks) driver.Connector {
	nop := func(string) {}
	if hooks.Statement == nil {
		hooks.Statement = nop
	}
	if hooks.Prepare == nil {
		hooks.Prepare = nop
	}
	if hooks.Begin == nil {
		hooks.Begin = func() {}
	}
	return &connector{inner: inner, record: hooks.Statement, begin: hooks.Begin, prepare: hooks.Prepare}
}

type connector struct {
	inner   driver.Connector
	record  func(string)
	begin   func()
	prepare func(string)
}

func (c *connector) Driver() driver.Driver { return c.inner.Driver() }

func (c *connector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.inner.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &conn_{Conn: conn, record: c.record, begin: c.begin, prepare: c.prepare}, nil
}

// conn_ forwards to the wrapped connection. It implements the optional
// interfaces the SQL drivers in use (go-sql-driver/mysql) implement, so
// database/sql takes the same paths with and without the wrapper.
type conn_ struct {
	driver.Conn
	record  func(string)
	begin   func()
	prepare func(string)
}

func (c *conn_) Prepare(query string) (driver.Stmt, error) {
	c.prepare(query)
	st, err := c.Conn.Prepare(query)
	if err != nil {
		return nil, err
	}
	return &stmt{Stmt: st, query: query, record: c.record}, nil
}

func (c *conn_) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	p, ok := c.Conn.(driver.ConnPrepareContext)
	if !ok {
		return c.Prepare(query)
	}
	c.prepare(query)
	st, err := p.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	return &stmt{Stmt: st, query: query, record: c.record}, nil
}

// ExecContext and QueryContext record a statement the driver runs as
// text: one without parameters before it runs; one with parameters after,
// if the driver interpolated them, followed by their values, which the
// driver spliced into the text it sent. (Binding them on the server, it
// answers ErrSkip and database/sql prepares the statement, recorded as it
// runs.)
func (c *conn_) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	e, ok := c.Conn.(driver.ExecerContext)
	if !ok {
		return nil, driver.ErrSkip
	}
	if len(args) == 0 {
		c.record(query)
	}
	res, err := e.ExecContext(ctx, query, args)
	if len(args) > 0 && !errors.Is(err, driver.ErrSkip) {
		c.record(interpolated(query, args))
	}
	return res, err
}

func (c *conn_) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	q, ok := c.Conn.(driver.QueryerContext)
	if !ok {
		return nil, driver.ErrSkip
	}
	if len(args) == 0 {
		c.record(query)
	}
	rows, err := q.QueryContext(ctx, query, args)
	if len(args) > 0 && !errors.Is(err, driver.ErrSkip) {
		c.record(interpolated(query, args))
	}
	return rows, err
}

// interpolated is query with the values the driver spliced into it.
func interpolated(query string, args []driver.NamedValue) string {
	var b strings.Builder
	b.WriteString(query)
	b.WriteString(" /* interpolated:")
	for _, a := range args {
		fmt.Fprintf(&b, " %v", a.Value)
	}
	b.WriteString(" */")
	return b.String()
}

// stmt is a prepared statement that reports its text each time it runs.
type stmt struct {
	driver.Stmt
	query  string
	record func(string)
}

func (s *stmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	s.record(s.query)
	if e, ok := s.Stmt.(driver.StmtExecContext); ok {
		return e.ExecContext(ctx, args)
	}
	return nil, errors.New("sqlrecord: statement cannot ExecContext")
}

func (s *stmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	s.record(s.query)
	if q, ok := s.Stmt.(driver.StmtQueryContext); ok {
		return q.QueryContext(ctx, args)
	}
	return nil, errors.New("sqlrecord: statement cannot QueryContext")
}

func (s *stmt) CheckNamedValue(nv *driver.NamedValue) error {
	if ch, ok := s.Stmt.(driver.NamedValueChecker); ok {
		return ch.CheckNamedValue(nv)
	}
	return driver.ErrSkip
}

func (c *conn_) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	c.begin()
	if b, ok := c.Conn.(driver.ConnBeginTx); ok {
		return b.BeginTx(ctx, opts)
	}
	//lint:ignore SA1019 the fallback for a driver without BeginTx, as database/sql does
	return c.Conn.Begin()
}

func (c *conn_) CheckNamedValue(nv *driver.NamedValue) error {
	if ch, ok := c.Conn.(driver.NamedValueChecker); ok {
		return ch.CheckNamedValue(nv)
	}
	return driver.ErrSkip
}

func (c *conn_) ResetSession(ctx context.Context) error {
	if r, ok := c.Conn.(driver.SessionResetter); ok {
		return r.ResetSession(ctx)
	}
	return nil
}

func (c *conn_) IsValid() bool {
	if v, ok := c.Conn.(driver.Validator); ok {
		return v.IsValid()
	}
	return true
}
