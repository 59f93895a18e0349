// SPDX-License-Identifier: Apache-2.0

package wakeup

import (
	"testing"

	"github.com/shardq/shardq/driver"
)

func TestCommittedWakesEveryTopic(t *testing.T) {
	var r Registry
	got := map[string]int{}
	r.Add("x", 1, func(rows []*driver.InsertMessage) { got["x"] += len(rows) })
	r.Add("y", 2, func(rows []*driver.InsertMessage) { got["y"] += len(rows) })
	r.Add("z", 3, func(rows []*driver.InsertMessage) { got["z"] += len(rows) })
	r.Remove("z", 3)
	r.Committed([]*driver.InsertMessage{{Topic: "x"}, {Topic: "y"}})
	if got["x"] != 2 || got["y"] != 2 || got["z"] != 0 {
		t.Fatalf("woken %v; want x and y, each with both rows, and not the removed z", got)
	}
}
