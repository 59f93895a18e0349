// SPDX-License-Identifier: Apache-2.0

package vitessfeed

import (
	"context"

	binlogdatapb "vitess.io/vitess/go/vt/proto/binlogdata"
	querypb "vitess.io/vitess/go/vt/proto/query"

	"github.com/shardq/shardq/driver"
)

// FeedFrom runs f from start (nil: the current positions).
func FeedFrom(ctx context.Context, f *Feed, sink driver.FeedSink, start *binlogdatapb.VGtid) error {
	return f.feedFrom(ctx, sink, start)
}

// Apply runs events through a fresh stream's event handling, as if they
// arrived in one VStream, and returns the position the stream would
// resume from.
func Apply(f *Feed, sink driver.FeedSink, events ...*binlogdatapb.VEvent) *binlogdatapb.VGtid {
	s := &stream{f: f, sink: sink}
	var tx txn
	for _, ev := range events {
		s.event(&tx, ev)
	}
	return s.pos
}

// DecodeHead is decodeHead with the columns in headColumns' order.
var DecodeHead = func(row *querypb.Row) (driver.HeadChange, error) {
	return decodeHead(row, [4]int{0, 1, 2, 3}, true)
}
