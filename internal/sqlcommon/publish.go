// SPDX-License-Identifier: Apache-2.0

package sqlcommon

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/shardq/shardq/driver"
)

// The statements a driver's InsertMessages runs. Each driver keeps its own
// order of them (MySQL locks head rows first and draws offsets from
// AUTO_INCREMENT; SQLite has a single writer and RETURNING), but none
// writes SQL of its own.

// LockHeads creates, or locks, the head row of every partition groups (all
// of tenant) write, in key order.
func (d *Store) LockHeads(ctx context.Context, tx driver.DBTX, tenant string, groups []*Group) error {
	now := d.EncodeTime(time.Now())
	var rows Rows
	for _, g := range groups {
		for _, k := range g.Keys {
			rows = append(rows, []any{tenant, g.Topic, k, 0, now, now})
		}
	}
	if _, err := d.exec(ctx, tx, d.sql().publish.lockHeads, Args{"rows": rows}); err != nil {
		return d.Wrap(fmt.Sprintf("tenant %q: lock partition heads", tenant), err)
	}
	return nil
}

// messageRows are msgs as rows of queue_messages.
func (d *Store) messageRows(g *Group, msgs []*driver.InsertMessage) (Rows, error) {
	rows := make(Rows, len(msgs))
	for i, m := range msgs {
		h, err := EncodeHeaders(m.Headers)
		if err != nil {
			return nil, err
		}
		payload := m.Payload
		if payload == nil {
			payload = []byte{} // NOT NULL column; an empty payload is legal
		}
		rows[i] = []any{g.Tenant, g.Topic, m.PartitionKey, m.ID, string(h), payload, d.EncodeTime(m.CreatedAt), d.encodeNotBefore(m.NotBefore)}
	}
	return rows, nil
}

// InsertRows inserts msgs (all of g) in one statement; the database draws
// their offsets. A stored identity fails the whole statement with the
// database's duplicate-key error, wrapped.
func (d *Store) InsertRows(ctx context.Context, tx driver.DBTX, g *Group, msgs []*driver.InsertMessage) (sql.Result, error) {
	rows, err := d.messageRows(g, msgs)
	if err != nil {
		return nil, err
	}
	res, err := d.exec(ctx, tx, d.sql().publish.insert, Args{"rows": rows})
	if err != nil {
		return nil, d.Wrap("insert messages", err)
	}
	return res, nil
}

// InsertLocked inserts m alone while it locks m's partition head row, in
// one statement (MySQL): the lock comes before the row's AUTO_INCREMENT
// value, as LockHeads before InsertRows. It reports whether the row went
// in; it did not when the head row does not exist yet.
func (d *Store) InsertLocked(ctx context.Context, tx driver.DBTX, m *driver.InsertMessage) (sql.Result, bool, error) {
	g := &Group{Tenant: m.Tenant, Topic: m.Topic}
	rows, err := d.messageRows(g, []*driver.InsertMessage{m})
	if err != nil {
		return nil, false, err
	}
	r := rows[0]
	res, err := d.exec(ctx, tx, d.sql().publish.insertLocked, Args{"tenant": r[0], "topic": r[1], "key": r[2], "id": r[3],
		"headers": r[4], "payload": r[5], "created_at": r[6], "not_before": r[7]})
	if err != nil {
		return nil, false, d.Wrap("insert message", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return nil, false, d.Wrap("insert message", err)
	}
	return res, n == 1, nil
}

// InsertFresh inserts the msgs (all of g) whose identity is not stored
// and returns the offsets they received, by (partition key, id). SQLite
// only: it needs INSERT ... RETURNING.
func (d *Store) InsertFresh(ctx context.Context, tx driver.DBTX, g *Group, msgs []*driver.InsertMessage, into map[[2]string]int64) error {
	stmt := d.sql().publish.insertFresh
	if stmt == "" {
		return fmt.Errorf("insert messages: %v has no INSERT ... RETURNING", d.Syntax)
	}
	rows, err := d.messageRows(g, msgs)
	if err != nil {
		return err
	}
	res, err := d.query(ctx, tx, stmt, Args{"rows": rows})
	if err != nil {
		return d.Wrap("insert messages", err)
	}
	defer res.Close()
	for res.Next() {
		var key, id string
		var off int64
		if err := res.Scan(&key, &id, &off); err != nil {
			return fmt.Errorf("insert messages: %w", err)
		}
		into[[2]string{key, id}] = off
	}
	if err := res.Err(); err != nil {
		return d.Wrap("insert messages", err)
	}
	return nil
}

// MarkStored marks the msgs (all of g) that are stored already as
// Duplicate, with their stored offsets. The read is current (locking on
// MySQL): the latest committed rows, whatever the caller's isolation
// level and snapshot.
func (d *Store) MarkStored(ctx context.Context, tx driver.DBTX, g *Group, msgs []*driver.InsertMessage) error {
	idx := make(map[[2]string]*driver.InsertMessage, len(msgs))
	ids := make(Rows, len(msgs))
	for i, m := range msgs {
		idx[[2]string{m.PartitionKey, m.ID}] = m
		ids[i] = []any{m.PartitionKey, m.ID}
	}
	rows, err := d.query(ctx, tx, d.sql().publish.stored, Args{"tenant": g.Tenant, "topic": g.Topic, "ids": ids})
	if err != nil {
		return d.Wrap("look up message ids", err)
	}
	defer rows.Close()
	for rows.Next() {
		var key, id string
		var off int64
		if err := rows.Scan(&key, &id, &off); err != nil {
			return fmt.Errorf("look up message ids: %w", err)
		}
		if m := idx[[2]string{key, id}]; m != nil {
			m.Offset, m.Duplicate = off, true
		}
	}
	if err := rows.Err(); err != nil {
		return d.Wrap("look up message ids", err)
	}
	return nil
}

// AdvanceHeads raises the head rows of g's partitions to heads (partition
// key to its highest new offset), creating missing rows, in key order.
func (d *Store) AdvanceHeads(ctx context.Context, tx driver.DBTX, g *Group, heads map[string]int64) error {
	if len(heads) == 0 {
		return nil
	}
	now := d.EncodeTime(time.Now())
	rows := make(Rows, 0, len(heads))
	for _, k := range g.Keys { // sorted, matching the lock order
		if h, ok := heads[k]; ok {
			rows = append(rows, []any{g.Tenant, g.Topic, k, h, now, now})
		}
	}
	if _, err := d.exec(ctx, tx, d.sql().publish.advanceHeads, Args{"rows": rows}); err != nil {
		return d.Wrap("advance partition heads", err)
	}
	return nil
}
