// SPDX-License-Identifier: Apache-2.0

package server

import (
	"bufio"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/shardq/shardq/driver"
)

// A tenant's life over HTTP: its use, a suspension that refuses publishes
// and receives (403 tenant-suspended) while admin routes work, an export
// as JSON lines resumed from a cursor, and a delete previewed, then made.
func TestTenantRoutes(t *testing.T) {
	eachDB(t, func(t *testing.T, drv driver.Driver) {
		h := newHarness(t, drv, harnessOptions{})
		adm, _ := h.token(RoleAdmin, 0, "acme")
		op, _ := h.token(RoleOperator, 0, "acme")
		other, _ := h.token(RoleAdmin, 0, "other")
		pub, _ := h.token(RolePublish, 0, "acme")
		h.must(200, "POST", topicPath+"/messages", pub, `{"messages":[{"key":"k","id":"m1","payload":"one"},{"key":"k","id":"m2","payload":"two"},{"key":"j","id":"m3","payload":"three"}]}`)
		h.must(200, "POST", "/v1/tenants/other/topics/orders/messages", other, `{"messages":[{"key":"k","id":"o1","payload":"x"}]}`)

		info := h.must(200, "GET", "/v1/tenants/acme", adm, nil)
		if info["messages"] != 3.0 || info["partitions"] != 2.0 || info["bytes"] != 83.0 || info["suspended_at"] != nil || len(info["topics"].([]any)) != 1 {
			t.Fatalf("tenant: %v", info)
		}
		if r := h.call("GET", "/v1/tenants/acme", pub, nil); r.status != 403 {
			t.Fatalf("tenant with a publish token: %d %s", r.status, r.raw)
		}
		if r := h.call("GET", "/v1/tenants/acme?x=1", adm, nil); r.status != 400 || r.body["field"] != "x" {
			t.Fatalf("tenant with an unknown parameter: %d %s", r.status, r.raw)
		}

		// A tenant's own admin may not suspend or resume it.
		for _, path := range []string{"/v1/tenants/acme/suspend", "/v1/tenants/acme/resume"} {
			if r := h.call("POST", path, adm, nil); r.status != 403 || !strings.Contains(r.body["detail"].(string), "operator") {
				t.Fatalf("%s with an admin token: %d %s", path, r.status, r.raw)
			}
		}
		h.must(200, "POST", "/v1/tenants/acme/suspend", op, nil)
		r := h.call("POST", topicPath+"/messages", pub, `{"messages":[{"key":"k","id":"refused","payload":"no"}]}`)
		if r.status != 403 || r.body["type"] != typeSuspended {
			t.Fatalf("publish while suspended: %d %s", r.status, r.raw)
		}
		if r := h.call("POST", groupPath+"/receive", adm, `{"key":"k","max":1}`); r.status != 403 || r.body["type"] != typeSuspended {
			t.Fatalf("receive while suspended: %d %s", r.status, r.raw)
		}
		h.must(200, "POST", "/v1/tenants/other/topics/orders/messages", other, `{"messages":[{"key":"k","id":"o2","payload":"y"}]}`)
		if info := h.must(200, "GET", "/v1/tenants/acme", adm, nil); info["suspended_at"] == nil {
			t.Fatalf("tenant while suspended: %v", info)
		}

		export := func(query string) []map[string]any {
			t.Helper()
			req, err := http.NewRequest("GET", h.http.URL+"/v1/tenants/acme/export"+query, nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Authorization", "Bearer "+adm)
			res, err := h.http.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			if res.StatusCode != 200 || res.Header.Get("Content-Type") != "application/x-ndjson" {
				t.Fatalf("export: %d %s", res.StatusCode, res.Header.Get("Content-Type"))
			}
			var lines []map[string]any
			sc := bufio.NewScanner(res.Body)
			for sc.Scan() {
				var l map[string]any
				if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
					t.Fatalf("export line %q: %v", sc.Text(), err)
				}
				lines = append(lines, l)
			}
			return lines
		}
		lines := export("?batch=1")
		var msgs []map[string]any
		for _, l := range lines {
			if l["kind"] == "message" {
				msgs = append(msgs, l)
			}
		}
		if len(msgs) != 3 || lines[0]["kind"] != "tenant" || lines[len(lines)-1]["kind"] != "end" || lines[len(lines)-1]["messages"] != 3.0 {
			t.Fatalf("export: %v", lines)
		}
		rest := export("?after=" + msgs[0]["cursor"].(string))
		if n := rest[len(rest)-1]["messages"]; n != 2.0 {
			t.Fatalf("export resumed after the first message: %v", rest)
		}
		for _, q := range []string{"?after=%21", "?batch=0", "?nope=1"} {
			if r := h.call("GET", "/v1/tenants/acme/export"+q, adm, nil); r.status != 400 {
				t.Fatalf("export%s: %d %s", q, r.status, r.raw)
			}
		}

		h.must(200, "POST", "/v1/tenants/acme/resume", op, `{}`)
		h.must(200, "POST", topicPath+"/messages", pub, `{"messages":[{"key":"k","id":"m4","payload":"four"}]}`)

		preview := h.must(200, "POST", "/v1/tenants/acme/delete", adm, `{}`)
		if preview["executed"] != false || !strings.Contains(toJSON(t, preview), `"queue_messages"`) {
			t.Fatalf("delete preview: %v", preview)
		}
		if r := h.call("POST", "/v1/tenants/acme/delete", adm, `{"execute":true,"batch":-1}`); r.status != 400 {
			t.Fatalf("delete with a bad batch: %d %s", r.status, r.raw)
		}
		done := h.must(200, "POST", "/v1/tenants/acme/delete", adm, `{"execute":true,"batch":2}`)
		if done["executed"] != true {
			t.Fatalf("delete: %v", done)
		}
		// Its tokens went with it.
		if r := h.call("GET", "/v1/tenants/acme", adm, nil); r.status != 403 {
			t.Fatalf("the deleted tenant's token: %d %s", r.status, r.raw)
		}
		if info := h.must(200, "GET", "/v1/tenants/other", other, nil); info["messages"] != 2.0 {
			t.Fatalf("the other tenant after the delete: %v", info)
		}
	})
}

func toJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// A tenant's limits over HTTP: its admin reads them, only an operator sets
// them; a publish over a rate answers 429 with Retry-After, over what is
// stored 409, each naming the quota; nothing of a refused publish is
// stored.
func TestTenantLimitsRoutes(t *testing.T) {
	eachDB(t, func(t *testing.T, drv driver.Driver) {
		h := newHarness(t, drv, harnessOptions{})
		adm, _ := h.token(RoleAdmin, 0, "acme")
		op, _ := h.token(RoleOperator, 0, "acme")
		pub, _ := h.token(RolePublish, 0, "acme")
		if r := h.call("PUT", "/v1/tenants/acme/limits", adm, `{"publish_rate":1000}`); r.status != 403 {
			t.Fatalf("limits set by the tenant's admin: %d %s", r.status, r.raw)
		}
		for body, field := range map[string]string{`{"publish_rate":-1}`: "publish rate", `{"max_retention_ms":-5}`: "max_retention_ms", `{"nope":1}`: ""} {
			if r := h.call("PUT", "/v1/tenants/acme/limits", op, body); r.status != 400 || field != "" && r.body["field"] != field {
				t.Fatalf("limits %s: %d %s", body, r.status, r.raw)
			}
		}
		set := h.must(200, "PUT", "/v1/tenants/acme/limits", op, `{"publish_rate":2,"max_retention_ms":3600000}`)
		if set["publish_rate"] != 2.0 || set["max_retention_ms"] != 3600000.0 || set["max_messages"] != 0.0 {
			t.Fatalf("limits set: %v", set)
		}
		if got := h.must(200, "GET", "/v1/tenants/acme/limits", adm, nil); got["publish_rate"] != 2.0 {
			t.Fatalf("limits read: %v", got)
		}
		h.must(200, "POST", topicPath+"/messages", pub, `{"messages":[{"key":"k","id":"m1","payload":"a"},{"key":"k","id":"m2","payload":"b"}]}`)
		r := h.call("POST", topicPath+"/messages", pub, `{"messages":[{"key":"k","id":"m3","payload":"c"}]}`)
		if r.status != 429 || r.body["type"] != typeQuota || r.body["quota"] != "publish_rate" || r.body["limit"] != 2.0 || r.header.Get("Retry-After") != "1" {
			t.Fatalf("publish over the rate: %d %v %s", r.status, r.header, r.raw)
		}
		r = h.call("POST", topicPath+"/messages", pub, `{"messages":[{"key":"k","id":"m3","payload":"c"},{"key":"k","id":"m4","payload":"d"},{"key":"k","id":"m5","payload":"e"}]}`)
		if r.status != 413 || r.body["quota"] != "publish_rate" || r.header.Get("Retry-After") != "" {
			t.Fatalf("publish of more than a second's worth: %d %v %s", r.status, r.header, r.raw)
		}
		h.must(200, "PUT", "/v1/tenants/acme/limits", op, `{"max_messages":2}`)
		r = h.call("POST", topicPath+"/messages", pub, `{"messages":[{"key":"k","id":"m3","payload":"c"}]}`)
		if r.status != 409 || r.body["type"] != typeQuota || r.body["quota"] != "max_messages" || r.header.Get("Retry-After") != "" {
			t.Fatalf("publish over what may be stored: %d %s", r.status, r.raw)
		}
		if info := h.must(200, "GET", "/v1/tenants/acme", adm, nil); info["messages"] != 2.0 || info["limits"].(map[string]any)["max_messages"] != 2.0 {
			t.Fatalf("tenant after refused publishes: %v", info)
		}
	})
}

