// SPDX-License-Identifier: Apache-2.0

// Package chaoscheck judges a chaos run (docs/chaos.md) from what its
// processes wrote down and what the database held at the end. It is
// written apart from the runtime it judges: it imports only the standard
// library (a test keeps it so), reads the history format documented in
// docs/chaos.md rather than the runner's types, and knows the promises,
// not the mechanisms.
package chaoscheck

import (
	"bufio"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// Event is one line of a history file. Times are Unix nanoseconds of the
// machine's wall clock, which every process on it shares.
type Event struct {
	Op   string `json:"op"`
	Proc string `json:"proc"`
	// Tenant qualifies Key: a partition is (tenant, topic, key). The
	// runner writes it on every line that names a message.
	Tenant string `json:"tenant,omitempty"`
	Group  string `json:"group,omitempty"`
	Topic  string `json:"topic,omitempty"`
	Key    string `json:"key,omitempty"`
	ID     string `json:"id,omitempty"`
	Offset int64  `json:"offset,omitempty"`
	Start  int64  `json:"start,omitempty"`
	End    int64  `json:"end,omitempty"`
	Result string `json:"result,omitempty"`
	Fault  string `json:"fault,omitempty"`
	// Skew (op fault, kind clock; nanoseconds): how far the process's
	// clock is off from now on.
	Skew int64 `json:"skew,omitempty"`
	// Touches (op fault, kinds kill and stop of a process that others go
	// through, a server): the slots of those others. A process is named
	// "slot.incarnation"; the fault touches every incarnation of each
	// slot listed as it touches its own process.
	Touches []string `json:"touches,omitempty"`
	// Groups (op config): each consumer group and the topic it reads;
	// Ordered: the groups that promise per-key order and one holder per
	// key; DLQ: each group's dead-letter topic.
	Groups  map[string]string `json:"groups,omitempty"`
	Ordered []string          `json:"ordered,omitempty"`
	DLQ     map[string]string `json:"dlq,omitempty"`
	// Grace (op config, nanoseconds): how long after a fault ends its
	// effects may still cost a lease or claim (a lease's TTL and the
	// commit interval): a duplicate within it is explained.
	Grace int64 `json:"grace,omitempty"`
	// Size and SHA256 (large messages): written by the publisher (on its
	// send too, so that a completed write it never saw acknowledged is
	// checked as well), and what a consumer read back.
	Size   int64  `json:"size,omitempty"`
	SHA256 string `json:"sha256,omitempty"`
	// Intent (op send, check; transactional messages): how the sender's
	// local transaction ends, commit or rollback, whoever resolves it.
	Intent string `json:"intent,omitempty"`
	// Complete (op stored, a large message's end marker): its write
	// completed; an aborted or abandoned write's marker is stored without.
	Complete bool `json:"complete,omitempty"`
}

// History ops.
const (
	OpConfig  = "config"  // the run's groups (the runner, first)
	OpSend    = "send"    // a publish is about to be attempted (before the call)
	OpPublish = "publish" // a publish was acknowledged, with its offset
	OpHandle  = "handle"  // a handler ran: Start, End, Result ok or error
	// OpUnsettled: the settlement of one handle line the same process
	// wrote (same topic, id, offset and start) got no answer; its outcome
	// is unknown, so a redelivery after that line is allowed whatever the
	// faults.
	OpUnsettled = "unsettled"
	OpFault     = "fault"  // the runner injected a fault
	OpStored    = "stored" // a message stored at the end (the runner's dump)
	OpCursor    = "cursor" // a group's committed offset in a partition at the end (the runner's dump)
	OpHalf      = "half"   // a transactional half message still pending at the end (the runner's dump)
	OpCheck     = "check"  // a check-back asked about a half message and was given its Intent
)

// Transactional intents.
const (
	IntentCommit   = "commit"
	IntentRollback = "rollback"
)

// Handle results. Unknown: the handler succeeded but its settlement's
// outcome is not known (an ack whose commit lost its connection).
const (
	ResultOK      = "ok"
	ResultError   = "error"
	ResultUnknown = "unknown"
)

// Faults. A process fault names the process (Proc); the others touch
// every process's connections.
const (
	FaultKill      = "kill"
	FaultStop      = "stop"
	FaultCont      = "cont"
	FaultCut       = "cut"
	FaultBlackhole = "blackhole"
	FaultDelay     = "delay"
	FaultDBRestart = "db-restart"
	FaultDiskFull  = "disk-full"
	// FaultReparent moves a database's primary (a Vitess shard's planned
	// reparent): its clients' connections and transactions there end.
	FaultReparent = "reparent"
	// FaultClock restarts a killed process (its kill is a fault of its
	// own) with its clock off; it explains nothing: members keep to the
	// database's clock.
	FaultClock = "clock"
)

// Violation is one broken promise.
type Violation struct {
	Kind   string // lost, stuck, phantom, order, precedence, overlap, duplicate, partial, rolled-back, unresolved
	Group  string
	Topic  string
	Key    string
	ID     string
	Detail string
}

func (v Violation) String() string {
	var b strings.Builder
	b.WriteString(v.Kind)
	for _, f := range [][2]string{{"group", v.Group}, {"topic", v.Topic}, {"key", v.Key}, {"id", v.ID}} {
		if f[1] != "" {
			fmt.Fprintf(&b, " %s=%q", f[0], f[1])
		}
	}
	if v.Detail != "" {
		b.WriteString(": " + v.Detail)
	}
	return b.String()
}

// Report is the checker's verdict and the run's counts.
type Report struct {
	Sent, Published, Stored int
	Halves                  int            // transactional messages sent (Sent counts them too)
	CheckedBack             int            // check-backs answered
	Handled                 map[string]int // per group: handler calls that succeeded
	DeadLettered            map[string]int // per group
	Duplicates              map[string]int // per group: deliveries after a success, each explained by a fault
	Faults                  map[string]int
	Violations              []Violation
}

// ReadDir reads every *.jsonl history in dir.
func ReadDir(dir string) ([]Event, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.jsonl"))
	if err != nil {
		return nil, err
	}
	var all []Event
	for _, f := range files {
		evs, err := readFile(f)
		if err != nil {
			return nil, err
		}
		all = append(all, evs...)
	}
	return all, nil
}

func readFile(name string) ([]Event, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return Read(f, name)
}

// Read reads one history. A last line cut short (its process was killed
// while writing it) is left out; any other bad line is an error.
func Read(r io.Reader, name string) ([]Event, error) {
	var evs []Event
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	var pending error
	for n := 1; sc.Scan(); n++ {
		if pending != nil {
			return nil, pending
		}
		var e Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			pending = fmt.Errorf("%s:%d: %w", name, n, err)
			continue
		}
		evs = append(evs, e)
	}
	return evs, sc.Err()
}

