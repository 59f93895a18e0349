// SPDX-License-Identifier: Apache-2.0

// Package sqlrecord wraps a database/sql connector and reports every
// statement text sent through it, before passing it on unchanged. Tests use
// it to check properties of the SQL a driver really sends (tenant scoping);
// the database behind it is the real one.
package sqlrecord

import (
	"context"
	"database/sql/driver"
)

// Connector wraps inner; record is called with each statement's text.
func Connector(inner driver.Connector, record func(query string)) driver.Connector {
	return &connector{inner: inner, record: record, begin: func() {}}
}

// CountingBegins is Connector that also calls begin as each transaction
// starts (the driver sends its BEGIN itself, not through record).
func CountingBegins(inner driver.Connector, record func(query string), begin func()) driver.Connector {
	return &connector{inner: inner, record: record, begin: begin}
}

type connector struct {
	inner  driver.Connector
	record func(string)
	begin  func()
}

func (c *connector) Driver() driver.Driver { return c.inner.Driver() }

func (c *connector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.inner.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &conn_{Conn: conn, record: c.record, begin: c.begin}, nil
}

// conn_ forwards to the wrapped connection. It implements the optional
// interfaces the SQL drivers in use (go-sql-driver/mysql) implement, so
// database/sql takes the same paths with and without the wrapper.
type conn_ struct {
	driver.Conn
	record func(string)
	begin  func()
}

func (c *conn_) Prepare(query string) (driver.Stmt, error) {
	c.record(query)
	return c.Conn.Prepare(query)
}

func (c *conn_) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	c.record(query)
	if p, ok := c.Conn.(driver.ConnPrepareContext); ok {
		return p.PrepareContext(ctx, query)
	}
	return c.Conn.Prepare(query)
}

func (c *conn_) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	e, ok := c.Conn.(driver.ExecerContext)
	if !ok {
		return nil, driver.ErrSkip
	}
	c.record(query)
	return e.ExecContext(ctx, query, args)
}

func (c *conn_) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	q, ok := c.Conn.(driver.QueryerContext)
	if !ok {
		return nil, driver.ErrSkip
	}
	c.record(query)
	return q.QueryContext(ctx, query, args)
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
