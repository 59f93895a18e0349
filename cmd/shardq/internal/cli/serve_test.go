// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"bufio"
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"maps"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// serveProc is a `shardq serve` process: this test binary run as the
// command (TestMain), on its own port.
type serveProc struct {
	cmd    *exec.Cmd
	base   string // http://127.0.0.1:PORT
	mu     sync.Mutex
	stderr bytes.Buffer // everything it printed on stderr
	exited chan error
}

var listening = regexp.MustCompile(`shardq serve: listening on (https?://\S+)`)

// startServe starts `shardq serve` on dsn and waits until it listens.
func startServe(t *testing.T, dsn string, args ...string) *serveProc {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"serve", "--addr", "127.0.0.1:0"}, args...)...)
	cmd.Env = append(os.Environ(), "SHARDQ_TEST_RUN_AS_CLI=1", "SHARDQ_DSN="+dsn)
	pipe, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &serveProc{cmd: cmd, exited: make(chan error, 1)}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pipe)
		for sc.Scan() {
			p.mu.Lock()
			p.stderr.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
			if m := listening.FindStringSubmatch(sc.Text()); m != nil {
				addr <- m[1]
			}
		}
		p.exited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			t.Logf("serve %s stderr:\n%s", p.base, p.output())
		}
	})
	select {
	case p.base = <-addr:
		return p
	case err := <-p.exited:
		t.Fatalf("serve exited before listening: %v\n%s", err, p.output())
	case <-time.After(30 * time.Second):
		t.Fatalf("serve did not listen within 30 s:\n%s", p.output())
	}
	return nil
}

func (p *serveProc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stderr.String()
}

// stop signals the process and returns its exit error.
func (p *serveProc) stop(t *testing.T, sig syscall.Signal) error {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.exited:
		return err
	case <-time.After(30 * time.Second):
		t.Fatalf("serve did not exit within 30 s of %v", sig)
		return nil
	}
}

// api sends a JSON request to a server and decodes its JSON answer.
func api(t *testing.T, base, token, method, path string, body any) (int, map[string]any) {
	t.Helper()
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, base+path, r)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatalf("%s %s: %d, not JSON: %v", method, path, resp.StatusCode, err)
	}
	return resp.StatusCode, out
}

// received is one message of a receive answer.
type received struct {
	Key, ID, Payload, Receipt string
	Offset                    int64
}

func receive(t *testing.T, base, token string, req map[string]any) []received {
	t.Helper()
	code, out := api(t, base, token, "POST", "/v1/tenants/acme/topics/orders/groups/billing/receive", req)
	if code != http.StatusOK {
		t.Fatalf("receive: %d %v", code, out)
	}
	var got []received
	for _, m := range out["messages"].([]any) {
		m := m.(map[string]any)
		got = append(got, received{Key: m["key"].(string), ID: m["id"].(string), Payload: m["payload"].(string),
			Receipt: m["receipt"].(string), Offset: int64(m["offset"].(float64))})
	}
	return got
}

// migrateDSN migrates the database of dsn with `shardq migrate`.
func migrateDSN(t *testing.T, dsn string) {
	t.Helper()
	if r := runCLI(t, nil, "", "--dsn", dsn, "migrate"); r.code != 0 {
		t.Fatal(r)
	}
}

func createToken(t *testing.T, dsn, role string, tenants ...string) string {
	t.Helper()
	args := []string{"--dsn", dsn, "token", "create", "--role", role}
	for _, tn := range tenants {
		args = append(args, "--tenant", tn)
	}
	r := runCLI(t, nil, "", args...)
	if r.code != 0 || !strings.HasPrefix(r.stdout, "sq_") {
		t.Fatalf("token create: %+v", r)
	}
	return strings.TrimSpace(r.stdout)
}

