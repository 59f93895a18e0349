// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The raw baselines: what the database itself does with tables of the
// queue's shape, with no queue around it.

func (e *env) rawCases() []scenCase {
	cases := []scenCase{e.rawInsertCase(1), e.rawAppendCase(1)}
	if e.p.Publishers > 1 {
		cases = append(cases, e.rawInsertCase(e.p.Publishers), e.rawAppendCase(e.p.Publishers))
	}
	return append(cases, e.rawMultiRowCase(), e.rawConsumeCase())
}

// rawInsertCase: single-row autocommit INSERTs over conns connections.
func (e *env) rawInsertCase(conns int) scenCase {
	return scenCase{fmt.Sprintf("raw-insert-%dconn", conns), func(ctx context.Context, ns namespace) (rep, error) {
		return e.rawInsert(ctx, ns, conns, 1)
	}}
}

// rawAppendCase: over conns connections, one transaction a message that
// inserts it and raises its partition's head row (created on first use),
// the two writes every ordered append needs: { BEGIN; INSERT the message;
// INSERT ... ON DUPLICATE KEY UPDATE (SQLite: ON CONFLICT) the head;
// COMMIT }. On SQLite BEGIN IMMEDIATE, as shardq's writer.
func (e *env) rawAppendCase(conns int) scenCase {
	return scenCase{fmt.Sprintf("raw-append-%dconn", conns), func(ctx context.Context, ns namespace) (rep, error) {
		return e.rawAppend(ctx, ns, conns)
	}}
}

// rawMultiRowCase: multi-row INSERTs of --batch rows over --publishers
// connections.
func (e *env) rawMultiRowCase() scenCase {
	return scenCase{fmt.Sprintf("raw-multirow-%d", e.p.Batch), func(ctx context.Context, ns namespace) (rep, error) {
		return e.rawInsert(ctx, ns, e.p.Publishers, e.p.Batch)
	}}
}

// createRaw creates the namespace's raw tables: copies of queue_messages
// (its offset assigned by the database) and queue_offsets.
func (ns namespace) createRaw(ctx context.Context) error {
	db := ns.e.d.DB()
	for src, dst := range map[string]string{"queue_messages": ns.rawMessages(), "queue_offsets": ns.rawOffsets()} {
		var stmts []string
		if ns.e.d.Name() == "mysql" {
			stmts = []string{"CREATE TABLE " + dst + " LIKE " + src}
		} else {
			rows, err := db.QueryContext(ctx, "SELECT sql FROM sqlite_master WHERE tbl_name = ? AND sql IS NOT NULL ORDER BY type DESC", src)
			if err != nil {
				return err
			}
			for rows.Next() {
				var s string
				if err := rows.Scan(&s); err != nil {
					rows.Close()
					return err
				}
				stmts = append(stmts, strings.ReplaceAll(s, src, dst))
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return err
			}
		}
		for _, s := range stmts {
			if _, err := db.ExecContext(ctx, s); err != nil {
				return fmt.Errorf("create raw table %s: %w", dst, err)
			}
		}
		if err := ns.e.route(ctx, dst); err != nil {
			return err
		}
	}
	return nil
}

// timeArg is t as the dialect stores created_at.
func (e *env) timeArg(t time.Time) any {
	if e.d.Name() == "mysql" {
		return t.UTC()
	}
	return t.UnixMicro()
}

func (e *env) offsetCol() string {
	if e.d.Name() == "mysql" {
		return "`offset`"
	}
	return `"offset"`
}

