// SPDX-License-Identifier: Apache-2.0

// Package vitessfeed is shardq's change feed on Vitess. vtgate serves no
// binary log, so the MySQL driver's feed cannot read one through it; this
// one streams the head rows of shardq's keyspace through vtgate's VStream
// (gRPC), which follows each shard's primary, and hands them to the
// driver:
//
//	f, err := vitessfeed.New(vitessfeed.Config{Addr: "vtgate:15991", Keyspace: "shardq"})
//	d, err := mysqldriver.Open(dsn, mysqldriver.HeadFeed(f))
//
// It is a module of its own so that the library's users who do not run
// Vitess build none of Vitess's generated protocol code; it imports only
// that code (vitess.io/vitess/go/vt/proto/...) and gRPC (docs/vitess.md,
// "Change feed").
package vitessfeed

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	binlogdatapb "vitess.io/vitess/go/vt/proto/binlogdata"
	querypb "vitess.io/vitess/go/vt/proto/query"
	topodatapb "vitess.io/vitess/go/vt/proto/topodata"
	vtgatepb "vitess.io/vitess/go/vt/proto/vtgate"
	vtgateservicepb "vitess.io/vitess/go/vt/proto/vtgateservice"
	vtrpcpb "vitess.io/vitess/go/vt/proto/vtrpc"

	"github.com/shardq/shardq/driver"
)

// headTable is the table whose row events the feed reads: a publish
// writes its partition's head row in the same transaction as its messages.
const headTable = "queue_partitions"

// headColumns are the columns the feed asks VStream for, in this order.
var headColumns = []string{"tenant", "topic", "partition_key", "head_offset"}

// Defaults.
const (
	DefaultHeartbeat  = time.Second
	DefaultMaxPending = 4096
	retryMax          = 5 * time.Second
)

// Config says where vtgate is and how to reach it.
type Config struct {
	// Addr is vtgate's gRPC address, host:port (its --grpc-port; the
	// local scripts/vitess serves it on 15001).
	Addr string
	// Keyspace is the keyspace of shardq's tables: the database name of
	// the driver's DSN.
	Keyspace string
	// DialOptions are given to grpc.NewClient. Without any, the feed
	// connects without transport security, as to a vtgate on loopback or
	// inside a private network; give grpc.WithTransportCredentials for TLS.
	DialOptions []grpc.DialOption
	// Principal, when set, is the caller id the stream carries, for
	// vtgate's and the tablets' table ACLs.
	Principal string
	// Heartbeat is how often vtgate sends a heartbeat on an idle stream
	// [DefaultHeartbeat, whole seconds, at least 1 s]; a stream silent
	// for three heartbeats is taken as cut and opened again.
	Heartbeat time.Duration
	// MaxPending bounds the head changes one transaction may name
	// [DefaultMaxPending]; a larger transaction makes the consumers rescan
	// instead, so that memory is bounded by this, not by what is written.
	MaxPending int
}

// Feed is a driver.HeadFeed over vtgate's VStream. One Feed serves one
// client; FeedHeads may run once at a time.
type Feed struct {
	cfg Config
}

var _ driver.HeadFeed = (*Feed)(nil)

