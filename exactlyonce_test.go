// SPDX-License-Identifier: Apache-2.0

package shardq_test

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
)

// ackTxHelperEnv makes the test binary a subscriber process whose
// handler writes an effect row and acks in the same transaction; with
// ackTxStopEnv "before-commit:ID" or "after-commit:ID" it says so on
// stdout at that point of message ID and hangs there until killed.
const (
	ackTxHelperEnv = "SHARDQ_ACKTX_HELPER_DSN"
	ackTxTopicEnv  = "SHARDQ_ACKTX_TOPIC"
	ackTxStopEnv   = "SHARDQ_ACKTX_STOP"
)

func runAckTxHelper(url string) int {
	c, drv, err := openURL(url)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	stop := os.Getenv(ackTxStopEnv)
	var mu sync.Mutex
	say := func(what, id string) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(os.Stdout, "%s %s\n", what, id) // unbuffered
	}
	cfg := killedConfig("exactly-once", func(ctx context.Context, d *shardq.Delivery) error {
		tx, err := drv.BeginWrite(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if _, err := tx.ExecContext(ctx, "INSERT INTO app_effects (id) VALUES (?)", d.ID); err != nil {
			return err
		}
		if err := d.AckTx(ctx, tx.(*sql.Tx)); err != nil {
			return err
		}
		if stop == "before-commit:"+d.ID {
			say("before-commit", d.ID)
			select {} // until SIGKILL: the effect and the ack are lost together
		}
		if err := tx.Commit(); err != nil {
			return err
		}
		say("committed", d.ID)
		if stop == "after-commit:"+d.ID {
			select {} // until SIGKILL: the runtime never acks it itself
		}
		return nil
	})
	cfg.Topic = os.Getenv(ackTxTopicEnv)
	cfg.VisibilityTimeout = time.Second
	if _, err := c.Subscribe(context.Background(), cfg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	select {} // until SIGKILL
}

// TestAckTxExactlyOnceAcrossKills: a handler's effect and its ack
// commit in one transaction (Delivery.AckTx), so a process SIGKILLed
// between its writes and their commit, or between the commit and the
// runtime's own ack, leaves each message's effect exactly once, for a
// message group and for ungrouped messages. Without AckTx the kill after
// the commit would deliver that message again: its effect twice.
func TestAckTxExactlyOnceAcrossKills(t *testing.T) {
	eachDatabase(t, func(t *testing.T, url string, drv driver.Driver, c *shardq.Client) {
		ctx := context.Background()
		tx, err := drv.BeginWrite(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.ExecContext(ctx, "CREATE TABLE app_effects (id VARCHAR(64) NOT NULL)"); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		var grouped, ungrouped []shardq.Message
		for i := 1; i <= 6; i++ {
			grouped = append(grouped, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: fmt.Sprintf("k%d", i)})
		}
		for i := 1; i <= 4; i++ {
			ungrouped = append(ungrouped, shardq.Message{Tenant: "t", Topic: "y", ID: fmt.Sprintf("u%d", i)})
		}
		if _, err := c.Publish(ctx, append(grouped, ungrouped...)...); err != nil {
			t.Fatal(err)
		}
		effects := func() map[string]int {
			t.Helper()
			rows, err := drv.DB().QueryContext(ctx, "SELECT id FROM app_effects")
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			out := map[string]int{}
			for rows.Next() {
				var id string
				if err := rows.Scan(&id); err != nil {
					t.Fatal(err)
				}
				out[id]++
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			return out
		}
		// run starts a helper on topic and kills it once it printed want
		// (or, with want "", once every id has its effect).
		run := func(topic, stop, want string, ids []shardq.Message) {
			t.Helper()
			t.Setenv(ackTxTopicEnv, topic)
			t.Setenv(ackTxStopEnv, stop)
			cmd, stdout := startHelper(t, ackTxHelperEnv, url)
			lines := make(chan string, 64)
			go func() {
				sc := bufio.NewScanner(stdout)
				for sc.Scan() {
					lines <- sc.Text()
				}
				close(lines)
			}()
			deadline := time.After(time.Minute)
			tick := time.NewTicker(50 * time.Millisecond)
			defer tick.Stop()
		wait:
			for {
				select {
				case l, ok := <-lines:
					if !ok {
						t.Fatalf("helper on %s (stop %q) exited before %q", topic, stop, want)
					}
					if want != "" && l == want {
						break wait
					}
				case <-tick.C:
					if want == "" {
						got := effects()
						done := true
						for _, m := range ids {
							done = done && got[m.ID] > 0
						}
						if done {
							break wait
						}
					}
				case <-deadline:
					t.Fatalf("helper on %s (stop %q): no %q within a minute; effects %v", topic, stop, want, effects())
				}
			}
			if err := cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			cmd.Wait()
		}
		run("x", "before-commit:k3", "before-commit k3", nil)
		run("x", "after-commit:k4", "committed k4", nil)
		run("x", "", "", grouped)
		run("y", "after-commit:u2", "committed u2", nil)
		run("y", "", "", ungrouped)
		got := effects()
		for _, m := range append(grouped, ungrouped...) {
			if got[m.ID] != 1 {
				t.Errorf("%s: effect stored %d times, want exactly once (all: %v)", m.ID, got[m.ID], got)
			}
		}
		if len(got) != len(grouped)+len(ungrouped) {
			t.Errorf("effects %v, want one per message", got)
		}
	})
}
