// SPDX-License-Identifier: Apache-2.0

package server

import (
	"bytes"
	"cmp"
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/swaggest/openapi-go/openapi31"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/internal/testdb"
)

// update makes TestOpenAPIIsGenerated write openapi.json (go generate).
var update = flag.Bool("update", false, "write openapi.json from the routes and types")

// regenerate is what brings openapi.json up to date.
const regenerate = "cd cmd/shardq && go generate ./internal/server"

// TestOpenAPIIsGenerated: the checked-in document is exactly what the
// routes, apiDocs and the handlers' types make.
func TestOpenAPIIsGenerated(t *testing.T) {
	doc, err := buildOpenAPI()
	if err != nil {
		t.Fatalf("buildOpenAPI: %v", err)
	}
	if bytes.Equal(doc, openAPI) {
		return
	}
	if *update {
		if err := os.WriteFile("openapi.json", doc, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got, want := strings.Split(string(openAPI), "\n"), strings.Split(string(doc), "\n")
	line := 0
	for line < min(len(got), len(want)) && got[line] == want[line] {
		line++
	}
	at := func(lines []string) string {
		if line < len(lines) {
			return strings.TrimSpace(lines[line])
		}
		return "(end of file)"
	}
	t.Fatalf("openapi.json is not what the routes and types make: run `%s` and commit it.\n"+
		"First difference at line %d: checked in %q, generated %q", regenerate, line+1, at(got), at(want))
}

// TestOpenAPIDocsCoverRoutes: every route has its entry in apiDocs, and
// apiDocs describes no other route than those served without a token.
func TestOpenAPIDocsCoverRoutes(t *testing.T) {
	want := slices.Clone(publicRoutes)
	for _, rt := range (&Server{}).apiRoutes() {
		want = append(want, rt.pattern)
		if _, ok := apiDocs[rt.pattern]; !ok {
			t.Errorf("route %q has no entry in apiDocs (apidocs.go)", rt.pattern)
		}
	}
	slices.Sort(want)
	if got := slices.Sorted(maps.Keys(apiDocs)); !slices.Equal(got, want) {
		t.Errorf("apiDocs and the routes differ:\n apiDocs %q\n routes  %q", got, want)
	}
	ids := map[string]string{}
	for pattern, d := range apiDocs {
		if d.id == "" || d.summary == "" || len(d.responses) == 0 {
			t.Errorf("%s: want an id, a summary and a response", pattern)
		}
		if other, dup := ids[d.id]; dup {
			t.Errorf("operationId %q of both %s and %s", d.id, pattern, other)
		}
		ids[d.id] = pattern
	}
}

// openAPIDoc is the checked-in document as JSON values.
func openAPIDoc(t *testing.T) map[string]any {
	t.Helper()
	var doc map[string]any
	if err := json.Unmarshal(openAPI, &doc); err != nil {
		t.Fatalf("openapi.json: %v", err)
	}
	return doc
}

// operation is pattern's operation in doc.
func operation(t *testing.T, doc map[string]any, pattern string) map[string]any {
	t.Helper()
	method, path, _ := strings.Cut(pattern, " ")
	op, _ := at(doc, "paths", path, strings.ToLower(method)).(map[string]any)
	if op == nil {
		t.Fatalf("openapi.json has no %s: run `%s`", pattern, regenerate)
	}
	return op
}

// at is the value of doc at the path of keys (nil: none).
func at(doc any, keys ...string) any {
	for _, k := range keys {
		m, ok := doc.(map[string]any)
		if !ok {
			return nil
		}
		doc = m[k]
	}
	return doc
}

// resolve follows schema's $ref in doc.
func resolve(doc, schema map[string]any) map[string]any {
	for {
		ref, ok := schema["$ref"].(string)
		if !ok {
			return schema
		}
		schema, _ = at(doc, "components", "schemas", strings.TrimPrefix(ref, "#/components/schemas/")).(map[string]any)
	}
}

// jsonFields are the members of t's JSON form, embedded structs' too,
// with their types.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case name == "-":
		case f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct:
			maps.Copy(out, jsonFields(f.Type))
		case !f.IsExported():
		default:
			out[cmp.Or(name, f.Name)] = f.Type
		}
	}
	return out
}

