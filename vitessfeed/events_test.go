// SPDX-License-Identifier: Apache-2.0

package vitessfeed_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	binlogdatapb "vitess.io/vitess/go/vt/proto/binlogdata"
	querypb "vitess.io/vitess/go/vt/proto/query"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/testdb"
	"github.com/shardq/shardq/vitessfeed"
)

// sink is a FeedSink that hands every event to the test.
type sink = testdb.FeedEvents

// row encodes values as VStream does: lengths, values concatenated; a
// nil value is NULL.
func row(values ...*string) *querypb.Row {
	r := &querypb.Row{}
	for _, v := range values {
		if v == nil {
			r.Lengths = append(r.Lengths, -1)
			continue
		}
		r.Lengths = append(r.Lengths, int64(len(*v)))
		r.Values = append(r.Values, *v...)
	}
	return r
}

func str(s string) *string { return &s }

func headRow(tenant, topic, key string, head int64) *querypb.Row {
	return row(str(tenant), str(topic), str(key), str(strconv.FormatInt(head, 10)))
}

var headFields = &binlogdatapb.VEvent{Type: binlogdatapb.VEventType_FIELD, FieldEvent: &binlogdatapb.FieldEvent{
	TableName: "queue_partitions",
	Fields:    []*querypb.Field{{Name: "tenant"}, {Name: "topic"}, {Name: "partition_key"}, {Name: "head_offset"}},
}}

func begin() *binlogdatapb.VEvent  { return &binlogdatapb.VEvent{Type: binlogdatapb.VEventType_BEGIN} }
func commit() *binlogdatapb.VEvent { return &binlogdatapb.VEvent{Type: binlogdatapb.VEventType_COMMIT} }

func rows(table string, changes ...*binlogdatapb.RowChange) *binlogdatapb.VEvent {
	return &binlogdatapb.VEvent{Type: binlogdatapb.VEventType_ROW, RowEvent: &binlogdatapb.RowEvent{TableName: table, Shard: "-80", RowChanges: changes}}
}

func vgtid(gtid string) *binlogdatapb.VEvent {
	return &binlogdatapb.VEvent{Type: binlogdatapb.VEventType_VGTID, Vgtid: &binlogdatapb.VGtid{ShardGtids: []*binlogdatapb.ShardGtid{
		{Keyspace: "shardq", Shard: "-80", Gtid: gtid}}}}
}

func newFeed(t *testing.T, cfg vitessfeed.Config) *vitessfeed.Feed {
	t.Helper()
	if cfg.Addr == "" {
		cfg.Addr, cfg.Keyspace = "127.0.0.1:1", "shardq"
	}
	f, err := vitessfeed.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// A committed transaction names the partitions whose head rows it wrote
// (inserted or updated; a deleted one and other tables' rows wake
// nobody), each once with its last head, at its commit, and the stream
// resumes after it; a rolled-back one names nothing and moves no
// position.
func TestEventsNameCommittedHeads(t *testing.T) {
	events := make(sink, 100)
	f := newFeed(t, vitessfeed.Config{})
	pos := vitessfeed.Apply(f, events,
		headFields,
		begin(),
		rows("shardq.queue_partitions",
			&binlogdatapb.RowChange{After: headRow("t", "x", "a", 0)},
			&binlogdatapb.RowChange{Before: headRow("t", "x", "a", 0), After: headRow("t", "x", "a", 7)},
			&binlogdatapb.RowChange{Before: headRow("t", "y", "ключ", 1), After: headRow("t", "y", "ключ", 9)},
			&binlogdatapb.RowChange{Before: headRow("t", "z", "gone", 3)}),
		rows("queue_messages", &binlogdatapb.RowChange{After: headRow("not", "a", "head", 1)}),
		vgtid("MariaDB/0-1-10"),
		commit(),
		begin(),
		rows("queue_partitions", &binlogdatapb.RowChange{After: headRow("t", "x", "rolled-back", 8)}),
		vgtid("MariaDB/0-1-11"),
		&binlogdatapb.VEvent{Type: binlogdatapb.VEventType_ROLLBACK},
	)
	got := strings.Join(events.Drain(), ",")
	if want := "moved t/x/a@7,moved t/y/ключ@9"; got != want {
		t.Fatalf("sink got %q, want %q", got, want)
	}
	if g := pos.GetShardGtids(); len(g) != 1 || g[0].Gtid != "MariaDB/0-1-10" {
		t.Fatalf("resume position %v, want the committed transaction's MariaDB/0-1-10", pos)
	}
}

// A position that arrives outside a transaction (after another table's
// transaction, say) is where the stream resumes; one inside a transaction only
// once the transaction commits.
func TestEventsResumeAfterWholeTransactions(t *testing.T) {
	f := newFeed(t, vitessfeed.Config{})
	events := make(sink, 10)
	if pos := vitessfeed.Apply(f, events, vgtid("MariaDB/0-1-5")); pos.GetShardGtids()[0].Gtid != "MariaDB/0-1-5" {
		t.Fatalf("position outside a transaction %v, want MariaDB/0-1-5", pos)
	}
	pos := vitessfeed.Apply(f, events, vgtid("MariaDB/0-1-5"), headFields, begin(),
		rows("queue_partitions", &binlogdatapb.RowChange{After: headRow("t", "x", "a", 7)}), vgtid("MariaDB/0-1-6"))
	if pos.GetShardGtids()[0].Gtid != "MariaDB/0-1-5" {
		t.Fatalf("position inside an open transaction %v, want the one before it, MariaDB/0-1-5", pos)
	}
	if got := events.Drain(); len(got) != 0 {
		t.Fatalf("an uncommitted transaction said %q", got)
	}
}

// A transaction naming more partitions than MaxPending makes the
// consumers rescan rather than hold them all; a row that does not decode makes them
// rescan and is said once; a schema change makes them rescan.
func TestEventsRescanWhatTheyCannotName(t *testing.T) {
	f := newFeed(t, vitessfeed.Config{MaxPending: 2})
	cases := []struct {
		name   string
		events []*binlogdatapb.VEvent
		want   string
	}{
		{"past MaxPending", []*binlogdatapb.VEvent{headFields, begin(), rows("queue_partitions",
			&binlogdatapb.RowChange{After: headRow("t", "x", "a", 1)},
			&binlogdatapb.RowChange{After: headRow("t", "x", "b", 2)},
			&binlogdatapb.RowChange{After: headRow("t", "x", "c", 3)}), commit()}, "rescan"},
		{"at MaxPending partitions, one written twice", []*binlogdatapb.VEvent{headFields, begin(), rows("queue_partitions",
			&binlogdatapb.RowChange{After: headRow("t", "x", "a", 1)},
			&binlogdatapb.RowChange{After: headRow("t", "x", "b", 2)},
			&binlogdatapb.RowChange{After: headRow("t", "x", "a", 3)}), commit()}, "moved t/x/a@3,moved t/x/b@2"},
		{"a row that does not decode", []*binlogdatapb.VEvent{headFields, begin(), rows("queue_partitions",
			&binlogdatapb.RowChange{After: &querypb.Row{Lengths: []int64{1, 1, 1, 50}, Values: []byte("txa1")}},
			&binlogdatapb.RowChange{After: row(str("t"), str("x"), str("a"), str("seven"))}), commit()},
			"note shardq: vitess change feed could not read a head row; consumers rescan,rescan"},
		{"a NULL column", []*binlogdatapb.VEvent{headFields, begin(), rows("queue_partitions",
			&binlogdatapb.RowChange{After: row(str("t"), nil, str("a"), str("1"))}), commit()},
			"note shardq: vitess change feed could not read a head row; consumers rescan,rescan"},
		{"a row before its FIELD event", []*binlogdatapb.VEvent{begin(), rows("queue_partitions",
			&binlogdatapb.RowChange{After: headRow("t", "x", "a", 1)}), commit()},
			"note shardq: vitess change feed could not read a head row; consumers rescan,rescan"},
		{"a schema change", []*binlogdatapb.VEvent{{Type: binlogdatapb.VEventType_DDL}},
			"note shardq: vitess change feed saw a schema change; consumers rescan,rescan"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			events := make(sink, 100)
			vitessfeed.Apply(f, events, tc.events...)
			if got := strings.Join(events.Drain(), ","); got != tc.want {
				t.Fatalf("sink got %q, want %q", got, tc.want)
			}
		})
	}
}

