// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"
)

// A request body trickled a byte at a time is cut off at --read-timeout
// instead of holding its connection for ever.
func TestServeCutsSlowBodies(t *testing.T) {
	dsn := "sqlite://" + t.TempDir() + "/q.db"
	migrateDSN(t, dsn)
	tok := createToken(t, dsn, "publish", "acme")
	p := startServe(t, dsn, "--read-timeout", "1s")
	conn, err := net.Dial("tcp", strings.TrimPrefix(p.base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/tenants/acme/topics/orders/messages HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Length: 100\r\n\r\n", tok)
	closed := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, conn) // returns when the server closes
		closed <- err
	}()
	for i := range 40 { // 40 bytes over 8 s at most: far past the timeout
		select {
		case <-closed:
			if i > 15 {
				t.Fatalf("closed only after %d bytes", i)
			}
			return
		case <-time.After(200 * time.Millisecond):
		}
		if _, err := conn.Write([]byte("x")); err != nil {
			return // closed under us: cut off
		}
	}
	t.Fatal("a body trickled for 8 s held its connection: no read timeout")
}

// /metrics caps the series of each metric (tenants and topics come from
// clients), and carries the Go runtime's, the process's and the HTTP
// server's own series.
func TestServeMetricsBounded(t *testing.T) {
	dsn := "sqlite://" + t.TempDir() + "/q.db"
	migrateDSN(t, dsn)
	tok := createToken(t, dsn, "publish", "acme")
	p := startServe(t, dsn, "--metrics-series", "10")
	for i := range 40 {
		if code, out := api(t, p.base, tok, "POST", fmt.Sprintf("/v1/tenants/acme/topics/t%02d/messages", i), map[string]any{"id": "m"}); code != 200 {
			t.Fatalf("publish: %d %v", code, out)
		}
	}
	// The Host header is the client's: it names no series.
	for i := range 5 {
		req, err := http.NewRequest("GET", p.base+"/v1/tenants/acme/topics/t00/groups/g", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = fmt.Sprintf("h%d.example:%d", i, 1000+i)
		if res, err := http.DefaultClient.Do(req); err != nil {
			t.Fatal(err)
		} else {
			res.Body.Close()
		}
	}
	res, err := http.Get(p.base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	series := map[string]int{}
	overflow := false
	name := regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)`)
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") || line == "" {
			continue
		}
		if strings.Contains(line, `otel_metric_overflow="true"`) {
			overflow = true
		}
		if strings.Contains(line, "server_address=") || strings.Contains(line, "server_port=") {
			t.Errorf("a series named by the client's Host header: %s", line)
		}
		if m := name.FindString(line); strings.HasPrefix(m, "messaging_client_sent_messages") {
			series[m]++
		}
		for _, want := range []string{"go_goroutines", "process_resident_memory_bytes", "http_server_request_duration_seconds_count"} {
			if strings.HasPrefix(line, want) {
				series[want]++
			}
		}
	}
	for m, n := range series {
		if strings.HasPrefix(m, "messaging_client_sent_messages") && n > 10 {
			t.Errorf("%s: %d series, cap 10", m, n)
		}
	}
	if !overflow {
		t.Error("no overflow series after 40 topics with a cap of 10")
	}
	for _, want := range []string{"go_goroutines", "process_resident_memory_bytes", "http_server_request_duration_seconds_count"} {
		if series[want] == 0 {
			t.Errorf("no %s series", want)
		}
	}
	if len(series) == 0 {
		t.Fatal("no series read")
	}
}

// receipt-key list and rotate; a token with several roles.
func TestReceiptKeyCommands(t *testing.T) {
	for _, db := range databases {
		t.Run(db.name, func(t *testing.T) {
			dsn := db.dsn(t)
			migrateDSN(t, dsn) // creates key 1
			r := runCLI(t, nil, "", "--dsn", dsn, "receipt-key", "list")
			if r.code != 0 || !regexp.MustCompile(`(?m)^1\s+\S+\s+signs$`).MatchString(r.stdout) {
				t.Fatalf("list after migrate: %+v", r)
			}
			if r := runCLI(t, nil, "", "--dsn", dsn, "receipt-key", "rotate"); r.code != 0 || !strings.Contains(r.stdout, "receipt key 2 signs") {
				t.Fatalf("rotate: %+v", r)
			}
			r = runCLI(t, nil, "", "--dsn", dsn, "receipt-key", "list")
			if r.code != 0 || !regexp.MustCompile(`(?m)^1\s+\S+\s+\d{4}-`).MatchString(r.stdout) || !regexp.MustCompile(`(?m)^2\s+\S+\s+signs$`).MatchString(r.stdout) {
				t.Fatalf("list after rotate: %+v", r)
			}
			if r := runCLI(t, nil, "", "--dsn", dsn, "receipt-key", "rotate", "--drop-previous"); r.code != 0 || !strings.Contains(r.stdout, "deleted keys [1 2]") {
				t.Fatalf("rotate --drop-previous: %+v", r)
			}
			r = runCLI(t, nil, "", "--dsn", dsn, "token", "create", "--tenant", "acme", "--role", "publish", "--role", "consume")
			if r.code != 0 {
				t.Fatalf("token with two roles: %+v", r)
			}
			if r := runCLI(t, nil, "", "--dsn", dsn, "token", "list"); !strings.Contains(r.stdout, "consume,publish") {
				t.Fatalf("token list: %+v, want the roles consume,publish", r)
			}
		})
	}
}

// The transfer limits' flags are checked before anything starts: the
// per-token and per-tenant slots within --max-large-transfers, a minimum
// rate not negative, a window that is one.
func TestServeTransferFlags(t *testing.T) {
	env := map[string]string{"SHARDQ_DSN": "sqlite://" + t.TempDir() + "/q.db"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--max-large-transfers", "4", "--max-large-transfers-per-token", "5"}, "--max-large-transfers-per-token: 5: want 0 (half) to --max-large-transfers (4)"},
		{[]string{"--max-large-transfers-per-tenant", "-1"}, "--max-large-transfers-per-tenant: -1"},
		{[]string{"--min-transfer-rate", "-1"}, "--min-transfer-rate: must not be negative"},
		{[]string{"--transfer-rate-window", "0s"}, "--transfer-rate-window"},
	} {
		if r := runCLI(t, env, "", append([]string{"serve"}, c.args...)...); r.code != 2 || !strings.Contains(r.stderr, c.want) {
			t.Errorf("serve %v: %+v; want exit 2 naming %q", c.args, r, c.want)
		}
	}
}
