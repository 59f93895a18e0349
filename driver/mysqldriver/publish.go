// SPDX-License-Identifier: Apache-2.0

package mysqldriver

import (
	"context"
	"database/sql"
	"fmt"

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
	b := sqlcommon.Plan(msgs)
	err := b.ByTenant(func(tenant string, groups []*sqlcommon.Group) error {
		if err := d.LockHeads(ctx, tx, tenant, groups); err != nil {
			return err
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
