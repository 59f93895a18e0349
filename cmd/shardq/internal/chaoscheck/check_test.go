// SPDX-License-Identifier: Apache-2.0

package chaoscheck

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

var config = Event{Op: OpConfig, Proc: "runner",
	Groups:  map[string]string{"sub": "ordered", "ung": "work"},
	Ordered: []string{"sub"},
	DLQ:     map[string]string{"sub": "ordered.dlq-sub", "ung": "work.dlq-ung"}}

func send(id, topic, key string) Event {
	return Event{Op: OpSend, Proc: "pub-0.1", Topic: topic, Key: key, ID: id}
}

func pub(id, topic, key string, off, start, end int64) Event {
	return Event{Op: OpPublish, Proc: "pub-0.1", Topic: topic, Key: key, ID: id, Offset: off, Start: start, End: end}
}

func hdl(proc, group, id, topic, key string, off, start, end int64, result string) Event {
	return Event{Op: OpHandle, Proc: proc, Group: group, Topic: topic, Key: key, ID: id, Offset: off, Start: start, End: end, Result: result}
}

// healthy is a run with nothing wrong: two keys and an ungrouped message,
// a retry, a dead letter, and a redelivery after its holder was killed.
func healthy() []Event {
	return []Event{
		config,
		send("a1", "ordered", "k1"), pub("a1", "ordered", "k1", 1, 10, 20),
		send("a2", "ordered", "k1"), pub("a2", "ordered", "k1", 3, 30, 40),
		send("b1", "ordered", "k2"), pub("b1", "ordered", "k2", 2, 25, 35),
		send("w1", "work", ""), pub("w1", "work", "", 4, 50, 60),
		send("x1", "ordered", "k3"), pub("x1", "ordered", "k3", 5, 50, 60),
		hdl("sub-0.1", "sub", "a1", "ordered", "k1", 1, 100, 101, "ok"),
		hdl("sub-1.1", "sub", "b1", "ordered", "k2", 2, 100, 105, "error"),
		hdl("sub-1.1", "sub", "b1", "ordered", "k2", 2, 110, 111, "ok"),
		hdl("sub-0.1", "sub", "a2", "ordered", "k1", 3, 102, 103, "ok"),
		{Op: OpFault, Proc: "sub-0.1", Fault: FaultKill, Start: 104},
		hdl("sub-1.1", "sub", "a2", "ordered", "k1", 3, 200, 201, "ok"), // replayed after the kill
		hdl("sub-0.1", "sub", "x1", "ordered", "k3", 5, 90, 91, "error"),
		{Op: OpStored, Proc: "runner", Topic: "ordered.dlq-sub", Key: "k3", ID: "x1", Offset: 9},
		hdl("ung-0.1", "ung", "w1", "work", "", 4, 120, 122, "ok"),
		// Transactional: t1 committed by its sender, t2 by the check-back
		// (never acknowledged, found stored and delivered), t3 rolled back.
		txSend("t1", "k4", IntentCommit), pub("t1", "ordered", "k4", 6, 61, 70),
		hdl("sub-0.1", "sub", "t1", "ordered", "k4", 6, 130, 131, "ok"),
		txSend("t2", "k4", IntentCommit),
		{Op: OpCheck, Proc: "tx-1.1", Topic: "ordered", Key: "k4", ID: "t2", Intent: IntentCommit},
		hdl("sub-0.1", "sub", "t2", "ordered", "k4", 7, 140, 141, "ok"),
		txSend("t3", "k4", IntentRollback),
		// A large message whose write was cut off: its abandoned marker
		// stays, and no handler is given it.
		{Op: OpSend, Proc: "large-0.1", Topic: "ordered", Key: "L0", ID: "L2", Size: 100},
		{Op: OpStored, Proc: "runner", Topic: "ordered", Key: "L0", ID: "L2", Offset: 12},
	}
}

func txSend(id, key, intent string) Event {
	return Event{Op: OpSend, Proc: "tx-0.1", Topic: "ordered", Key: key, ID: id, Intent: intent}
}

func TestHealthyRunHasNoViolations(t *testing.T) {
	r := Check(healthy())
	if len(r.Violations) != 0 {
		t.Fatalf("violations in a healthy run: %v", r.Violations)
	}
	if r.Published != 6 || r.Halves != 3 || r.Handled["sub"] != 6 || r.Handled["ung"] != 1 || r.Duplicates["sub"] != 1 || r.DeadLettered["sub"] != 1 {
		t.Fatalf("counts: %+v", r)
	}
}

