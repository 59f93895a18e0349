// SPDX-License-Identifier: Apache-2.0

package server

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"reflect"
	"slices"
	"strings"

	"github.com/swaggest/jsonschema-go"
	openapi "github.com/swaggest/openapi-go"
	"github.com/swaggest/openapi-go/openapi31"
)

// schemaNames names the types that are components of the document, by
// the names clients have known them by; every other type is written
// where it is used.
var schemaNames = map[reflect.Type]string{
	reflect.TypeFor[problem]():          "Problem",
	reflect.TypeFor[publishIn]():        "PublishRequest",
	reflect.TypeFor[publishResultOut](): "PublishResult",
	reflect.TypeFor[receiveIn]():        "ReceiveRequest",
	reflect.TypeFor[messageOut]():       "Message",
	reflect.TypeFor[settleIn]():         "SettleRequest",
	reflect.TypeFor[topicOut]():         "Topic",
	reflect.TypeFor[offsetOut]():        "Offset",
	reflect.TypeFor[groupOut]():         "Group",
	reflect.TypeFor[leaseOut]():         "Lease",
	reflect.TypeFor[memberOut]():        "Member",
	reflect.TypeFor[halfOut]():          "HalfMessage",
	reflect.TypeFor[requeueIn]():        "RequeueRequest",
	reflect.TypeFor[resetIn]():          "ResetRequest",
	reflect.TypeFor[changeOut]():        "OffsetChange",
	reflect.TypeFor[limitsJSON]():       "TenantLimits",
}

// publicRoutes are the routes served without a token, outside apiRoutes.
var publicRoutes = []string{"GET /healthz", "GET /readyz", "GET /metrics", "GET /v1/openapi.json"}

const (
	problemJSON = "application/problem+json"
	apiSummary  = "shardq's HTTP API (docs/server.md). Every /v1/tenants/{tenant} operation needs Authorization: Bearer <token> " +
		"(shardq token create) of a role the operation names in x-shardq-role; admin may do everything in its tenants. " +
		"Errors are application/problem+json (RFC 9457) with field and rule for validation errors. Durations are numbers of seconds."
)

// buildOpenAPI makes the OpenAPI document from apiDocs, the routes of
// apiRoutes (their roles) and the Go types the docs name.
func buildOpenAPI() ([]byte, error) {
	roles := map[string]string{}
	for _, rt := range (&Server{}).apiRoutes() {
		if _, ok := apiDocs[rt.pattern]; !ok {
			return nil, fmt.Errorf("openapi: route %q has no entry in apiDocs", rt.pattern)
		}
		roles[rt.pattern] = rt.role
	}
	r := openapi31.NewReflector()
	r.DefaultOptions = append(r.DefaultOptions,
		jsonschema.InterceptDefName(func(t reflect.Type, name string) string {
			if n, ok := schemaNames[t]; ok {
				return n
			}
			return name
		}),
		// The server answers no null (an absent field, an empty list or
		// object instead), and a request needs none.
		jsonschema.InterceptNullability(func(p jsonschema.InterceptNullabilityParams) {
			p.Schema.RemoveType(jsonschema.Null)
		}),
	)
	spec := r.SpecEns()
	spec.Info.WithTitle("shardq").WithVersion("1").WithDescription(apiSummary)
	spec.WithServers(openapi31.Server{URL: "/"})
	spec.WithSecurity(map[string][]string{"bearer": {}})
	spec.ComponentsEns().WithSecuritySchemesItem("bearer", openapi31.SecuritySchemeOrReference{
		SecurityScheme: &openapi31.SecurityScheme{HTTPBearer: &openapi31.SecuritySchemeHTTPBearer{Scheme: "bearer"}}})

	seen := map[reflect.Type]bool{}
	for _, d := range apiDocs {
		inlineUnnamed(r, reflect.TypeOf(d.body), seen)
		for _, rs := range d.responses {
			inlineUnnamed(r, reflect.TypeOf(rs.body), seen)
		}
	}
	for _, pattern := range slices.Sorted(maps.Keys(apiDocs)) {
		role, isAPI := roles[pattern]
		if !isAPI && !slices.Contains(publicRoutes, pattern) {
			return nil, fmt.Errorf("openapi: apiDocs has %q, which is no route", pattern)
		}
		if err := addOperation(r, pattern, apiDocs[pattern], role, isAPI); err != nil {
			return nil, err
		}
	}
	for _, item := range spec.Paths.MapOfPathItemValues {
		for _, op := range []*openapi31.Operation{item.Get, item.Put, item.Post, item.Delete} {
			if op == nil {
				continue
			}
			// Path parameters first, as the path names them.
			slices.SortStableFunc(op.Parameters, func(a, b openapi31.ParameterOrReference) int {
				return paramRank(a) - paramRank(b)
			})
			for _, p := range op.Parameters {
				// The reflector writes a description twice: once is enough.
				if p.Parameter != nil && p.Parameter.Description != nil && p.Parameter.Schema["description"] == *p.Parameter.Description {
					delete(p.Parameter.Schema, "description")
				}
			}
		}
	}
	named := slices.Collect(maps.Values(schemaNames))
	for name := range spec.ComponentsEns().Schemas {
		if !slices.Contains(named, name) {
			return nil, fmt.Errorf("openapi: component %q has no name in schemaNames", name)
		}
	}
	compact, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	var doc bytes.Buffer
	if err := json.Indent(&doc, compact, "", " "); err != nil {
		return nil, err
	}
	doc.WriteByte('\n')
	return doc.Bytes(), nil
}