// Config is checked before anything connects, each error naming the
// field and the rule.
func TestNewChecksConfig(t *testing.T) {
	cases := []struct {
		cfg  vitessfeed.Config
		want string
	}{
		{vitessfeed.Config{Keyspace: "shardq"}, "Config.Addr: vtgate's gRPC address (host:port) is required"},
		{vitessfeed.Config{Addr: "h:1"}, "Config.Keyspace: the keyspace of shardq's tables is required"},
		{vitessfeed.Config{Addr: "h:1", Keyspace: "shardq:-80"}, "must be a plain keyspace name"},
		{vitessfeed.Config{Addr: "h:1", Keyspace: "a`b"}, "must be a plain keyspace name"},
		{vitessfeed.Config{Addr: "h:1", Keyspace: "shardq", Heartbeat: 1500 * time.Millisecond}, "Config.Heartbeat 1.5s: must be whole seconds"},
		{vitessfeed.Config{Addr: "h:1", Keyspace: "shardq", Heartbeat: -time.Second}, "Config.Heartbeat -1s: must be whole seconds"},
		{vitessfeed.Config{Addr: "h:1", Keyspace: "shardq", MaxPending: -1}, "Config.MaxPending -1: must not be negative"},
	}
	for _, tc := range cases {
		_, err := vitessfeed.New(tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v) = %v, want an error containing %q", tc.cfg, err, tc.want)
		}
	}
	if _, err := vitessfeed.New(vitessfeed.Config{Addr: "h:1", Keyspace: "shardq", Heartbeat: 2 * time.Second, MaxPending: 10}); err != nil {
		t.Fatalf("a valid config: %v", err)
	}
}

// The row decoder reads what VStream encodes, and anything else yields
// an error, never a panic or a read past the row.
func FuzzDecodeHead(f *testing.F) {
	f.Add("t", "x", "k", int64(1), []byte(nil), []byte(nil))
	f.Add("", "topic", "ключ", int64(1<<62), []byte{0xff, 0, 0, 0, 0, 0, 0, 0}, []byte("junk"))
	f.Fuzz(func(t *testing.T, tenant, topic, key string, head int64, rawLengths, rawValues []byte) {
		h, err := vitessfeed.DecodeHead(headRow(tenant, topic, key, head))
		if err != nil || h != (driver.HeadChange{Tenant: tenant, Topic: topic, PartitionKey: key, Head: head}) {
			t.Fatalf("round trip of %q/%q/%q@%d: %+v, %v", tenant, topic, key, head, h, err)
		}
		r := &querypb.Row{Values: rawValues}
		for i := 0; i+8 <= len(rawLengths) && len(r.Lengths) < 8; i += 8 {
			var n int64
			for j := range 8 {
				n |= int64(rawLengths[i+j]) << (8 * j)
			}
			r.Lengths = append(r.Lengths, n)
		}
		vitessfeed.DecodeHead(r) // must not panic
	})
}