// New checks cfg and returns a feed; it connects when FeedHeads runs.
func New(cfg Config) (*Feed, error) {
	switch {
	case cfg.Addr == "":
		return nil, errors.New("vitessfeed: Config.Addr: vtgate's gRPC address (host:port) is required")
	case cfg.Keyspace == "":
		return nil, errors.New("vitessfeed: Config.Keyspace: the keyspace of shardq's tables is required")
	case strings.ContainsAny(cfg.Keyspace, "`'\"\\/:@ \t\n"):
		return nil, fmt.Errorf("vitessfeed: Config.Keyspace %q: must be a plain keyspace name (no quotes, slashes, colons, @ or spaces)", cfg.Keyspace)
	case cfg.Heartbeat < 0 || cfg.Heartbeat%time.Second != 0 || cfg.Heartbeat > time.Hour:
		return nil, fmt.Errorf("vitessfeed: Config.Heartbeat %s: must be whole seconds, at most 1h (0: the default, %s)", cfg.Heartbeat, DefaultHeartbeat)
	case cfg.MaxPending < 0:
		return nil, fmt.Errorf("vitessfeed: Config.MaxPending %d: must not be negative (0: the default, %d)", cfg.MaxPending, DefaultMaxPending)
	}
	if cfg.Heartbeat == 0 {
		cfg.Heartbeat = DefaultHeartbeat
	}
	if cfg.MaxPending == 0 {
		cfg.MaxPending = DefaultMaxPending
	}
	if len(cfg.DialOptions) == 0 {
		cfg.DialOptions = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	return &Feed{cfg: cfg}, nil
}

// FeedHeads streams the keyspace's head changes to sink until ctx ends
// (driver.HeadFeed). It starts at each shard's current position; after a
// cut it reconnects from the last commit it read. From a position vtgate
// refuses (a shard's logs purged) it starts at the current positions
// again, and a shard that shows no position of its own within three
// heartbeats of resuming (noPositionError) starts again at its current
// one. Each stream is Up once every shard has a position, so consumers
// rescan what a gap may have hidden. vtgate refusing the stream itself
// (no VStream, no permission) returns ErrFeedUnavailable.
func (f *Feed) FeedHeads(ctx context.Context, sink driver.FeedSink) error {
	return f.feedFrom(ctx, sink, nil)
}

// feedFrom runs the feed from start, or from the current positions when
// start is nil (tests start from a refused one).
func (f *Feed) feedFrom(ctx context.Context, sink driver.FeedSink, start *binlogdatapb.VGtid) error {
	conn, err := grpc.NewClient(f.cfg.Addr, f.cfg.DialOptions...)
	if err != nil {
		return fmt.Errorf("vitess change feed: %w: vtgate address %q: %w", driver.ErrFeedUnavailable, f.cfg.Addr, err)
	}
	defer conn.Close()
	client := vtgateservicepb.NewVitessClient(conn)
	s := &stream{f: f, sink: sink, pos: start}
	pause := 100 * time.Millisecond
	for {
		err := s.run(ctx, client)
		if ctx.Err() != nil {
			return nil
		}
		sink.Down(err)
		switch status.Code(err) {
		case codes.Unimplemented, codes.PermissionDenied, codes.Unauthenticated:
			return fmt.Errorf("vitess change feed: %w: vtgate %s refused VStream of keyspace %q: %w",
				driver.ErrFeedUnavailable, f.cfg.Addr, f.cfg.Keyspace, err)
		}
		var stuck *noPositionError
		switch {
		case errors.As(err, &stuck):
			sink.Note("shardq: vitess change feed position refused; continuing from the current positions and rescanning",
				"was", vgtidString(s.pos), "err", err)
			s.pos = fromCurrent(s.pos, stuck.shards)
			continue
		case !s.streamed && s.pos != nil && !errors.Is(err, errSilent) && refusedPosition(err):
			sink.Note("shardq: vitess change feed position refused; continuing from the current positions and rescanning",
				"was", vgtidString(s.pos), "err", err)
			s.pos = nil
			continue
		}
		if s.streamed {
			pause = 100 * time.Millisecond
		}
		sink.Note("shardq: vitess change feed cut; reconnecting", "err", err, "retry_in", pause)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(pause):
		}
		pause = min(2*pause, retryMax)
	}
}

// noPositionError ends a stream resumed from a saved position in which
// some shards showed no position of their own within three heartbeats.
// MariaDB does not refuse a position ahead of its binary log (a primary
// that lost transactions in a failover): it waits, silently, for the
// position to come. An idle shard resumed at exactly its position looks
// the same, and for it the restart from its current position costs one
// rescan.
type noPositionError struct{ shards []string }

func (e *noPositionError) Error() string {
	return fmt.Sprintf("shards %s showed no position within three heartbeats of resuming", strings.Join(e.shards, ", "))
}

// errSilent ends a stream that sent nothing, not even vtgate's
// heartbeat, for three heartbeats: a hung vtgate or a black-holed
// connection, not a refused position.
var errSilent = errors.New("no event or heartbeat for three heartbeats")

// fromCurrent is pos with shards' positions replaced by "current".
func fromCurrent(pos *binlogdatapb.VGtid, shards []string) *binlogdatapb.VGtid {
	out := &binlogdatapb.VGtid{}
	for _, g := range pos.GetShardGtids() {
		g := &binlogdatapb.ShardGtid{Keyspace: g.Keyspace, Shard: g.Shard, Gtid: g.Gtid}
		if slices.Contains(shards, g.Shard) {
			g.Gtid = "current"
		}
		out.ShardGtids = append(out.ShardGtids, g)
	}
	return out
}

// unmoved lists the shards whose position in latest is still the one in
// start (or that latest does not name).
func unmoved(start, latest *binlogdatapb.VGtid) []string {
	now := map[string]string{}
	for _, g := range latest.GetShardGtids() {
		now[g.Shard] = g.Gtid
	}
	var out []string
	for _, g := range start.GetShardGtids() {
		if g.Gtid != "current" && now[g.Shard] == g.Gtid || now[g.Shard] == "" {
			out = append(out, g.Shard)
		}
	}
	return out
}

