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
	// PreparedListMax is the longest list (List or Rows) of a statement
	// that is prepared; a longer one runs unprepared. 0: no bound.
	PreparedListMax int
}

// statements is every statement of the package, written once per syntax
// from the tables of each mechanism.
type statements struct {
	lease     leaseSQL
	group     groupSQL
	deferred  deferredSQL
	publish   publishSQL
	admin     adminSQL
	lifecycle lifecycleSQL
	token     tokenSQL
	tenant    tenantSQL
}

func newStatements(s Syntax) *statements {
	return &statements{lease: newLeaseSQL(s), group: newGroupSQL(s), deferred: newDeferredSQL(s), publish: newPublishSQL(s), admin: newAdminSQL(s), lifecycle: newLifecycleSQL(s), token: newTokenSQL(s), tenant: newTenantSQL(s)}
}

// FetchAfter reads up to limit messages of one partition after offset
// after, in offset order, from the index that leads with the partition.
func (d *Store) FetchAfter(ctx context.Context, p driver.TopicPartition, after int64, limit int) ([]driver.Message, error) {
	tenant, topic, partitionKey := p.Tenant, p.Topic, p.PartitionKey
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

// CountBetween counts one partition's messages in (after, upTo].
func (d *Store) CountBetween(ctx context.Context, p driver.TopicPartition, after, upTo int64) (int64, error) {
	var n int64
	err := d.queryRow(ctx, d.Read, d.sql().admin.countBetween, Args{"tenant": p.Tenant, "topic": p.Topic, "key": p.PartitionKey, "after": after, "up_to": upTo}).Scan(&n)
	if err != nil {
		return 0, d.Wrap(fmt.Sprintf("count tenant %q topic %q partition %q between offsets %d and %d", p.Tenant, p.Topic, p.PartitionKey, after, upTo), err)
	}
	return n, nil
}

// FetchWithin reads what FetchAfter would, but no more than budget bytes
// of payload and headers (the first message whatever its size), in one
// statement when the messages are small: each row's body comes only when
// the row alone is within budget/limit, and the larger rows that fit are
// read by offset afterwards. truncated reports a message left out.
func (d *Store) FetchWithin(ctx context.Context, in driver.FetchWithinParams) ([]driver.Message, bool, error) {
	p, after, limit, budget := in.Partition, in.After, in.Limit, in.Budget
	tenant, topic, partitionKey := p.Tenant, p.Topic, p.PartitionKey
	op := fmt.Sprintf("fetch tenant %q topic %q partition %q within %d bytes", tenant, topic, partitionKey, budget)
	key := Args{"tenant": tenant, "topic": topic, "key": partitionKey}
	rows, err := d.query(ctx, d.Read, d.sql().admin.fetchWithin, key.with(Args{"after": after, "limit": limit, "small": max(budget/int64(limit), 1)}))
	if err != nil {
		return nil, false, d.Wrap(op, err)
	}
	var out []driver.Message
	var withheld []any
	var used int64
	truncated := false
	for rows.Next() {
		m := driver.Message{Tenant: tenant, Topic: topic, PartitionKey: partitionKey}
		size, held, err := d.scanSized(rows, &m, op)
		if err != nil {
			rows.Close()
			return nil, false, err
		}
		if len(out) > 0 && used+size > budget {
			truncated = true
			break
		}
		used += size
		if held {
			withheld = append(withheld, m.Offset)
		}
		out = append(out, m)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, false, d.Wrap(op, err)
	}
	if len(withheld) == 0 {
		return out, truncated, nil
	}
	bodies := map[int64]driver.Message{}
	rows, err = d.query(ctx, d.Read, d.sql().admin.fetchAt, key.with(Args{"offsets": List(withheld)}))
	if err != nil {
		return nil, false, d.Wrap(op, err)
	}
	defer rows.Close()
	for rows.Next() {
		m := driver.Message{Tenant: tenant, Topic: topic, PartitionKey: partitionKey}
		if err := d.scanMessage(rows, &m, op); err != nil {
			return nil, false, err
		}
		bodies[m.Offset] = m
	}
	if err := rows.Err(); err != nil {
		return nil, false, d.Wrap(op, err)
	}
	for i, m := range out {
		if b, ok := bodies[m.Offset]; ok {
			out[i] = b
		} else if m.Headers == nil {
			return out[:i], truncated, nil // deleted meanwhile (retention): deliver what came before it
		}
	}
	return out, truncated, nil
}

// scanSized reads the sizedColumns into m and returns the row's size and
// whether its headers and payload were left out.
func (d *Store) scanSized(rows *sql.Rows, m *driver.Message, op string) (size int64, withheld bool, err error) {
	var headers []byte
	var created, notBefore any
	if err := rows.Scan(&m.Offset, &m.ID, &size, &headers, &m.Payload, &created, &notBefore); err != nil {
		return 0, false, fmt.Errorf("%s: %w", op, err)
	}
	if m.NotBefore, err = d.decodeNotBefore(notBefore); err != nil {
		return 0, false, fmt.Errorf("%s offset %d: not_before: %w", op, m.Offset, err)
	}
	if headers == nil {
		if m.CreatedAt, err = d.DecodeTime(created); err != nil {
			return 0, false, fmt.Errorf("%s offset %d: %w", op, m.Offset, err)
		}
		m.Payload = nil
		return size, true, nil
	}
	*m, err = d.decodeMessage(*m, headers, created, op)
	return size, false, err
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
