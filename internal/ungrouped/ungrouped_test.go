// SPDX-License-Identifier: Apache-2.0

package ungrouped

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/large"
	"github.com/shardq/shardq/internal/settle"
	"github.com/shardq/shardq/internal/testdb"
)

// probeRecorder notes when the claim loop reads the tenants with work,
// and counts the claims made in tenant "b"; while streaming, it publishes
// an ungrouped message to tenant "a" before each read, as another process
// would (no wake-up).
type probeRecorder struct {
	driver.Driver
	streaming *atomic.Bool
	n         *atomic.Int64 // messages published
	bClaims   *atomic.Int64
	at        chan time.Time
}

func (r probeRecorder) PartitionsWithWorkOf(ctx context.Context, g driver.GroupScope, keys []string) ([]driver.Partition, error) {
	if r.streaming.Load() {
		if err := insert(ctx, r.Driver, &driver.InsertMessage{Tenant: "a", ID: fmt.Sprint("m", r.n.Add(1))}); err != nil {
			return nil, err
		}
	}
	ps, err := r.Driver.PartitionsWithWorkOf(ctx, g, keys)
	select {
	case r.at <- time.Now():
	default:
	}
	return ps, err
}

func (r probeRecorder) ClaimMessages(ctx context.Context, in driver.ClaimMessagesParams) ([]driver.Claim, bool, error) {
	if in.Group.Tenant == "b" {
		r.bClaims.Add(1)
		// As on a loaded server: b's dry mark starts well after the
		// probe before it, so a probe that came just before the mark's
		// end would leave b dry for another interval.
		time.Sleep(20 * time.Millisecond)
	}
	return r.Driver.ClaimMessages(ctx, in)
}

func insert(ctx context.Context, d driver.Driver, m *driver.InsertMessage) error {
	m.Topic, m.CreatedAt = "tick", time.Now()
	tx, err := d.BeginWrite(ctx)
	if err != nil {
		return err
	}
	if err := d.InsertMessages(ctx, tx, []*driver.InsertMessage{m}); err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
}

// TestProbesFasterWhileTheyLeadToClaims: without a change feed, the claim
// loop reads the tenants with ungrouped messages every PollInterval while
// that leads to no claim (tenant b's one message is delayed by an hour: b
// has work by the probe, but nothing is claimable), at a twentieth of it
// while probes lead to claims (tenant a's messages stream in from another
// process), and backs off again when they stop. Meanwhile b, whose claim
// found nothing and whose head stays, is claimed from about once a
// PollInterval, not at every probe a brings forward; and b's second
// message, delayed by 2.1 s, is claimed within a PollInterval of its time
// though b's head never moves.
func TestProbesFasterWhileTheyLeadToClaims(t *testing.T) {
	const every = time.Second // a floor of 50 ms
	d := testdb.Migrated(t, testdb.SQLite(t))
	ctx := context.Background()
	if err := insert(ctx, d, &driver.InsertMessage{Tenant: "b", ID: "later", NotBefore: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	due := time.Now().Add(every * 21 / 10)
	if err := insert(ctx, d, &driver.InsertMessage{Tenant: "b", ID: "b-due", NotBefore: due}); err != nil {
		t.Fatal(err)
	}
	probes := make(chan time.Time, 64)
	var streaming atomic.Bool
	var published, bClaims atomic.Int64
	bDue := make(chan time.Time, 1)
	s := Start(ctx, probeRecorder{d, &streaming, &published, &bClaims, probes}, Config{ConsumerGroup: "g", Topic: "tick", Tenants: []string{"a", "b"}, ID: "m0",
		Handle: func(_ context.Context, msgs []driver.Message, _ *large.Whole, _ int) error {
			if msgs[0].ID == "b-due" {
				bDue <- time.Now()
			}
			return nil
		},
		Concurrency: 1, Visibility: 30 * time.Second, MaxRenewal: 30 * time.Second, PollInterval: every,
		DiscoveryInterval: time.Hour, // the cursor stays behind b's delayed message: b keeps work
		Policy:            settle.Policy{MaxAttempts: 3, BackoffMin: time.Second, BackoffMax: time.Second},
		Clock:             time.Now, Log: slog.New(slog.DiscardHandler)})
	defer s.Stop(ctx)
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

	select {
	case at := <-bDue:
		t.Logf("b-due handled %v after its time", at.Sub(due))
		if late := at.Sub(due); late > every+every/4 {
			t.Errorf("b's message was handled %v after its time: more than PollInterval (%v)", late, every)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("b's delayed message was not handled")
	}
	for len(probes) > 0 {
		<-probes
	}

	streaming.Store(true)
	next() // the probe that finds a's first message
	from, b0 := time.Now(), bClaims.Load()
	for range 10 {
		next()
	}
	took, b := time.Since(from), bClaims.Load()-b0
	if took >= every {
		t.Fatalf("10 probes while they led to claims took %v: not faster than PollInterval (%v)", took, every)
	}
	if b > 3 {
		t.Fatalf("tenant b, whose claim found nothing and whose head stayed, was claimed from %d times in 10 fast probes (%v)", b, took)
	}

	streaming.Store(false)
	for len(probes) > 0 {
		<-probes
	}
	last := next()
	var gaps []time.Duration
	for range 9 {
		at := next()
		gaps = append(gaps, at.Sub(last))
		last = at
	}
	// At most five at 50 ms, then backing off: 100, 200, 400, 800 ms.
	if tail := gaps[6] + gaps[7] + gaps[8]; tail < every*6/10 {
		t.Fatalf("gaps between probes once nothing is claimed %v: not backing off towards PollInterval (%v)", gaps, every)
	}
}