type msgKey struct{ topic, id string }

type message struct {
	topic, key, id string
	offset         int64
	sent, acked    bool
	intent         string // transactional: commit or rollback
	large          bool   // sent as a large message (Size on its send)
	start, end     int64  // the acknowledged publish's call
	stored         bool
	complete       bool // a large message whose end marker says its write completed
	size           int64
	sha256         string
}

type handle struct {
	Event
	proc string
}

// Check judges a run's events.
func Check(evs []Event) Report {
	evs = qualify(evs)
	r := Report{Handled: map[string]int{}, DeadLettered: map[string]int{}, Duplicates: map[string]int{}, Faults: map[string]int{}}
	groups := map[string]string{}
	dlq := map[string]string{}
	ordered := map[string]bool{}
	msgs := map[msgKey]*message{}
	get := func(topic, id string) *message {
		m := msgs[msgKey{topic, id}]
		if m == nil {
			m = &message{topic: topic, id: id, offset: -1}
			msgs[msgKey{topic, id}] = m
		}
		return m
	}
	var handles []handle
	type unsettledKey struct {
		proc, topic, id string
		offset, start   int64
	}
	unsettled := map[unsettledKey]bool{}
	var faults []Event
	var grace int64
	cursors := map[[3]string]int64{} // group, topic, key
	add := func(v Violation) { r.Violations = append(r.Violations, v) }
	for _, e := range evs {
		switch e.Op {
		case OpCursor:
			cursors[[3]string{e.Group, e.Topic, e.Key}] = e.Offset
		case OpConfig:
			grace = e.Grace
			for g, t := range e.Groups {
				groups[g] = t
			}
			for g, t := range e.DLQ {
				dlq[g] = t
			}
			for _, g := range e.Ordered {
				ordered[g] = true
			}
		case OpSend:
			m := get(e.Topic, e.ID)
			m.sent, m.key, m.intent, m.large = true, e.Key, e.Intent, e.Size > 0
			if m.sha256 == "" { // a large message's, known before the call; its publish line says the same
				m.size, m.sha256 = e.Size, e.SHA256
			}
			r.Sent++
			if e.Intent != "" {
				r.Halves++
			}
		case OpCheck:
			r.CheckedBack++
		case OpHalf:
			add(Violation{Kind: "unresolved", Topic: e.Topic, Key: e.Key, ID: e.ID, Detail: "a half message still pending after the drain: its check-back never resolved it"})
		case OpPublish:
			m := get(e.Topic, e.ID)
			m.acked, m.key, m.offset, m.start, m.end = true, e.Key, e.Offset, e.Start, e.End
			m.size, m.sha256 = e.Size, e.SHA256
			r.Published++
		case OpStored:
			m := get(e.Topic, e.ID)
			m.stored, m.complete, m.key = true, e.Complete, e.Key
			if m.offset < 0 {
				m.offset = e.Offset
			}
			r.Stored++
		case OpHandle:
			handles = append(handles, handle{Event: e, proc: e.Proc})
		case OpUnsettled:
			unsettled[unsettledKey{e.Proc, e.Topic, e.ID, e.Offset, e.Start}] = true
		case OpFault:
			faults = append(faults, e)
			r.Faults[e.Fault]++
		}
	}
	for i, h := range handles {
		if h.Result == ResultOK && unsettled[unsettledKey{h.proc, h.Topic, h.ID, h.Offset, h.Start}] {
			handles[i].Result = ResultUnknown
		}
	}
	// Offsets learnt from deliveries (a publish whose acknowledgement was
	// lost still has one).
	for _, h := range handles {
		if m := msgs[msgKey{h.Topic, h.ID}]; m != nil && m.offset < 0 {
			m.offset = h.Offset
		}
	}
	// Phantoms: a delivery of something no publisher sent.
	for _, h := range handles {
		if m := msgs[msgKey{h.Topic, h.ID}]; m == nil || !m.sent {
			add(Violation{Kind: "phantom", Group: h.Group, Topic: h.Topic, Key: h.Key, ID: h.ID, Detail: "delivered but never sent"})
			continue
		}
		// A large message is delivered at its first chunk's offset and
		// acknowledged (and dumped) at its end marker's.
		if m := msgs[msgKey{h.Topic, h.ID}]; (m.offset != h.Offset && (!m.large || h.Offset > m.offset)) || m.key != h.Key {
			add(Violation{Kind: "phantom", Group: h.Group, Topic: h.Topic, Key: h.Key, ID: h.ID,
				Detail: fmt.Sprintf("delivered as key %q offset %d, published as key %q offset %d", h.Key, h.Offset, m.key, m.offset)})
		}
	}
	checkPrecedence(msgs, add)
	// A transaction that rolled back never reaches a consumer, nor stays.
	for _, m := range sortedMessages(msgs) {
		if m.intent == IntentRollback && (m.acked || m.stored) {
			add(Violation{Kind: "rolled-back", Topic: m.topic, Key: m.key, ID: m.id, Detail: fmt.Sprintf("its transaction rolled back, yet it was published (acknowledged %v, stored %v)", m.acked, m.stored)})
		}
	}
	for _, h := range handles {
		if m := msgs[msgKey{h.Topic, h.ID}]; m != nil && m.intent == IntentRollback {
			add(Violation{Kind: "rolled-back", Group: h.Group, Topic: h.Topic, Key: h.Key, ID: h.ID, Detail: "its transaction rolled back, yet it was delivered to " + h.proc})
		}
	}

	sort.SliceStable(handles, func(i, j int) bool { return handles[i].Start < handles[j].Start })
	byGroup := map[string][]handle{}
	for _, h := range handles {
		byGroup[h.Group] = append(byGroup[h.Group], h)
	}
	for _, g := range sortedKeys(groups) {
		topic := groups[g]
		hs := byGroup[g]
		done := map[string]bool{}
		for _, h := range hs {
			if h.Result == ResultOK || h.Result == ResultUnknown {
				done[h.ID] = true
				r.Handled[g]++
			}
		}
		dead := map[string]bool{}
		for k, m := range msgs {
			if k.topic == dlq[g] && m.stored {
				dead[k.id] = true
				r.DeadLettered[g]++
			}
		}
		// Lost or stuck: acknowledged to its publisher (or sent and found
		// stored: its acknowledgement was lost, or a check-back committed
		// it), never settled. Lost when the group's cursor passed it (or
		// it is gone), stuck when the cursor is still below it. A large
		// message whose write was cut off is stored as an aborted or
		// abandoned marker, which no handler is given; one whose write
		// completed, acknowledged or not, must arrive.
		for _, m := range sortedMessages(msgs) {
			if m.topic != topic || !(m.acked || m.sent && m.stored && (!m.large || m.complete)) || dead[m.id] {
				continue
			}
			cursor, ok := cursors[[3]string{g, topic, m.key}]
			passed := ok && cursor >= m.offset
			switch {
			case !passed && m.stored:
				add(Violation{Kind: "stuck", Group: g, Topic: topic, Key: m.key, ID: m.id,
					Detail: fmt.Sprintf("published, still unsettled after the drain (offset %d, cursor %d, acknowledged %v)", m.offset, cursor, m.acked)})
			case !done[m.id]:
				add(Violation{Kind: "lost", Group: g, Topic: topic, Key: m.key, ID: m.id,
					Detail: fmt.Sprintf("published, never delivered (offset %d, cursor %d, acknowledged %v, stored %v)", m.offset, cursor, m.acked, m.stored)})
			}
		}
		checkLarge(g, hs, msgs, add)
		r.Duplicates[g] = checkDuplicates(g, hs, faults, grace, add)
		if ordered[g] {
			checkOrder(g, topic, hs, add)
			checkOverlap(g, hs, func(h handle) string { return h.Key }, faults, add)
		} else {
			checkOverlap(g, hs, func(h handle) string { return h.ID }, faults, add)
		}
	}
	return r
}