// TestEachViolationIsFound feeds histories that break one promise each.
func TestEachViolationIsFound(t *testing.T) {
	without := func(drop func(Event) bool, add ...Event) []Event {
		var out []Event
		for _, e := range healthy() {
			if !drop(e) {
				out = append(out, e)
			}
		}
		return append(out, add...)
	}
	cases := []struct {
		name, kind, id string
		evs            []Event
	}{
		{"never delivered", "lost", "w1", without(func(e Event) bool { return e.Op == OpHandle && e.ID == "w1" })},
		{"still stored", "stuck", "w1", without(func(e Event) bool { return e.Op == OpHandle && e.ID == "w1" },
			Event{Op: OpStored, Proc: "runner", Topic: "work", ID: "w1", Offset: 4})},
		{"passed over by the cursor", "lost", "w1", without(func(e Event) bool { return e.Op == OpHandle && e.ID == "w1" },
			Event{Op: OpStored, Proc: "runner", Topic: "work", ID: "w1", Offset: 4},
			Event{Op: OpCursor, Proc: "runner", Group: "ung", Topic: "work", Offset: 4})},
		{"delivered, cursor below it", "stuck", "w1", append(healthy(),
			Event{Op: OpStored, Proc: "runner", Topic: "work", ID: "w1", Offset: 4},
			Event{Op: OpCursor, Proc: "runner", Group: "ung", Topic: "work", Offset: 3})},
		{"redelivered after the grace", "duplicate", "a2", append(without(func(e Event) bool { return e.Op == OpFault || e.Op == OpConfig },
			withGrace(50)), Event{Op: OpFault, Proc: "sub-0.1", Fault: FaultKill, Start: 40})},
		{"only failed", "lost", "b1", without(func(e Event) bool { return e.Op == OpHandle && e.ID == "b1" && e.Result == "ok" })},
		{"dead letter of another group", "lost", "x1", without(func(e Event) bool { return e.Op == OpStored },
			Event{Op: OpStored, Proc: "runner", Topic: "work.dlq-ung", Key: "k3", ID: "x1", Offset: 9})},
		{"never sent", "phantom", "zz", append(healthy(), hdl("ung-0.1", "ung", "zz", "work", "", 8, 130, 131, "ok"))},
		{"another offset", "phantom", "w1", append(healthy(), hdl("ung-0.1", "ung", "w1", "work", "", 7, 300, 301, "error"))},
		{"out of order", "order", "a2", without(func(e Event) bool { return e.Op == OpHandle && e.ID == "a1" },
			hdl("sub-0.1", "sub", "a1", "ordered", "k1", 1, 150, 151, "ok"))},
		{"acknowledged first, lower offset later", "precedence", "a2", without(func(e Event) bool { return e.Op == OpPublish && e.ID == "a2" },
			pub("a2", "ordered", "k1", 0, 30, 40))},
		{"one offset twice", "precedence", "a1", without(func(e Event) bool { return e.Op == OpPublish && e.ID == "a2" },
			pub("a2", "ordered", "k1", 1, 5, 40))},
		{"two holders of a key", "overlap", "a2", without(func(e Event) bool { return e.Op == OpHandle && e.ID == "a2" },
			hdl("sub-0.1", "sub", "a1", "ordered", "k1", 1, 100, 101, "ok"),
			hdl("sub-1.1", "sub", "a2", "ordered", "k1", 3, 100, 102, "ok"))},
		{"a key twice at once in one process", "overlap", "a2", without(func(e Event) bool { return e.Op == OpHandle && e.ID == "a2" },
			hdl("sub-0.1", "sub", "a2", "ordered", "k1", 3, 100, 102, "ok"))},
		{"two holders of a message", "overlap", "w1", append(healthy(), hdl("ung-1.1", "ung", "w1", "work", "", 4, 121, 123, "error"))},
		{"redelivered without a fault", "duplicate", "a2", without(func(e Event) bool { return e.Op == OpFault })},
		{"redelivered after a clock fault only", "duplicate", "a2", without(func(e Event) bool { return e.Op == OpFault },
			Event{Op: OpFault, Proc: "sub-0.1", Fault: FaultClock, Start: 104, Skew: 30e9})},
		{"large message cut short", "partial", "L1", append(healthy(),
			send("L1", "ordered", "k9"),
			Event{Op: OpPublish, Proc: "pub-0.1", Topic: "ordered", Key: "k9", ID: "L1", Offset: 11, Start: 1, End: 2, Size: 100, SHA256: "aa"},
			Event{Op: OpHandle, Proc: "sub-0.1", Group: "sub", Topic: "ordered", Key: "k9", ID: "L1", Offset: 11, Start: 100, End: 101, Result: "ok", Size: 50, SHA256: "bb"})},
		{"rolled back, delivered", "rolled-back", "t3", append(healthy(), hdl("sub-1.1", "sub", "t3", "ordered", "k4", 8, 150, 151, "ok"))},
		{"rolled back, stored", "rolled-back", "t3", append(healthy(), Event{Op: OpStored, Proc: "runner", Topic: "ordered", Key: "k4", ID: "t3", Offset: 8})},
		{"half never resolved", "unresolved", "t4", append(healthy(), txSend("t4", "k4", IntentCommit),
			Event{Op: OpHalf, Proc: "runner", Topic: "ordered", Key: "k4", ID: "t4"})},
		{"committed by the check-back, never delivered", "stuck", "t5", append(healthy(), txSend("t5", "k4", IntentCommit),
			Event{Op: OpStored, Proc: "runner", Topic: "ordered", Key: "k4", ID: "t5", Offset: 9})},
		// Its writer died after the end marker committed, before it
		// wrote the acknowledgement: the write completed all the same.
		{"large write completed, unacknowledged, never delivered", "stuck", "L3", append(healthy(),
			Event{Op: OpSend, Proc: "large-0.1", Topic: "ordered", Key: "L0", ID: "L3", Size: 100},
			Event{Op: OpStored, Proc: "runner", Topic: "ordered", Key: "L0", ID: "L3", Offset: 14, Complete: true})},
		{"large write completed, unacknowledged, read back otherwise", "partial", "L4", append(healthy(),
			Event{Op: OpSend, Proc: "large-0.1", Topic: "ordered", Key: "L4", ID: "L4", Size: 100, SHA256: "aa"},
			Event{Op: OpStored, Proc: "runner", Topic: "ordered", Key: "L4", ID: "L4", Offset: 15, Complete: true},
			Event{Op: OpHandle, Proc: "sub-0.1", Group: "sub", Topic: "ordered", Key: "L4", ID: "L4", Offset: 15, Start: 100, End: 101, Result: "ok", Size: 100, SHA256: "bb"})},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := Check(c.evs)
			found := false
			for _, v := range r.Violations {
				if v.Kind == c.kind && v.ID == c.id {
					found = true
				}
			}
			if !found {
				t.Fatalf("no %s violation for %s; got %v", c.kind, c.id, r.Violations)
			}
		})
	}
}