// allPositioned says whether v names a concrete position for every shard.
func allPositioned(v *binlogdatapb.VGtid) bool {
	for _, g := range v.GetShardGtids() {
		if g.Gtid == "current" || g.Shard == "" {
			return false
		}
	}
	return len(v.GetShardGtids()) > 0
}

// refusedPosition says whether a stream that failed before its first
// event failed at its position rather than on the way to vtgate: then
// asking again from it would fail again.
func refusedPosition(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.Canceled, codes.DeadlineExceeded, codes.ResourceExhausted, codes.Aborted:
		return false
	}
	return true
}

// stream is one FeedHeads run's state, kept across reconnects.
type stream struct {
	f    *Feed
	sink driver.FeedSink
	// pos is the position after the last transaction read whole; nil:
	// the current positions.
	pos *binlogdatapb.VGtid
	// streamed: the last run received at least one event.
	streamed bool
	// latest is the last position the running stream reported (a VGTID
	// event), for the check of resumed shards.
	latest atomic.Pointer[binlogdatapb.VGtid]
}

// run opens one VStream from s.pos and reads it until it ends.
func (s *stream) run(ctx context.Context, client vtgateservicepb.VitessClient) error {
	s.streamed = false
	s.latest.Store(nil)
	sctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	start := s.pos
	if start != nil {
		unpositioned := time.AfterFunc(3*s.f.cfg.Heartbeat, func() {
			if shards := unmoved(start, s.latest.Load()); len(shards) > 0 {
				cancel(&noPositionError{shards: shards})
			}
		})
		defer unpositioned.Stop()
	} else {
		start = &binlogdatapb.VGtid{ShardGtids: []*binlogdatapb.ShardGtid{{Keyspace: s.f.cfg.Keyspace, Gtid: "current"}}}
	}
	req := &vtgatepb.VStreamRequest{
		TabletType: topodatapb.TabletType_PRIMARY,
		Vgtid:      start,
		Filter: &binlogdatapb.Filter{Rules: []*binlogdatapb.Rule{{
			Match:  headTable,
			Filter: "select " + strings.Join(headColumns, ", ") + " from " + headTable,
		}}},
		Flags: &vtgatepb.VStreamFlags{
			HeartbeatInterval:            uint32(s.f.cfg.Heartbeat / time.Second),
			ExcludeKeyspaceFromTableName: true,
		},
	}
	if s.f.cfg.Principal != "" {
		req.CallerId = &vtrpcpb.CallerID{Principal: s.f.cfg.Principal}
	}
	silence := 3 * s.f.cfg.Heartbeat
	watchdog := time.AfterFunc(silence, func() {
		cancel(errSilent)
	})
	defer watchdog.Stop()
	vs, err := client.VStream(sctx, req)
	if err != nil {
		return s.cause(sctx, err)
	}
	var tx txn
	up := false
	for {
		resp, err := vs.Recv()
		if err != nil {
			return s.cause(sctx, err)
		}
		watchdog.Reset(silence)
		s.streamed = true
		// Up once every shard streams from a position of its own: what
		// committed before those positions, the rescan that Up implies
		// reads. A shard still at "current" (its tablet not yet found)
		// could commit unseen between a rescan and its first position.
		// Up comes before any change the stream names, so a sink never
		// hears of a move while it still counts the feed down.
		if !up && allPositioned(start) {
			up = true
			s.sink.Up(true)
		}
		for _, ev := range resp.Events {
			s.event(&tx, ev)
			if !up && ev.Type == binlogdatapb.VEventType_VGTID && allPositioned(ev.Vgtid) {
				up = true
				s.sink.Up(true)
			}
		}
	}
}

// cause prefers the watchdog's reason to the cancellation it caused.
func (s *stream) cause(ctx context.Context, err error) error {
	if c := context.Cause(ctx); c != nil && !errors.Is(c, context.Canceled) {
		return fmt.Errorf("vitess change feed: %w", c)
	}
	return fmt.Errorf("vitess change feed: %w", err)
}

// txn is what the open transaction named so far.
type txn struct {
	open bool
	// heads holds each partition once, with its last head: a publish
	// writes its partition's head row more than once (created, then
	// moved); at holds each one's index in heads.
	heads    []driver.HeadChange
	at       map[partition]int
	overflow bool // more than MaxPending partitions: rescan at commit
	bad      bool // a row that did not decode: rescan at commit
	pos      *binlogdatapb.VGtid
	cols     [4]int // headColumns' indexes in the row images; -1: missing
	haveCols bool
}

type partition struct{ tenant, topic, key string }

// add records h, replacing the head an earlier row of its partition gave.
func (tx *txn) add(h driver.HeadChange, limit int) {
	p := partition{h.Tenant, h.Topic, h.PartitionKey}
	if i, ok := tx.at[p]; ok {
		tx.heads[i] = h
		return
	}
	if len(tx.heads) >= limit {
		tx.overflow = true
		return
	}
	if tx.at == nil {
		tx.at = map[partition]int{}
	}
	tx.at[p] = len(tx.heads)
	tx.heads = append(tx.heads, h)
}

