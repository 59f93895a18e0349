// SPDX-License-Identifier: Apache-2.0

package helm

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"sigs.k8s.io/yaml"
)

const schemaFile = "shardq/values.schema.json"

var update = flag.Bool("update", false, "rewrite "+schemaFile+"'s Kubernetes definitions from k8s.io/api (and its layout)")

// kubeTypes are the Kubernetes API types that values pass through to the
// pods as they are (toYaml): the schema describes them, to every level,
// by definitions made from the Go types, so that a misspelt field fails
// as a misspelt value of the chart's own does.
var kubeTypes = []reflect.Type{
	reflect.TypeFor[corev1.LocalObjectReference](),
	reflect.TypeFor[corev1.ResourceRequirements](),
	reflect.TypeFor[corev1.PodSecurityContext](),
	reflect.TypeFor[corev1.SecurityContext](),
	reflect.TypeFor[corev1.Toleration](),
	reflect.TypeFor[corev1.Affinity](),
	reflect.TypeFor[corev1.TopologySpreadConstraint](),
	reflect.TypeFor[networkingv1.IngressTLS](),
}

// kubePrefix starts the names of the definitions made from kubeTypes
// (Kubernetes' OpenAPI names: k8s.io/api/core/v1.Toleration is
// io.k8s.api.core.v1.Toleration); the chart's own start with "shardq.".
const kubePrefix = "io.k8s."

// quantityPattern is a resource.Quantity's string form (Kubernetes'
// OpenAPI has it too): "100m", "64Mi", "1.5", "2e3".
const quantityPattern = `^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$`

// kubeSchema makes JSON Schema definitions (draft-07) of Go types of the
// Kubernetes API: a struct is an object with its JSON fields and no other
// (a field without omitempty is required, as Kubernetes' OpenAPI has it),
// a map an object of its values, a slice an array.
type kubeSchema struct {
	defs map[string]any
	errs []string
}

func defName(t reflect.Type) string {
	p := strings.Split(t.PkgPath(), "/")
	host := strings.Split(p[0], ".")
	slices.Reverse(host)
	return strings.Join(append(host, p[1:]...), ".") + "." + t.Name()
}

func (g *kubeSchema) of(t reflect.Type) map[string]any {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.PkgPath() + "." + t.Name() {
	case "k8s.io/apimachinery/pkg/util/intstr.IntOrString":
		return map[string]any{"type": []any{"integer", "string"}}
	case "k8s.io/apimachinery/pkg/api/resource.Quantity":
		return map[string]any{"type": []any{"number", "string"}, "pattern": quantityPattern}
	}
	switch t.Kind() {
	case reflect.String:
		return map[string]any{"type": "string"}
	case reflect.Bool:
		return map[string]any{"type": "boolean"}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return map[string]any{"type": "integer"}
	case reflect.Float32, reflect.Float64:
		return map[string]any{"type": "number"}
	case reflect.Slice:
		return map[string]any{"type": "array", "items": g.of(t.Elem())}
	case reflect.Map:
		if t.Key().Kind() == reflect.String {
			return map[string]any{"type": "object", "additionalProperties": g.of(t.Elem())}
		}
	case reflect.Struct:
		if t.Implements(reflect.TypeFor[json.Marshaler]()) || reflect.PointerTo(t).Implements(reflect.TypeFor[json.Marshaler]()) {
			break // its JSON is its own: say it above
		}
		name := defName(t)
		if _, ok := g.defs[name]; !ok {
			g.defs[name] = nil // a type that holds itself stops here
			props, required := map[string]any{}, []any{}
			g.fields(t, props, &required)
			def := map[string]any{"type": "object", "additionalProperties": false, "properties": props}
			if len(required) > 0 {
				def["required"] = required
			}
			g.defs[name] = def
		}
		return map[string]any{"$ref": "#/definitions/" + name}
	}
	g.errs = append(g.errs, fmt.Sprintf("%s (%s): no schema for it", t, t.Kind()))
	return map[string]any{}
}

func (g *kubeSchema) fields(t reflect.Type, props map[string]any, required *[]any) {
	for i := range t.NumField() {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		if !f.IsExported() || name == "-" {
			continue
		}
		if f.Anonymous && name == "" {
			g.fields(f.Type, props, required) // inline
			continue
		}
		if name == "" {
			g.errs = append(g.errs, fmt.Sprintf("%s.%s: no JSON name", t, f.Name))
			continue
		}
		props[name] = g.of(f.Type)
		if o := strings.Split(opts, ","); !slices.Contains(o, "omitempty") && !slices.Contains(o, "omitzero") {
			*required = append(*required, name)
		}
	}
}