func withGrace(g int64) Event {
	c := config
	c.Grace = g
	return c
}

// TestExplainedByAnEarlierFault: a fault's effect on a lease outlasts
// the fault by up to the grace; an ack's unknown outcome is a delivery.
func TestExplainedByAnEarlierFault(t *testing.T) {
	evs := append(healthy(), withGrace(70))
	for i, e := range evs {
		if e.Op == OpFault {
			evs[i].Start = 40 // before the success at 103, within its grace
		}
	}
	if r := Check(evs); len(r.Violations) != 0 {
		t.Fatalf("a duplicate within the grace reported: %v", r.Violations)
	}
	evs = healthy()
	for i, e := range evs {
		if e.Op == OpHandle && e.ID == "w1" {
			evs[i].Result = ResultUnknown
		}
	}
	if r := Check(evs); len(r.Violations) != 0 {
		t.Fatalf("an ack of unknown outcome reported: %v", r.Violations)
	}
}

// TestServerFaultTouchesItsClients: a kill of a process that others go
// through (a server) explains the redeliveries of the slots it lists,
// any incarnation, and of no other.
func TestServerFaultTouchesItsClients(t *testing.T) {
	evs := func(touches ...string) []Event {
		var out []Event
		for _, e := range healthy() {
			if e.Op != OpFault {
				out = append(out, e)
			}
		}
		return append(out, Event{Op: OpFault, Proc: "serve-0.1", Fault: FaultKill, Start: 104, Touches: touches})
	}
	for _, touches := range [][]string{nil, {"sub-1"}, {"sub"}, {"sub-0.1"}} {
		if r := Check(evs(touches...)); countKind(r, "duplicate") != 1 {
			t.Fatalf("a server's kill touching %q explained sub-0.1's duplicate: %v", touches, r.Violations)
		}
	}
	if r := Check(evs("http-recv-0", "sub-0")); len(r.Violations) != 0 {
		t.Fatalf("a server's kill touching sub-0 did not explain sub-0.1's duplicate: %v", r.Violations)
	}
}

