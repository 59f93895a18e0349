// SPDX-License-Identifier: Apache-2.0

package helm

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

const (
	alertRules     = "../../examples/prometheus/shardq-alerts.yml"
	alertRuleTests = "../../examples/prometheus/shardq-alerts.test.yml"
	operationsDoc  = "../../docs/operations.md"
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
