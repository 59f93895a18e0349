// SPDX-License-Identifier: Apache-2.0

package helm

import (
	"encoding/json"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

const (
	alertRules     = "../../examples/prometheus/shardq-alerts.yml"
	alertRuleTests = "../../examples/prometheus/shardq-alerts.test.yml"
	operationsDoc  = "../../docs/operations.md"
	serveOpenAPI   = "../../cmd/shardq/internal/server/openapi.json"
	runbookBase    = "https://github.com/shardq/shardq/blob/main/docs/operations.md#"
)

// githubAnchor is the anchor GitHub gives a Markdown heading.
func githubAnchor(heading string) string {
	s := strings.ToLower(strings.TrimSpace(heading))
	s = regexp.MustCompile(`[^a-z0-9 _-]`).ReplaceAllString(s, "")
	return strings.ReplaceAll(s, " ", "-")
}

// The alerting rules the chart's users load (examples/prometheus): each
// has a severity, a summary and a runbook_url to its own section of
// docs/operations.md, which says what the alert means, what to check and
// what to do. With promtool installed, the rules load and their unit
// tests (shardq-alerts.test.yml) pass; cmd/shardq/internal/otelcheck
// checks that the shardq metrics they name are exported.
func TestAlertRunbooks(t *testing.T) {
	b, err := os.ReadFile(alertRules)
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Groups []struct {
			Name  string
			Rules []struct {
				Alert, Expr, For    string
				Labels, Annotations map[string]string
			}
		}
	}
	if err := yaml.UnmarshalStrict(b, &file); err != nil {
		t.Fatalf("%s: %v", alertRules, err)
	}
	doc, err := os.ReadFile(operationsDoc)
	if err != nil {
		t.Fatal(err)
	}
	// Each heading's anchor, and the text of its section (up to the next
	// heading).
	sections := map[string]string{}
	var anchor string
	fenced := false // a shell comment in a code block is no heading
	for _, line := range strings.Split(string(doc), "\n") {
		if strings.HasPrefix(line, "```") {
			fenced = !fenced
		}
		if h, ok := strings.CutPrefix(line, "#"); ok && !fenced {
			anchor = githubAnchor(strings.TrimLeft(h, "#"))
			sections[anchor] = ""
			continue
		}
		if anchor != "" {
			sections[anchor] += line + "\n"
		}
	}
	seen := map[string]bool{}
	for _, g := range file.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" || strings.TrimSpace(r.Expr) == "" || seen[r.Alert] {
				t.Errorf("group %s: a rule without a name or an expression, or named twice: %+v", g.Name, r)
				continue
			}
			seen[r.Alert] = true
			if s := r.Labels["severity"]; s != "info" && s != "warning" && s != "critical" {
				t.Errorf("%s: severity %q", r.Alert, s)
			}
			if r.Annotations["summary"] == "" {
				t.Errorf("%s: no summary", r.Alert)
			}
			url := r.Annotations["runbook_url"]
			if want := runbookBase + strings.ToLower(r.Alert); url != want {
				t.Errorf("%s: runbook_url %q, want %q", r.Alert, url, want)
				continue
			}
			text, ok := sections[strings.TrimPrefix(url, runbookBase)]
			if !ok {
				t.Errorf("%s: %s has no heading for %s", r.Alert, operationsDoc, url)
				continue
			}
			for _, part := range []string{"**Means.**", "**Check.**", "**Do.**"} {
				if !strings.Contains(text, part) {
					t.Errorf("%s: its runbook has no %s", r.Alert, part)
				}
			}
		}
	}
	if len(seen) < 9 || !seen["ShardqHTTPServerErrors"] || !seen["ShardqTargetDown"] {
		t.Fatalf("rules %v", seen)
	}

	t.Run("promtool", func(t *testing.T) {
		promtool, err := exec.LookPath("promtool")
		if err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("promtool is needed to check the alert rules (scripts/test installs Debian's prometheus): %v", err)
			}
			t.Skip("promtool is not installed (Debian's prometheus package has it)")
		}
		for _, args := range [][]string{{"check", "rules", alertRules}, {"test", "rules", alertRuleTests}} {
			if out, err := exec.Command(promtool, args...).CombinedOutput(); err != nil {
				t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
			}
		}
	})
}

