// SPDX-License-Identifier: Apache-2.0

package server

import (
	"slices"
	"testing"

	"github.com/shardq/shardq/driver"
)

// Deferral over HTTP: a receipt defers its message (the group goes on),
// the group's deferred messages are listed, and received by offset with
// receipts that ack (no longer deferred) and nack (deferred still); bad
// requests name their field.
func TestDeferralOverHTTP(t *testing.T) {
	eachDB(t, func(t *testing.T, drv driver.Driver) {
		h := newHarness(t, drv, harnessOptions{})
		tok, _ := h.token(RoleConsume, 0, "acme")
		pub, _ := h.token(RolePublish, 0, "acme")
		h.must(200, "POST", topicPath+"/messages", pub, `{"messages":[{"key":"k","id":"m1","payload":"1"},{"key":"k","id":"m2","payload":"2"},{"id":"u1","payload":"3"}]}`)

		got := received(h.must(200, "POST", groupPath+"/receive", tok, `{"key":"k"}`))
		if !slices.Equal(ids(got), []string{"m1"}) {
			t.Fatalf("receive = %v", ids(got))
		}
		if b := h.must(200, "POST", groupPath+"/defer", tok, map[string]any{"receipts": receipts(got)}); b["deferred"] != 1.0 {
			t.Fatalf("defer = %v", b)
		}
		if got := received(h.must(200, "POST", groupPath+"/receive", tok, `{"key":"k"}`)); !slices.Equal(ids(got), []string{"m2"}) {
			t.Fatalf("after the deferral, receive = %v; want m2", ids(got))
		}
		if r := h.call("POST", groupPath+"/defer", tok, map[string]any{"receipts": receipts(got)}); r.status != 409 {
			t.Fatalf("second defer of one receipt: %d %s", r.status, r.raw)
		}

		list := h.must(200, "GET", groupPath+"/deferred", tok, nil)["deferred"].([]any)
		if len(list) != 1 || list[0].(map[string]any)["id"] != "m1" || list[0].(map[string]any)["key"] != "k" {
			t.Fatalf("deferred list %v", list)
		}
		off := list[0].(map[string]any)["offset"].(float64)
		ds := received(h.must(200, "POST", groupPath+"/deferred/receive", tok, map[string]any{"offsets": []float64{off, off + 100}, "visibility": 60}))
		if !slices.Equal(ids(ds), []string{"m1"}) || ds[0]["payload"] != "1" || ds[0]["attempt"] != 1.0 {
			t.Fatalf("receive deferred = %v", ds)
		}
		h.must(200, "POST", groupPath+"/nack", tok, map[string]any{"receipts": receipts(ds)})
		ds = received(h.must(200, "POST", groupPath+"/deferred/receive", tok, map[string]any{"offsets": []float64{off}}))
		if len(ds) != 1 || ds[0]["attempt"] != 2.0 {
			t.Fatalf("after a nack, receive deferred = %v; want m1 again", ds)
		}
		h.must(200, "POST", groupPath+"/ack", tok, map[string]any{"receipts": receipts(ds)})
		if list := h.must(200, "GET", groupPath+"/deferred", tok, nil)["deferred"].([]any); len(list) != 0 {
			t.Fatalf("acked, still listed: %v", list)
		}

		for _, bad := range []struct {
			method, path string
			body         any
			field        string
		}{
			{"POST", groupPath + "/deferred/receive", `{"offsets":[]}`, "offsets"},
			{"POST", groupPath + "/deferred/receive", `{"offsets":[-1]}`, "offsets[0]"},
			{"POST", groupPath + "/deferred/receive", `{"offsets":[1],"visibility":0}`, "visibility"},
			{"POST", groupPath + "/deferred/receive", `{"offsets":[1],"other":1}`, ""},
			{"POST", groupPath + "/defer", `{"receipts":["r2.1.x.y"]}`, "receipts[0]"},
			{"GET", groupPath + "/deferred?limit=0", nil, "limit"},
			{"GET", groupPath + "/deferred?after=x", nil, "after"},
		} {
			r := h.call(bad.method, bad.path, tok, bad.body)
			if r.status != 400 || bad.field != "" && r.body["field"] != bad.field {
				t.Errorf("%s %s %v: %d %s; want 400 naming %q", bad.method, bad.path, bad.body, r.status, r.raw, bad.field)
			}
		}
	})
}