// A suspended tenant's every write is refused, 403 tenant-suspended, and
// changes nothing: publish, large upload, receive, receive of deferred
// messages, defer, a longer visibility, a group state. What settles what
// is in hand goes on: ack (a receive's ack too, whose answer says so),
// nack, a visibility of 0, closing a session; and reads (the state, the
// deferred list).
func TestSuspendedTenantRoutes(t *testing.T) {
	eachDB(t, func(t *testing.T, drv driver.Driver) {
		h := newHarness(t, drv, harnessOptions{})
		op, _ := h.token(RoleOperator, 0, "acme")
		pub, _ := h.token(RolePublish, 0, "acme")
		con, _ := h.token(RoleConsume, 0, "acme")
		h.must(200, "POST", topicPath+"/messages", pub, `{"messages":[{"key":"a","id":"a1","payload":"1"},{"key":"b","id":"b1","payload":"2"},`+
			`{"key":"c","id":"c1","payload":"3"},{"key":"d","id":"d1","payload":"4"},{"id":"u1","payload":"5"},{"id":"u2","payload":"6"}]}`)
		ra := received(h.must(200, "POST", groupPath+"/receive", con, `{"key":"a"}`))
		held := h.must(200, "POST", groupPath+"/receive", con, `{"key":"b","hold":true}`)
		session := held["session"].(map[string]any)["id"].(string)
		rc := received(h.must(200, "POST", groupPath+"/receive", con, `{"key":"c"}`))
		rd := received(h.must(200, "POST", groupPath+"/receive", con, `{"key":"d"}`))
		h.must(200, "POST", groupPath+"/defer", con, map[string]any{"receipts": receipts(rd)})
		ru := received(h.must(200, "POST", groupPath+"/receive", con, `{"ungrouped":true,"max":2}`))
		if len(ra) != 1 || len(rc) != 1 || len(ru) != 2 {
			t.Fatalf("receives: %v %v %v", ra, rc, ru)
		}
		h.must(200, "PUT", "/v1/tenants/acme/limits", op, `{}`) // a settings row
		h.must(200, "POST", "/v1/tenants/acme/suspend", op, nil)

		refused := func(what string, r reply) {
			t.Helper()
			if r.status != 403 || r.body["type"] != typeSuspended {
				t.Fatalf("%s while suspended: %d %s; want 403 tenant-suspended", what, r.status, r.raw)
			}
		}
		refused("publish", h.call("POST", topicPath+"/messages", pub, `{"key":"a","id":"no"}`))
		refused("large upload", h.upload(topicPath+"/large?key=big", pub, strings.NewReader("body"), nil))
		refused("receive", h.call("POST", groupPath+"/receive", con, `{"ungrouped":true}`))
		refused("state", h.state("PUT", con, session, "no"))
		refused("defer", h.call("POST", groupPath+"/defer", con, map[string]any{"receipts": receipts(rc)}))
		refused("visibility", h.call("POST", groupPath+"/visibility", con, map[string]any{"receipts": []string{ru[0]["receipt"].(string), session}, "visibility": 60}))
		refused("deferred receive", h.call("POST", groupPath+"/deferred/receive", con, map[string]any{"offsets": []any{rd[0]["offset"]}}))
		refused("requeue", h.call("POST", topicPath+"/dead-letters/requeue", op, `{"all":true}`))
		r := h.call("POST", groupPath+"/receive", con, map[string]any{"ungrouped": true, "ack": receipts(ra)})
		refused("receive with ack", r)
		if r.body["settled"] != 1.0 {
			t.Fatalf("receive with ack while suspended: %s; want its ack settled", r.raw)
		}

		if st := h.state("GET", con, session, ""); st.status != 200 || st.raw != "" {
			t.Fatalf("state read while suspended: %d %q", st.status, st.raw)
		}
		if list := h.must(200, "GET", groupPath+"/deferred", con, nil)["deferred"].([]any); len(list) != 1 {
			t.Fatalf("deferred while suspended: %v; want d1 alone", list)
		}
		h.must(200, "POST", groupPath+"/ack", con, map[string]any{"receipts": []string{ru[0]["receipt"].(string)}})
		h.must(200, "POST", groupPath+"/nack", con, map[string]any{"receipts": []string{ru[1]["receipt"].(string)}})
		h.must(200, "POST", groupPath+"/visibility", con, map[string]any{"receipts": receipts(rc), "visibility": 0})
		h.must(200, "POST", groupPath+"/session/close", con, map[string]any{"session": session})

		h.must(200, "POST", "/v1/tenants/acme/resume", op, nil)
		if got := received(h.must(200, "POST", groupPath+"/receive", con, `{"key":"a"}`)); len(got) != 0 {
			t.Fatalf("after the resume, key a: %v; want nothing (acked while suspended)", ids(got))
		}
		if got := received(h.must(200, "POST", groupPath+"/receive", con, `{"key":"c"}`)); !slices.Equal(ids(got), []string{"c1"}) {
			t.Fatalf("after the resume, key c: %v; want c1 (given back, not deferred)", ids(got))
		}
	})
}
