// SPDX-License-Identifier: Apache-2.0

package sqlcommon

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/shardq/shardq/driver"
)

// Dialect is what differs between the SQL drivers in the statements they
// share.
type Dialect struct {
	// Offset is the offset column, quoted: `offset` or "offset".
	Offset string
	// Wrap names an operation and maps the database's errors (a missing
	// table becomes driver.ErrNotMigrated).
	Wrap func(op string, err error) error
	// EncodeTime and DecodeTime convert created_at to and from the
	// column's type.
	EncodeTime func(time.Time) any
	DecodeTime func(src any) (time.Time, error)
	// LockClause ends a SELECT that must lock the rows it reads inside a
	// write transaction (" FOR UPDATE"; "" on SQLite, whose write
	// transaction already excludes every other writer).
	LockClause string
	// ShareLockClause ends a SELECT that must read the latest committed
	// row, not the transaction's snapshot, and keep it from changing until
	// commit (" LOCK IN SHARE MODE"; "" on SQLite).
	ShareLockClause string
	// SkipLocked ends a SELECT that locks the rows it returns and skips
	// rows other transactions hold (" FOR UPDATE SKIP LOCKED"; "" on
	// SQLite, whose writers never overlap).
	SkipLocked string
	// Greatest is the two-argument maximum function.
	Greatest string
	// Excluded names the value an upsert tried to insert into col.
	Excluded func(col string) string
	// Upsert ends an INSERT: on a conflict over conflictCols, apply set
	// (an assignment list using Excluded), or do nothing when set is "".
	Upsert func(conflictCols, set string) string
	// UseIndex follows a table name in FROM to make the planner use the
	// named index (" FORCE INDEX (i)", " INDEXED BY i"), where statistics
	// of a table that grows and shrinks quickly would mislead it.
	UseIndex func(index string) string
	// PartitionOrder is the UseIndex of queue_messages' index that leads
	// with (tenant, topic, partition_key, offset): reads of a partition
	// after a cursor must range over it, not over the id index that a
	// fresh table's statistics may prefer (seen: a read of 8 rows after
	// offset 8480 examined 8488).
	PartitionOrder string
	// DeleteLimit reports DELETE … ORDER BY … LIMIT support (MySQL);
	// without it a bounded delete selects its rows in a subquery.
	DeleteLimit bool
}

// InsertMessages returns a multi-row INSERT of msgs (all of group g) into
// queue_messages and its arguments; the offset is left to the database.
func (d Dialect) InsertMessages(g *Group, msgs []*driver.InsertMessage) (string, []any, error) {
	var sb strings.Builder
	args := make([]any, 0, 7*len(msgs))
	sb.WriteString("INSERT INTO queue_messages (tenant, topic, partition_key, id, headers, payload, created_at) VALUES ")
	for i, m := range msgs {
		if i > 0 {
			sb.WriteString(", ")
		}
		sb.WriteString("(?, ?, ?, ?, ?, ?, ?)")
		h, err := EncodeHeaders(m.Headers)
		if err != nil {
			return "", nil, err
		}
		payload := m.Payload
		if payload == nil {
			payload = []byte{} // NOT NULL column; an empty payload is legal
		}
		args = append(args, g.Tenant, g.Topic, m.PartitionKey, m.ID, string(h), payload, d.EncodeTime(m.CreatedAt))
	}
	return sb.String(), args, nil
}

// FetchAfter reads up to limit messages of one partition after offset
// after, in offset order, from the index that leads with the partition.
func (d *Store) FetchAfter(ctx context.Context, tenant, topic, partitionKey string, after int64, limit int) ([]driver.Message, error) {
	op := fmt.Sprintf("fetch tenant %q topic %q partition %q", tenant, topic, partitionKey)
	rows, err := d.Read.QueryContext(ctx, "SELECT "+d.Offset+", id, headers, payload, created_at FROM queue_messages"+d.PartitionOrder+" "+
		"WHERE tenant = ? AND topic = ? AND partition_key = ? AND "+d.Offset+" > ? ORDER BY "+d.Offset+" LIMIT ?",
		tenant, topic, partitionKey, after, limit)
	if err != nil {
		return nil, d.Wrap(op, err)
	}
	defer rows.Close()
	var out []driver.Message
	for rows.Next() {
		m := driver.Message{Tenant: tenant, Topic: topic, PartitionKey: partitionKey}
		if err := d.scanMessage(rows, &m, op); err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	return out, nil
}

// scanMessage reads the columns offset, id, headers, payload, created_at.
func (d *Store) scanMessage(rows *sql.Rows, m *driver.Message, op string) error {
	var headers []byte
	var created any
	if err := rows.Scan(&m.Offset, &m.ID, &headers, &m.Payload, &created); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	var err error
	*m, err = d.decodeMessage(*m, headers, created, op)
	return err
}

// decodeMessage decodes the stored headers and created_at into m.
func (d *Store) decodeMessage(m driver.Message, headers []byte, created any, op string) (driver.Message, error) {
	var err error
	if m.Headers, err = DecodeHeaders(headers); err != nil {
		return m, fmt.Errorf("%s offset %d: %w", op, m.Offset, err)
	}
	if m.CreatedAt, err = d.DecodeTime(created); err != nil {
		return m, fmt.Errorf("%s offset %d: %w", op, m.Offset, err)
	}
	if m.Payload == nil {
		m.Payload = []byte{}
	}
	return m, nil
}