// rawInsert writes --messages rows in statements of rowsPer rows over conns
// connections, each statement its own transaction.
func (e *env) rawInsert(ctx context.Context, ns namespace, conns, rowsPer int) (rep, error) {
	if err := ns.createRaw(ctx); err != nil {
		return rep{}, err
	}
	stmts := e.prepared()
	defer stmts.close()
	total := e.p.Messages
	stmt := "INSERT INTO " + ns.rawMessages() + " (tenant, topic, partition_key, id, headers, payload, created_at) VALUES "
	var next atomic.Int64
	var mu sync.Mutex
	var lat []time.Duration
	errc := make(chan error, conns)
	start := time.Now()
	var wg sync.WaitGroup
	for range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			defer func() { mu.Lock(); lat = append(lat, mine...); mu.Unlock() }()
			for {
				first := int(next.Add(int64(rowsPer))) - rowsPer
				if first >= total {
					return
				}
				n := min(rowsPer, total-first)
				args := make([]any, 0, 7*n)
				now := time.Now()
				for i := first; i < first+n; i++ {
					tenant, key := ns.partition(i % e.p.Partitions)
					args = append(args, tenant, ns.topic, key, fmt.Sprint(i), `{"queue_name":"`+tenant+`"}`,
						payload(e.p.Size, uint64(i), now, 0), e.timeArg(now))
				}
				st, err := stmts.get(ctx, stmt+strings.TrimSuffix(strings.Repeat("(?, ?, ?, ?, ?, ?, ?), ", n), ", "))
				if err != nil {
					errc <- fmt.Errorf("raw insert: %w", err)
					return
				}
				t0 := time.Now()
				if _, err := st.ExecContext(ctx, args...); err != nil {
					errc <- fmt.Errorf("raw insert: %w", err)
					return
				}
				mine = append(mine, time.Since(t0))
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errc)
	if err := <-errc; err != nil {
		return rep{}, err
	}
	var stored int64
	if err := e.d.DB().QueryRowContext(ctx, "SELECT COUNT(*) FROM "+ns.rawMessages()).Scan(&stored); err != nil {
		return rep{}, err
	}
	return rep{msgs: int64(total), elapsed: elapsed, latencies: lat, lost: max(0, int64(total)-stored),
		dups: max(0, stored-int64(total))}, nil
}

// rawAppend runs rawAppendCase, its statements prepared and its
// transactions begun as shardq's (the driver's BeginWrite).
func (e *env) rawAppend(ctx context.Context, ns namespace, conns int) (rep, error) {
	if err := ns.createRaw(ctx); err != nil {
		return rep{}, err
	}
	db := e.d.DB()
	if _, err := db.ExecContext(ctx, "CREATE TABLE "+ns.rawHeads()+" (tenant VARCHAR(255) NOT NULL, topic VARCHAR(255) NOT NULL, "+
		"partition_key VARCHAR(255) NOT NULL, head_offset BIGINT NOT NULL, updated_at BIGINT NOT NULL, PRIMARY KEY (tenant, topic, partition_key))"); err != nil {
		return rep{}, fmt.Errorf("create raw heads: %w", err)
	}
	if err := e.route(ctx, ns.rawHeads()); err != nil {
		return rep{}, err
	}
	upsert := "INSERT INTO " + ns.rawHeads() + " (tenant, topic, partition_key, head_offset, updated_at) VALUES (?, ?, ?, ?, ?) "
	if e.d.Name() == "mysql" {
		upsert += "ON DUPLICATE KEY UPDATE head_offset = GREATEST(head_offset, VALUES(head_offset)), updated_at = VALUES(updated_at)"
	} else {
		upsert += "ON CONFLICT (tenant, topic, partition_key) DO UPDATE SET head_offset = MAX(head_offset, excluded.head_offset), updated_at = excluded.updated_at"
	}
	stmts, err := e.preparedForTx(ctx)
	if err != nil {
		return rep{}, err
	}
	defer stmts.close()
	ins, err := stmts.get(ctx, "INSERT INTO "+ns.rawMessages()+" (tenant, topic, partition_key, id, headers, payload, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)")
	if err != nil {
		return rep{}, err
	}
	up, err := stmts.get(ctx, upsert)
	if err != nil {
		return rep{}, err
	}
	total := e.p.Messages
	var next atomic.Int64
	var mu sync.Mutex
	var lat []time.Duration
	elapsed, err := runWorkers(conns, func(int) error {
		var mine []time.Duration
		defer func() { mu.Lock(); lat = append(lat, mine...); mu.Unlock() }()
		for {
			i := int(next.Add(1)) - 1
			if i >= total {
				return nil
			}
			tenant, key := ns.partition(i % e.p.Partitions)
			now := time.Now()
			t0 := time.Now()
			tx, err := e.beginWrite(ctx)
			if err != nil {
				return fmt.Errorf("raw append: %w", err)
			}
			res, err := tx.StmtContext(ctx, ins).ExecContext(ctx, tenant, ns.topic, key, fmt.Sprint(i), `{"queue_name":"`+tenant+`"}`, payload(e.p.Size, uint64(i), now, 0), e.timeArg(now))
			var off int64
			if err == nil {
				off, err = res.LastInsertId()
			}
			if err == nil {
				_, err = tx.StmtContext(ctx, up).ExecContext(ctx, tenant, ns.topic, key, off, now.UnixMicro())
			}
			if err == nil {
				err = tx.Commit()
			} else {
				tx.Rollback() //nolint:errcheck // the error above is the one to report
			}
			if err != nil {
				return fmt.Errorf("raw append: %w", err)
			}
			mine = append(mine, time.Since(t0))
		}
	})
	if err != nil {
		return rep{}, err
	}
	var stored int64
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+ns.rawMessages()).Scan(&stored); err != nil {
		return rep{}, err
	}
	return rep{msgs: int64(total), elapsed: elapsed, latencies: lat, lost: max(0, int64(total)-stored),
		dups: max(0, stored-int64(total))}, nil
}

