// SPDX-License-Identifier: Apache-2.0

package wakeup

import (
	"context"
	"log/slog"
	"sync"
	"testing"

	"github.com/shardq/shardq/driver"
)

type recorder struct {
	mu      sync.Mutex
	heads   []driver.HeadChange
	rescans int
}

func (r *recorder) Moved(hs []driver.HeadChange) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.heads = append(r.heads, hs...)
}

func (r *recorder) Rescan() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rescans++
}

func (r *recorder) got() ([]driver.HeadChange, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]driver.HeadChange(nil), r.heads...), r.rescans
}

func TestCommittedWakesEveryTopicOnce(t *testing.T) {
	var r Registry
	x, y, z := &recorder{}, &recorder{}, &recorder{}
	r.Add("x", nil, 1, x)
	r.Add("y", nil, 2, y)
	r.Add("z", nil, 3, z)
	r.Remove("z", 3)
	r.Committed([]*driver.InsertMessage{
		{Tenant: "a", Topic: "x", PartitionKey: "k", Offset: 1}, {Tenant: "a", Topic: "x", PartitionKey: "k", Offset: 2},
		{Tenant: "a", Topic: "y", PartitionKey: "k", Offset: 7}})
	gx, _ := x.got()
	gy, _ := y.got()
	gz, _ := z.got()
	if len(gx) != 1 || gx[0].Head != 2 || len(gy) != 1 || gy[0].Head != 7 || len(gz) != 0 {
		t.Fatalf("x %v, y %v, z %v; want x's partition once at head 2, y's at 7, nothing for the removed z", gx, gy, gz)
	}
}

// A consumer hears only of its tenants: a tenant outside them (outside
// SHARDQ_TENANTS) wakes nothing.
func TestDispatchFiltersTenants(t *testing.T) {
	var r Registry
	mine := &recorder{}
	r.Add("x", []string{"a", "b"}, 1, mine)
	r.dispatch([]driver.HeadChange{{Tenant: "a", Topic: "x", PartitionKey: "k"}, {Tenant: "evil", Topic: "x", PartitionKey: "k"},
		{Tenant: "b", Topic: "other", PartitionKey: "k"}})
	got, _ := mine.got()
	if len(got) != 1 || got[0].Tenant != "a" {
		t.Fatalf("woken with %v; want only tenant a's change of topic x", got)
	}
}

// scriptedFeed streams what the test sends it.
type scriptedFeed struct {
	events  chan func(driver.FeedSink)
	running chan struct{}
}

func (f *scriptedFeed) FeedHeads(ctx context.Context, sink driver.FeedSink) error {
	f.running <- struct{}{}
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev := <-f.events:
			ev(sink)
		}
	}
}

// The feed runs from the first consumer until Close: up means slower
// polling and a rescan; down means polling again.
func TestFeedRunsWhileConsumersAre(t *testing.T) {
	f := &scriptedFeed{events: make(chan func(driver.FeedSink)), running: make(chan struct{}, 2)}
	var r Registry
	r.UseFeed(f, slog.New(slog.DiscardHandler))
	c := &recorder{}
	r.Add("x", nil, 1, c)
	<-f.running
	f.events <- func(s driver.FeedSink) { s.Up(true) }
	f.events <- func(s driver.FeedSink) {
		s.Moved([]driver.HeadChange{{Tenant: "a", Topic: "x", PartitionKey: "k", Head: 3}})
	}
	f.events <- func(driver.FeedSink) {} // the previous event was handled
	heads, rescans := c.got()
	if !r.Up() || !r.Names() || rescans != 1 || len(heads) != 1 || heads[0].Head != 3 {
		t.Fatalf("up %v, rescans %d, heads %v; want up, one rescan, the head change", r.Up(), rescans, heads)
	}
	f.events <- func(s driver.FeedSink) { s.Down(context.DeadlineExceeded) }
	f.events <- func(driver.FeedSink) {}
	if r.Up() || r.Names() {
		t.Fatal("up after Down")
	}
	r.Remove("x", 1)
	r.Close()
	select {
	case f.events <- func(driver.FeedSink) {}:
		t.Fatal("the feed still runs after Close")
	default: // Close waited for the feed to return
	}
	r.Add("x", nil, 1, c)
	if r.cancel != nil {
		t.Fatal("a closed registry started its feed again")
	}
}
