// SPDX-License-Identifier: Apache-2.0

package publish

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/telemetry"
	"github.com/shardq/shardq/internal/testdb"
	"github.com/shardq/shardq/internal/wakeup"
)

// heldHalfCommits is the real database with its first CommitHalves held
// until release, and every batch's size recorded.
type heldHalfCommits struct {
	driver.Driver
	entered, release chan struct{}
	once             sync.Once
	mu               sync.Mutex
	sizes            []int
}

func (d *heldHalfCommits) CommitHalves(ctx context.Context, hs []*driver.HalfCommit) error {
	d.mu.Lock()
	d.sizes = append(d.sizes, len(hs))
	d.mu.Unlock()
	d.once.Do(func() {
		close(d.entered)
		<-d.release
	})
	return d.Driver.CommitHalves(ctx, hs)
}

// Commits that arrive while one runs share the next transaction, in the
// order they arrived: sixteen senders are two transactions on the head
// row, not sixteen queued for its lock.
func TestHalfCommitsShareTransactions(t *testing.T) {
	d := testdb.Migrated(t, testdb.SQLite(t))
	held := &heldHalfCommits{Driver: d, entered: make(chan struct{}), release: make(chan struct{})}
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
	if fmt.Sprint(held.sizes) != "[1 15]" {
		t.Fatalf("transactions of %v half messages; want [1 15]", held.sizes)
	}
}
