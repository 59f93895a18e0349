// SPDX-License-Identifier: Apache-2.0

package shardq

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/ident"
)

// ExportOptions shape Admin.ExportTenant.
type ExportOptions struct {
	// After resumes an export cut short: the "cursor" of the last
	// message line it wrote. Empty: from the first message.
	After string
	// BatchSize bounds the rows read per statement [DefaultExportBatch];
	// an export holds at most one batch of rows, and one encoded line, in
	// memory.
	BatchSize int
}

// DefaultExportBatch is ExportOptions.BatchSize's default.
const DefaultExportBatch = 100

// Export line kinds, in the order ExportTenant writes them.
const (
	ExportKindTenant     = "tenant"
	ExportKindGroup      = "group"
	ExportKindCursor     = "cursor"
	ExportKindGroupState = "group_state"
	ExportKindMessage    = "message"
	ExportKindEnd        = "end"
)

// ExportLine is one line of a tenant's export (docs/tenants.md): Kind
// says which fields it carries.
type ExportLine struct {
	Kind   string `json:"kind"`
	Tenant string `json:"tenant,omitempty"` // tenant
	// SuspendedAt (tenant) and PausedAt (group): absent when not.
	SuspendedAt   *time.Time `json:"suspended_at,omitempty"`
	ExportedAt    *time.Time `json:"exported_at,omitempty"` // tenant
	Topic         string     `json:"topic,omitempty"`
	PartitionKey  *string    `json:"partition_key,omitempty"`  // cursor, group_state, message ("" ungrouped)
	ConsumerGroup string     `json:"consumer_group,omitempty"` // group, cursor, group_state
	StartOffset   *int64     `json:"start_offset,omitempty"`   // group
	CreatedAt     *time.Time `json:"created_at,omitempty"`     // group, message
	PausedAt      *time.Time `json:"paused_at,omitempty"`
	Committed     *int64     `json:"committed_offset,omitempty"` // cursor
	State         []byte     `json:"state,omitempty"`            // group_state
	// Message.
	Offset    int64             `json:"offset,omitempty"`
	ID        string            `json:"id,omitempty"`
	Headers   map[string]string `json:"headers,omitempty"`
	Payload   []byte            `json:"payload,omitempty"`
	NotBefore *time.Time        `json:"not_before,omitempty"`
	// Cursor resumes the export after this message (ExportOptions.After).
	Cursor string `json:"cursor,omitempty"`
	// Messages counts the message lines of this run (end).
	Messages *int64 `json:"messages,omitempty"`
}

// ExportTenant writes everything a tenant owns that a reader would want
// back to w, as JSON lines (ExportLine): the tenant's line, its consumer
// groups, cursors and message-group states, then its messages in
// (topic, partition key, offset) order, and an "end" line last. Each
// statement reads at most opts.BatchSize rows of one table, routed by the
// tenant (on Vitess, to its shard). An export cut short has no end line;
// run it again with After set to its last message line's cursor and it
// writes the tenant's group lines again (the later ones win) and the
// messages after that one. It returns the message lines written.
//
// Leases, heartbeats, claims, retry bookkeeping, half messages and
// tokens are not exported: they belong to running processes and to
// serve, not to the tenant's data.
func (a *Admin) ExportTenant(ctx context.Context, tenant string, w io.Writer, opts ExportOptions) (int64, error) {
	fail := func(err error) (int64, error) { return 0, fmt.Errorf("shardq: admin export tenant: %w", err) }
	if err := ident.Tenant(tenant); err != nil {
		return fail(err)
	}
	switch {
	case opts.BatchSize < 0 || opts.BatchSize > MaxPageLimit:
		return fail(&ident.Error{Field: "batch size", Rule: fmt.Sprintf("must be between 1 and %d", MaxPageLimit)})
	case opts.BatchSize == 0:
		opts.BatchSize = DefaultExportBatch
	}
	var after driver.ExportPosition
	if opts.After != "" {
		var err error
		if after, err = decodeExportCursor(opts.After); err != nil {
			return fail(err)
		}
	}
	e := &exporter{a: a, tenant: tenant, w: w, batch: opts.BatchSize}
	e.enc = json.NewEncoder(&e.buf)
	e.enc.SetEscapeHTML(false)
	n, err := e.run(ctx, after)
	if err != nil {
		return n, fmt.Errorf("shardq: admin export tenant %q: %w", tenant, err)
	}
	return n, nil
}

// exporter writes one tenant's export, a batch of lines at a time.
type exporter struct {
	a      *Admin
	tenant string
	w      io.Writer
	batch  int
	buf    bytes.Buffer
	enc    *json.Encoder
}

func (e *exporter) line(l ExportLine) error { return e.enc.Encode(l) }

// flush writes the buffered lines.
func (e *exporter) flush() error {
	_, err := e.w.Write(e.buf.Bytes())
	e.buf.Reset()
	return err
}

