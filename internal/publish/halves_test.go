// SPDX-License-Identifier: Apache-2.0

package publish

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/telemetry"
	"github.com/shardq/shardq/internal/testdb"
	"github.com/shardq/shardq/internal/wakeup"
)

// heldHalfCommits is the real database with its first CommitHalves held
// until release, and every batch's size recorded. With loseAck, a batch
// of more than one commits and then reports an error, as a commit whose
// acknowledgement was lost does.
type heldHalfCommits struct {
	driver.Driver
	entered, release chan struct{}
	loseAck          bool
	once             sync.Once
	mu               sync.Mutex
	sizes            []int
}

var errAckLost = errors.New("injected: the commit's acknowledgement was lost")

func (d *heldHalfCommits) CommitHalves(ctx context.Context, hs []*driver.HalfCommit) error {
	d.mu.Lock()
	d.sizes = append(d.sizes, len(hs))
	d.mu.Unlock()
	d.once.Do(func() {
		close(d.entered)
		<-d.release
	})
	err := d.Driver.CommitHalves(ctx, hs)
	if err == nil && d.loseAck && len(hs) > 1 {
		for _, hc := range hs {
			hc.Message = nil
		}
		return errAckLost
	}
	return err
}

// Commits that arrive while one runs share the next transaction, in the
// order they arrived: sixteen senders are two transactions on the head
// row, not sixteen queued for its lock. When the shared one committed but
// reported an error, each commit run alone again finds its half message
// resolved and its message stored: the senders get their messages, not
// ErrHalfResolved.
func TestHalfCommitsShareTransactions(t *testing.T) {
	for _, loseAck := range []bool{false, true} {
		t.Run(fmt.Sprintf("loseAck=%v", loseAck), func(t *testing.T) { testHalfCommitsShare(t, loseAck) })
	}
}

func testHalfCommitsShare(t *testing.T, loseAck bool) {
	d := testdb.Migrated(t, testdb.SQLite(t))
	held := &heldHalfCommits{Driver: d, entered: make(chan struct{}), release: make(chan struct{}), loseAck: loseAck}
	p, err := New(held, telemetry.New(nil, nil), &wakeup.Registry{}, Config{MaxPayloadBytes: 1 << 20, MaxDelay: time.Hour,
		MaxBatch: 100, MaxInflight: 1, Timeout: time.Minute, Tenants: []string{"t"}, Clock: time.Now})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	const senders = 16
	refs := make([]driver.MessageRef, senders)
	for i := range refs {
		h := &driver.HalfMessage{InsertMessage: driver.InsertMessage{Tenant: "t", Topic: "x", PartitionKey: "hot", ID: fmt.Sprintf("h%02d", i),
			Headers: map[string]string{}, CreatedAt: time.Now()}, ProducerGroup: "pg", NextCheckAt: time.Now().Add(time.Hour)}
		if err := d.InsertHalf(ctx, h); err != nil {
			t.Fatal(err)
		}
		refs[i] = h.Ref()
	}
	offsets := make([]int64, senders)
	errs := make([]error, senders)
	var wg sync.WaitGroup
	commit := func(i int) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m, err := p.CommitHalf(ctx, refs[i])
			if errs[i] = err; err == nil {
				offsets[i] = m.Offset
			}
		}()
	}
	commit(0)
	<-held.entered
	for i := 1; i < senders; i++ {
		commit(i)
		for n := 0; p.halves.Queued("t") != i; n++ { // bounded: each is queued at once
			if n == 10_000 {
				t.Fatalf("commit %d never queued", i)
			}
			time.Sleep(time.Millisecond)
		}
	}
	close(held.release)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("commit %d: %v", i, err)
		}
	}
	if !slices.IsSorted(offsets) || offsets[0] == offsets[senders-1] {
		t.Fatalf("offsets %v: want them in the order the commits arrived", offsets)
	}
	want := "[1 15]"
	if loseAck {
		want = "[1 15" + strings.Repeat(" 1", 15) + "]" // the shared one, then each alone
	}
	if fmt.Sprint(held.sizes) != want {
		t.Fatalf("transactions of %v half messages; want %s", held.sizes, want)
	}
}

// A sender whose half message another resolver committed (a check-back,
// an operator) gets the stored message; one whose half message was
// rolled back gets ErrHalfResolved.
func TestCommitHalfOfAResolvedHalf(t *testing.T) {
	d := testdb.Migrated(t, testdb.SQLite(t))
	p, err := New(d, telemetry.New(nil, nil), &wakeup.Registry{}, Config{MaxPayloadBytes: 1 << 20, MaxDelay: time.Hour,
		MaxBatch: 100, MaxInflight: 1, Timeout: time.Minute, Tenants: []string{"t"}, Clock: time.Now})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	half := func(id string) driver.MessageRef {
		h := &driver.HalfMessage{InsertMessage: driver.InsertMessage{Tenant: "t", Topic: "x", PartitionKey: "k", ID: id,
			Headers: map[string]string{}, CreatedAt: time.Now()}, ProducerGroup: "pg", NextCheckAt: time.Now().Add(time.Hour)}
		if err := d.InsertHalf(ctx, h); err != nil {
			t.Fatal(err)
		}
		return h.Ref()
	}
	committed, rolledBack := half("c"), half("r")
	by := &driver.HalfCommit{Ref: committed}
	if err := d.CommitHalves(ctx, []*driver.HalfCommit{by}); err != nil {
		t.Fatal(err)
	}
	if err := d.RollbackHalf(ctx, rolledBack, 0); err != nil {
		t.Fatal(err)
	}
	if m, err := p.CommitHalf(ctx, committed); err != nil || m.Offset != by.Message.Offset {
		t.Fatalf("commit of a half message committed by another: %+v, %v; want offset %d", m, err, by.Message.Offset)
	}
	if m, err := p.CommitHalf(ctx, rolledBack); !errors.Is(err, driver.ErrHalfResolved) {
		t.Fatalf("commit of a half message rolled back: %+v, %v; want ErrHalfResolved", m, err)
	}
}
