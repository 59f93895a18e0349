// SPDX-License-Identifier: Apache-2.0

package ungrouped

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/large"
	"github.com/shardq/shardq/internal/settle"
	"github.com/shardq/shardq/internal/testdb"
)

// probeRecorder notes when the claim loop reads the tenants with work.
type probeRecorder struct {
	driver.Driver
	at chan time.Time
}

func (r probeRecorder) PartitionsWithWorkOf(ctx context.Context, g driver.GroupScope, keys []string) ([]driver.Partition, error) {
	ps, err := r.Driver.PartitionsWithWorkOf(ctx, g, keys)
	select {
	case r.at <- time.Now():
	default:
	}
	return ps, err
}

// TestProbesFasterWhileTheyLeadToClaims: without a change feed, the claim
// loop reads the tenants with ungrouped messages every PollInterval while
// that leads to no claim (here a message delayed by an hour: its tenant
// has work by the probe, but nothing is claimable), and at a twentieth of
// it once a probe led to a claim, so that a stream of messages published
// by another process is claimed within milliseconds.
func TestProbesFasterWhileTheyLeadToClaims(t *testing.T) {
	const every = time.Second // a floor of 50 ms
	d := testdb.Migrated(t, testdb.SQLite(t))
	probes := make(chan time.Time, 64)
	handled := make(chan string, 1)
	publish := func(m *driver.InsertMessage) {
		t.Helper()
		m.Tenant, m.Topic, m.CreatedAt = "bench", "tick", time.Now()
		tx, err := d.BeginWrite(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if err := d.InsertMessages(context.Background(), tx, []*driver.InsertMessage{m}); err != nil {
			tx.Rollback()
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	publish(&driver.InsertMessage{ID: "later", NotBefore: time.Now().Add(time.Hour)})
	s := Start(context.Background(), probeRecorder{d, probes}, Config{ConsumerGroup: "g", Topic: "tick", Tenants: []string{"bench"}, ID: "m0",
		Handle: func(_ context.Context, msgs []driver.Message, _ *large.Whole, _ int) error {
			handled <- msgs[0].ID
			return nil
		},
		Concurrency: 1, Visibility: 30 * time.Second, MaxRenewal: 30 * time.Second, PollInterval: every,
		DiscoveryInterval: time.Hour, // the cursor stays behind the delayed message: the tenant keeps work
		Policy:            settle.Policy{MaxAttempts: 3, BackoffMin: time.Second, BackoffMax: time.Second},
		Clock:             time.Now, Log: slog.New(slog.DiscardHandler)})
	defer s.Stop(context.Background())
	next := func() time.Time {
		t.Helper()
		select {
		case at := <-probes:
			return at
		case <-time.After(10 * time.Second):
			t.Fatal("the claim loop stopped probing")
			return time.Time{}
		}
	}

	first := next()
	if gap := next().Sub(first); gap < every*8/10 {
		t.Fatalf("probes %v apart while they led to no claim: faster than PollInterval (%v)", gap, every)
	}
	publish(&driver.InsertMessage{ID: "now"}) // as another process would: no wake-up
	next()                                    // the probe that finds it
	select {
	case id := <-handled:
		if id != "now" {
			t.Fatalf("handled %s, want now", id)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the message was not handled")
	}
	from := time.Now()
	for range 5 {
		next()
	}
	if took := time.Since(from); took >= every {
		t.Fatalf("5 probes after a claim took %v: not faster than PollInterval (%v)", took, every)
	}
}
