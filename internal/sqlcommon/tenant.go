// SPDX-License-Identifier: Apache-2.0

package sqlcommon

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/shardq/shardq/driver"
)

// TenantRows counts the tenant's rows in each of TenantTables.
func (d *Store) TenantRows(ctx context.Context, tenant string) ([]driver.TableRows, error) {
	st := &d.sql().tenant
	out := make([]driver.TableRows, len(TenantTables))
	for i, t := range TenantTables {
		out[i].Table = t
		if err := d.queryRow(ctx, d.Read, st.count[i], Args{"tenant": tenant}).Scan(&out[i].Rows); err != nil {
			return nil, d.Wrap(fmt.Sprintf("count the rows of tenant %q in %s", tenant, t), err)
		}
	}
	return out, nil
}

// DeleteTenantBatch deletes up to limit of the tenant's rows from the
// first of TenantTables that has any, in a statement of its own, and
// reports which and how many; 0 rows means none is left.
func (d *Store) DeleteTenantBatch(ctx context.Context, tenant string, limit int) (string, int64, error) {
	st := &d.sql().tenant
	for i, t := range TenantTables {
		res, err := d.exec(ctx, d.Write, st.drop[i], Args{"tenant": tenant, "limit": limit})
		if err != nil {
			return t, 0, d.Wrap(fmt.Sprintf("delete rows of tenant %q from %s", tenant, t), err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return t, 0, fmt.Errorf("delete rows of tenant %q from %s: %w", tenant, t, err)
		}
		if n > 0 {
			if t == "queue_consumer_groups" {
				d.forgetTenant(tenant)
			}
			return t, n, nil
		}
	}
	d.forgetTenant(tenant)
	return "", 0, nil
}

// forgetTenant drops what the Store remembers of the tenant's groups.
func (d *Store) forgetTenant(tenant string) {
	d.groupStarts.Range(func(k, _ any) bool {
		if k.([3]string)[0] == tenant {
			d.groupStarts.Delete(k)
		}
		return true
	})
	for _, m := range []*sync.Map{&d.busyClaims, &d.markRows} {
		m.Range(func(k, _ any) bool {
			if k.([3]string)[0] == tenant {
				m.Delete(k)
			}
			return true
		})
	}
}

// TenantLive lists the tenant's members with a heartbeat since since and
// counts its leases unexpired at now.
func (d *Store) TenantLive(ctx context.Context, tenant string, since, now time.Time) ([]string, int, error) {
	op := fmt.Sprintf("read whether tenant %q has live members", tenant)
	st := &d.sql().tenant
	rows, err := d.query(ctx, d.Read, st.liveMembers, Args{"tenant": tenant, "since": d.EncodeTime(since)})
	if err != nil {
		return nil, 0, d.Wrap(op, err)
	}
	defer rows.Close()
	var members []string
	for rows.Next() {
		var m string
		if err := rows.Scan(&m); err != nil {
			return nil, 0, fmt.Errorf("%s: %w", op, err)
		}
		members = append(members, m)
	}
	if err := rows.Err(); err != nil {
		return nil, 0, d.Wrap(op, err)
	}
	var leases int
	if err := d.queryRow(ctx, d.Read, st.liveLeases, Args{"tenant": tenant, "now": d.EncodeTime(now)}).Scan(&leases); err != nil {
		return nil, 0, d.Wrap(op, err)
	}
	return members, leases, nil
}

// TenantSettings reads the settings rows of those of tenants that have one.
// A schema behind the code (a new release's process ahead of its
// migration) reads what it has: on schema 10 no limits, before it no
// settings at all, so no tenant is suspended or limited there.
func (d *Store) TenantSettings(ctx context.Context, tenants []string) ([]driver.TenantSettings, error) {
	op := fmt.Sprintf("read the settings of tenants %q", tenants)
	if len(tenants) == 0 {
		return nil, nil
	}
	st := &d.sql().tenant
	limits := true
	rows, err := d.query(ctx, d.Read, st.settings, Args{"tenants": textList(tenants)})
	if err != nil && errors.Is(d.Wrap(op, err), driver.ErrNotMigrated) {
		limits = false
		rows, err = d.query(ctx, d.Read, st.settings10, Args{"tenants": textList(tenants)})
		if err != nil && errors.Is(d.Wrap(op, err), driver.ErrNotMigrated) {
			return nil, nil
		}
	}
	if err != nil {
		return nil, d.Wrap(op, err)
	}
	defer rows.Close()
	var out []driver.TenantSettings
	for rows.Next() {
		var ts driver.TenantSettings
		var suspended, updated any
		var minRet, maxRet int64
		l := &ts.Limits
		dest := []any{&ts.Tenant, &suspended, &updated}
		if limits {
			dest = append(dest, &l.PublishRate, &l.PublishByteRate, &l.MaxMessages, &l.MaxBytes, &l.MaxPartitions, &minRet, &maxRet)
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		l.MinRetention, l.MaxRetention = time.Duration(minRet)*time.Millisecond, time.Duration(maxRet)*time.Millisecond
		var err error
		if ts.SuspendedAt, err = d.decodeNotBefore(suspended); err == nil {
			ts.UpdatedAt, err = d.DecodeTime(updated)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		out = append(out, ts)
	}
	return out, d.wrapNil(op, rows.Err())
}

// SetTenantSuspended sets or clears the tenant's suspension.
func (d *Store) SetTenantSuspended(ctx context.Context, tenant string, suspended bool, now time.Time) error {
	var err error
	if suspended {
		_, err = d.exec(ctx, d.Write, d.sql().tenant.suspend, Args{"rows": Rows{{tenant, d.EncodeTime(now), d.EncodeTime(now)}}})
	} else {
		// A tenant without a row is not suspended: nothing to add.
		_, err = d.exec(ctx, d.Write, d.sql().tenant.resume, Args{"tenant": tenant, "now": d.EncodeTime(now)})
	}
	return d.wrapNil(fmt.Sprintf("set suspended=%t of tenant %q", suspended, tenant), err)
}

// SetTenantLimits stores the tenant's limits.
func (d *Store) SetTenantLimits(ctx context.Context, tenant string, l driver.TenantLimits, now time.Time) error {
	row := []any{tenant, d.EncodeTime(now), l.PublishRate, l.PublishByteRate, l.MaxMessages, l.MaxBytes, l.MaxPartitions,
		l.MinRetention.Milliseconds(), l.MaxRetention.Milliseconds()}
	_, err := d.exec(ctx, d.Write, d.sql().tenant.setLimits, Args{"rows": Rows{row}})
	return d.wrapNil(fmt.Sprintf("set the limits of tenant %q", tenant), err)
}

// ListTenants merges two ordered pages, of the tenants with head rows and
// of those with settings rows: a UNION would be one statement, but
// vtgate plans a scatter UNION with ORDER BY and LIMIT poorly.
func (d *Store) ListTenants(ctx context.Context, after string, limit int) ([]string, error) {
	op := fmt.Sprintf("list the tenants after %q", after)
	var pages [2][]string
	for i, stmt := range []string{d.sql().tenant.list, d.sql().tenant.listSet} {
		rows, err := d.query(ctx, d.Read, stmt, Args{"after": after, "limit": limit})
		if err != nil {
			return nil, d.Wrap(op, err)
		}
		if pages[i], err = scanStrings(rows, op); err != nil {
			return nil, err
		}
	}
	out := append(pages[0], pages[1]...)
	slices.Sort(out)
	out = slices.Compact(out)
	return out[:min(len(out), limit)], nil
}

// TenantUsage counts the tenant's messages, partitions and stored bytes
// per topic: three statements (messages, message-group states, deferred
// rows), merged by topic.
func (d *Store) TenantUsage(ctx context.Context, tenant string) ([]driver.TopicUsage, error) {
	op := fmt.Sprintf("count the messages and bytes of tenant %q", tenant)
	st := &d.sql().tenant
	byTopic := map[string]*driver.TopicUsage{}
	var out []driver.TopicUsage
	topic := func(name string) *driver.TopicUsage {
		if u := byTopic[name]; u != nil {
			return u
		}
		u := &driver.TopicUsage{Topic: name}
		byTopic[name] = u
		return u
	}
	err := d.each(ctx, st.usage, Args{"tenant": tenant}, func(rows *sql.Rows) error {
		var name string
		var msgs, parts, n int64
		if err := rows.Scan(&name, &msgs, &parts, &n); err != nil {
			return err
		}
		u := topic(name)
		u.Messages, u.Partitions, u.Bytes = msgs, parts, u.Bytes+n
		return nil
	})
	type sum struct {
		stmt string
		into func(*driver.TopicUsage) *int64
	}
	sums := []sum{
		{st.stateUsage, func(u *driver.TopicUsage) *int64 { return &u.StateBytes }},
		{st.deferUsage, func(u *driver.TopicUsage) *int64 { return &u.DeferredBytes }},
	}
	for _, stmt := range st.groupUsage {
		sums = append(sums, sum{stmt, func(u *driver.TopicUsage) *int64 { return &u.GroupBytes }})
	}
	for _, q := range sums {
		if err != nil {
			break
		}
		err = d.each(ctx, q.stmt, Args{"tenant": tenant}, func(rows *sql.Rows) error {
			var name string
			var n int64
			if err := rows.Scan(&name, &n); err != nil {
				return err
			}
			u := topic(name)
			*q.into(u) += n
			u.Bytes += n
			return nil
		})
	}
	if err != nil {
		return nil, d.Wrap(op, err)
	}
	for _, u := range byTopic {
		out = append(out, *u)
	}
	slices.SortFunc(out, func(a, b driver.TopicUsage) int { return strings.Compare(a.Topic, b.Topic) })
	return out, nil
}

// TenantPartitions counts the tenant's head rows.
func (d *Store) TenantPartitions(ctx context.Context, tenant string) (int64, error) {
	var n int64
	if err := d.queryRow(ctx, d.Read, d.sql().tenant.heads, Args{"tenant": tenant}).Scan(&n); err != nil {
		return 0, d.Wrap(fmt.Sprintf("count the partitions of tenant %q", tenant), err)
	}
	return n, nil
}

// ExportMessages reads a keyset page of the tenant's messages.
func (d *Store) ExportMessages(ctx context.Context, tenant string, after driver.ExportPosition, limit int) ([]driver.Message, error) {
	op := fmt.Sprintf("export the messages of tenant %q", tenant)
	rows, err := d.query(ctx, d.Read, d.sql().tenant.exportMsgs, keyset(tenant, limit, after.Topic, after.PartitionKey, after.Offset))
	if err != nil {
		return nil, d.Wrap(op, err)
	}
	return d.scanMessages(rows, op)
}

// ExportGroups reads a keyset page of the tenant's group registry rows.
func (d *Store) ExportGroups(ctx context.Context, tenant string, after driver.GroupRow, limit int) ([]driver.GroupRow, error) {
	op := fmt.Sprintf("export the consumer groups of tenant %q", tenant)
	var out []driver.GroupRow
	err := d.each(ctx, d.sql().tenant.exportGroup, keyset(tenant, limit, after.Topic, after.ConsumerGroup), func(rows *sql.Rows) error {
		var g driver.GroupRow
		var created, paused any
		if err := rows.Scan(&g.Topic, &g.ConsumerGroup, &g.StartOffset, &created, &paused); err != nil {
			return err
		}
		var err error
		if g.CreatedAt, err = d.DecodeTime(created); err == nil {
			g.PausedAt, err = d.decodeNotBefore(paused)
		}
		out = append(out, g)
		return err
	})
	return out, d.wrapNil(op, err)
}

// ExportCursors reads a keyset page of the tenant's cursors.
func (d *Store) ExportCursors(ctx context.Context, tenant string, after driver.CursorRow, limit int) ([]driver.CursorRow, error) {
	op := fmt.Sprintf("export the cursors of tenant %q", tenant)
	var out []driver.CursorRow
	err := d.each(ctx, d.sql().tenant.exportCurs, keyset(tenant, limit, after.Topic, after.PartitionKey, after.ConsumerGroup), func(rows *sql.Rows) error {
		var c driver.CursorRow
		err := rows.Scan(&c.Topic, &c.PartitionKey, &c.ConsumerGroup, &c.Committed)
		out = append(out, c)
		return err
	})
	return out, d.wrapNil(op, err)
}

// ExportGroupStates reads a keyset page of the tenant's message-group
// states.
func (d *Store) ExportGroupStates(ctx context.Context, tenant string, after driver.GroupStateRow, limit int) ([]driver.GroupStateRow, error) {
	op := fmt.Sprintf("export the message-group states of tenant %q", tenant)
	var out []driver.GroupStateRow
	err := d.each(ctx, d.sql().tenant.exportState, keyset(tenant, limit, after.ConsumerGroup, after.Topic, after.PartitionKey), func(rows *sql.Rows) error {
		var g driver.GroupStateRow
		err := rows.Scan(&g.Topic, &g.ConsumerGroup, &g.PartitionKey, &g.State)
		out = append(out, g)
		return err
	})
	return out, d.wrapNil(op, err)
}

// keyset binds a keyset page's arguments (tenantSQL's keysetPage).
func keyset(tenant string, limit int, after ...any) Args {
	args := Args{"tenant": tenant, "limit": limit}
	for i, v := range after {
		args["a"+strconv.Itoa(i)] = v
	}
	return args
}

// each runs a read on the read pool and calls scan for each row.
func (d *Store) each(ctx context.Context, stmt string, args Args, scan func(*sql.Rows) error) error {
	rows, err := d.query(ctx, d.Read, stmt, args)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := scan(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}
