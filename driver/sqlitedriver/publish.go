// SPDX-License-Identifier: Apache-2.0

package sqlitedriver

import (
	"context"
	"fmt"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/sqlcommon"
)

const (
	maxInsertRows  = 500 // 7 variables a row, far below SQLite's 32766
	maxInsertBytes = 4 << 20
)

// InsertMessages appends msgs in tx. The transaction holds SQLite's write
// lock (BEGIN IMMEDIATE), so there is one writer at a time and the offsets
// (AUTOINCREMENT rowids) it draws increase in commit order.
func (d *Driver) InsertMessages(ctx context.Context, tx driver.DBTX, msgs []*driver.InsertMessage) error {
	if len(msgs) == 0 {
		return nil
	}
	b := sqlcommon.Plan(msgs)
	for _, g := range b.Groups {
		if err := d.insertGroup(ctx, tx, g); err != nil {
			return fmt.Errorf("tenant %q topic %q: %w", g.Tenant, g.Topic, err)
		}
	}
	b.Finish()
	return nil
}

// insertGroup inserts the messages, skipping stored identities; RETURNING
// names the rows that went in and their offsets (rowids). The others were
// stored before and get their stored offset.
func (d *Driver) insertGroup(ctx context.Context, tx driver.DBTX, g *sqlcommon.Group) error {
	inserted := make(map[[2]string]int64, len(g.Msgs))
	for _, chunk := range sqlcommon.Chunks(g.Msgs, maxInsertRows, maxInsertBytes) {
		if err := d.InsertFresh(ctx, tx, g, chunk, inserted); err != nil {
			return err
		}
	}
	heads := map[string]int64{}
	var stored []*driver.InsertMessage
	for _, m := range g.Msgs {
		if off, ok := inserted[[2]string{m.PartitionKey, m.ID}]; ok {
			m.Offset = off
			heads[m.PartitionKey] = max(heads[m.PartitionKey], off)
		} else {
			stored = append(stored, m)
		}
	}
	for _, chunk := range sqlcommon.Chunks(stored, maxInsertRows, maxInsertBytes) {
		if err := d.MarkStored(ctx, tx, g, chunk); err != nil {
			return err
		}
	}
	for _, m := range stored {
		if !m.Duplicate {
			return fmt.Errorf("partition %q id %q: neither inserted nor stored", m.PartitionKey, m.ID)
		}
	}
	return d.AdvanceHeads(ctx, tx, g, heads)
}