// checkFields fails where schema's properties are not exactly the JSON
// members of typ, at every depth of this package's types.
func checkFields(t *testing.T, doc map[string]any, where string, typ reflect.Type, schema map[string]any) {
	t.Helper()
	for typ.Kind() == reflect.Pointer || typ.Kind() == reflect.Slice {
		typ = typ.Elem()
		if s := resolve(doc, schema); s["type"] == "array" {
			schema, _ = s["items"].(map[string]any)
		}
	}
	if typ.Kind() != reflect.Struct || typ.PkgPath() != reflect.TypeFor[problem]().PkgPath() {
		return
	}
	schema = resolve(doc, schema)
	props, _ := schema["properties"].(map[string]any)
	fields := jsonFields(typ)
	got, want := slices.Sorted(maps.Keys(props)), slices.Sorted(maps.Keys(fields))
	if !slices.Equal(got, want) {
		t.Errorf("%s: openapi.json describes %q, the Go type %s has %q: run `%s`", where, got, typ, want, regenerate)
		return
	}
	for name, ft := range fields {
		ps, _ := props[name].(map[string]any)
		checkFields(t, doc, where+"."+name, ft, ps)
	}
}

// TestOpenAPIDescribesEveryField: the checked-in document describes
// every JSON member of each operation's request and response types and
// of the problem, no other, and every parameter apiDocs names.
func TestOpenAPIDescribesEveryField(t *testing.T) {
	doc := openAPIDoc(t)
	for pattern, d := range apiDocs {
		op := operation(t, doc, pattern)
		if _, empty := d.body.(emptyIn); d.body != nil && !empty {
			s, _ := at(op, "requestBody", "content", "application/json", "schema").(map[string]any)
			checkFields(t, doc, pattern+" request", reflect.TypeOf(d.body), s)
		}
		for _, rs := range d.responses {
			if rs.body != nil {
				s, _ := at(op, "responses", strconv.Itoa(rs.status), "content", "application/json", "schema").(map[string]any)
				checkFields(t, doc, fmt.Sprintf("%s %d", pattern, rs.status), reflect.TypeOf(rs.body), s)
			}
		}
		var want, got []string
		if d.params != nil {
			want = params(reflect.TypeOf(d.params))
		}
		ps, _ := op["parameters"].([]any)
		for _, p := range ps {
			p := p.(map[string]any)
			got = append(got, fmt.Sprint(p["in"], " ", p["name"]))
		}
		slices.Sort(want)
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("%s: openapi.json has parameters %q, apiDocs %q: run `%s`", pattern, got, want, regenerate)
		}
	}
	s, _ := at(doc, "components", "schemas", "Problem").(map[string]any)
	checkFields(t, doc, "Problem", reflect.TypeFor[problem](), s)
}

// params are the parameters of a params struct, as "in name".
func params(t reflect.Type) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Anonymous {
			out = append(out, params(f.Type)...)
			continue
		}
		for _, in := range []string{"path", "query", "header"} {
			if name := f.Tag.Get(in); name != "" {
				out = append(out, in+" "+name)
			}
		}
	}
	return out
}

// sample is a value of schema with every property it describes.
func sample(doc, schema map[string]any) any {
	schema = resolve(doc, schema)
	if enum, ok := schema["enum"].([]any); ok && len(enum) > 0 {
		return enum[0]
	}
	switch schema["type"] {
	case "object":
		out := map[string]any{}
		props, _ := schema["properties"].(map[string]any)
		for name, p := range props {
			out[name] = sample(doc, p.(map[string]any))
		}
		if ap, ok := schema["additionalProperties"].(map[string]any); ok && len(props) == 0 {
			out["name"] = sample(doc, ap)
		}
		return out
	case "array":
		items, _ := schema["items"].(map[string]any)
		return []any{sample(doc, items)}
	case "string":
		if schema["format"] == "date-time" {
			return time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC).Format(time.RFC3339)
		}
		return "x"
	case "integer", "number":
		return 0
	case "boolean":
		return false
	}
	return nil
}

// TestOpenAPIRequestsDecode: a body with every member the document
// describes is one the handler's decoding takes: the type apiDocs names
// takes it, and so does the route itself (it may refuse the values, never
// a member as unknown).
func TestOpenAPIRequestsDecode(t *testing.T) {
	doc := openAPIDoc(t)
	h := newHarness(t, testdb.Migrated(t, testdb.SQLite(t)), harnessOptions{})
	tok, _ := h.token(RoleOperator, 0, "acme")
	// The tenant's own routes last: suspend and delete change what the
	// others answer.
	patterns := slices.SortedFunc(maps.Keys(apiDocs), func(a, b string) int {
		return strings.Count(b, "/") - strings.Count(a, "/")
	})
	for _, pattern := range patterns {
		d := apiDocs[pattern]
		if _, empty := d.body.(emptyIn); d.body == nil || empty {
			continue
		}
		s, _ := at(operation(t, doc, pattern), "requestBody", "content", "application/json", "schema").(map[string]any)
		body, err := json.Marshal(sample(doc, s))
		if err != nil {
			t.Fatal(err)
		}
		if err := jsonv2.Unmarshal(body, reflect.New(reflect.TypeOf(d.body)).Interface(), jsonOptions); err != nil {
			t.Errorf("%s: %T does not take %s: %v", pattern, d.body, body, err)
		}
		method, path, _ := strings.Cut(pattern, " ")
		path = strings.NewReplacer("{tenant}", "acme", "{topic}", "orders", "{group}", "g").Replace(path)
		r := h.call(method, path, tok, string(body))
		if rule, _ := r.body["rule"].(string); r.status == 400 && r.body["field"] == "body" && strings.HasPrefix(rule, "malformed JSON") {
			t.Errorf("%s refuses %s, which openapi.json describes: %s", pattern, body, r.raw)
		}
	}
}