// addOperation adds the operation of pattern as d describes it.
func addOperation(r *openapi31.Reflector, pattern string, d apiDoc, role string, isAPI bool) error {
	method, path, _ := strings.Cut(pattern, " ")
	oc, err := r.NewOperationContext(method, path)
	if err != nil {
		return err
	}
	op := oc.(openapi31.OperationExposer).Operation()
	oc.SetID(d.id)
	oc.SetSummary(d.summary)
	if d.description != "" {
		oc.SetDescription(d.description)
	}
	if isAPI {
		op.WithMapOfAnythingItem("x-shardq-role", role)
	} else {
		// Operation's security is omitted when empty: an empty list, which
		// lifts the document's bearer requirement, is written as an
		// extra member.
		op.WithMapOfAnythingItem("security", []any{})
	}
	if d.params != nil {
		oc.AddReqStructure(d.params)
	}
	required := func(cu *openapi.ContentUnit) {
		cu.Customize = func(cor openapi.ContentOrReference) {
			if rb := cor.(*openapi31.RequestBodyOrReference).RequestBody; rb != nil {
				rb.WithRequired(!d.optionalBody)
			}
		}
	}
	switch _, empty := d.body.(emptyIn); {
	case empty:
		op.RequestBodyEns().RequestBodyEns().WithRequired(!d.optionalBody).WithContentItem("application/json",
			openapi31.MediaType{Schema: map[string]any{"type": "object", "description": "nothing, or {}"}})
	case d.body != nil:
		oc.AddReqStructure(d.body, openapi.WithContentType("application/json"), required)
	case d.rawBody != "":
		oc.AddReqStructure(nil, openapi.WithContentType(d.rawBody), binary(d.rawBody), required)
	}
	for _, rs := range d.responses {
		// Not the description of the body's type, which the reflector
		// would take.
		desc := cmp.Or(rs.description, http.StatusText(rs.status))
		opts := []openapi.ContentOption{openapi.WithHTTPStatus(rs.status), described(desc)}
		if rs.raw != "" {
			opts = append(opts, openapi.WithContentType(rs.raw), binary(rs.raw))
		}
		if len(rs.headers) > 0 {
			opts = append(opts, openapi.WithCustomize(func(cor openapi.ContentOrReference) {
				resp := cor.(*openapi31.ResponseOrReference).Response
				for name, desc := range rs.headers {
					h := openapi31.Header{Schema: map[string]any{"type": "string"}}
					if desc != "" {
						h.WithDescription(desc)
					}
					resp.WithHeadersItem(name, openapi31.HeaderOrReference{Header: &h})
				}
			}))
		}
		oc.AddRespStructure(rs.body, opts...)
	}
	statuses := slices.Clone(d.problems)
	if isAPI {
		statuses = append(statuses, authProblems...)
	}
	if d.body != nil || d.rawBody != "" {
		statuses = append(statuses, http.StatusRequestEntityTooLarge)
	}
	slices.Sort(statuses)
	for _, status := range slices.Compact(statuses) {
		desc := "an RFC 9457 problem"
		if n := d.notes[status]; n != "" {
			desc += ": " + n
		}
		oc.AddRespStructure(problem{}, openapi.WithHTTPStatus(status), openapi.WithContentType(problemJSON), described(desc))
	}
	return r.AddOperation(oc)
}

// described sets a content unit's description.
func described(desc string) openapi.ContentOption {
	return func(cu *openapi.ContentUnit) { cu.Description = desc }
}

// binary marks a body of bytes (not an export's JSON lines) as such.
func binary(media string) openapi.ContentOption {
	return func(cu *openapi.ContentUnit) {
		if media == octetStream {
			cu.Format = "binary"
		}
	}
}

// paramRank orders parameters: path, query, header.
func paramRank(p openapi31.ParameterOrReference) int {
	if p.Parameter == nil {
		return 3
	}
	return slices.Index([]openapi31.ParameterIn{openapi31.ParameterInPath, openapi31.ParameterInQuery, openapi31.ParameterInHeader}, p.Parameter.In)
}

// inlineUnnamed has the reflector write the types of this package that
// t holds and schemaNames does not name where they are used.
func inlineUnnamed(r *openapi31.Reflector, t reflect.Type, seen map[reflect.Type]bool) {
	for t != nil && (t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Map) {
		t = t.Elem()
	}
	if t == nil || t.Kind() != reflect.Struct || seen[t] || t.PkgPath() != reflect.TypeFor[problem]().PkgPath() {
		return
	}
	seen[t] = true
	if _, named := schemaNames[t]; !named {
		r.InlineDefinition(reflect.New(t).Elem().Interface())
	}
	for i := range t.NumField() {
		inlineUnnamed(r, t.Field(i).Type, seen)
	}
}