func TestTokenCommands(t *testing.T) {
	for _, db := range databases {
		t.Run(db.name, func(t *testing.T) {
			dsn := db.dsn(t)
			migrateDSN(t, dsn)
			tok := createToken(t, dsn, "publish", "acme", "beta")
			createToken(t, dsn, "admin", "gamma")
			for _, tc := range []struct {
				args []string
				want string
			}{
				{[]string{"token", "create", "--role", "admin"}, "--tenant is required"},
				{[]string{"token", "create", "--tenant", "a", "--role", "root"}, `--role "root": want one of publish, consume, admin, operator`},
				{[]string{"token", "create", "--tenant", "a", "--role", "admin", "--from-env", "SHARDQ_TEST_UNSET_TOKEN"}, "--from-env: SHARDQ_TEST_UNSET_TOKEN is empty or unset"},
				{[]string{"token", "create", "--tenant", strings.Repeat("t", 256), "--role", "admin"}, "tenant: 256 bytes, limit 255"},
				{[]string{"token", "create", "--tenant", "a", "--role", "admin", "--expires", "-1h"}, "--expires must not be negative"},
			} {
				if r := runCLI(t, nil, "", append([]string{"--dsn", dsn}, tc.args...)...); r.code != 2 || !strings.Contains(r.stderr, tc.want) {
					t.Errorf("%q: %+v; want code 2 and %q", tc.args, r, tc.want)
				}
			}
			r := runCLI(t, nil, "", "--dsn", dsn, "token", "list")
			if r.code != 0 || strings.Count(r.stdout, "\n") != 3 || !strings.Contains(r.stdout, "acme,beta") || strings.Contains(r.stdout, tok) {
				t.Fatalf("token list (a header and two tokens, no secret): %+v", r)
			}
			id := strings.Fields(strings.Split(r.stdout, "\n")[1])[0]
			if !strings.Contains(tok, id) {
				id = strings.Fields(strings.Split(r.stdout, "\n")[2])[0]
			}
			if r := runCLI(t, nil, "", "--dsn", dsn, "token", "list", "--tenant", "gamma"); r.code != 0 || strings.Count(r.stdout, "\n") != 2 || strings.Contains(r.stdout, id) {
				t.Fatalf("token list --tenant gamma (one token): %+v", r)
			}
			if r := runCLI(t, nil, "", "--dsn", dsn, "token", "revoke", id); r.code != 0 || r.stdout != "revoked "+id+" in 2 tenants\n" {
				t.Fatalf("revoke: %+v", r)
			}
			if r := runCLI(t, nil, "", "--dsn", dsn, "token", "revoke", id); r.code != 1 || !strings.Contains(r.stderr, "no live token") {
				t.Fatalf("second revoke: %+v", r)
			}
			r = runCLI(t, nil, "", "--dsn", dsn, "token", "list", "--tenant", "acme")
			if f := strings.Fields(strings.Split(r.stdout, "\n")[1]); r.code != 0 || f[0] != id || f[len(f)-1] == "-" {
				t.Fatalf("the revoked token lists with its revocation time: %+v", r)
			}
		})
	}
}