// checkPrecedence: a publish acknowledged before another to the same
// partition began has the lower offset.
func checkPrecedence(msgs map[msgKey]*message, add func(Violation)) {
	parts := map[string][]*message{}
	for _, m := range msgs {
		if m.acked {
			p := m.topic + "\x00" + m.key
			parts[p] = append(parts[p], m)
		}
	}
	for _, p := range sortedKeys(parts) {
		ms := parts[p]
		topic, key, _ := strings.Cut(p, "\x00")
		// Ties (one offset twice) in id order, so that a report names the
		// same message each time.
		slices.SortFunc(ms, func(a, b *message) int { return cmp.Or(cmp.Compare(a.offset, b.offset), cmp.Compare(a.id, b.id)) })
		// From the highest offset down: the earliest acknowledgement among
		// higher offsets must not precede this publish's start.
		var earliest *message
		for i := len(ms) - 1; i >= 0; i-- {
			m := ms[i]
			if i+1 < len(ms) && ms[i+1].offset == m.offset {
				add(Violation{Kind: "precedence", Topic: topic, Key: key, ID: m.id,
					Detail: fmt.Sprintf("offset %d acknowledged for %s too", m.offset, ms[i+1].id)})
			}
			if earliest != nil && earliest.end < m.start {
				add(Violation{Kind: "precedence", Topic: topic, Key: key, ID: m.id,
					Detail: fmt.Sprintf("published after %s was acknowledged, at the lower offset %d < %d", earliest.id, m.offset, earliest.offset)})
			}
			if earliest == nil || m.end < earliest.end {
				earliest = m
			}
		}
	}
}

