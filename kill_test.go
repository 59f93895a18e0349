// SPDX-License-Identifier: Apache-2.0

package shardq_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
)

// killHelperEnv makes the test binary a subscriber process that prints
// "partition offset id" for each message before acking it, until killed.
const killHelperEnv = "SHARDQ_KILL_HELPER_DSN"

func killedConfig(name string, h shardq.Handler) shardq.SubscriberConfig {
	return shardq.SubscriberConfig{ConsumerGroup: "g", Topic: "x", Tenants: []string{"t"}, Name: name, Handler: h,
		LeaseTTL: 2 * time.Second, HeartbeatInterval: 100 * time.Millisecond, StaleAfter: time.Second,
		DiscoveryInterval: 50 * time.Millisecond, PollInterval: 10 * time.Millisecond, CommitInterval: 20 * time.Millisecond}
}

func runKillHelper(url string) int {
	c, _, err := openURL(url)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	var mu sync.Mutex
	_, err = c.Subscribe(context.Background(), killedConfig("doomed", func(_ context.Context, d *shardq.Delivery) error {
		mu.Lock()
		fmt.Fprintf(os.Stdout, "%s %d %s\n", d.PartitionKey, d.Offset, d.ID) // unbuffered: written before the ack
		mu.Unlock()
		time.Sleep(5 * time.Millisecond)
		return nil
	}))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	select {} // until SIGKILL
}

// startHelper re-runs the test binary as the helper process env selects,
// on the database at url, and returns it with its standard output.
func startHelper(t *testing.T, env, url string) (*exec.Cmd, io.Reader) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env+"="+url)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd, stdout
}

// TestSubscriberKilledMidRun is invariant 4 of docs/design.md for a killed process: a
// subscriber process is SIGKILLed mid-run; another takes its partitions
// over (its heartbeat goes stale, its leases are swept) and every message
// is delivered, in order per partition, each consumer's share in order.
func TestSubscriberKilledMidRun(t *testing.T) {
	eachDatabase(t, func(t *testing.T, url string, drv driver.Driver, c *shardq.Client) {
		ctx := context.Background()
		const total = 1200
		publishSpread(t, c, 8, total)

		cmd, stdout := startHelper(t, killHelperEnv, url)
		type line struct {
			key    string
			offset int64
			id     string
		}
		lines := make(chan line, total)
		go func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				f := strings.Fields(sc.Text())
				off, _ := strconv.ParseInt(f[1], 10, 64)
				lines <- line{f[0], off, f[2]}
			}
			close(lines)
		}()
		var child []line
		for l := range lines {
			child = append(child, l)
			if len(child) == 200 {
				if err := cmd.Process.Kill(); err != nil { // SIGKILL mid-run
					t.Fatal(err)
				}
			}
		}
		cmd.Wait()
		if len(child) < 200 {
			t.Fatalf("the helper printed only %d messages before it died", len(child))
		}

		var mu sync.Mutex
		var parent []line
		sub, err := c.Subscribe(ctx, killedConfig("heir", func(_ context.Context, d *shardq.Delivery) error {
			mu.Lock()
			parent = append(parent, line{d.PartitionKey, d.Offset, d.ID})
			mu.Unlock()
			return nil
		}))
		if err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(time.Minute)
		for {
			ps, err := drv.PartitionsWithWork(ctx, driver.GroupScope{Tenants: []string{"t"}, Topic: "x", ConsumerGroup: "g"})
			if err == nil && len(ps) == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("partitions still have work a minute after the kill: %+v", ps)
			}
			time.Sleep(50 * time.Millisecond)
		}
		stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := sub.Stop(stopCtx); err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for _, who := range [][]line{child, parent} {
			last := map[string]int64{}
			for _, l := range who {
				if l.offset <= last[l.key] {
					t.Fatalf("partition %s: offset %d after %d", l.key, l.offset, last[l.key])
				}
				last[l.key] = l.offset
				seen[l.id] = true
			}
		}
		if len(seen) != total {
			t.Fatalf("delivered %d distinct messages of %d (child %d, heir %d)", len(seen), total, len(child), len(parent))
		}
		t.Logf("child delivered %d before SIGKILL, heir %d (%d redelivered)", len(child), len(parent), len(child)+len(parent)-total)
	})
}

// txKillHelperEnv makes the test binary a producer that writes a half
// message, says so on stdout, and hangs in its local transaction.
const txKillHelperEnv = "SHARDQ_TX_KILL_HELPER_DSN"

func runTxKillHelper(url string) int {
	c, _, err := openURL(url)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	p, err := c.StartTransactionProducer(context.Background(), shardq.TransactionProducerConfig{ProducerGroup: "pg", Tenants: []string{"t"},
		TransactionTimeout: 100 * time.Millisecond, Checker: func(context.Context, *shardq.HalfMessage) (shardq.TxState, error) {
			return shardq.TxUnknown, nil // this process never answers
		}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	_, err = p.SendInTransaction(context.Background(), shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "orphan", Payload: []byte("paid")}, nil, nil,
		func(context.Context, *shardq.HalfMessage) (shardq.TxState, error) {
			fmt.Println("half written")
			select {} // the local transaction never returns: SIGKILL comes first
		})
	fmt.Fprintln(os.Stderr, "unreachable:", err)
	return 1
}

// TestTxProducerKilledAfterHalfMessage: a producer process dies after
// writing its half message; another producer of the group checks it back
// and commits it, once.
func TestTxProducerKilledAfterHalfMessage(t *testing.T) {
	eachDatabase(t, func(t *testing.T, url string, drv driver.Driver, c *shardq.Client) {
		ctx := context.Background()
		cmd, stdout := startHelper(t, txKillHelperEnv, url)
		line, err := bufio.NewReader(stdout).ReadString('\n')
		if err != nil || line != "half written\n" {
			t.Fatalf("helper said %q, %v", line, err)
		}
		if err := cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		cmd.Wait()
		if hs, err := drv.ListHalves(ctx, driver.Scope{Tenants: []string{"t"}}); err != nil || len(hs) != 1 {
			t.Fatalf("pending after the kill: %d, %v", len(hs), err)
		}
		checked := make(chan string, 10)
		p, err := c.StartTransactionProducer(ctx, shardq.TransactionProducerConfig{ProducerGroup: "pg", Tenants: []string{"t"},
			PollInterval: 20 * time.Millisecond, Checker: func(_ context.Context, h *shardq.HalfMessage) (shardq.TxState, error) {
				checked <- h.ID
				return shardq.TxCommit, nil // the business record exists: commit
			}})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Stop(ctx)
		select {
		case id := <-checked:
			if id != "orphan" {
				t.Fatalf("checked %q", id)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("the orphaned half message was never checked")
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			msgs, err := drv.FetchAfter(ctx, driver.TopicPartition{Tenant: "t", Topic: "x", PartitionKey: "k"}, 0, 10)
			if err != nil {
				t.Fatal(err)
			}
			if len(msgs) == 1 && msgs[0].ID == "orphan" && string(msgs[0].Payload) == "paid" {
				break
			}
			if len(msgs) > 1 || time.Now().After(deadline) {
				t.Fatalf("partition holds %+v", msgs)
			}
			time.Sleep(20 * time.Millisecond)
		}
		if hs, _ := drv.ListHalves(ctx, driver.Scope{Tenants: []string{"t"}}); len(hs) != 0 {
			t.Fatalf("half message still pending after the check-back committed it")
		}
	})
}