// A bootstrap token: made by token new (stored nowhere), stored from an
// environment variable by token create --from-env (only its id printed),
// stored again unchanged, refused when its id comes with another secret
// or role or is not a token, and accepted by serve.
func TestTokenFromEnv(t *testing.T) {
	for _, db := range databases {
		t.Run(db.name, func(t *testing.T) {
			dsn := db.dsn(t)
			migrateDSN(t, dsn)
			r := runCLI(t, nil, "", "token", "new")
			tok := strings.TrimSpace(r.stdout)
			if r.code != 0 || !strings.HasPrefix(tok, "sq_") {
				t.Fatalf("token new: %+v", r)
			}
			env := map[string]string{"BOOT": tok}
			for range 2 {
				r := runCLI(t, env, "", "--dsn", dsn, "token", "create", "--tenant", "acme", "--role", "operator", "--from-env", "BOOT")
				if r.code != 0 || strings.Contains(r.stdout+r.stderr, tok) || !strings.Contains(r.stdout, "stored from BOOT") {
					t.Fatalf("token create --from-env: %+v", r)
				}
			}
			if r := runCLI(t, nil, "", "--dsn", dsn, "token", "list"); strings.Count(r.stdout, "\n") != 2 || !strings.Contains(r.stdout, "operator") {
				t.Fatalf("token list after storing one token twice: %+v", r)
			}
			id, _, _ := strings.Cut(strings.TrimPrefix(tok, "sq_"), ".")
			other := "sq_" + id + "." + strings.Repeat("A", 43)
			for name, e := range map[string]map[string]string{
				"another secret": {"BOOT": other},
				"another role":   env,
				"not a token":    {"BOOT": "hunter2"},
			} {
				role := "operator"
				if name == "another role" {
					role = "admin"
				}
				if r := runCLI(t, e, "", "--dsn", dsn, "token", "create", "--tenant", "acme", "--role", role, "--from-env", "BOOT"); r.code == 0 || strings.Contains(r.stderr, "hunter2") {
					t.Fatalf("%s: %+v", name, r)
				}
			}
			// An id names one token in every tenant: acme's (public) id with
			// another secret is refused for another tenant too, naming the
			// id, and nothing is stored there.
			r = runCLI(t, map[string]string{"BOOT": other}, "", "--dsn", dsn, "token", "create", "--tenant", "evil", "--role", "admin", "--from-env", "BOOT")
			if want := fmt.Sprintf("error: create token %q: the id is held by another token (make another token: shardq token new)\n", id); r.code != 1 || r.stderr != want {
				t.Fatalf("acme's id with another secret for tenant evil: %+v; want exit 1, %q", r, want)
			}
			if r := runCLI(t, nil, "", "--dsn", dsn, "token", "list", "--tenant", "evil"); r.code != 0 || strings.Count(r.stdout, "\n") != 1 {
				t.Fatalf("tokens of evil after the refused create: %+v; want none", r)
			}
			// The same token may be given another tenant.
			if r := runCLI(t, env, "", "--dsn", dsn, "token", "create", "--tenant", "globex", "--role", "operator", "--from-env", "BOOT"); r.code != 0 {
				t.Fatalf("the bootstrap token for tenant globex too: %+v", r)
			}
			if r := runCLI(t, nil, "", "--dsn", dsn, "token", "list"); strings.Count(r.stdout, "\n") != 2 || !strings.Contains(r.stdout, "acme,globex") {
				t.Fatalf("token list after giving the token globex: %+v", r)
			}
			srv := startServe(t, dsn)
			if code, body := api(t, srv.base, tok, "PUT", "/v1/tenants/acme/limits", map[string]any{"publish_rate": 100}); code != 200 {
				t.Fatalf("serve with the bootstrap operator token: %d %v", code, body)
			}
		})
	}
}

// Tokens of one id stored before ids were checked across tenants (put in
// by hand here): token list shows them apart, serve warns at start naming
// the id and each token's tenants, and token revoke revokes both.
func TestSharedTokenIDWarned(t *testing.T) {
	for _, db := range databases {
		t.Run(db.name, func(t *testing.T) {
			dsn := db.dsn(t)
			migrateDSN(t, dsn)
			tok := createToken(t, dsn, "admin", "acme")
			id, _, _ := strings.Cut(strings.TrimPrefix(tok, "sq_"), ".")
			if _, err := openURL(t, dsn).DB().Exec("INSERT INTO queue_api_tokens (tenant, token_id, secret_hash, role, created_at) "+
				"SELECT 'evil', token_id, ?, role, created_at FROM queue_api_tokens WHERE tenant = 'acme' AND token_id = ?",
				[]byte("evil's hash, 32 bytes long......"), id); err != nil {
				t.Fatal(err)
			}
			if r := runCLI(t, nil, "", "--dsn", dsn, "token", "list"); r.code != 0 || strings.Count(r.stdout, id) != 2 || strings.Contains(r.stdout, "acme,evil") {
				t.Fatalf("token list with two tokens of one id: %+v; want them listed apart", r)
			}
			srv := startServe(t, dsn)
			out := srv.output()
			if !strings.Contains(out, "several tokens hold one id") || !strings.Contains(out, "id="+id) || !strings.Contains(out, "[[acme] [evil]]") {
				t.Fatalf("serve's start with two tokens of one id:\n%s\nwant a warning naming the id and the tenants of each", out)
			}
			if r := runCLI(t, nil, "", "--dsn", dsn, "token", "revoke", id); r.code != 0 || r.stdout != "revoked "+id+" in 2 tenants\n" {
				t.Fatalf("token revoke of a shared id: %+v", r)
			}
		})
	}
}

