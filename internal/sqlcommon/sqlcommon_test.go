// SPDX-License-Identifier: Apache-2.0

package sqlcommon

import (
	"encoding/json"
	"maps"
	"testing"
	"unicode/utf8"

	"github.com/shardq/shardq/driver"
)

// FuzzDecodeHeaders: DecodeHeaders reads whatever the JSON decoder reads
// as an object of strings, the same, fast paths included; refuses the
// rest; and what it reads encodes back to itself.
func FuzzDecodeHeaders(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":"b"}`, `null`, `[]`, `{"a":1}`, `{"\u00e9":"\ud83d\ude00"}`, ``,
		`{"queue_name":"acme"}`, `{"a":"b","c":"d"}`, `{"a":"b\"}`, `{"":""}`, `{"a":"é"}`, `{"a" : "b"}`, `{"a":"b"}x`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := DecodeHeaders(b)
		var want map[string]string
		if jerr := json.Unmarshal(b, &want); (err == nil) != (jerr == nil && want != nil) || err == nil && !maps.Equal(h, want) {
			t.Fatalf("DecodeHeaders(%q) = %v, %v; the JSON decoder reads %v, %v", b, h, err, want, jerr)
		}
		if err != nil {
			return
		}
		if h == nil {
			t.Fatalf("DecodeHeaders(%q) returned a nil map without error", b)
		}
		enc, err := EncodeHeaders(h)
		if err != nil {
			t.Fatalf("re-encode %v: %v", h, err)
		}
		back, err := DecodeHeaders(enc)
		if err != nil || !maps.Equal(h, back) {
			t.Fatalf("round trip of %q: %v, %v", b, back, err)
		}
	})
}

func TestPlanDeduplicatesAndSorts(t *testing.T) {
	msgs := []*driver.InsertMessage{
		{Tenant: "b", Topic: "x", PartitionKey: "k2", ID: "1"},
		{Tenant: "a", Topic: "y", PartitionKey: "k1", ID: "1"},
		{Tenant: "a", Topic: "x", PartitionKey: "k9", ID: "1"},
		{Tenant: "a", Topic: "x", PartitionKey: "k1", ID: "1"},
		{Tenant: "a", Topic: "x", PartitionKey: "k9", ID: "1"}, // repeat of the third
	}
	b := Plan(msgs)
	var order []string
	for _, g := range b.Groups {
		order = append(order, g.Tenant+"/"+g.Topic)
	}
	if got := order; len(got) != 3 || got[0] != "a/x" || got[1] != "a/y" || got[2] != "b/x" {
		t.Fatalf("groups %v, want a/x a/y b/x", got)
	}
	if k := b.Groups[0].Keys; len(k) != 2 || k[0] != "k1" || k[1] != "k9" || len(b.Groups[0].Msgs) != 2 {
		t.Fatalf("group a/x keys %v msgs %d", k, len(b.Groups[0].Msgs))
	}
	msgs[2].Offset = 7
	b.Finish()
	if !msgs[4].Duplicate || msgs[4].Offset != 7 || msgs[2].Duplicate {
		t.Fatalf("repeat not resolved: %+v / %+v", msgs[4], msgs[2])
	}
}

// StatementBytes never undercounts: the headers' JSON, the other values,
// each doubled by escaping, fit in its bound.
func FuzzStatementBytes(f *testing.F) {
	f.Add("k", "v", []byte("payload"))
	f.Add("<&>\u2028", "\x00\x1f\"\\\n", []byte("'\\\x00"))
	f.Fuzz(func(t *testing.T, k, v string, payload []byte) {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return // refused by validation before any driver sees it
		}
		m := &driver.InsertMessage{Tenant: "t", Topic: "x", PartitionKey: k, ID: v, Payload: payload, Headers: map[string]string{k: v, "queue_name": "t"}}
		enc, err := EncodeHeaders(m.Headers)
		if err != nil {
			t.Fatal(err)
		}
		worst := 2*(len(enc)+len(payload)+len(k)+len(v)+len("t")+len("x")) + 128
		if got := StatementBytes(m); got < worst {
			t.Fatalf("StatementBytes = %d, below the encoded worst case %d (headers %q)", got, worst, enc)
		}
	})
}