func readSchema(t *testing.T) map[string]any {
	t.Helper()
	b, err := os.ReadFile(schemaFile)
	if err != nil {
		t.Fatal(err)
	}
	var s map[string]any
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatalf("%s: %v", schemaFile, err)
	}
	return s
}

// The schema's Kubernetes definitions are those k8s.io/api's types make
// (go.mod's version): a field Kubernetes adds or drops reaches the schema
// by `go test -run TestSchemaKubernetesDefinitions -update`, which also
// lays the file out again (one line per object that fits).
func TestSchemaKubernetesDefinitions(t *testing.T) {
	g := kubeSchema{defs: map[string]any{}}
	for _, k := range kubeTypes {
		g.of(k)
	}
	if len(g.errs) > 0 {
		t.Fatalf("kubeSchema:\n%s", strings.Join(g.errs, "\n"))
	}
	// Compared as JSON reads them back.
	var want map[string]any
	b, err := json.Marshal(g.defs)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &want); err != nil {
		t.Fatal(err)
	}
	s := readSchema(t)
	defs, _ := s["definitions"].(map[string]any)
	if defs == nil {
		defs = map[string]any{}
		s["definitions"] = defs
	}
	var stale []string
	for name, d := range defs {
		if strings.HasPrefix(name, kubePrefix) && !reflect.DeepEqual(d, want[name]) {
			stale = append(stale, name)
		}
	}
	for name := range want {
		if _, ok := defs[name]; !ok {
			stale = append(stale, name)
		}
	}
	slices.Sort(stale)
	if *update {
		for name := range defs {
			if strings.HasPrefix(name, kubePrefix) {
				delete(defs, name)
			}
		}
		for name, d := range want {
			defs[name] = d
		}
		var out bytes.Buffer
		layout(&out, s, "", 0)
		out.WriteString("\n")
		if err := os.WriteFile(schemaFile, out.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %d Kubernetes definitions (%d changed)", schemaFile, len(want), len(stale))
		return
	}
	if len(stale) > 0 {
		t.Fatalf("%s: Kubernetes definitions missing, stale or changed by hand: %v; run go test -run TestSchemaKubernetesDefinitions -update", schemaFile, stale)
	}
	// Some of them, as the chart uses them.
	for name, required := range map[string][]string{
		"io.k8s.api.core.v1.TopologySpreadConstraint":        {"maxSkew", "topologyKey", "whenUnsatisfiable"},
		"io.k8s.api.core.v1.Toleration":                      nil,
		"io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelector": nil,
	} {
		d, _ := want[name].(map[string]any)
		if d == nil || d["additionalProperties"] != false {
			t.Fatalf("%s: %v", name, d)
		}
		var got []string
		for _, r := range asSlice(d["required"]) {
			got = append(got, r.(string))
		}
		slices.Sort(got)
		if !slices.Equal(got, required) {
			t.Fatalf("%s requires %v, want %v", name, got, required)
		}
	}
}

func asSlice(v any) []any { s, _ := v.([]any); return s }

// layout writes v as JSON, an object's keys in keyOrder then by name, and
// on one line whatever fits in 100 columns (from column col).
func layout(b *bytes.Buffer, v any, indent string, col int) {
	one := compact(v)
	if col+len(one) <= 100 {
		b.WriteString(one)
		return
	}
	switch v := v.(type) {
	case map[string]any:
		b.WriteString("{")
		for i, k := range orderedKeys(v) {
			if i > 0 {
				b.WriteString(",")
			}
			key := indent + "  " + scalar(k) + ": "
			b.WriteString("\n" + key)
			layout(b, v[k], indent+"  ", len(key))
		}
		b.WriteString("\n" + indent + "}")
	case []any:
		b.WriteString("[")
		for i, e := range v {
			if i > 0 {
				b.WriteString(",")
			}
			b.WriteString("\n" + indent + "  ")
			layout(b, e, indent+"  ", len(indent)+2)
		}
		b.WriteString("\n" + indent + "]")
	default:
		b.WriteString(one)
	}
}

var keyOrder = []string{"$schema", "title", "description", "$ref", "type", "enum", "additionalProperties", "required", "properties"}

func orderedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	rank := func(k string) int {
		if k == "definitions" {
			return len(keyOrder) + 1
		}
		if i := slices.Index(keyOrder, k); i >= 0 {
			return i
		}
		return len(keyOrder)
	}
	slices.SortFunc(keys, func(a, b string) int {
		if d := rank(a) - rank(b); d != 0 {
			return d
		}
		return strings.Compare(a, b)
	})
	return keys
}

