// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shardq/shardq/cmd/shardq/internal/bench"
)

// bench consume with subscribers in separate processes, as JSON lines.
func TestBenchConsumeInProcesses(t *testing.T) {
	t.Setenv("SHARDQ_TEST_RUN_AS_CLI", "1")
	for _, db := range databases {
		t.Run(db.name, func(t *testing.T) {
			url := db.dsn(t)
			if r := runCLI(t, nil, "", "--dsn", url, "migrate"); r.code != 0 { // bench creates no database
				t.Fatal(r)
			}
			res := runCLI(t, nil, "", "--dsn", url, "bench", "consume", "--messages", "400", "--partitions", "8",
				"--subscribers", "2", "--processes", "--reps", "1", "--poll", "20ms", "--json")
			if res.code != 0 {
				t.Fatalf("exit %d: %s", res.code, res.stderr)
			}
			var got []bench.Result
			dec := json.NewDecoder(strings.NewReader(res.stdout))
			for dec.More() {
				var r bench.Result
				if err := dec.Decode(&r); err != nil {
					t.Fatalf("not JSON lines: %v\n%s", err, res.stdout)
				}
				got = append(got, r)
			}
			if len(got) != 2 || got[0].Scenario != "raw-ordered-consume" || got[1].Scenario != "consume" {
				t.Fatalf("results %+v", got)
			}
			c := got[1]
			if c.Msgs != 400 || c.Lost != 0 || c.OutOfOrder != 0 || c.Ratio <= 0 || c.Params["processes"] != true {
				t.Fatalf("consume result %+v", c)
			}
			// A backlog's consumption measures a rate, no latency: none is
			// reported (not a column of zeros).
			if c.P99Ms != 0 || c.Latency != nil || strings.Contains(res.stdout, "p99_ms") {
				t.Fatalf("consume reports a latency it did not measure: %s", res.stdout)
			}
		})
	}
}

func TestBenchRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"bench", "publish", "--size", "3"},
		{"bench", "publish", "--tenants", "100", "--partitions", "10"},
		{"bench", "nonsense"},
	} {
		res := runCLI(t, nil, "", append([]string{"--dsn", "sqlite://" + filepath.Join(t.TempDir(), "q.db")}, args...)...)
		if res.code != 2 || !strings.Contains(res.stderr, "error:") {
			t.Errorf("%v: exit %d, stderr %q", args, res.code, res.stderr)
		}
	}
}

// The table shows "-" where nothing was measured, and a latency histogram
// for the scenarios that measure latency.
func TestBenchTableSaysWhatWasMeasured(t *testing.T) {
	var buf strings.Builder
	printResults(&buf, []bench.Result{
		{Scenario: "consume", Driver: "sqlite", Msgs: 10, Seconds: 1, MsgsPerSec: 10},
		{Scenario: "publish", Driver: "sqlite", Msgs: 3, Seconds: 1, MsgsPerSec: 3, P50Ms: 1.5, P99Ms: 4,
			Latency: []bench.Bucket{{LeMs: 1}, {LeMs: 2, Count: 2}, {LeMs: 5, Count: 1}, {LeMs: 10}, {}}},
	})
	out := buf.String()
	lines := strings.Split(out, "\n")
	if !strings.Contains(lines[1], " -  ") || strings.Contains(lines[1], "0.00") {
		t.Fatalf("consume row %q: want - for p50 and p99", lines[1])
	}
	if !strings.Contains(lines[2], "1.50") || !strings.Contains(out, "publish (sqlite) latency, all repetitions: ≤2ms 2  ≤5ms 1\n") {
		t.Fatalf("publish row and histogram:\n%s", out)
	}
}