// reset forgets the transaction.
func (tx *txn) reset(open bool) {
	tx.open, tx.heads, tx.at, tx.overflow, tx.bad, tx.pos = open, nil, nil, false, false, nil
}

// event applies one VStream event.
func (s *stream) event(tx *txn, ev *binlogdatapb.VEvent) {
	switch ev.Type {
	case binlogdatapb.VEventType_BEGIN:
		tx.reset(true)
	case binlogdatapb.VEventType_FIELD:
		if fe := ev.FieldEvent; fe != nil && isHeadTable(fe.TableName) {
			tx.cols, tx.haveCols = fieldIndexes(fe.Fields), true
		}
	case binlogdatapb.VEventType_ROW:
		re := ev.RowEvent
		if re == nil || !isHeadTable(re.TableName) {
			return
		}
		for _, rc := range re.RowChanges {
			if rc.After == nil { // a deleted partition wakes nobody
				continue
			}
			h, err := decodeHead(rc.After, tx.cols, tx.haveCols)
			switch {
			case err != nil:
				if !tx.bad {
					s.sink.Note("shardq: vitess change feed could not read a head row; consumers rescan", "shard", re.Shard, "err", err)
				}
				tx.bad = true
			default:
				tx.add(h, s.f.cfg.MaxPending)
			}
		}
	case binlogdatapb.VEventType_VGTID:
		s.latest.Store(ev.Vgtid)
		tx.pos = ev.Vgtid
		if !tx.open {
			s.pos = ev.Vgtid
		}
	case binlogdatapb.VEventType_COMMIT:
		switch {
		case tx.overflow || tx.bad:
			s.sink.Rescan()
		case len(tx.heads) > 0:
			s.sink.Moved(tx.heads)
		}
		if tx.pos != nil {
			s.pos = tx.pos
		}
		tx.reset(false)
	case binlogdatapb.VEventType_ROLLBACK:
		tx.reset(false)
	case binlogdatapb.VEventType_DDL:
		// A changed head table: what streams next may be laid out anew;
		// the consumers read their heads again.
		tx.haveCols = false
		s.sink.Note("shardq: vitess change feed saw a schema change; consumers rescan", "shard", ev.Shard)
		s.sink.Rescan()
	}
}

// isHeadTable matches the head table's name, with or without its keyspace.
func isHeadTable(name string) bool {
	if i := strings.LastIndexByte(name, '.'); i >= 0 {
		name = name[i+1:]
	}
	return name == headTable
}

// fieldIndexes finds headColumns among a FIELD event's columns.
func fieldIndexes(fields []*querypb.Field) [4]int {
	idx := [4]int{-1, -1, -1, -1}
	for i, f := range fields {
		for j, name := range headColumns {
			if strings.EqualFold(f.Name, name) {
				idx[j] = i
			}
		}
	}
	return idx
}

// decodeHead reads a head row image: VStream sends each column's value as
// text, its length in Lengths (-1: NULL), the values concatenated.
func decodeHead(row *querypb.Row, cols [4]int, haveCols bool) (driver.HeadChange, error) {
	if !haveCols {
		return driver.HeadChange{}, errors.New("a row before its table's FIELD event")
	}
	values := make([][]byte, len(row.Lengths))
	off := int64(0)
	for i, n := range row.Lengths {
		if n < 0 {
			continue
		}
		if n > int64(len(row.Values))-off {
			return driver.HeadChange{}, fmt.Errorf("column %d: length %d past the row's %d bytes", i, n, len(row.Values))
		}
		values[i] = row.Values[off : off+n]
		off += n
	}
	var text [4]string
	for j, c := range cols {
		if c < 0 || c >= len(values) || values[c] == nil {
			return driver.HeadChange{}, fmt.Errorf("column %s missing or NULL", headColumns[j])
		}
		text[j] = string(values[c])
	}
	head, err := strconv.ParseInt(text[3], 10, 64)
	if err != nil {
		return driver.HeadChange{}, fmt.Errorf("head_offset %q: %w", text[3], err)
	}
	return driver.HeadChange{Tenant: text[0], Topic: text[1], PartitionKey: text[2], Head: head}, nil
}

// vgtidString is a position for a log line.
func vgtidString(v *binlogdatapb.VGtid) string {
	parts := make([]string, 0, len(v.GetShardGtids()))
	for _, g := range v.GetShardGtids() {
		parts = append(parts, g.Keyspace+"/"+g.Shard+"@"+g.Gtid)
	}
	return strings.Join(parts, ",")
}
