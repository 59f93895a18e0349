// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// read is what w (over b) holds so far.
func read(w *lockedWriter, b *bytes.Buffer) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return b.String()
}

// freeAddr is a loopback address with a port nobody listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// scrape reads http://addr/metrics as Prometheus text.
func scrape(addr string) (map[string]*dto.MetricFamily, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s: %s", resp.Status, body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(bytes.NewReader(body))
}

// counterSum adds a counter family's values.
func counterSum(fams map[string]*dto.MetricFamily, name string) float64 {
	var n float64
	if f := fams[name]; f != nil {
		for _, m := range f.GetMetric() {
			n += m.GetCounter().GetValue()
		}
	}
	return n
}

// A running `shardq consume --metrics-addr` serves Prometheus text whose
// consumed-messages counter equals the messages it printed, with the lag
// and lease metrics beside it.
func TestConsumeServesMetrics(t *testing.T) {
	for _, db := range databases {
		t.Run(db.name, func(t *testing.T) {
			env := map[string]string{"SHARDQ_DSN": db.dsn(t)}
			if r := runCLI(t, env, "", "migrate"); r.code != 0 {
				t.Fatal(r)
			}
			const n = 25
			var lines strings.Builder
			for i := range n {
				fmt.Fprintf(&lines, "msg %d\n", i)
			}
			if r := runCLI(t, env, lines.String(), "publish", "--tenant", "acme", "--topic", "orders", "--key", "k", "--lines"); r.code != 0 {
				t.Fatal(r)
			}
			addr := freeAddr(t)
			ctx, stop := context.WithCancel(context.Background())
			var outb, errbb bytes.Buffer
			out, errb := &lockedWriter{w: &outb}, &lockedWriter{w: &errbb}
			code := make(chan int, 1)
			go func() {
				code <- Main(ctx, []string{"consume", "--tenant", "acme", "--topic", "orders", "--group", "g", "--metrics-addr", addr},
					Env{Stdin: strings.NewReader(""), Stdout: out, Stderr: errb, Getenv: func(k string) string { return env[k] }})
			}()
			var fams map[string]*dto.MetricFamily
			deadline := time.Now().Add(30 * time.Second)
			for {
				var err error
				fams, err = scrape(addr)
				if err == nil && counterSum(fams, "messaging_client_consumed_messages_total") == n {
					break
				}
				if time.Now().After(deadline) {
					stop()
					t.Fatalf("after 30 s: scrape %v; consumed counter %v; printed %d lines; stderr %s",
						err, counterSum(fams, "messaging_client_consumed_messages_total"), strings.Count(read(out, &outb), "\n"), read(errb, &errbb))
				}
				time.Sleep(20 * time.Millisecond)
			}
			stop()
			if c := <-code; c != 0 {
				t.Fatalf("consume exited %d: %s", c, read(errb, &errbb))
			}
			if printed := len(jsonLines[consumeLine](t, read(out, &outb))); printed != n {
				t.Fatalf("printed %d messages; the counter said %d", printed, n)
			}
			for _, name := range []string{"shardq_consumer_lag", "shardq_consumer_lag_age_seconds", "shardq_consumer_leases_acquired_total",
				"messaging_process_duration_seconds", "shardq_consumer_rebalance_duration_seconds"} {
				if fams[name] == nil {
					var have []string
					for k := range fams {
						have = append(have, k)
					}
					t.Fatalf("no %s among %v", name, have)
				}
			}
			if _, err := scrape(addr); err == nil {
				t.Fatal("/metrics still served after consume exited")
			}
		})
	}
}

func TestTelemetryFlagsAreChecked(t *testing.T) {
	for _, args := range [][]string{
		{"--metrics-addr", "9464"},
		{"--otlp-endpoint", "localhost:4318"},
		{"--otlp-endpoint", "ftp://collector"},
	} {
		r := runCLI(t, nil, "", append([]string{"consume", "--topic", "x", "--group", "g", "--tenant", "t", "--dsn", "sqlite:///nonexistent/q.db"}, args...)...)
		if r.code != 2 || !strings.Contains(r.stderr, args[0]) {
			t.Fatalf("%v: exit %d, stderr %q; want 2 naming %s", args, r.code, r.stderr, args[0])
		}
	}
}

// --otlp-endpoint sends the command's spans and metrics over OTLP/HTTP:
// a publish's send span reaches /v1/traces, its metrics /v1/metrics, by
// the time the command exits.
func TestPublishExportsOTLP(t *testing.T) {
	var mu sync.Mutex
	posts := map[string]int{}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		if r.Method == http.MethodPost && len(body) > 0 {
			posts[r.URL.Path]++
		}
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusOK)
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Close()
	env := map[string]string{"SHARDQ_DSN": databases[0].dsn(t)}
	if r := runCLI(t, env, "", "migrate"); r.code != 0 {
		t.Fatal(r)
	}
	r := runCLI(t, env, "", "publish", "--tenant", "acme", "--topic", "orders", "--key", "k", "--otlp-endpoint", "http://"+ln.Addr().String(), "hello")
	if r.code != 0 {
		t.Fatal(r)
	}
	mu.Lock()
	defer mu.Unlock()
	if posts["/v1/traces"] == 0 || posts["/v1/metrics"] == 0 {
		t.Fatalf("the collector got %v; want traces and metrics", posts)
	}
}
