// SPDX-License-Identifier: Apache-2.0

package coalesce

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// recorder is a flush that records each call and can be held shut.
type recorder struct {
	mu      sync.Mutex
	calls   [][]int
	subs    []int         // submissions each flush carried
	gate    chan struct{} // each flush waits for one receive when non-nil
	started chan struct{}
	fail    func(items []int) error
}

func (r *recorder) flush(ctx context.Context, items []int, submissions int) error {
	if r.started != nil {
		r.started <- struct{}{}
	}
	if r.gate != nil {
		<-r.gate
	}
	r.mu.Lock()
	r.calls = append(r.calls, slices.Clone(items))
	r.subs = append(r.subs, submissions)
	r.mu.Unlock()
	if r.fail != nil {
		return r.fail(items)
	}
	return nil
}

// waitPending waits until key's queue holds n submissions, the last of
// which starts with first.
func waitPending(b *Batcher[string, int], n, first int) {
	for {
		b.mu.Lock()
		q := b.queues["t"]
		ok := q != nil && len(q.pending) == n && q.pending[n-1].items[0] == first
		b.mu.Unlock()
		if ok {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

func TestQueuedSubmissionsShareOneFlush(t *testing.T) {
	rec := &recorder{gate: make(chan struct{}), started: make(chan struct{}, 100)}
	b := New[string, int](rec.flush, 100, 1, 0, time.Minute)
	var wg sync.WaitGroup
	submit := func(v int) {
		defer wg.Done()
		if err := b.Submit(context.Background(), "t", []int{v}); err != nil {
			t.Error(err)
		}
	}
	wg.Add(1)
	go submit(0)
	<-rec.started // the first flush is running alone and holds the only slot
	for i := 1; i <= 10; i++ {
		wg.Add(1)
		go submit(i)
	}
	// Wait until all ten are queued behind the running flush.
	for {
		b.mu.Lock()
		n := len(b.queues["t"].pending)
		b.mu.Unlock()
		if n == 10 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	close(rec.gate)
	wg.Wait()
	b.Close()
	if len(rec.calls) != 2 || len(rec.calls[0]) != 1 || len(rec.calls[1]) != 10 {
		t.Fatalf("flushes = %v, want one of 1 item then one of 10", rec.calls)
	}
	if !slices.Equal(rec.subs, []int{1, 10}) {
		t.Fatalf("flushes carried %v submissions, want 1 then 10", rec.subs)
	}
}

func TestMaxItemsSplitsButNeverCutsASubmission(t *testing.T) {
	rec := &recorder{gate: make(chan struct{}), started: make(chan struct{}, 100)}
	b := New[string, int](rec.flush, 5, 1, 0, time.Minute)
	var wg sync.WaitGroup
	submit := func(items []int) {
		defer wg.Done()
		if err := b.Submit(context.Background(), "t", items); err != nil {
			t.Error(err)
		}
	}
	wg.Add(1)
	go submit([]int{0})
	<-rec.started
	for i, items := range [][]int{{1, 2, 3}, {4, 5, 6}, {7, 8, 9, 10, 11, 12, 13}} {
		wg.Add(1)
		go submit(items)
		waitPending(b, i+1, items[0]) // keep the queue order deterministic
	}
	close(rec.gate)
	wg.Wait()
	b.Close()
	want := [][]int{{0}, {1, 2, 3}, {4, 5, 6}, {7, 8, 9, 10, 11, 12, 13}}
	if len(rec.calls) != len(want) {
		t.Fatalf("flushes = %v, want %v", rec.calls, want)
	}
	for i := range want {
		if !slices.Equal(rec.calls[i], want[i]) {
			t.Fatalf("flushes = %v, want %v", rec.calls, want)
		}
	}
}

func TestFailedSharedFlushIsolatesEachSubmission(t *testing.T) {
	bad := errors.New("bad item")
	rec := &recorder{gate: make(chan struct{}), started: make(chan struct{}, 100)}
	rec.fail = func(items []int) error {
		if slices.Contains(items, 13) {
			return bad
		}
		return nil
	}
	b := New[string, int](rec.flush, 100, 1, 0, time.Minute)
	errs := make(chan error, 3)
	var wg sync.WaitGroup
	for i, items := range [][]int{{1}, {13}, {2}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- b.Submit(context.Background(), "t", items)
		}()
		if i == 0 {
			<-rec.started
		} else {
			waitPending(b, i, items[0])
		}
	}
	waitPending(b, 2, 2)
	close(rec.gate)
	wg.Wait()
	b.Close()
	close(errs)
	var failed int
	for err := range errs {
		if errors.Is(err, bad) {
			failed++
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if failed != 1 {
		t.Fatalf("%d submissions failed, want only the bad one", failed)
	}
}

func TestCloseDrainsAndRefuses(t *testing.T) {
	rec := &recorder{}
	b := New[string, int](rec.flush, 10, 2, 0, time.Minute)
	if err := b.Submit(context.Background(), "t", []int{1}); err != nil {
		t.Fatal(err)
	}
	b.Close()
	if err := b.Submit(context.Background(), "t", []int{2}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Submit after Close = %v, want ErrClosed", err)
	}
	if len(rec.calls) != 1 {
		t.Fatalf("calls = %v", rec.calls)
	}
}

func TestSubmitReturnsOnContextEnd(t *testing.T) {
	rec := &recorder{gate: make(chan struct{})}
	b := New[string, int](rec.flush, 10, 1, 0, time.Minute)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := b.Submit(ctx, "t", []int{1}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Submit = %v, want context.Canceled", err)
	}
	close(rec.gate) // the flush still completes; Close waits for it
	b.Close()
	if len(rec.calls) != 1 {
		t.Fatalf("calls = %v", rec.calls)
	}
}

func TestLingerGathersConcurrentSubmissions(t *testing.T) {
	rec := &recorder{}
	// A long linger: the ten submissions below start within microseconds
	// of each other, far inside it.
	b := New[string, int](rec.flush, 100, 1, time.Second, time.Minute)
	var wg sync.WaitGroup
	for i := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := b.Submit(context.Background(), "t", []int{i}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	b.Close()
	if len(rec.calls) != 1 || len(rec.calls[0]) != 10 {
		t.Fatalf("flushes %v, want one flush of all 10", rec.calls)
	}
}

// Close ends a linger: what waits for more is flushed at once, so that a
// stop is not held up by a linger (an hour here).
func TestCloseEndsALinger(t *testing.T) {
	rec := &recorder{}
	b := New[string, int](rec.flush, 100, 1, time.Hour, time.Minute)
	flushed := make(chan error, 1)
	if err := b.Enqueue("t", []int{1}, func(err error) { flushed <- err }); err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{})
	go func() { b.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(time.Minute):
		t.Fatal("Close waited for the linger")
	}
	if err := <-flushed; err != nil {
		t.Fatal(err)
	}
	if len(rec.calls) != 1 {
		t.Fatalf("flushes %v, want one", rec.calls)
	}
}