// Two serve processes share one consumer group; one is killed with
// messages received and unsettled. Nothing is lost: the other server
// delivers them again once their visibility times out, and every key's
// messages are acknowledged in order.
func TestServeProcessesShareAGroup(t *testing.T) {
	for _, db := range databases {
		t.Run(db.name, func(t *testing.T) {
			dsn := db.dsn(t)
			migrateDSN(t, dsn)
			tok := createToken(t, dsn, "admin", "acme")
			a, b := startServe(t, dsn), startServe(t, dsn)

			const keys, perKey = 4, 25
			var batch []map[string]any
			for i := range perKey {
				for k := range keys {
					batch = append(batch, map[string]any{"key": fmt.Sprintf("k%d", k), "id": fmt.Sprintf("k%d-%d", k, i), "payload": fmt.Sprint(i)})
				}
			}
			if code, out := api(t, a.base, tok, "POST", "/v1/tenants/acme/topics/orders/messages", map[string]any{"messages": batch}); code != 200 {
				t.Fatalf("publish: %d %v", code, out)
			}

			// A receives one key's messages and never settles them.
			held := receive(t, a.base, tok, map[string]any{"max": 5, "key": "k0", "visibility": 1})
			if len(held) != 5 || held[0].ID != "k0-0" {
				t.Fatalf("receive on A: %+v", held)
			}
			// While they are in flight, B gets every other group but none
			// of k0's messages; it settles none of them either, so they
			// come back after their visibility.
			groups := map[string]bool{}
			for {
				got := receive(t, b.base, tok, map[string]any{"max": 100, "next_group": true, "visibility": 1})
				if len(got) == 0 {
					break
				}
				for _, m := range got {
					if m.Key == "k0" {
						t.Fatalf("B received %s while A holds k0", m.ID)
					}
					groups[m.Key] = true
				}
			}
			if len(groups) != keys-1 {
				t.Fatalf("B received the groups %v, want the %d other than k0", groups, keys-1)
			}
			if err := a.stop(t, syscall.SIGKILL); err == nil {
				t.Fatal("A exited cleanly after SIGKILL")
			}

			acked := map[string][]int64{}
			ids := map[string]bool{}
			deadline := time.Now().Add(60 * time.Second)
			for len(ids) < keys*perKey {
				if time.Now().After(deadline) {
					t.Fatalf("after 60 s only %d of %d messages acknowledged", len(ids), keys*perKey)
				}
				got := receive(t, b.base, tok, map[string]any{"max": 10, "wait": 2, "visibility": 5, "next_group": true})
				var receipts []any
				for _, m := range got {
					receipts = append(receipts, m.Receipt)
				}
				if len(receipts) == 0 {
					continue
				}
				if code, out := api(t, b.base, tok, "POST", "/v1/tenants/acme/topics/orders/groups/billing/ack", map[string]any{"receipts": receipts}); code != 200 {
					t.Fatalf("ack on B: %d %v", code, out)
				}
				for _, m := range got {
					if o := acked[m.Key]; len(o) > 0 && m.Offset <= o[len(o)-1] {
						t.Fatalf("key %s: offset %d acknowledged after %d", m.Key, m.Offset, o[len(o)-1])
					}
					acked[m.Key] = append(acked[m.Key], m.Offset)
					ids[m.ID] = true
				}
			}
			for k, offs := range acked {
				if len(offs) != perKey {
					t.Errorf("key %s: %d messages acknowledged, want %d", k, len(offs), perKey)
				}
			}
			// Nothing more: every message was settled once.
			if extra := receive(t, b.base, tok, map[string]any{"max": 10, "next_group": true}); len(extra) != 0 {
				t.Fatalf("after everything was acknowledged, B received %+v", extra)
			}
			if err := b.stop(t, syscall.SIGTERM); err != nil {
				t.Fatalf("B after SIGTERM: %v", err)
			}
		})
	}
}

// SIGTERM answers a waiting receive at once, lets it finish, and exits 0.
func TestServeStopsGracefully(t *testing.T) {
	dsn := "sqlite://" + t.TempDir() + "/q.db"
	migrateDSN(t, dsn)
	tok := createToken(t, dsn, "consume", "acme")
	p := startServe(t, dsn)
	type answer struct {
		code int
		out  map[string]any
		took time.Duration
	}
	done := make(chan answer, 1)
	go func() {
		start := time.Now()
		req, _ := http.NewRequest("POST", p.base+"/v1/tenants/acme/topics/orders/groups/billing/receive", strings.NewReader(`{"wait":20}`))
		req.Header.Set("Authorization", "Bearer "+tok)
		a := answer{code: -1}
		if resp, err := http.DefaultClient.Do(req); err == nil {
			a.code = resp.StatusCode
			_ = json.NewDecoder(resp.Body).Decode(&a.out)
			resp.Body.Close()
		}
		a.took = time.Since(start)
		done <- a
	}()
	// Until the receive is in the server (if the signal came first, it
	// would be answered at once all the same).
	waitActive(t, p, "POST", 1)
	if err := p.stop(t, syscall.SIGTERM); err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", err, p.output())
	}
	a := <-done
	if msgs, _ := a.out["messages"].([]any); a.code != 200 || msgs == nil || len(msgs) != 0 {
		t.Fatalf("the waiting receive: %d %v", a.code, a.out)
	}
	if a.took >= 20*time.Second {
		t.Fatalf("the waiting receive took its whole wait (%v) instead of answering at shutdown", a.took)
	}
	if !strings.Contains(p.output(), "shardq serve: stopping") {
		t.Fatalf("no stop line:\n%s", p.output())
	}
}

