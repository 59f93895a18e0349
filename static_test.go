// SPDX-License-Identifier: Apache-2.0

package shardq_test

import (
	"bufio"
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
)

// staticHelperEnv makes the test binary a static member ("a") that
// acks every message, until killed.
const staticHelperEnv = "SHARDQ_STATIC_HELPER_DSN"

// staticConfig counts a silent member live for 5 minutes (StaleAfter
// covers a restart), with short leases.
func staticConfig(instance string, h shardq.Handler) shardq.SubscriberConfig {
	return shardq.SubscriberConfig{ConsumerGroup: "g", Topic: "x", Tenants: []string{"t"}, InstanceID: instance, Handler: h,
		LeaseTTL: 2 * time.Second, HeartbeatInterval: 100 * time.Millisecond, StaleAfter: 5 * time.Minute, IdleRelease: 10 * time.Minute,
		DiscoveryInterval: 50 * time.Millisecond, PollInterval: 10 * time.Millisecond, CommitInterval: 20 * time.Millisecond}
}

func runStaticHelper(url string) int {
	c, _, err := openURL(url)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	var mu sync.Mutex
	if _, err := c.Subscribe(context.Background(), staticConfig("a", func(_ context.Context, d *shardq.Delivery) error {
		mu.Lock()
		fmt.Fprintf(os.Stdout, "%s %s\n", d.PartitionKey, d.ID) // unbuffered: written before the ack
		mu.Unlock()
		return nil
	})); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	select {} // until SIGKILL
}

// TestStaticMemberRestartsAfterKill: a static member's process is
// SIGKILLed and started again with its InstanceID. With StaleAfter of 5
// minutes the other member counts the dead one live, and a new member
// would get a third of the partitions, some of them the other member's;
// the static member takes the dead one's over at its start (new tokens)
// and delivers them, and the other member keeps its own, with their
// tokens: no partition moves.
func TestStaticMemberRestartsAfterKill(t *testing.T) {
	eachDatabase(t, func(t *testing.T, url string, drv driver.Driver, c *shardq.Client) {
		ctx := context.Background()
		const keys = 8
		b, err := c.Subscribe(ctx, staticConfig("b", func(context.Context, *shardq.Delivery) error { return nil }))
		if err != nil {
			t.Fatal(err)
		}
		defer b.Stop(ctx)
		scope := driver.GroupScope{Tenants: []string{"t"}, Topic: "x", ConsumerGroup: "g"}
		byOwner := func() map[string]map[string]int64 { // owner -> key -> token
			ls, err := drv.HeldLeases(ctx, scope)
			if err != nil {
				t.Fatal(err)
			}
			out := map[string]map[string]int64{}
			for _, l := range ls {
				if out[l.Owner] == nil {
					out[l.Owner] = map[string]int64{}
				}
				out[l.Owner][l.PartitionKey] = l.Token
			}
			return out
		}
		other := func(owners map[string]map[string]int64) (string, map[string]int64) {
			for o, ks := range owners {
				if o != b.ID() {
					return o, ks
				}
			}
			return "", nil
		}

		first, _ := startHelper(t, staticHelperEnv, url)
		waitFor(t, "the helper's heartbeat", func() bool {
			ms, err := drv.Subscribers(ctx, scope)
			return err == nil && len(ms) == 2
		})
		publishSpread(t, c, keys, keys) // both members see the work at once, and split it
		waitFor(t, "an even split with the helper", func() bool {
			o := byOwner()
			_, a := other(o)
			return len(o) == 2 && len(o[b.ID()]) == keys/2 && len(a) == keys/2
		})
		if err := first.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		first.Wait()
		before := byOwner()
		deadID, aKeys := other(before)

		second, out := startHelper(t, staticHelperEnv, url)
		defer func() { second.Process.Kill(); second.Wait() }()
		waitFor(t, "the restarted static member holding its partitions", func() bool {
			id, ks := other(byOwner())
			return id != deadID && id != "" && slices.Equal(slices.Sorted(maps.Keys(ks)), slices.Sorted(maps.Keys(aKeys)))
		})
		after := byOwner()
		if !maps.Equal(after[b.ID()], before[b.ID()]) {
			t.Fatalf("the other member's partitions moved: %v, before %v", after[b.ID()], before[b.ID()])
		}
		_, now := other(after)
		for k, tok := range aKeys {
			if now[k] <= tok {
				t.Fatalf("partition %s: token %d after the restart, %d before", k, now[k], tok)
			}
		}
		members, err := drv.Subscribers(ctx, scope)
		if err != nil || len(members) != 2 {
			t.Fatalf("heartbeat rows %+v (%v): want b and the restarted member, not the dead one", members, err)
		}
		var msgs []shardq.Message
		for k := range aKeys {
			msgs = append(msgs, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: k, ID: "after-" + k})
		}
		if _, err := c.Publish(ctx, msgs...); err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		lines := bufio.NewScanner(out)
		stop := time.AfterFunc(30*time.Second, func() { second.Process.Kill() }) // ends the read below
		defer stop.Stop()
		for len(seen) < len(aKeys) && lines.Scan() {
			if key, id, ok := strings.Cut(lines.Text(), " "); ok && id == "after-"+key {
				seen[key] = true
			}
		}
		if len(seen) < len(aKeys) {
			t.Fatalf("the restarted member delivered %v of its partitions' new messages, want all of %v", seen, slices.Sorted(maps.Keys(aKeys)))
		}
	})
}
