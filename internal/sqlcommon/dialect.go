// SPDX-License-Identifier: Apache-2.0

package sqlcommon

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/shardq/shardq/driver"
)

// Dialect is what differs between the SQL drivers: the syntax their
// statements are written in, error mapping and the time column's type.
type Dialect struct {
	Syntax Syntax
	// Wrap names an operation and maps the database's errors (a missing
	// table becomes driver.ErrNotMigrated).
	Wrap func(op string, err error) error
	// EncodeTime and DecodeTime convert time columns to and from the
	// column's type.
	EncodeTime func(time.Time) any
	DecodeTime func(src any) (time.Time, error)
	// PreparedStatements bounds the prepared statements cached per pool,
	// by text (texts differ by the length of their lists and rows); past
	// it a statement is prepared for one use. 0 caches none.
	PreparedStatements int
}

// statements is every statement of the package, written once per syntax
// from the tables of each mechanism.
type statements struct {
	lease     leaseSQL
	group     groupSQL
	publish   publishSQL
	admin     adminSQL
	lifecycle lifecycleSQL
	token     tokenSQL
}

func newStatements(s Syntax) *statements {
	return &statements{lease: newLeaseSQL(s), group: newGroupSQL(s), publish: newPublishSQL(s), admin: newAdminSQL(s), lifecycle: newLifecycleSQL(s), token: newTokenSQL(s)}
}

// FetchAfter reads up to limit messages of one partition after offset
// after, in offset order, from the index that leads with the partition.
func (d *Store) FetchAfter(ctx context.Context, tenant, topic, partitionKey string, after int64, limit int) ([]driver.Message, error) {
	op := fmt.Sprintf("fetch tenant %q topic %q partition %q", tenant, topic, partitionKey)
	rows, err := d.query(ctx, d.Read, d.sql().admin.fetch, Args{"tenant": tenant, "topic": topic, "key": partitionKey, "after": after, "limit": limit})
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

// MessageSizes reads the sizes of up to limit messages of one partition
// after offset after, in offset order.
func (d *Store) MessageSizes(ctx context.Context, tenant, topic, partitionKey string, after int64, limit int) ([]driver.MessageSize, error) {
	op := fmt.Sprintf("read message sizes of tenant %q topic %q partition %q", tenant, topic, partitionKey)
	rows, err := d.query(ctx, d.Read, d.sql().admin.sizes, Args{"tenant": tenant, "topic": topic, "key": partitionKey, "after": after, "limit": limit})
	if err != nil {
		return nil, d.Wrap(op, err)
	}
	defer rows.Close()
	var out []driver.MessageSize
	for rows.Next() {
		var m driver.MessageSize
		if err := rows.Scan(&m.Offset, &m.Bytes); err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		out = append(out, m)
	}
	if err := rows.Err(); err != nil {
		return nil, d.Wrap(op, err)
	}
	return out, nil
}

// scanMessage reads the columns offset, id, headers, payload, created_at,
// not_before.
func (d *Store) scanMessage(rows *sql.Rows, m *driver.Message, op string) error {
	var headers []byte
	var created, notBefore any
	if err := rows.Scan(&m.Offset, &m.ID, &headers, &m.Payload, &created, &notBefore); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	var err error
	if *m, err = d.decodeMessage(*m, headers, created, op); err != nil {
		return err
	}
	m.NotBefore, err = d.decodeNotBefore(notBefore)
	if err != nil {
		return fmt.Errorf("%s offset %d: not_before: %w", op, m.Offset, err)
	}
	return nil
}

// encodeNotBefore is t as a not_before value: NULL when zero.
func (d *Store) encodeNotBefore(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return d.EncodeTime(t)
}

// decodeNotBefore reads a not_before column (NULL: zero).
func (d *Store) decodeNotBefore(v any) (time.Time, error) {
	if v == nil {
		return time.Time{}, nil
	}
	return d.DecodeTime(v)
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
