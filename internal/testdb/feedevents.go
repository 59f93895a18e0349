// SPDX-License-Identifier: Apache-2.0

package testdb

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/shardq/shardq/driver"
)

// FeedEvents is a driver.FeedSink that hands every event to the test as
// a line: "moved TENANT/TOPIC/KEY@HEAD", "rescan", "up names=BOOL",
// "down ERR", "note MSG".
type FeedEvents chan string

func (e FeedEvents) Moved(hs []driver.HeadChange) {
	for _, h := range hs {
		e.send(fmt.Sprintf("moved %s/%s/%s@%d", h.Tenant, h.Topic, h.PartitionKey, h.Head))
	}
}
func (e FeedEvents) Rescan()                      { e.send("rescan") }
func (e FeedEvents) Up(names bool)                { e.send(fmt.Sprint("up names=", names)) }
func (e FeedEvents) Down(err error)               { e.send(fmt.Sprint("down ", err)) }
func (e FeedEvents) Note(msg string, args ...any) { e.send("note " + msg) }

// send never blocks the feed (a sink must not): a test that reads
// nothing does not hold the feed past its cancellation.
func (e FeedEvents) send(ev string) {
	select {
	case e <- ev:
	default:
	}
}

// Drain returns the lines held now.
func (e FeedEvents) Drain() []string {
	var out []string
	for {
		select {
		case ev := <-e:
			out = append(out, ev)
		default:
			return out
		}
	}
}

// Next waits up to 30 s for the next line that starts with prefix,
// skipping others.
func (e FeedEvents) Next(t testing.TB, prefix string) string {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case ev := <-e:
			if strings.HasPrefix(ev, prefix) {
				return ev
			}
		case <-deadline:
			t.Fatalf("no %q event within 30 s", prefix)
		}
	}
}
