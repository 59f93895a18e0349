package sqlcommon

import (
	"context"
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
	// Greatest is the two-argument maximum function.
	Greatest string
	// Excluded names the value an upsert tried to insert into col.
	Excluded func(col string) string
	// Upsert ends an INSERT: on a conflict over conflictCols, apply set
	// (an assignment list using Excluded), or do nothing when set is "".
	Upsert func(conflictCols, set string) string
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
	rows, err := d.Read.QueryContext(ctx, "SELECT "+d.Offset+", id, headers, payload, created_at FROM queue_messages "+
		"WHERE tenant = ? AND topic = ? AND partition_key = ? AND "+d.Offset+" > ? ORDER BY "+d.Offset+" LIMIT ?",
		tenant, topic, partitionKey, after, limit)
	if err != nil {
		return nil, d.Wrap(op, err)
	}
	defer rows.Close()
	var out []driver.Message
	for rows.Next() {
		m := driver.Message{Tenant: tenant, Topic: topic, PartitionKey: partitionKey}
		var headers []byte
		var created any
		if err := rows.Scan(&m.Offset, &m.ID, &headers, &m.Payload, &created); err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		if m.Headers, err = DecodeHeaders(headers); err != nil {
			return nil, fmt.Errorf("%s offset %d: %w", op, m.Offset, err)
		}
		if m.CreatedAt, err = d.DecodeTime(created); err != nil {
			return nil, fmt.Errorf("%s offset %d: %w", op, m.Offset, err)
		}
		if m.Payload == nil {
			m.Payload = []byte{}
		}
		out = append(out, m)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	return out, nil
}