// fillRaw writes --messages rows into the namespace's raw messages table,
// untimed, 500 a statement; message i goes to the tenant and partition
// place names, with that sequence in its payload.
func (e *env) fillRaw(ctx context.Context, ns namespace, place func(i int) (tenant, key string, seq uint64)) error {
	const fillBatch = 500
	for first := 0; first < e.p.Messages; first += fillBatch {
		n := min(fillBatch, e.p.Messages-first)
		args := make([]any, 0, 7*n)
		now := time.Now()
		for i := first; i < first+n; i++ {
			tenant, key, seq := place(i)
			args = append(args, tenant, ns.topic, key, fmt.Sprint(i), `{"queue_name":"`+tenant+`"}`, payload(e.p.Size, seq, now, 0), e.timeArg(now))
		}
		q := "INSERT INTO " + ns.rawMessages() + " (tenant, topic, partition_key, id, headers, payload, created_at) VALUES " +
			strings.TrimSuffix(strings.Repeat("(?, ?, ?, ?, ?, ?, ?), ", n), ", ")
		if _, err := e.d.DB().ExecContext(ctx, q, args...); err != nil {
			return fmt.Errorf("raw fill: %w", err)
		}
	}
	return nil
}

// rawConsumeCase is the ordered-consume ceiling: --subscribers workers,
// each owning its share of --partitions, loop { begin; select up to 100
// rows after the cursor; update the cursor row; commit } until every row
// is read.
func (e *env) rawConsumeCase() scenCase {
	return scenCase{"raw-ordered-consume", e.rawConsume}
}

func (e *env) rawConsume(ctx context.Context, ns namespace) (rep, error) {
	if err := ns.createRaw(ctx); err != nil {
		return rep{}, err
	}
	p := e.p
	db := e.d.DB()
	// Fill, untimed: message i goes to partition i % K as its (i / K)th.
	if err := e.fillRaw(ctx, ns, func(i int) (string, string, uint64) {
		tenant, key := ns.partition(i % p.Partitions)
		return tenant, key, uint64(i / p.Partitions)
	}); err != nil {
		return rep{}, err
	}
	for k := range p.Partitions {
		tenant, key := ns.partition(k)
		if _, err := db.ExecContext(ctx, "INSERT INTO "+ns.rawOffsets()+" (tenant, topic, partition_key, consumer_group, committed_offset, updated_at) VALUES (?, ?, ?, 'bench', 0, ?)",
			tenant, ns.topic, key, e.timeArg(time.Now())); err != nil {
			return rep{}, fmt.Errorf("raw fill offsets: %w", err)
		}
	}
	rec := newRecorder(p.Messages, p.Partitions)
	oc := e.offsetCol()
	sel := "SELECT " + oc + ", payload FROM " + ns.rawMessages() + " WHERE tenant = ? AND topic = ? AND partition_key = ? AND " + oc + " > ? ORDER BY " + oc + " LIMIT 100"
	upd := "UPDATE " + ns.rawOffsets() + " SET committed_offset = ?, updated_at = ? WHERE tenant = ? AND topic = ? AND partition_key = ? AND consumer_group = 'bench'"
	stmts, err := e.preparedForTx(ctx)
	if err != nil {
		return rep{}, err
	}
	defer stmts.close()
	selStmt, err := stmts.get(ctx, sel)
	if err != nil {
		return rep{}, err
	}
	updStmt, err := stmts.get(ctx, upd)
	if err != nil {
		return rep{}, err
	}
	consumePartition := func(k int) error {
		tenant, key := ns.partition(k)
		var cursor int64
		for {
			tx, err := e.beginWrite(ctx)
			if err != nil {
				return err
			}
			rows, err := tx.StmtContext(ctx, selStmt).QueryContext(ctx, tenant, ns.topic, key, cursor)
			if err != nil {
				tx.Rollback()
				return err
			}
			n := 0
			for rows.Next() {
				var body []byte
				if err := rows.Scan(&cursor, &body); err != nil {
					rows.Close()
					tx.Rollback()
					return err
				}
				seq, _, _, err := parsePayload(body)
				if err != nil {
					rows.Close()
					tx.Rollback()
					return err
				}
				rec.record(event{tenant: tenant, key: key, seq: seq, at: time.Now()})
				n++
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				tx.Rollback()
				return err
			}
			if _, err := tx.StmtContext(ctx, updStmt).ExecContext(ctx, cursor, e.timeArg(time.Now()), tenant, ns.topic, key); err != nil {
				tx.Rollback()
				return err
			}
			if err := tx.Commit(); err != nil {
				return err
			}
			if n < 100 {
				return nil
			}
		}
	}
	elapsed, err := runWorkers(p.Subscribers, func(w int) error {
		for k := w; k < p.Partitions; k += p.Subscribers {
			if err := consumePartition(k); err != nil {
				return fmt.Errorf("raw consume partition %d: %w", k, err)
			}
		}
		return nil
	})
	if err != nil {
		return rep{}, err
	}
	return rec.rep(elapsed), nil
}