// checkOrder: in an ordered group, a key's messages are first delivered
// in offset order.
func checkOrder(g, topic string, hs []handle, add func(Violation)) {
	first := map[string]map[int64]handle{}
	for _, h := range hs { // sorted by start
		if first[h.Key] == nil {
			first[h.Key] = map[int64]handle{}
		}
		if _, ok := first[h.Key][h.Offset]; !ok {
			first[h.Key][h.Offset] = h
		}
	}
	for _, key := range sortedKeys(first) {
		offs := sortedKeys(first[key])
		var latest handle
		for i, o := range offs {
			h := first[key][o]
			if i > 0 && h.Start < latest.Start {
				add(Violation{Kind: "order", Group: g, Topic: topic, Key: key, ID: h.ID,
					Detail: fmt.Sprintf("offset %d first delivered (by %s) before offset %d (by %s)", o, h.proc, latest.Offset, latest.proc)})
			}
			if i == 0 || h.Start > latest.Start {
				latest = h
			}
		}
	}
}

// checkOverlap: two handler calls of one unit (a key in an ordered group,
// a message otherwise), by one process or two, never run at once, unless
// the earlier one's process was stopped (SIGSTOP) meanwhile: nothing
// stops a frozen process's handler from going on when it wakes, which is
// why its settlement is fenced.
func checkOverlap(g string, hs []handle, unit func(handle) string, faults []Event, add func(Violation)) {
	open := map[string]handle{} // the call of each unit that ends last so far
	for _, h := range hs {      // sorted by start
		u := unit(h)
		prev, ok := open[u]
		if ok && prev.End > h.Start && !stoppedDuring(prev.proc, prev.Start, prev.End, faults) {
			add(Violation{Kind: "overlap", Group: g, Topic: h.Topic, Key: h.Key, ID: h.ID,
				Detail: fmt.Sprintf("%s handled %s from %d to %d while %s handled %s from %d to %d", h.proc, h.ID, h.Start, h.End, prev.proc, prev.ID, prev.Start, prev.End)})
		}
		if !ok || h.End > prev.End {
			open[u] = h
		}
	}
}