func compact(v any) string {
	switch v := v.(type) {
	case map[string]any:
		parts := make([]string, 0, len(v))
		for _, k := range orderedKeys(v) {
			parts = append(parts, scalar(k)+": "+compact(v[k]))
		}
		return "{" + strings.Join(parts, ", ") + "}"
	case []any:
		parts := make([]string, 0, len(v))
		for _, e := range v {
			parts = append(parts, compact(e))
		}
		return "[" + strings.Join(parts, ", ") + "]"
	}
	return scalar(v)
}

func scalar(v any) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		panic(err)
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// resolve follows a schema's $ref to the chart's own definitions; a
// Kubernetes one is returned as the $ref (values pass it through).
func resolve(root, s map[string]any) map[string]any {
	ref, _ := s["$ref"].(string)
	name, ok := strings.CutPrefix(ref, "#/definitions/")
	if !ok || strings.HasPrefix(name, kubePrefix) {
		return s
	}
	d, _ := root["definitions"].(map[string]any)[name].(map[string]any)
	return d
}

// chartLeaves are the dotted names of the schema's values that are not
// objects of the chart's own (with properties): what README.md lists.
func chartLeaves(root, s map[string]any, prefix string) []string {
	s = resolve(root, s)
	props, ok := s["properties"].(map[string]any)
	if !ok {
		return []string{prefix}
	}
	var out []string
	for k, p := range props {
		name := k
		if prefix != "" {
			name = prefix + "." + k
		}
		out = append(out, chartLeaves(root, p.(map[string]any), name)...)
	}
	return out
}

// Every value values.yaml gives is in the schema, and every value of the
// chart's own objects in the schema has a default in values.yaml: a
// value added to one and not the other fails here (one the schema lacks
// fails every install, one values.yaml lacks is undocumented).
func TestSchemaMatchesValues(t *testing.T) {
	root := readSchema(t)
	if root["$schema"] != "http://json-schema.org/draft-07/schema#" {
		t.Fatalf("$schema %v: Helm's validator reads draft-07", root["$schema"])
	}
	b, err := os.ReadFile("shardq/values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var values map[string]any
	if err := yaml.Unmarshal(b, &values); err != nil {
		t.Fatal(err)
	}
	var walk func(path string, v any, s map[string]any, exact bool)
	walk = func(path string, v any, s map[string]any, exact bool) {
		s = resolve(root, s)
		if s == nil {
			t.Errorf("%s: a $ref to no definition", path)
			return
		}
		if props, ok := s["properties"].(map[string]any); ok {
			if s["additionalProperties"] != false {
				t.Errorf("%s: the schema's object takes any key (additionalProperties is not false)", path)
			}
			m, ok := v.(map[string]any)
			if !ok {
				t.Errorf("%s: values.yaml has %T, the schema an object", path, v)
				return
			}
			for k, vv := range m {
				p, ok := props[k].(map[string]any)
				if !ok {
					t.Errorf("%s: in values.yaml, not in the schema", strings.TrimPrefix(path+"."+k, "."))
					continue
				}
				walk(strings.TrimPrefix(path+"."+k, "."), vv, p, true)
			}
			for k := range props {
				if _, ok := m[k]; !ok && exact {
					t.Errorf("%s: in the schema, not in values.yaml", strings.TrimPrefix(path+"."+k, "."))
				}
			}
			return
		}
		if items, ok := s["items"].(map[string]any); ok {
			for i, e := range asSlice(v) {
				walk(fmt.Sprintf("%s[%d]", path, i), e, items, false) // an element may leave out what is optional
			}
		}
	}
	walk("", values, root, true)
}

// README.md describes every value once, and no value the chart lacks.
func TestReadmeDocumentsEveryValue(t *testing.T) {
	root := readSchema(t)
	leaves := chartLeaves(root, root, "")
	b, err := os.ReadFile("shardq/README.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]int{}
	for _, m := range regexp.MustCompile("(?m)^\\| `([^`]+)` \\|").FindAllStringSubmatch(string(b), -1) {
		rows[m[1]]++
	}
	if len(leaves) < 50 {
		t.Fatalf("the schema has %d values; the walk finds too few", len(leaves))
	}
	for _, l := range leaves {
		if rows[l] != 1 {
			t.Errorf("README.md describes %s %d times, want once", l, rows[l])
		}
	}
	for r := range rows {
		if !slices.Contains(leaves, r) {
			t.Errorf("README.md describes %s, which the chart does not have", r)
		}
	}
}