func (e *exporter) run(ctx context.Context, after driver.ExportPosition) (int64, error) {
	drv, now := e.a.c.drv, e.a.c.cfg.Clock().UTC()
	settings, err := drv.TenantSettings(ctx, []string{e.tenant})
	if err != nil {
		return 0, err
	}
	tl := ExportLine{Kind: ExportKindTenant, Tenant: e.tenant, ExportedAt: &now}
	for _, s := range settings {
		tl.SuspendedAt = timeOrNil(s.SuspendedAt)
	}
	if err := e.line(tl); err != nil {
		return 0, err
	}
	if err := pages(ctx, e, driver.GroupRow{}, drv.ExportGroups, func(g driver.GroupRow) (driver.GroupRow, ExportLine) {
		return driver.GroupRow{Topic: g.Topic, ConsumerGroup: g.ConsumerGroup}, ExportLine{Kind: ExportKindGroup, Topic: g.Topic,
			ConsumerGroup: g.ConsumerGroup, StartOffset: &g.StartOffset, CreatedAt: timeOrNil(g.CreatedAt), PausedAt: timeOrNil(g.PausedAt)}
	}); err != nil {
		return 0, err
	}
	if err := pages(ctx, e, driver.CursorRow{}, drv.ExportCursors, func(c driver.CursorRow) (driver.CursorRow, ExportLine) {
		return c, ExportLine{Kind: ExportKindCursor, Topic: c.Topic, PartitionKey: &c.PartitionKey, ConsumerGroup: c.ConsumerGroup, Committed: &c.Committed}
	}); err != nil {
		return 0, err
	}
	if err := pages(ctx, e, driver.GroupStateRow{}, drv.ExportGroupStates, func(g driver.GroupStateRow) (driver.GroupStateRow, ExportLine) {
		return driver.GroupStateRow{Topic: g.Topic, ConsumerGroup: g.ConsumerGroup, PartitionKey: g.PartitionKey},
			ExportLine{Kind: ExportKindGroupState, Topic: g.Topic, PartitionKey: &g.PartitionKey, ConsumerGroup: g.ConsumerGroup, State: g.State}
	}); err != nil {
		return 0, err
	}
	var n int64
	err = pages(ctx, e, after, drv.ExportMessages, func(m driver.Message) (driver.ExportPosition, ExportLine) {
		n++
		pos := driver.ExportPosition{Topic: m.Topic, PartitionKey: m.PartitionKey, Offset: m.Offset}
		return pos, ExportLine{Kind: ExportKindMessage, Topic: m.Topic, PartitionKey: &m.PartitionKey, Offset: m.Offset, ID: m.ID,
			Headers: m.Headers, Payload: m.Payload, CreatedAt: timeOrNil(m.CreatedAt), NotBefore: timeOrNil(m.NotBefore), Cursor: encodeExportCursor(pos)}
	})
	if err == nil {
		err = e.line(ExportLine{Kind: ExportKindEnd, Messages: &n})
	}
	if err == nil {
		err = e.flush()
	}
	return n, err
}

// pages reads a table's rows of the tenant a page at a time, from after,
// and writes a line for each; conv gives a row's key (the next page's
// after) and its line.
func pages[K, R any](ctx context.Context, e *exporter, after K, read func(context.Context, string, K, int) ([]R, error), conv func(R) (K, ExportLine)) error {
	for {
		rows, err := read(ctx, e.tenant, after, e.batch)
		if err != nil {
			return err
		}
		for _, r := range rows {
			var l ExportLine
			after, l = conv(r)
			// Line by line: the buffer holds one line, and each write
			// carries one message at most.
			if err := e.line(l); err != nil {
				return err
			}
			if err := e.flush(); err != nil {
				return err
			}
		}
		e.a.advance(int64(len(rows)))
		if len(rows) < e.batch {
			return nil
		}
	}
}

func timeOrNil(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	t = t.UTC()
	return &t
}

// encodeExportCursor is a message's place in a tenant's export: topic,
// partition key and offset, NUL-separated (neither name may hold a NUL),
// in unpadded base64url.
func encodeExportCursor(p driver.ExportPosition) string {
	return base64.RawURLEncoding.EncodeToString([]byte(p.Topic + "\x00" + p.PartitionKey + "\x00" + strconv.FormatInt(p.Offset, 10)))
}

// decodeExportCursor checks and decodes an export line's cursor. It is a
// place in the tenant's messages, not a secret: a forged one only moves
// where a read of the tenant named beside it starts.
func decodeExportCursor(s string) (driver.ExportPosition, error) {
	bad := func(rule string) (driver.ExportPosition, error) {
		return driver.ExportPosition{}, &ident.Error{Field: "after", Rule: rule}
	}
	if len(s) > 2048 {
		return bad("longer than any export cursor")
	}
	raw, err := base64.RawURLEncoding.Strict().DecodeString(s)
	if err != nil {
		return bad("not an export cursor (unpadded base64url)")
	}
	parts := bytes.Split(raw, []byte{0})
	if len(parts) != 3 {
		return bad("not an export cursor (topic, partition key and offset)")
	}
	p := driver.ExportPosition{Topic: string(parts[0]), PartitionKey: string(parts[1])}
	if err := ident.Topic(p.Topic); err != nil {
		return bad("an export cursor with a bad topic: " + err.Error())
	}
	if p.PartitionKey != "" {
		if err := ident.PartitionKey(p.PartitionKey); err != nil {
			return bad("an export cursor with a bad partition key: " + err.Error())
		}
	}
	if p.Offset, err = strconv.ParseInt(string(parts[2]), 10, 64); err != nil || p.Offset < 0 || strconv.FormatInt(p.Offset, 10) != string(parts[2]) {
		return bad("an export cursor with a bad offset")
	}
	return p, nil
}