// TestOpenAPIIsValid: the document is OpenAPI 3.1 as the library reads
// it, and every reference in it resolves.
func TestOpenAPIIsValid(t *testing.T) {
	var spec openapi31.Spec
	if err := spec.UnmarshalJSON(openAPI); err != nil {
		t.Fatalf("openapi.json is not OpenAPI 3.1: %v", err)
	}
	if spec.Openapi != "3.1.0" || len(spec.Paths.MapOfPathItemValues) == 0 {
		t.Fatalf("openapi %q with %d paths", spec.Openapi, len(spec.Paths.MapOfPathItemValues))
	}
	// The library's model drops what is not OpenAPI 3.1: read back, the
	// document loses nothing but the empty security lists (written as
	// extra members, see addOperation).
	back, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	var reread any
	if err := json.Unmarshal(back, &reread); err != nil {
		t.Fatal(err)
	}
	doc := openAPIDoc(t)
	want := openAPIDoc(t)
	for _, pattern := range publicRoutes {
		delete(operation(t, want, pattern), "security")
	}
	if !reflect.DeepEqual(reread, any(want)) {
		t.Errorf("openapi.json has members OpenAPI 3.1 does not know: read by the library and written back, it differs")
	}
	var walk func(where string, v any)
	walk = func(where string, v any) {
		switch v := v.(type) {
		case map[string]any:
			if ref, ok := v["$ref"].(string); ok {
				keys := strings.Split(strings.TrimPrefix(ref, "#/"), "/")
				if !strings.HasPrefix(ref, "#/") || at(doc, keys...) == nil {
					t.Errorf("%s: $ref %q resolves to nothing", where, ref)
				}
			}
			for k, e := range v {
				walk(where+"/"+k, e)
			}
		case []any:
			for i, e := range v {
				walk(where+"/"+strconv.Itoa(i), e)
			}
		}
	}
	walk("#", doc)
}

// TestStreamedAnswersMatchTheirTypes: what writeMessages streams for a
// receive, a listing of stored messages and a deferred receive is
// exactly what the types the document is made of say.
func TestStreamedAnswersMatchTheirTypes(t *testing.T) {
	one := 1
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	view := func(int) messageOut {
		m := messageOf("k", "id", 1, map[string]string{"h": "v"}, []byte("p"), now, now)
		m.Attempt, m.Receipt, m.ExpiresAt, m.Large, m.BodyURL = 1, "r", &now, &largeOut{Bytes: 1}, "/body"
		return m
	}
	for _, c := range []struct {
		list  string
		extra any
		into  any
	}{
		{"messages", receiveExtra{Acked: &one, Stale: []int{0}, Session: &sessionOut{ID: "s", Key: "k", ExpiresAt: now}}, &receiveOut{}},
		{"items", nil, &messagesOut{}},
		{"messages", nil, &deferredMessagesOut{}},
	} {
		rec := httptest.NewRecorder()
		writeMessages(rec, c.list, []int{1, 2}, c.extra, view, true)
		if err := jsonv2.Unmarshal(rec.Body.Bytes(), c.into, jsonOptions); err != nil {
			t.Errorf("%T does not describe %s: %v", c.into, rec.Body, err)
		}
	}
}