// stmtSet holds the raw baselines' prepared statements by text: each is
// prepared once on the pool (then once per connection), so a raw
// statement costs one round trip with its values bound, as shardq's do.
type stmtSet struct {
	db *sql.DB
	mu sync.Mutex
	m  map[string]*sql.Stmt
}

func (e *env) prepared() *stmtSet { return &stmtSet{db: e.d.DB(), m: map[string]*sql.Stmt{}} }

// preparedForTx holds statements for the transactions BeginWrite begins,
// prepared on their pool: on MariaDB and MySQL a pool of its own
// (mysqldriver's WriteDB), whose statements alone bind to them.
func (e *env) preparedForTx(ctx context.Context) (*stmtSet, error) {
	w, ok := e.d.(interface {
		WriteDB(context.Context) (*sql.DB, error)
	})
	if !ok {
		return e.prepared(), nil
	}
	db, err := w.WriteDB(ctx)
	if err != nil {
		return nil, err
	}
	return &stmtSet{db: db, m: map[string]*sql.Stmt{}}, nil
}

func (s *stmtSet) get(ctx context.Context, q string) (*sql.Stmt, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st, ok := s.m[q]; ok {
		return st, nil
	}
	st, err := s.db.PrepareContext(ctx, q)
	if err != nil {
		return nil, fmt.Errorf("prepare %q: %w", q, err)
	}
	s.m[q] = st
	return st, nil
}

func (s *stmtSet) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, st := range s.m {
		st.Close()
	}
}

// runWorkers runs work(0..n-1) at once and times them; it returns the
// first error.
func runWorkers(n int, work func(w int) error) (time.Duration, error) {
	errc := make(chan error, n)
	start := time.Now()
	var wg sync.WaitGroup
	for w := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := work(w); err != nil {
				errc <- err
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errc)
	return elapsed, <-errc
}

// rawClaimCase is the competing-consumer ceiling: --subscribers workers
// loop { begin; select up to 100 ungrouped rows (FOR UPDATE SKIP LOCKED on
// MySQL; SQLite's write transaction excludes the others); delete them;
// commit } until the table is empty.
func (e *env) rawClaimCase() scenCase {
	return scenCase{"raw-claim-delete", e.rawClaim}
}

