// SPDX-License-Identifier: Apache-2.0

package server

import (
	"bufio"
	"encoding/json"
	"net/http"
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
		other, _ := h.token(RoleAdmin, 0, "other")
		pub, _ := h.token(RolePublish, 0, "acme")
		h.must(200, "POST", topicPath+"/messages", pub, `{"messages":[{"key":"k","id":"m1","payload":"one"},{"key":"k","id":"m2","payload":"two"},{"key":"j","id":"m3","payload":"three"}]}`)
		h.must(200, "POST", "/v1/tenants/other/topics/orders/messages", other, `{"messages":[{"key":"k","id":"o1","payload":"x"}]}`)

		info := h.must(200, "GET", "/v1/tenants/acme", adm, nil)
		if info["messages"] != 3.0 || info["bytes"] != 11.0 || info["suspended_at"] != nil || len(info["topics"].([]any)) != 1 {
			t.Fatalf("tenant: %v", info)
		}
		if r := h.call("GET", "/v1/tenants/acme", pub, nil); r.status != 403 {
			t.Fatalf("tenant with a publish token: %d %s", r.status, r.raw)
		}
		if r := h.call("GET", "/v1/tenants/acme?x=1", adm, nil); r.status != 400 || r.body["field"] != "x" {
			t.Fatalf("tenant with an unknown parameter: %d %s", r.status, r.raw)
		}

		h.must(200, "POST", "/v1/tenants/acme/suspend", adm, nil)
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

		h.must(200, "POST", "/v1/tenants/acme/resume", adm, `{}`)
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
