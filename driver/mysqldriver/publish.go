// SPDX-License-Identifier: Apache-2.0

package mysqldriver

import (
	"context"
	"database/sql"
	"fmt"
	"sync"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/sqlcommon"
)

// Statement size bounds: at most maxInsertRows rows, and at most
// maxInsertBytes of statement text (sqlcommon.StatementBytes, an upper
// bound) or the server's max_allowed_packet less packetHeadroom, whichever
// is smaller.
const (
	maxInsertRows  = 500
	maxInsertBytes = 4 << 20
	packetHeadroom = 64 << 10
)

// InsertMessages appends msgs in tx. Per tenant (one shard on Vitess):
//
//  1. lock the head row of every partition written, in key order, creating
//     missing ones (INSERT ... ON DUPLICATE KEY UPDATE takes the row lock);
//  2. insert the messages in multi-row INSERTs; offsets come from
//     AUTO_INCREMENT, consecutive within one statement (LAST_INSERT_ID()
//     is the first, spaced by auto_increment_increment);
//  3. only if the unique key (tenant, topic, partition_key, id) reports a
//     duplicate: read the stored offsets of that statement's messages with
//     a locking read (the latest committed rows, whatever the caller's
//     isolation level), mark them Duplicate, insert the others;
//  4. advance the head rows.
//
// The statements are sqlcommon's (publishsql.go); the order and the
// offsets' arithmetic are MySQL's.
//
// Because step 1 holds the head rows until commit, no other transaction
// inserts into these partitions meanwhile: step 3 cannot race, and a later
// commit never holds a lower offset than an earlier one, so a reader's
// cursor cannot pass a gap that may still fill. Locking in sorted order keeps
// two batches from waiting on each other in a cycle.
func (d *Driver) InsertMessages(ctx context.Context, tx driver.DBTX, msgs []*driver.InsertMessage) error {
	if len(msgs) == 0 {
		return nil
	}
	if len(msgs) == 1 && driver.IsRerunnable(ctx) && d.server.insertSelect.Load() && d.heads.has(msgs[0]) {
		if done, err := d.insertOne(ctx, tx, msgs[0]); done || err != nil {
			return err
		}
	}
	b := sqlcommon.Plan(msgs)
	err := b.ByTenant(func(tenant string, groups []*sqlcommon.Group) error {
		if err := d.LockHeads(ctx, tx, tenant, groups); err != nil {
			return err
		}
		for _, g := range groups {
			for _, k := range g.Keys {
				d.heads.add(g.Tenant, g.Topic, k)
			}
		}
		for _, g := range groups {
			if err := d.insertGroup(ctx, tx, g); err != nil {
				return fmt.Errorf("tenant %q topic %q: %w", g.Tenant, g.Topic, err)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	b.Finish()
	return nil
}

// insertOne appends m alone in one statement that locks its head row and
// inserts (steps 1 and 2 above), then advances the head: one round trip
// fewer than the general path, for the lone publisher's transaction. It
// reports false, having changed nothing but perhaps the head row's lock,
// when the general path must run: the head row is gone (retention removed
// it), or m's identity is stored (the duplicate key rolled the statement
// back).
//
// A locking read of a missing row takes a gap lock, and two publishers
// creating one partition that way would each wait for the other's gap
// before their inserts. So it runs only for a partition whose head row
// this driver locked before (heads; the row may still have gone since,
// by a rollback or retention: then the rare deadlock is possible), and
// only in a transaction its caller runs again on a deadlock
// (driver.Rerunnable: Publish's; a caller's PublishTx, dead-letter copies
// and the other writers take the general path). Through vtgate an INSERT
// ... SELECT is not one statement on one shard, and under the STATEMENT
// binary-log format a replica would draw other offsets for it: the
// general path runs there.
func (d *Driver) insertOne(ctx context.Context, tx driver.DBTX, m *driver.InsertMessage) (bool, error) {
	m.Offset, m.Duplicate = 0, false
	res, ok, err := d.InsertLocked(ctx, tx, m)
	if err == nil && !ok {
		d.heads.remove(m)
	}
	if isDuplicateKey(err) || (err == nil && !ok) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("tenant %q topic %q: %w", m.Tenant, m.Topic, err)
	}
	if m.Offset, err = res.LastInsertId(); err != nil {
		return false, fmt.Errorf("tenant %q topic %q: insert message: %w", m.Tenant, m.Topic, err)
	}
	g := &sqlcommon.Group{Tenant: m.Tenant, Topic: m.Topic, Msgs: []*driver.InsertMessage{m}, Keys: []string{m.PartitionKey}}
	if err := d.AdvanceHeads(ctx, tx, g, map[string]int64{m.PartitionKey: m.Offset}); err != nil {
		return false, fmt.Errorf("tenant %q topic %q: %w", m.Tenant, m.Topic, err)
	}
	return true, nil
}

func (d *Driver) insertGroup(ctx context.Context, tx driver.DBTX, g *sqlcommon.Group) error {
	limit := maxInsertBytes
	if p := int(d.server.packet.Load()); p > 0 {
		limit = min(limit, max(p-packetHeadroom, p/2))
	}
	for _, chunk := range sqlcommon.Chunks(g.Msgs, maxInsertRows, limit) {
		err := d.insertChunk(ctx, tx, g, chunk)
		if isDuplicateKey(err) {
			err = d.insertNew(ctx, tx, g, chunk)
		}
		if err != nil {
			return err
		}
	}
	heads := map[string]int64{}
	for _, m := range g.Msgs {
		if !m.Duplicate {
			heads[m.PartitionKey] = max(heads[m.PartitionKey], m.Offset)
		}
	}
	return d.AdvanceHeads(ctx, tx, g, heads)
}

// insertNew handles a chunk that hit the unique key: the statement was
// rolled back, so look up which identities are stored and insert the rest.
func (d *Driver) insertNew(ctx context.Context, tx driver.DBTX, g *sqlcommon.Group, chunk []*driver.InsertMessage) error {
	if err := d.MarkStored(ctx, tx, g, chunk); err != nil {
		return err
	}
	var fresh []*driver.InsertMessage
	for _, m := range chunk {
		if !m.Duplicate {
			fresh = append(fresh, m)
		}
	}
	if len(fresh) == 0 {
		return nil
	}
	return d.insertChunk(ctx, tx, g, fresh)
}

// insertChunk inserts msgs in one statement and sets their offsets.
func (d *Driver) insertChunk(ctx context.Context, tx driver.DBTX, g *sqlcommon.Group, msgs []*driver.InsertMessage) error {
	res, err := d.InsertRows(ctx, tx, g, msgs)
	if err != nil {
		return err // on a duplicate key, the caller looks the ids up
	}
	first, err := res.LastInsertId()
	if err != nil {
		return fmt.Errorf("insert messages: %w", err)
	}
	if n, err := res.RowsAffected(); err != nil || n != int64(len(msgs)) {
		return fmt.Errorf("insert messages: %d rows affected, want %d (%v)", n, len(msgs), err)
	}
	// Read with every connection's session check; a caller's transaction
	// on a pool of its own may find it cold, and then it is read on the
	// driver's pool, never inside the caller's transaction (through
	// vtgate, a system-variable read there was seen to hang).
	step, err := d.autoIncrementStep(ctx, d.db)
	if err != nil {
		return err
	}
	for i, m := range msgs {
		m.Offset = first + int64(i)*step
	}
	return nil
}

// autoIncrementStep reads auto_increment_increment once: the spacing of the
// AUTO_INCREMENT values one multi-row INSERT receives (1 unless the server
// is set up for multi-primary replication). max_allowed_packet, which
// bounds a statement's size, comes with it.
func (d *Driver) autoIncrementStep(ctx context.Context, q *sql.DB) (int64, error) {
	if v := d.server.step.Load(); v > 0 {
		return v, nil
	}
	var v, packet int64
	if err := q.QueryRowContext(ctx, "SELECT @@auto_increment_increment, @@max_allowed_packet").Scan(&v, &packet); err != nil {
		return 0, fmt.Errorf("read auto_increment_increment and max_allowed_packet: %w", err)
	}
	if err := d.server.store(v, packet); err != nil {
		return 0, err
	}
	return v, nil
}

// knownHeads remembers partitions whose head row this driver locked: the
// partitions a lone publish may lock in its insert (insertOne). It holds
// at most knownHeadEntries; when full it starts over, and a partition it
// forgot takes the general path once.
type knownHeads struct {
	mu sync.Mutex
	m  map[[3]string]struct{}
}

// knownHeadEntries bounds knownHeads.
const knownHeadEntries = 10_000

func (h *knownHeads) has(m *driver.InsertMessage) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.m[[3]string{m.Tenant, m.Topic, m.PartitionKey}]
	return ok
}

func (h *knownHeads) add(tenant, topic, key string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.m == nil || len(h.m) >= knownHeadEntries {
		h.m = make(map[[3]string]struct{})
	}
	h.m[[3]string{tenant, topic, key}] = struct{}{}
}

func (h *knownHeads) remove(m *driver.InsertMessage) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.m, [3]string{m.Tenant, m.Topic, m.PartitionKey})
}
