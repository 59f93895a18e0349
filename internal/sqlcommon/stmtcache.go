// SPDX-License-Identifier: Apache-2.0

package sqlcommon

import (
	"context"
	"database/sql"
	"sync"

	"github.com/shardq/shardq/driver"
)

// stmtCache holds one pool's prepared statements by text.
type stmtCache struct {
	mu sync.Mutex
	m  map[string]*sql.Stmt
	// wanted are texts a transaction ran unprepared: preparing them on
	// the pool needs another connection, which SQLite's one write
	// connection cannot lend while the transaction holds it, and a full
	// MySQL pool may not have. prepareWanted prepares them before the next
	// transaction begins.
	wanted map[string]bool
}

// cached returns q's prepared statement, or nil and notes q as wanted.
func (c *stmtCache) cached(q string, limit int) *sql.Stmt {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s, ok := c.m[q]; ok {
		return s
	}
	if len(c.m)+len(c.wanted) < limit {
		if c.wanted == nil {
			c.wanted = map[string]bool{}
		}
		c.wanted[q] = true
	}
	return nil
}

// prepareWanted prepares the wanted texts on db.
func (c *stmtCache) prepareWanted(ctx context.Context, db *sql.DB, limit int) {
	c.mu.Lock()
	var qs []string
	for q := range c.wanted {
		qs = append(qs, q)
	}
	clear(c.wanted)
	c.mu.Unlock()
	for _, q := range qs {
		c.prepared(ctx, db, q, limit)
	}
}

// prepared returns q prepared on db, or nil (cache full, or the prepare
// failed: the statement then runs unprepared and reports its own error).
// The lock is not held while preparing: that waits for a connection,
// which a transaction may hold while it looks a statement up here.
func (c *stmtCache) prepared(ctx context.Context, db *sql.DB, q string, limit int) *sql.Stmt {
	c.mu.Lock()
	s, ok := c.m[q]
	full := len(c.m)+len(c.wanted) >= limit
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

// statementCaches are the Store's prepared statements: the read pool's,
// the write pool's, and the write-transaction pool's (TxPool). A cache
// serves every role its pool has: on MySQL, read serves reads and
// single-statement writes, and write is unused.
type statementCaches struct {
	read, write, tx stmtCache
}

// txPool is the pool the driver's write transactions are begun on.
func (d *Store) txPool() driver.DBTX {
	if d.TxPool != nil {
		if p := d.TxPool(); p != nil {
			return p
		}
	}
	return d.Write
}

// writeCache is the cache of the pool write transactions are begun on.
func (d *Store) writeCache() *stmtCache {
	switch d.txPool() {
	case d.Read:
		return &d.caches.read
	case d.Write:
		return &d.caches.write
	}
	return &d.caches.tx
}

// BeforeWrite prepares, on the write-transaction pool, the statements the
// last transactions ran unprepared; the driver's BeginWrite calls it
// before it takes a connection for the transaction.
func (d *Store) BeforeWrite(ctx context.Context) {
	if w, ok := d.txPool().(*sql.DB); ok && d.PreparedStatements > 0 {
		d.writeCache().prepareWanted(ctx, w, d.PreparedStatements)
	}
}

// CloseStatements closes the prepared statements (the driver's Close).
func (d *Store) CloseStatements() {
	d.caches.read.close()
	d.caches.write.close()
	d.caches.tx.close()
}

// stmt returns q prepared for db, or nil: for one of the Store's pools,
// from its cache; for a *sql.Tx, the write-transaction pool's statement
// bound to the transaction. That is the pool of the driver's own
// transactions; a caller's may be of another (exec and query then run
// the statement unprepared: otherPool), and a caller's PublishTx arrives
// as driver.PreparedTx.
func (d *Store) stmt(ctx context.Context, db driver.DBTX, q string) *sql.Stmt {
	limit := d.PreparedStatements
	if limit <= 0 {
		return nil
	}
	switch db := db.(type) {
	case *sql.Tx:
		if s := d.writeCache().cached(q, limit); s != nil {
			return db.StmtContext(ctx, s)
		}
	case *sql.DB:
		switch db {
		case d.Read:
			return d.caches.read.prepared(ctx, db, q, limit)
		case d.Write:
			return d.caches.write.prepared(ctx, db, q, limit)
		}
	}
	return nil
}

// preparable reports whether args expand to a statement to prepare: one
// whose lists are at most the dialect's PreparedListMax long.
func (d *Store) preparable(args Args) bool {
	limit := d.PreparedListMax
	if limit <= 0 {
		return true
	}
	for _, v := range args {
		switch v := v.(type) {
		case List:
			if len(v) > limit {
				return false
			}
		case Rows:
			if len(v) > limit {
				return false
			}
		}
	}
	return true
}

// exec, query and queryRow run a named statement (Bind), prepared where
// the dialect caches statements and the statement's lists are short.
func (d *Store) exec(ctx context.Context, db driver.DBTX, stmt string, args Args) (sql.Result, error) {
	q, a := Bind(stmt, args)
	if !d.preparable(args) {
		return db.ExecContext(ctx, q, a...)
	}
	if s := d.stmt(ctx, db, q); s != nil {
		res, err := s.ExecContext(ctx, a...)
		if !otherPool(db, err) {
			return res, err
		}
	}
	return db.ExecContext(ctx, q, a...)
}

func (d *Store) query(ctx context.Context, db driver.DBTX, stmt string, args Args) (*sql.Rows, error) {
	q, a := Bind(stmt, args)
	if !d.preparable(args) {
		return db.QueryContext(ctx, q, a...)
	}
	if s := d.stmt(ctx, db, q); s != nil {
		rows, err := s.QueryContext(ctx, a...)
		if !otherPool(db, err) {
			return rows, err
		}
	}
	return db.QueryContext(ctx, q, a...)
}

// errOtherPool is database/sql's refusal to bind a statement prepared on
// one pool to a transaction of another, given before anything reaches
// the server (Tx.StmtContext's sticky error; database/sql exports no
// value to compare with).
const errOtherPool = "sql: Tx.Stmt: statement from different database used"

// otherPool reports that db is a transaction of a pool other than the
// one the Store's write transactions begin on: a caller's transaction
// (the …Tx methods: AckTx) begun on another pool, such as MySQL's DB()
// beside its write-transaction pool. Its statements then run
// unprepared, as a caller's PublishTx runs them.
func otherPool(db driver.DBTX, err error) bool {
	_, tx := db.(*sql.Tx)
	return tx && err != nil && err.Error() == errOtherPool
}

func (d *Store) queryRow(ctx context.Context, db driver.DBTX, stmt string, args Args) row {
	rows, err := d.query(ctx, db, stmt, args)
	return row{rows, err}
}

// row is the first row of a query, scanned as *sql.Row scans it
// (sql.ErrNoRows when there is none). driver.DBTX has no QueryRowContext:
// a caller's transaction (driver.PreparedTx) could not build a *sql.Row
// for a statement that failed to prepare.
type row struct {
	rows *sql.Rows
	err  error
}

func (r row) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	defer r.rows.Close()
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return sql.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	return r.rows.Close()
}
