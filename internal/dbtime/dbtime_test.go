// SPDX-License-Identifier: Apache-2.0

package dbtime

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fake is a local clock and a database clock an hour apart, with a read
// that takes rtt of the local clock.
type fake struct {
	mu    sync.Mutex
	local time.Time
	skew  time.Duration // database minus local
	rtt   time.Duration
	err   error
	reads int
}

func (f *fake) now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.local
}

func (f *fake) advance(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.local = f.local.Add(d)
}

func (f *fake) read(context.Context) (time.Time, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reads++
	if f.err != nil {
		return time.Time{}, f.err
	}
	f.local = f.local.Add(f.rtt / 2)
	db := f.local.Add(f.skew)
	f.local = f.local.Add(f.rtt / 2)
	return db, nil
}

func newFake() *fake {
	return &fake{local: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), skew: time.Hour, rtt: 2 * time.Millisecond}
}

func TestNowKeepsToTheDatabase(t *testing.T) {
	f := newFake()
	c := New(f.now, f.read, time.Hour, slog.Default())
	if got := c.Now(); !got.Equal(f.now()) {
		t.Fatalf("before the first read Now = %v, want the local clock %v", got, f.now())
	}
	if err := c.Ensure(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer c.Stop(context.Background())
	if got, want := c.Now(), f.now().Add(time.Hour); !got.Equal(want) {
		t.Fatalf("after a read Now = %v, want the database's %v", got, want)
	}
	f.advance(3 * time.Second)
	if got, want := c.Now(), f.now().Add(time.Hour); !got.Equal(want) {
		t.Fatalf("3 s later Now = %v, want %v", got, want)
	}
	if got := c.Offset(); got != time.Hour {
		t.Fatalf("Offset = %v, want 1h", got)
	}
	if err := c.Ensure(context.Background()); err != nil || f.reads != 1 {
		t.Fatalf("a second Ensure read again (%d reads, %v)", f.reads, err)
	}
}

// A read slower than the anchor's is less exact: it is dropped, unless
// the anchor has aged ten reads.
func TestSlowReadsAreDropped(t *testing.T) {
	f := newFake()
	c := New(f.now, f.read, time.Hour, slog.Default())
	if err := c.sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	f.rtt, f.skew = 100*time.Millisecond, time.Hour+40*time.Millisecond // a slow read, off by its half
	f.mu.Unlock()
	for i := range 10 {
		if err := c.sync(context.Background()); err != nil {
			t.Fatal(err)
		}
		if got := c.Offset(); got != time.Hour {
			t.Fatalf("slow read %d replaced the anchor: offset %v", i+1, got)
		}
	}
	if err := c.sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := c.Offset(); got == time.Hour {
		t.Fatal("an anchor ten reads old was kept")
	}
}

// A failed first read fails Ensure, starts nothing, and the next Ensure
// reads again; a failed later read keeps the last reading.
func TestReadFailures(t *testing.T) {
	f := newFake()
	f.err = errors.New("down")
	c := New(f.now, f.read, time.Millisecond, slog.Default())
	if err := c.Ensure(context.Background()); !errors.Is(err, f.err) {
		t.Fatalf("Ensure = %v, want the read's error", err)
	}
	if c.life != nil {
		t.Fatal("a failed Ensure started the reads")
	}
	f.mu.Lock()
	f.err = nil
	f.mu.Unlock()
	if err := c.Ensure(context.Background()); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	f.err = errors.New("down again")
	reads := f.reads
	f.mu.Unlock()
	for { // the loop reads every millisecond
		f.mu.Lock()
		n := f.reads
		f.mu.Unlock()
		if n > reads+2 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if got := c.Offset(); got != time.Hour {
		t.Fatalf("failed reads moved the clock: offset %v", got)
	}
	if err := c.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// Stop does not wait for a first read that a caller is making (a hung
// database must not hold Close), and the read that returns after Stop
// starts nothing.
func TestStopDuringFirstRead(t *testing.T) {
	f := newFake()
	reading, release := make(chan struct{}), make(chan struct{})
	read := func(ctx context.Context) (time.Time, error) {
		close(reading)
		<-release
		return f.read(ctx)
	}
	c := New(f.now, read, time.Millisecond, slog.Default())
	done := make(chan error, 1)
	go func() { done <- c.Ensure(context.Background()) }()
	<-reading
	if err := c.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if c.life != nil {
		t.Fatal("a read that returned after Stop started the reads")
	}
}