// TestStoppedHolderOverlapIsExplained: a frozen process's handler goes on
// when it wakes; that overlap is what fencing exists for.
func TestStoppedHolderOverlapIsExplained(t *testing.T) {
	evs := append(healthy(),
		send("c1", "ordered", "k5"), pub("c1", "ordered", "k5", 20, 1, 2),
		hdl("sub-0.1", "sub", "c1", "ordered", "k5", 20, 100, 200, "error"),
		hdl("sub-1.1", "sub", "c1", "ordered", "k5", 20, 150, 151, "ok"))
	if r := Check(evs); countKind(r, "overlap") != 1 {
		t.Fatalf("overlap without a stop: %v", r.Violations)
	}
	evs = append(evs, Event{Op: OpFault, Proc: "sub-0.1", Fault: FaultStop, Start: 120, End: 180})
	if r := Check(evs); len(r.Violations) != 0 {
		t.Fatalf("overlap of a stopped holder reported: %v", r.Violations)
	}
}

func countKind(r Report, kind string) int {
	n := 0
	for _, v := range r.Violations {
		if v.Kind == kind {
			n++
		}
	}
	return n
}

func TestReadLeavesOutATornLastLine(t *testing.T) {
	evs, err := Read(strings.NewReader(`{"op":"send","id":"a"}`+"\n"+`{"op":"publ`), "h")
	if err != nil || len(evs) != 1 {
		t.Fatalf("torn last line: %v %v", evs, err)
	}
	if _, err := Read(strings.NewReader(`{"op":"publ`+"\n"+`{"op":"send","id":"a"}`), "h"); err == nil {
		t.Fatal("a bad line before the last: no error")
	}
}

// TestImportsOnlyTheStandardLibrary keeps the checker independent of the
// code it judges.
func TestImportsOnlyTheStandardLibrary(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		af, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range af.Imports {
			path := strings.Trim(imp.Path.Value, `"`)
			if first, _, _ := strings.Cut(path, "/"); strings.Contains(first, ".") {
				t.Errorf("%s imports %s: the checker uses the standard library only", f, path)
			}
		}
	}
}

// TestTenantsQualifyKeys: a key of one tenant is not another's: the
// same key and offset in two tenants, handled at once by two members,
// is no violation; without the tenants it is one offset twice and an
// overlap.
func TestTenantsQualifyKeys(t *testing.T) {
	evs := []Event{config}
	for _, tn := range []string{"a", "b"} {
		s, p := send(tn+"1", "ordered", "k1"), pub(tn+"1", "ordered", "k1", 1, 10, 20)
		h := hdl("sub-0.1", "sub", tn+"1", "ordered", "k1", 1, 100, 110, "ok")
		if tn == "b" {
			h.Proc = "sub-1.1"
		}
		s.Tenant, p.Tenant, h.Tenant = tn, tn, tn
		evs = append(evs, s, p, h)
	}
	if r := Check(evs); len(r.Violations) != 0 {
		t.Fatalf("two tenants' keys taken for one: %v", r.Violations)
	}
	for i := range evs {
		evs[i].Tenant = ""
	}
	if r := Check(evs); countKind(r, "precedence") == 0 || countKind(r, "overlap") == 0 {
		t.Fatalf("without tenants, one key: want precedence and overlap violations, got %v", r.Violations)
	}
}

// TestDatabaseFaultsExplainRedeliveries: a fault on the database's side
// (a restart, a primary moved) ends every client's connections there, so
// it explains a redelivery; a clock offset does not.
func TestDatabaseFaultsExplainRedeliveries(t *testing.T) {
	evs := func(kind string) []Event {
		var out []Event
		for _, e := range healthy() {
			if e.Op != OpFault {
				out = append(out, e)
			}
		}
		return append(out, Event{Op: OpFault, Proc: "runner", Fault: kind, Start: 104, End: 106})
	}
	for _, kind := range []string{FaultDBRestart, FaultReparent, FaultCut} {
		if r := Check(evs(kind)); len(r.Violations) != 0 {
			t.Errorf("%s did not explain sub-0.1's redelivery: %v", kind, r.Violations)
		}
	}
	if r := Check(evs(FaultClock)); countKind(r, "duplicate") != 1 {
		t.Errorf("a clock offset explained a redelivery: %v", r.Violations)
	}
}

