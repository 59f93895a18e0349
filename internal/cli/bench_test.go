// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shardq/shardq/internal/bench"
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