// The Python example (standard library only) publishes and consumes
// through a running server.
func TestPythonExample(t *testing.T) {
	python, err := exec.LookPath("python3")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("python3 is needed for examples/python: %v", err)
		}
		t.Skipf("python3 is not installed: %v", err)
	}
	dsn := "sqlite://" + t.TempDir() + "/q.db"
	migrateDSN(t, dsn)
	tok := createToken(t, dsn, "admin", "acme")
	p := startServe(t, dsn)
	run := func() string {
		t.Helper()
		cmd := exec.Command(python, "../../../../examples/python/shardq_example.py")
		cmd.Env = append(os.Environ(), "SHARDQ_URL="+p.base, "SHARDQ_TENANT=acme", "SHARDQ_TOKEN="+tok)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("python example: %v\n%s", err, out)
		}
		return string(out)
	}
	out := run()
	for _, want := range []string{
		"published order-42-created at offset 1\n",
		`received order-42 order-42-created attempt 1: {"state": "created"}` + "\n" +
			`received order-42 order-42-paid attempt 1: {"state": "paid"}` + "\n" +
			`received order-42 order-42-shipped attempt 1: {"state": "shipped"}` + "\n",
		"acknowledged 3 messages\n",
	} {
		if !strings.Contains(out, want) {
			t.Fatalf("python example printed:\n%s\nwant %q", out, want)
		}
	}
	// Again: the publishes are duplicates, and the group has read them.
	if out := run(); !strings.Contains(out, "published order-42-paid at offset 2 (duplicate)") || !strings.Contains(out, "acknowledged 0 messages") {
		t.Fatalf("second run printed:\n%s", out)
	}
}

// With --tls-cert and --tls-key the server speaks HTTPS only.
func TestServeTLS(t *testing.T) {
	dir := t.TempDir()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "127.0.0.1"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	dsn := "sqlite://" + filepath.Join(dir, "q.db")
	migrateDSN(t, dsn)
	if r := runCLI(t, nil, "", "--dsn", dsn, "serve", "--tls-cert", certFile); r.code != 2 || !strings.Contains(r.stderr, "--tls-cert and --tls-key go together") {
		t.Fatalf("--tls-cert alone: %+v", r)
	}
	p := startServe(t, dsn, "--tls-cert", certFile, "--tls-key", keyFile)
	if !strings.HasPrefix(p.base, "https://") {
		t.Fatalf("listening on %s, want https", p.base)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Get(p.base + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.TLS == nil {
		t.Fatalf("GET /healthz over TLS: %d, tls %v", resp.StatusCode, resp.TLS != nil)
	}
	// Plain HTTP on the TLS port is not served.
	plain, err := http.Get("http://" + strings.TrimPrefix(p.base, "https://") + "/healthz")
	if err == nil {
		plain.Body.Close()
		if plain.StatusCode == 200 {
			t.Fatal("plain HTTP was answered 200 on the TLS port")
		}
	}
}

// waitActive waits until p's /metrics counts n requests of method in
// flight.
func waitActive(t *testing.T, p *serveProc, method string, n float64) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		fams, err := scrape(strings.TrimPrefix(p.base, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		var active float64
		for _, m := range fams["http_server_active_requests"].GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "http_request_method" && l.GetValue() == method {
					active += m.GetGauge().GetValue()
				}
			}
		}
		if active >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v %s requests in flight after 10 s, want %v; metric families %v", active, method, n, slices.Collect(maps.Keys(fams)))
		}
	}
}