func stoppedDuring(proc string, from, to int64, faults []Event) bool {
	for _, f := range faults {
		if f.Fault == FaultStop && f.Proc == proc && f.Start <= to && f.End >= from {
			return true
		}
	}
	return false
}

// checkDuplicates: a message delivered again after a handler settled it
// is a duplicate; at-least-once allows one only after the settling
// process lost its lease or claim, which here means a fault that touched
// it between grace before the success and the redelivery. It returns the
// explained ones.
func checkDuplicates(g string, hs []handle, faults []Event, grace int64, add func(Violation)) int {
	okAt := map[msgKey]handle{}
	explained := 0
	for _, h := range hs { // sorted by start
		k := msgKey{h.Topic, h.ID}
		prev, ok := okAt[k]
		if ok && h.Start >= prev.End {
			if touched(prev.proc, prev.End-grace, h.Start, faults) {
				explained++
			} else {
				add(Violation{Kind: "duplicate", Group: g, Topic: h.Topic, Key: h.Key, ID: h.ID,
					Detail: fmt.Sprintf("delivered to %s at %d after %s settled it at %d, with no fault between", h.proc, h.Start, prev.proc, prev.End)})
			}
		}
		if h.Result == ResultOK && !ok {
			okAt[k] = h
		}
	}
	return explained
}

// touched: a fault that could cost proc its lease or claim (or the
// commit of its settlements) began between from and to, or was under
// way then.
func touched(proc string, from, to int64, faults []Event) bool {
	for _, f := range faults {
		end := max(f.End, f.Start)
		if end < from || f.Start > to {
			continue
		}
		switch f.Fault {
		case FaultKill, FaultStop:
			if f.Proc == proc || slices.Contains(f.Touches, slotOf(proc)) {
				return true
			}
		case FaultCut, FaultBlackhole, FaultDelay, FaultDBRestart, FaultDiskFull, FaultReparent:
			return true
		}
	}
	return false
}

// checkLarge: a large message is read back whole, or not at all.
func checkLarge(g string, hs []handle, msgs map[msgKey]*message, add func(Violation)) {
	for _, h := range hs {
		m := msgs[msgKey{h.Topic, h.ID}]
		if m == nil || m.sha256 == "" || h.Result == ResultError {
			continue
		}
		if h.SHA256 != m.sha256 || h.Size != m.size {
			add(Violation{Kind: "partial", Group: g, Topic: h.Topic, Key: h.Key, ID: h.ID,
				Detail: fmt.Sprintf("read %d bytes (sha256 %s), published %d (sha256 %s)", h.Size, h.SHA256, m.size, m.sha256)})
		}
	}
}

func sortedKeys[K cmp.Ordered, V any](m map[K]V) []K {
	ks := make([]K, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

func sortedMessages(msgs map[msgKey]*message) []*message {
	ms := make([]*message, 0, len(msgs))
	for _, m := range msgs {
		ms = append(ms, m)
	}
	slices.SortFunc(ms, func(a, b *message) int {
		return cmp.Or(cmp.Compare(a.topic, b.topic), cmp.Compare(a.key, b.key), cmp.Compare(a.offset, b.offset), cmp.Compare(a.id, b.id))
	})
	return ms
}

// qualify makes each event's key its partition's whole name within its
// topic, "tenant/key", so that one tenant's key is never taken for
// another's.
func qualify(evs []Event) []Event {
	out := make([]Event, len(evs))
	for i, e := range evs {
		if e.Tenant != "" {
			e.Key = e.Tenant + "/" + e.Key
		}
		out[i] = e
	}
	return out
}

// slotOf is a process's slot: its name without the incarnation.
func slotOf(proc string) string {
	if i := strings.LastIndexByte(proc, '.'); i >= 0 {
		return proc[:i]
	}
	return proc
}