// httpMethodFirst is a route that starts with a method: the mux's
// pattern ("POST /v1/..."), which serve's access log shows but its
// metrics do not.
var httpMethodFirst = regexp.MustCompile(`^(GET|HEAD|POST|PUT|PATCH|DELETE|CONNECT|OPTIONS|TRACE|_OTHER) `)

// serve's HTTP metrics are otelhttp's (OpenTelemetry's semantic
// conventions): http_route is the path template alone
// ("/v1/tenants/{tenant}/topics/{topic}/messages"; "/" for a path serve
// does not have), the method is http_request_method, and the probes and
// /metrics make no series. So no rule matches http_route against a
// method-first pattern or leaves the probes out (it would match
// nothing), the promtool fixtures hold series as serve exports them (a
// route of serve's OpenAPI document with one of its methods, or "/"),
// and the runbook groups by the method.
func TestAlertRulesUseServeHTTPLabels(t *testing.T) {
	rules, err := os.ReadFile(alertRules)
	if err != nil {
		t.Fatal(err)
	}
	matcher := regexp.MustCompile(`http_route\s*(=~|!~|!=|=)\s*"([^"]*)"`)
	for _, m := range matcher.FindAllStringSubmatch(string(rules), -1) {
		if httpMethodFirst.MatchString(m[2]) || regexp.MustCompile(`healthz|readyz|metrics`).MatchString(m[2]) {
			t.Errorf("%s: %s: serve's http_route has no method, and the probes and /metrics have no series", alertRules, m[0])
		}
	}

	b, err := os.ReadFile(serveOpenAPI)
	if err != nil {
		t.Fatal(err)
	}
	var api struct{ Paths map[string]map[string]any }
	if err := json.Unmarshal(b, &api); err != nil {
		t.Fatalf("%s: %v", serveOpenAPI, err)
	}
	methods := map[string][]string{} // route: its methods
	for path, ops := range api.Paths {
		switch path {
		case "/healthz", "/readyz", "/metrics": // no series
			continue
		}
		for m := range ops {
			methods[path] = append(methods[path], strings.ToUpper(m))
		}
	}
	if len(methods) < 20 {
		t.Fatalf("%s: %d routes", serveOpenAPI, len(methods))
	}

	b, err = os.ReadFile(alertRuleTests)
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Tests []struct {
			InputSeries []struct{ Series string } `json:"input_series"`
		}
	}
	if err := yaml.Unmarshal(b, &file); err != nil {
		t.Fatalf("%s: %v", alertRuleTests, err)
	}
	label := regexp.MustCompile(`(\w+)\s*=\s*"([^"]*)"`)
	n := 0
	for _, tc := range file.Tests {
		for _, in := range tc.InputSeries {
			if !strings.HasPrefix(in.Series, "http_server_") {
				continue
			}
			n++
			labels := map[string]string{}
			for _, m := range label.FindAllStringSubmatch(in.Series, -1) {
				labels[m[1]] = m[2]
			}
			route, method, status := labels["http_route"], labels["http_request_method"], labels["http_response_status_code"]
			known := route == "/" || slices.Contains(methods[route], method)
			if !known || method == "" || !regexp.MustCompile(`^[1-5][0-9][0-9]$`).MatchString(status) {
				t.Errorf("%s: %s: not a series serve exports (http_route %q, http_request_method %q, http_response_status_code %q)",
					alertRuleTests, in.Series, route, method, status)
			}
		}
	}
	if n < 5 {
		t.Fatalf("%s: %d series of serve's HTTP metrics", alertRuleTests, n)
	}

	doc, err := os.ReadFile(operationsDoc)
	if err != nil {
		t.Fatal(err)
	}
	_, runbook, _ := strings.Cut(string(doc), "### ShardqHTTPServerErrors")
	runbook, _, _ = strings.Cut(runbook, "\n#")
	if !strings.Contains(runbook, "http_request_method") || strings.Contains(runbook, "probes and scrapes left out") {
		t.Errorf("%s: the ShardqHTTPServerErrors runbook does not say that http_route is the path template and the method http_request_method:\n%s", operationsDoc, runbook)
	}
}
