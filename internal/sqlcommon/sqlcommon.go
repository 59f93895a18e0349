// SPDX-License-Identifier: Apache-2.0

// Package sqlcommon holds what the SQL drivers share: every statement
// they run, written once per Syntax in one table per mechanism
// (leasesql.go, groupsql.go, publishsql.go, adminsql.go,
// lifecyclesql.go) with named parameters (Bind); the Store that runs
// them; and the planning of a
// publish batch (grouping by tenant and topic, de-duplication inside the
// batch, statement sizing) and the header encoding.
package sqlcommon

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/shardq/shardq/driver"
)

// Group is the distinct messages of one (tenant, topic) within a batch.
type Group struct {
	Tenant string
	Topic  string
	// Msgs holds the first occurrence of each (partition key, id), in batch
	// order.
	Msgs []*driver.InsertMessage
	// Keys are the group's distinct partition keys, sorted: head rows are
	// locked in this order, so two batches never wait on each other in a
	// cycle.
	Keys []string
}

// Batch is a planned batch.
type Batch struct {
	Groups  []*Group // sorted by tenant, then topic
	repeats map[*driver.InsertMessage]*driver.InsertMessage
}

type identity struct{ tenant, topic, key, id string }

// Plan groups msgs and sets aside repeats of an identity already in the batch.
func Plan(msgs []*driver.InsertMessage) *Batch {
	b := &Batch{}
	first := make(map[identity]*driver.InsertMessage, len(msgs))
	groups := map[[2]string]*Group{}
	for _, m := range msgs {
		m.Offset, m.Duplicate = 0, false
		id := identity{m.Tenant, m.Topic, m.PartitionKey, m.ID}
		if f, ok := first[id]; ok {
			if b.repeats == nil {
				b.repeats = map[*driver.InsertMessage]*driver.InsertMessage{}
			}
			b.repeats[m] = f
			continue
		}
		first[id] = m
		gk := [2]string{m.Tenant, m.Topic}
		g := groups[gk]
		if g == nil {
			g = &Group{Tenant: m.Tenant, Topic: m.Topic}
			groups[gk] = g
			b.Groups = append(b.Groups, g)
		}
		g.Msgs = append(g.Msgs, m)
		g.Keys = append(g.Keys, m.PartitionKey)
	}
	slices.SortFunc(b.Groups, func(x, y *Group) int {
		return cmp.Or(strings.Compare(x.Tenant, y.Tenant), strings.Compare(x.Topic, y.Topic))
	})
	for _, g := range b.Groups {
		slices.Sort(g.Keys)
		g.Keys = slices.Compact(g.Keys)
	}
	return b
}

// Finish gives each repeat inside the batch its first occurrence's offset.
func (b *Batch) Finish() {
	for m, f := range b.repeats {
		m.Offset, m.Duplicate = f.Offset, true
	}
}

// ByTenant yields the batch's groups in runs that share a tenant.
func (b *Batch) ByTenant(yield func(tenant string, groups []*Group) error) error {
	for i := 0; i < len(b.Groups); {
		j := i + 1
		for j < len(b.Groups) && b.Groups[j].Tenant == b.Groups[i].Tenant {
			j++
		}
		if err := yield(b.Groups[i].Tenant, b.Groups[i:j]); err != nil {
			return err
		}
		i = j
	}
	return nil
}

// Chunks splits msgs into runs of at most maxRows messages and at most
// maxBytes of statement text (StatementBytes), so that one statement stays
// under the server's packet limit. A single larger message gets a run of
// its own.
func Chunks(msgs []*driver.InsertMessage, maxRows, maxBytes int) [][]*driver.InsertMessage {
	var out [][]*driver.InsertMessage
	start, size := 0, 0
	for i, m := range msgs {
		n := StatementBytes(m)
		if i > start && (i-start >= maxRows || size+n > maxBytes) {
			out = append(out, msgs[start:i])
			start, size = i, 0
		}
		size += n
	}
	if start < len(msgs) {
		out = append(out, msgs[start:])
	}
	return out
}

// StatementBytes bounds what m adds to an INSERT statement's text when the
// client interpolates it: every value at its encoded length (headers as
// their JSON object), doubled for escaping (each escaped byte gains one
// backslash), plus the row's fixed parts.
func StatementBytes(m *driver.InsertMessage) int {
	n := len(m.Payload) + len(m.ID) + len(m.PartitionKey) + len(m.Tenant) + len(m.Topic) + 2 // {}
	for k, v := range m.Headers {
		n += jsonStringBytes(k) + jsonStringBytes(v) + 2 // : and ,
	}
	return 2*n + 128
}

// jsonStringBytes is s's length as a JSON string, quotes included, as
// encoding/json writes it (HTML-safe escapes of <, > and &; \u escapes
// of control bytes and of U+2028/U+2029).
func jsonStringBytes(s string) int {
	n := 2
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\' || c == '\n' || c == '\r' || c == '\t':
			n += 2
		case c < 0x20 || c == '<' || c == '>' || c == '&':
			n += 6
		case c == 0xE2 && i+2 < len(s) && s[i+1] == 0x80 && (s[i+2] == 0xA8 || s[i+2] == 0xA9):
			n += 6
			i += 2
		default:
			n++
		}
	}
	return n
}

// placeholders returns "?, ?, ..." with n marks.
func placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?, ", n), ", ")
}

// EncodeHeaders stores headers as a JSON object (driver.EncodeHeaders:
// what a message's size counts is what is stored).
func EncodeHeaders(h map[string]string) ([]byte, error) { return driver.EncodeHeaders(h) }

// decodeOnePlain reads {"k":"v"} whose key and value are printable ASCII
// without quotes or backslashes, so need no unescaping: what
// EncodeHeaders writes for a message whose only header is the
// queue_name that Publish adds, most messages. Anything else is left to
// the JSON decoder.
func decodeOnePlain(b []byte) (map[string]string, bool) {
	rest, ok := bytes.CutPrefix(b, []byte(`{"`))
	if !ok {
		return nil, false
	}
	if rest, ok = bytes.CutSuffix(rest, []byte(`"}`)); !ok {
		return nil, false
	}
	k, v, ok := bytes.Cut(rest, []byte(`":"`))
	if !ok || !plainJSON(k) || !plainJSON(v) {
		return nil, false
	}
	return map[string]string{string(k): string(v)}, true
}

// plainJSON says b is a JSON string's content that reads as itself.
func plainJSON(b []byte) bool {
	for _, c := range b {
		if c < 0x20 || c > 0x7e || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}

// DecodeHeaders reads what EncodeHeaders wrote.
func DecodeHeaders(b []byte) (map[string]string, error) {
	if string(b) == "{}" {
		return map[string]string{}, nil
	}
	if h, ok := decodeOnePlain(b); ok {
		return h, nil
	}
	var h map[string]string
	if err := json.Unmarshal(b, &h); err != nil {
		return nil, fmt.Errorf("decode headers: %w", err)
	}
	if h == nil {
		return nil, fmt.Errorf("decode headers: %q is not a JSON object", b)
	}
	return h, nil
}