// TestUnsettledExplainsItsRedelivery: an ack the consumer saw get no
// answer leaves its message to come again, however long ago the fault
// behind it; the line excuses the one handle line it names (process,
// message, offset and start), not a later successful one.
func TestUnsettledExplainsItsRedelivery(t *testing.T) {
	noFaults := func(add ...Event) []Event {
		var out []Event
		for _, e := range healthy() {
			if e.Op != OpFault {
				out = append(out, e)
			}
		}
		return append(out, add...)
	}
	unsettled := func(proc, id string, off, start int64) Event {
		return Event{Op: OpUnsettled, Proc: proc, Group: "sub", Topic: "ordered", Key: "k1", ID: id, Offset: off, Start: start}
	}
	// sub-0.1 handled a2 (offset 3) from 102; sub-1.1 got it again at 200.
	if r := Check(noFaults(unsettled("sub-0.1", "a2", 3, 102))); len(r.Violations) != 0 {
		t.Fatalf("a redelivery after an ack that got no answer reported: %v", r.Violations)
	}
	for _, e := range []Event{unsettled("sub-1.1", "a2", 3, 102), unsettled("sub-0.1", "a1", 1, 102), unsettled("sub-0.1", "a2", 4, 102),
		unsettled("sub-0.1", "a2", 3, 101)} {
		if r := Check(noFaults(e)); countKind(r, "duplicate") != 1 {
			t.Fatalf("%s's unsettled %s at %d from %d explained sub-0.1's a2 at 3 from 102: %v", e.Proc, e.ID, e.Offset, e.Start, r.Violations)
		}
	}
	// sub-0.1 gets a2 again at 150 and its ack succeeds: a third delivery
	// is a duplicate, though the first ack got no answer.
	var evs []Event
	for _, e := range noFaults(unsettled("sub-0.1", "a2", 3, 102), hdl("sub-0.1", "sub", "a2", "ordered", "k1", 3, 150, 151, "ok")) {
		if e.Op != OpHandle || e.ID != "a2" || e.Start != 200 {
			evs = append(evs, e)
		}
	}
	if r := Check(append(evs, hdl("sub-1.1", "sub", "a2", "ordered", "k1", 3, 300, 301, "ok"))); countKind(r, "duplicate") != 1 {
		t.Fatalf("a delivery after a settled redelivery not reported: %v", r.Violations)
	}
}

// TestLargeDeliveredAtItsFirstChunk: a large message is delivered at
// its first chunk's offset, below its end marker's, whether its
// publisher saw the acknowledgement or only the dump found it stored.
func TestLargeDeliveredAtItsFirstChunk(t *testing.T) {
	large := Event{Op: OpSend, Proc: "large-0.1", Topic: "ordered", Key: "L0", ID: "L1", Size: 100}
	h := hdl("sub-0.1", "sub", "L1", "ordered", "L0", 20, 300, 301, "ok")
	acked := Event{Op: OpPublish, Proc: "large-0.1", Topic: "ordered", Key: "L0", ID: "L1", Offset: 25, Start: 1, End: 2, Size: 100, SHA256: "aa"}
	h.Size, h.SHA256 = 100, "aa"
	stored := Event{Op: OpStored, Proc: "runner", Topic: "ordered", Key: "L0", ID: "L1", Offset: 25, Complete: true}
	for name, evs := range map[string][]Event{
		"acknowledged": append(healthy(), large, acked, h),
		"found stored": append(healthy(), large, stored, h, Event{Op: OpCursor, Proc: "runner", Group: "sub", Topic: "ordered", Key: "L0", Offset: 25}),
	} {
		if r := Check(evs); len(r.Violations) != 0 {
			t.Errorf("%s: %v", name, r.Violations)
		}
	}
	h.Offset = 26
	if r := Check(append(healthy(), large, stored, h)); countKind(r, "phantom") != 1 {
		t.Errorf("a large message delivered past its end marker: %v", r.Violations)
	}
	small := large
	small.Size = 0
	h.Offset = 20
	if r := Check(append(healthy(), small, stored, h)); countKind(r, "phantom") != 1 {
		t.Errorf("a small message delivered below its stored offset: %v", r.Violations)
	}
}