func (e *env) rawClaim(ctx context.Context, ns namespace) (rep, error) {
	if err := ns.createRaw(ctx); err != nil {
		return rep{}, err
	}
	p := e.p
	if err := e.fillRaw(ctx, ns, func(i int) (string, string, uint64) { return ns.tenants[i%len(ns.tenants)], "", uint64(i) }); err != nil {
		return rep{}, err
	}
	oc := e.offsetCol()
	sel := "SELECT " + oc + ", payload FROM " + ns.rawMessages() + " WHERE tenant = ? AND topic = ? AND partition_key = '' ORDER BY " + oc + " LIMIT 100"
	if e.d.Name() == "mysql" {
		sel += " FOR UPDATE SKIP LOCKED"
	}
	stmts, err := e.preparedForTx(ctx)
	if err != nil {
		return rep{}, err
	}
	defer stmts.close()
	del := func(n int) string {
		return "DELETE FROM " + ns.rawMessages() + " WHERE tenant = ? AND topic = ? AND partition_key = '' AND " + oc + " IN (" +
			strings.TrimSuffix(strings.Repeat("?, ", n), ", ") + ")"
	}
	// Prepared before any transaction: SQLite's one write connection
	// cannot prepare on the pool while a transaction holds it.
	selStmt, err := stmts.get(ctx, sel)
	if err != nil {
		return rep{}, err
	}
	del100, err := stmts.get(ctx, del(100))
	if err != nil {
		return rep{}, err
	}
	countLeft := "SELECT COUNT(*) FROM " + ns.rawMessages() + " WHERE tenant = ? AND topic = ? AND partition_key = ''"
	rec := newRecorder(p.Messages, len(ns.tenants))
	rec.unordered = true
	// claimBatch claims, records and deletes up to 100 rows of tenant; it
	// reports how many.
	claimBatch := func(tenant string) (int, error) {
		tx, err := e.beginWrite(ctx)
		if err != nil {
			return 0, err
		}
		defer tx.Rollback()
		rows, err := tx.StmtContext(ctx, selStmt).QueryContext(ctx, tenant, ns.topic)
		if err != nil {
			return 0, err
		}
		var offsets []any
		var claimed []event
		for rows.Next() {
			var off int64
			var body []byte
			if err := rows.Scan(&off, &body); err != nil {
				rows.Close()
				return 0, err
			}
			seq, _, _, err := parsePayload(body)
			if err != nil {
				rows.Close()
				return 0, err
			}
			claimed = append(claimed, event{tenant: tenant, seq: seq})
			offsets = append(offsets, off)
		}
		rows.Close()
		if err := rows.Err(); err != nil || len(offsets) == 0 {
			return 0, err
		}
		args := append([]any{tenant, ns.topic}, offsets...)
		if len(offsets) == 100 {
			_, err = tx.StmtContext(ctx, del100).ExecContext(ctx, args...)
		} else { // the last, short batch
			_, err = tx.ExecContext(ctx, del(len(offsets)), args...)
		}
		if err != nil {
			return 0, err
		}
		if err := tx.Commit(); err != nil {
			return 0, err
		}
		for _, ev := range claimed { // delivered once committed
			ev.at = time.Now()
			rec.record(ev)
		}
		return len(offsets), nil
	}
	elapsed, err := runWorkers(p.Subscribers, func(w int) error {
		for i := range ns.tenants {
			tenant := ns.tenants[(w+i)%len(ns.tenants)]
			for {
				n, err := claimBatch(tenant)
				if err != nil && e.d.Retryable(err) {
					continue // a deadlock between workers: InnoDB rolled it back
				}
				if err != nil {
					return fmt.Errorf("raw claim tenant %s: %w", tenant, err)
				}
				if n == 0 {
					// SKIP LOCKED also finds nothing while the rows left
					// are another worker's: stop only when none is left.
					var left int
					if err := e.d.DB().QueryRowContext(ctx, countLeft, tenant, ns.topic).Scan(&left); err != nil {
						return fmt.Errorf("raw claim tenant %s: %w", tenant, err)
					}
					if left == 0 {
						break
					}
					time.Sleep(time.Millisecond)
				}
			}
		}
		return nil
	})
	if err != nil {
		return rep{}, err
	}
	return rec.rep(elapsed), nil
}

// beginWrite begins a transaction as shardq's writes do (the driver's
// BeginWrite), as the *sql.Tx the baselines prepare statements on.
func (e *env) beginWrite(ctx context.Context) (*sql.Tx, error) {
	tx, err := e.d.BeginWrite(ctx)
	if err != nil {
		return nil, err
	}
	return tx.(*sql.Tx), nil
}
