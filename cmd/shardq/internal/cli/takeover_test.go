// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shardq/shardq"
)

// cliProc is a shardq command run as its own process (this test binary
// as the command, TestMain), its stdout read as consume's JSON lines.
type cliProc struct {
	cmd      *exec.Cmd
	mu       sync.Mutex
	payloads []string     // stdout lines' payloads, in order
	stderr   bytes.Buffer // everything it printed on stderr
	exited   chan error   // its exit, once stdout and stderr are read
}

func startCLI(t *testing.T, dsn string, args ...string) *cliProc {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "SHARDQ_TEST_RUN_AS_CLI=1", "SHARDQ_DSN="+dsn)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &cliProc{cmd: cmd, exited: make(chan error, 1)}
	cmd.Stderr = &lockedBuffer{mu: &p.mu, b: &p.stderr}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var l struct {
				Payload string `json:"payload"`
			}
			if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
				l.Payload = "not JSON: " + sc.Text()
			}
			p.mu.Lock()
			p.payloads = append(p.payloads, l.Payload)
			p.mu.Unlock()
		}
		p.exited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Signal(syscall.SIGCONT)
			_ = cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			t.Logf("%v stderr:\n%s", args, p.errText())
		}
	})
	return p
}

// lockedBuffer is a process's stderr, read while it is written.
type lockedBuffer struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w *lockedBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (p *cliProc) got() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.payloads...)
}

func (p *cliProc) errText() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stderr.String()
}

// wait returns the process's exit code, failing after limit.
func (p *cliProc) wait(t *testing.T, limit time.Duration) int {
	t.Helper()
	select {
	case err := <-p.exited:
		var ee *exec.ExitError
		switch {
		case err == nil:
			return 0
		case errors.As(err, &ee):
			return ee.ExitCode()
		}
		t.Fatalf("wait: %v", err)
	case <-time.After(limit):
		t.Fatalf("%v still running after %s; stderr:\n%s", p.cmd.Args[1:], limit, p.errText())
	}
	return -1
}

// TestHeirOfFrozenReceiverDelivers is issue 29's takeover: receiver A
// (consume --key) is frozen by SIGSTOP with its group's lease; receiver B
// waits for the group longer than its --idle-exit, gets it once A's lease
// runs out, and must deliver every waiting message in order before its
// idle exit (it used to leave at once: its idle clock had started before
// the wait). Resumed, A finds its lease lost and exits 1.
func TestHeirOfFrozenReceiverDelivers(t *testing.T) {
	for _, db := range databases {
		t.Run(db.name, func(t *testing.T) {
			t.Parallel() // each waits out a 30 s lease (the CLI's default; consume has no flag for it)
			dsn := db.dsn(t)
			migrateDSN(t, dsn)
			env := map[string]string{"SHARDQ_DSN": dsn}
			publish := func(from, to int) {
				var lines strings.Builder
				for i := from; i < to; i++ {
					fmt.Fprintf(&lines, "m%04d\n", i)
				}
				if r := runCLI(t, env, lines.String(), "publish", "--tenant", "acme", "--topic", "orders", "--key", "k00", "--lines"); r.code != 0 {
					t.Fatal(r)
				}
			}
			const first, waiting = 5, 300
			publish(0, first)
			base := []string{"consume", "--tenant", "acme", "--topic", "orders", "--group", "g", "--key", "k00"}
			a := startCLI(t, dsn, base...)
			// Freeze A once it has acked all it printed: not inside a
			// write, whose lock (SQLite's file lock) would hold everyone
			// else; its lease renewal, every 10 s, is then its only write.
			admin := openClient(t, dsn)
			for deadline := time.Now().Add(60 * time.Second); len(a.got()) < first || lag(t, admin) > 0; time.Sleep(20 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("A printed %v within 60 s, lag %d; want %d messages acked", a.got(), lag(t, admin), first)
				}
			}
			if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			aGot := a.got()
			publish(first, first+waiting)

			// B's accept waits until A's lease (30 s, renewed every 10 s)
			// runs out: 20 to 30 s, well past B's --idle-exit.
			b := startCLI(t, dsn, append(base, "--wait", "90s", "--idle-exit", "3s")...)
			if code := b.wait(t, 120*time.Second); code != 0 {
				t.Fatalf("B exited %d; want 0 after its idle exit", code)
			}
			if !strings.Contains(b.errText(), `accepted message group "k00"`) {
				t.Fatalf("B never accepted the group: %s", b.errText())
			}
			// B starts where A's last ack left the cursor.
			bGot := b.got()
			if len(bGot) != waiting {
				t.Fatalf("B printed %d messages; want the %d waiting (m%04d to m%04d)", len(bGot), waiting, first, first+waiting-1)
			}
			for i, p := range bGot {
				if want := fmt.Sprintf("m%04d", first+i); p != want {
					t.Fatalf("B's message %d is %s; want %s (in order)", i, p, want)
				}
			}

			// Resumed, A's renewal (or its next delivery) finds the lease
			// taken: it must not deliver, and exits 1 saying so.
			if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
			if code := a.wait(t, 60*time.Second); code != 1 {
				t.Fatalf("resumed A exited %d; want 1", code)
			}
			if got := a.got(); len(got) != len(aGot) {
				t.Fatalf("resumed A printed %v after losing its lease", got[len(aGot):])
			}
			if !strings.Contains(a.errText(), shardq.ErrReceiverClosed.Error()) || !strings.Contains(a.errText(), "lease lost") {
				t.Fatalf("resumed A's stderr does not report its lease lost:\n%s", a.errText())
			}
		})
	}
}

// openClient is a client on dsn (no feed, no consumers), closed when t
// ends.
func openClient(t *testing.T, dsn string) *shardq.Client {
	t.Helper()
	c, err := shardq.NewClient(openURL(t, dsn), &shardq.Config{ChangeFeed: shardq.FeedOff})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// lag is group g's unacked messages of acme's topic orders.
func lag(t *testing.T, c *shardq.Client) int64 {
	t.Helper()
	offs, err := c.Admin().Offsets(context.Background(), shardq.Scope{Tenants: []string{"acme"}}, "g")
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, o := range offs {
		if o.Topic == "orders" {
			n += o.Lag
		}
	}
	return n
}