// TestOpenAPIBoundsAreTheServers: every maxItems and maximum the
// document states, on a request's field or a query parameter, is the
// bound the server enforces, by the constant that holds it.
func TestOpenAPIBoundsAreTheServers(t *testing.T) {
	bound := map[string]int64{ // by JSON member or parameter name
		"messages":    maxJSONElements,
		"ack":         int64(shardq.MaxReceiveMessages),
		"receipts":    int64(shardq.MaxReceiveMessages),
		"offsets":     shardq.MaxDeferredOffsets,
		"retry_after": int64(shardq.MaxVisibility / time.Second),
		"visibility":  int64(shardq.MaxVisibility / time.Second),
		"limit":       shardq.MaxPageLimit,
		"batch":       shardq.MaxPageLimit,
	}
	if maxJSONElements != shardq.MaxReceiveMessages {
		t.Errorf("maxJSONElements %d, a request's receipts up to %d", maxJSONElements, shardq.MaxReceiveMessages)
	}
	seen := map[reflect.Type]bool{}
	var walk func(where string, typ reflect.Type)
	walk = func(where string, typ reflect.Type) {
		for typ.Kind() == reflect.Pointer || typ.Kind() == reflect.Slice || typ.Kind() == reflect.Map {
			typ = typ.Elem()
		}
		if typ.Kind() != reflect.Struct || seen[typ] || typ.PkgPath() != reflect.TypeFor[problem]().PkgPath() {
			return
		}
		seen[typ] = true
		for i := range typ.NumField() {
			f := typ.Field(i)
			name, _, _ := strings.Cut(cmp.Or(f.Tag.Get("json"), f.Tag.Get("query")), ",")
			for _, tag := range []string{"maxItems", "maximum"} {
				v, ok := f.Tag.Lookup(tag)
				if !ok {
					continue
				}
				want, known := bound[name]
				if got, err := strconv.ParseInt(v, 10, 64); !known || err != nil || got != want {
					t.Errorf("%s.%s: %s %q, the server's bound for %q is %d (known: %v)", where, f.Name, tag, v, name, want, known)
				}
			}
			walk(where, f.Type)
		}
	}
	for pattern, d := range apiDocs {
		for _, v := range []any{d.params, d.body} {
			if v != nil {
				walk(pattern, reflect.TypeOf(v))
			}
		}
	}
	if len(seen) < 10 {
		t.Fatalf("walked %d types; the doc table names more", len(seen))
	}
}

// documentedPatterns routes a request to the pattern of its entry in
// apiDocs, as the server's mux does.
var documentedPatterns = sync.OnceValue(func() *http.ServeMux {
	mux := http.NewServeMux()
	for pattern := range apiDocs {
		mux.HandleFunc(pattern, func(http.ResponseWriter, *http.Request) {})
	}
	return mux
})

// checkAnswer holds a JSON answer to the type apiDocs gives its route and
// status: no member the type lacks, and every member the type always
// writes (not omitempty), at every depth. The harness calls it on every
// answer, so each server test checks the document against what the
// handlers send.
func checkAnswer(t testing.TB, req *http.Request, status int, raw []byte) {
	t.Helper()
	_, pattern := documentedPatterns().Handler(req)
	d, ok := apiDocs[pattern]
	if !ok {
		return // not a documented route (the dashboard, a 404)
	}
	for _, r := range d.responses {
		if r.status != status || r.body == nil {
			continue
		}
		typ := reflect.TypeOf(r.body)
		if err := jsonv2.Unmarshal(raw, reflect.New(typ).Interface(), jsonOptions); err != nil {
			t.Errorf("%s answered %d with what its documented %s does not describe: %v\n%s", pattern, status, typ, err, raw)
			return
		}
		var v any
		if err := json.Unmarshal(raw, &v); err == nil {
			if missing := missingMembers(typ, v, "$"); len(missing) > 0 {
				t.Errorf("%s answered %d without members its documented %s always has: %v\n%s", pattern, status, typ, missing, raw)
			}
		}
		return
	}
}

// missingMembers lists the members of typ that omit nothing (no
// omitempty) and are absent from v, at every depth.
func missingMembers(typ reflect.Type, v any, at string) []string {
	for typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	var out []string
	switch typ.Kind() {
	case reflect.Slice:
		if items, ok := v.([]any); ok && typ.Elem().Kind() != reflect.Uint8 {
			for i, item := range items {
				out = append(out, missingMembers(typ.Elem(), item, fmt.Sprintf("%s[%d]", at, i))...)
			}
		}
	case reflect.Struct:
		obj, ok := v.(map[string]any)
		if !ok || typ == reflect.TypeFor[time.Time]() {
			return nil
		}
		for i := range typ.NumField() {
			f := typ.Field(i)
			name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
			switch {
			case name == "-":
			case f.Anonymous && name == "":
				out = append(out, missingMembers(f.Type, v, at)...)
			case !f.IsExported():
			default:
				name = cmp.Or(name, f.Name)
				member, present := obj[name]
				if !present && !strings.Contains(opts, "omitempty") && !strings.Contains(opts, "omitzero") {
					out = append(out, at+"."+name)
				}
				if present {
					out = append(out, missingMembers(f.Type, member, at+"."+name)...)
				}
			}
		}
	}
	return out
}
