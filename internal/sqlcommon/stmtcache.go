// SPDX-License-Identifier: Apache-2.0

package sqlcommon

import (
	"context"
	"database/sql"
	"sync"
	"sync/atomic"

	"github.com/shardq/shardq/driver"
)

// maxCachedStatements bounds a pool's prepared statements: texts differ
// by the length of their lists and rows, and past the bound a statement
// simply runs unprepared.
const maxCachedStatements = 1024

// stmtCache holds one pool's prepared statements by text.
type stmtCache struct {
	mu sync.Mutex
	m  map[string]*sql.Stmt
	// wanted are texts a transaction ran unprepared: preparing needs the
	// pool's connection, which SQLite's one write connection cannot lend
	// while the transaction holds it. prepareWanted prepares them before
	// the next transaction begins.
	wanted map[string]bool
}

// cached returns q's prepared statement, or nil and notes q as wanted.
func (c *stmtCache) cached(q string) *sql.Stmt {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s, ok := c.m[q]; ok {
		return s
	}
	if len(c.m)+len(c.wanted) < maxCachedStatements {
		if c.wanted == nil {
			c.wanted = map[string]bool{}
		}
		c.wanted[q] = true
	}
	return nil
}

// prepareWanted prepares the wanted texts on db.
func (c *stmtCache) prepareWanted(ctx context.Context, db *sql.DB) {
	c.mu.Lock()
	var qs []string
	for q := range c.wanted {
		qs = append(qs, q)
	}
	clear(c.wanted)
	c.mu.Unlock()
	for _, q := range qs {
		c.prepared(ctx, db, q)
	}
}

// prepared returns q prepared on db, or nil (cache full, or the prepare
// failed: the statement then runs unprepared and reports its own error).
// The lock is not held while preparing: that waits for a connection,
// which a transaction may hold while it looks a statement up here.
func (c *stmtCache) prepared(ctx context.Context, db *sql.DB, q string) *sql.Stmt {
	c.mu.Lock()
	s, ok := c.m[q]
	full := len(c.m)+len(c.wanted) >= maxCachedStatements
	c.mu.Unlock()
	if ok || full {
		return s
	}
	s, err := db.PrepareContext(ctx, q)
	if err != nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if prev, ok := c.m[q]; ok { // prepared meanwhile by another caller
		s.Close()
		return prev
	}
	if c.m == nil {
		c.m = map[string]*sql.Stmt{}
	}
	c.m[q] = s
	return s
}

func (c *stmtCache) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.m {
		s.Close()
	}
	c.m = nil
}

// statementCaches are the Store's prepared statements: the read pool's, and
// the write pool's, which the driver's own write transactions use too.
type statementCaches struct {
	read, write stmtCache
	// ownTx is the write transaction the driver began last (BeginWrite
	// reports it through OwnTx). SQLite has one write connection, so at
	// most one is open; a caller's own transaction is never it.
	ownTx atomic.Pointer[sql.Tx]
}

// BeforeWrite prepares, on the write pool, the statements the last
// transactions ran unprepared; the driver's BeginWrite calls it before it
// takes the write connection.
func (d *Store) BeforeWrite(ctx context.Context) {
	if w, ok := d.Write.(*sql.DB); ok && d.Prepare {
		d.caches.write.prepareWanted(ctx, w)
	}
}

// OwnTx tells the Store that tx is a write transaction the driver began on
// its write pool, whose prepared statements it may use.
func (d *Store) OwnTx(tx *sql.Tx) {
	if d.Prepare {
		d.caches.ownTx.Store(tx)
	}
}

// CloseStatements closes the prepared statements (the driver's Close).
func (d *Store) CloseStatements() {
	d.caches.read.close()
	d.caches.write.close()
}

// stmt returns q prepared for db when db is one of the Store's pools or
// its own write transaction, else nil.
func (d *Store) stmt(ctx context.Context, db driver.DBTX, q string) *sql.Stmt {
	if !d.Prepare {
		return nil
	}
	switch db := db.(type) {
	case *sql.Tx:
		if db != d.caches.ownTx.Load() {
			return nil
		}
		if s := d.caches.write.cached(q); s != nil {
			return db.StmtContext(ctx, s)
		}
	case *sql.DB:
		switch db {
		case d.Read:
			return d.caches.read.prepared(ctx, db, q)
		case d.Write:
			return d.caches.write.prepared(ctx, db, q)
		}
	}
	return nil
}

// exec, query and queryRow run a named statement (Bind), prepared where
// the dialect caches statements.
func (d *Store) exec(ctx context.Context, db driver.DBTX, stmt string, args Args) (sql.Result, error) {
	q, a := Bind(stmt, args)
	if s := d.stmt(ctx, db, q); s != nil {
		return s.ExecContext(ctx, a...)
	}
	return db.ExecContext(ctx, q, a...)
}

func (d *Store) query(ctx context.Context, db driver.DBTX, stmt string, args Args) (*sql.Rows, error) {
	q, a := Bind(stmt, args)
	if s := d.stmt(ctx, db, q); s != nil {
		return s.QueryContext(ctx, a...)
	}
	return db.QueryContext(ctx, q, a...)
}

func (d *Store) queryRow(ctx context.Context, db driver.DBTX, stmt string, args Args) *sql.Row {
	q, a := Bind(stmt, args)
	if s := d.stmt(ctx, db, q); s != nil {
		return s.QueryRowContext(ctx, a...)
	}
	return db.QueryRowContext(ctx, q, a...)
}
