// SPDX-License-Identifier: Apache-2.0

//go:build vitesscluster

package vitessfeed_test

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/internal/testdb"
)

// These tests move a shard's primary, which vttestserver cannot: they run
// against scripts/vitess-cluster (a primary and a replica per shard, each
// a vttablet over a mysqld of its own), through scripts/vitess-failover,
// which sets SHARDQ_TEST_VITESS_DSN and SHARDQ_TEST_VITESS_GRPC to it.
// The build tag keeps them out of the ordinary suite, whose Vitess cannot
// run them.

// cluster runs scripts/vitess-cluster with args.
func cluster(t *testing.T, args ...string) {
	t.Helper()
	out, err := exec.Command("../scripts/vitess-cluster", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("scripts/vitess-cluster %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	t.Logf("%s", strings.TrimSpace(string(out)))
}

// publishEachRetrying is publishEach, retried while the moved shard's
// tablet finds its server again (bounded: 60 s).
func publishEachRetrying(t *testing.T, c *shardq.Client, tenants map[string]string, key string) []string {
	t.Helper()
	var want []string
	deadline := time.Now().Add(60 * time.Second)
	for tenant := range tenants {
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			res, err := c.Publish(ctx, shardq.Message{Tenant: tenant, Topic: "x", PartitionKey: key, ID: key})
			cancel()
			if err == nil {
				want = append(want, fmt.Sprintf("moved %s/x/%s@%d", tenant, key, res[0].Offset))
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("publish to %s after the move: %v", tenant, err)
			}
			t.Logf("publish to %s: %v (retrying)", tenant, err)
			time.Sleep(200 * time.Millisecond)
		}
	}
	slices.Sort(want)
	return want
}

// movedAfter waits for n moved lines of key and returns them sorted, with
// every other line the feed said meanwhile (down, up, rescan).
func movedAfter(t *testing.T, events sink, key string, n int) (moved, said []string) {
	t.Helper()
	deadline := time.After(60 * time.Second)
	for len(moved) < n {
		select {
		case ev := <-events:
			switch {
			case strings.HasPrefix(ev, "moved ") && strings.Contains(ev, "/"+key+"@"):
				moved = append(moved, ev)
			case !strings.HasPrefix(ev, "moved "):
				said = append(said, ev)
			}
		case <-deadline:
			t.Fatalf("within 60 s the feed named %q of key %s, want %d (and said %q)", moved, key, n, said)
		}
	}
	slices.Sort(moved)
	return moved, said
}

// Shard 80-'s primary replaced by a planned reparent, then restarted: the
// feed goes on naming both shards' commits from where it was, with no
// position lost (a reparent keeps the binary log's history: the new
// primary replicated it), and the other shard's stream is not cut.
func TestVitessFeedFollowsAPrimaryMove(t *testing.T) {
	c, tenants := placed(t)
	events := run(t, feedAt(t, testdb.VitessGRPCAddr()), nil)
	events.Next(t, "up names=true")
	want := publishEachRetrying(t, c, tenants, "before")
	if got, _ := movedAfter(t, events, "before", len(want)); !slices.Equal(got, want) {
		t.Fatalf("before: feed said %q, want %q", got, want)
	}
	for _, move := range []string{"reparent", "restart-primary"} {
		cluster(t, move, "80-")
		key := "after-" + move
		start := time.Now()
		want := publishEachRetrying(t, c, tenants, key)
		got, said := movedAfter(t, events, key, len(want))
		if !slices.Equal(got, want) {
			t.Fatalf("after %s: feed said %q, want %q", move, got, want)
		}
		for _, s := range said {
			if strings.HasPrefix(s, "rescan") {
				t.Errorf("after %s: the feed lost its position (%q); a planned move keeps it", move, said)
			}
		}
		t.Logf("after %s: both shards' commits named %s after the publishes began; the feed said %q meanwhile", move, time.Since(start).Round(time.Millisecond), said)
	}
}
