// SPDX-License-Identifier: Apache-2.0

package conformance

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
)

var producerTests = []conformanceTest{
	{"ProducerKeepsKeyOrder", testProducerKeepsKeyOrder},
	{"ProducerStopWritesWhatWasHandedIn", testProducerStopWritesWhatWasHandedIn},
	{"ProducerResumeFailsWhatWaited", testProducerResumeFailsWhatWaited},
}

// insertFails is the real database with the inserts of any batch that
// holds the message id fail failing, while fail is set.
type insertFails struct {
	driver.Driver
	fail *atomic.Pointer[string]
}

var errInjectedInsert = errors.New("injected: the insert failed")

func (d insertFails) InsertMessages(ctx context.Context, tx driver.DBTX, msgs []*driver.InsertMessage) error {
	if id := d.fail.Load(); id != nil {
		for _, m := range msgs {
			if m.ID == *id {
				return errInjectedInsert
			}
		}
	}
	return d.Driver.InsertMessages(ctx, tx, msgs)
}

// An asynchronous producer stores the messages of each key in the order
// they were handed in, across batches and lanes. A write that fails
// fails its messages, and every later message of their keys fails
// (ErrKeyPaused) without being stored: what is stored of a key is the
// messages handed in before its first failure, in order, and nothing
// after it until Resume; after Resume the key goes on after what it
// stored.
func testProducerKeepsKeyOrder(t *testing.T, open Open) {
	d, _ := setup(t, open, nil)
	var fail atomic.Pointer[string]
	c, err := shardq.NewClient(insertFails{d, &fail}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	p, err := c.Producer(&shardq.ProducerOptions{MaxBatch: 7, Lanes: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop(ctx)
	failing := "k1-12"
	fail.Store(&failing)
	const keys, per = 3, 30
	type sent struct {
		id string
		f  *shardq.PublishFuture
	}
	byKey := map[string][]sent{}
	for i := range per {
		for k := range keys {
			key, id := fmt.Sprintf("k%d", k), fmt.Sprintf("k%d-%d", k, i)
			byKey[key] = append(byKey[key], sent{id, p.Publish(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: key, ID: id})})
		}
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	paused := map[string]bool{}
	for key, ss := range byKey {
		var stored []string
		failedAt := -1
		for i, s := range ss {
			res, err := s.f.Wait(ctx)
			switch {
			case err == nil && failedAt >= 0:
				t.Fatalf("%s stored after %s failed", s.id, ss[failedAt].id)
			case err == nil:
				if res.ID != s.id || res.Offset <= 0 {
					t.Fatalf("%s: result %+v", s.id, res)
				}
				stored = append(stored, s.id)
			case failedAt < 0:
				if !errors.Is(err, errInjectedInsert) {
					t.Fatalf("%s: first failure of %s is %v, want the injected one", s.id, key, err)
				}
				failedAt = i
			case !errors.Is(err, shardq.ErrKeyPaused) && !errors.Is(err, errInjectedInsert):
				t.Fatalf("%s after %s failed: %v, want ErrKeyPaused or the batch's failure", s.id, ss[failedAt].id, err)
			}
		}
		if key == "k1" && (failedAt < 0 || failedAt > 12) {
			t.Fatalf("k1 failed first at %d, want by its 12th message, whose batch failed", failedAt)
		}
		var got []string
		for _, m := range fetchAll(t, d, "t", "x", key) {
			got = append(got, m.ID)
		}
		if !slices.Equal(got, stored) {
			t.Fatalf("%s stored %v, want %v (its successes, in the order handed in)", key, got, stored)
		}
		paused[key] = failedAt >= 0
	}
	// A paused key takes nothing until resumed; then it goes on after
	// what it stored.
	fail.Store(nil)
	if _, err := p.Publish(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k1", ID: "k1-still"}).Wait(ctx); !errors.Is(err, shardq.ErrKeyPaused) {
		t.Fatalf("a paused key's next message: %v, want ErrKeyPaused", err)
	}
	for key, was := range paused {
		if was {
			p.Resume(shardq.TopicRef{Tenant: "t", Topic: "x"}, key)
		}
		res, err := p.Publish(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: key, ID: key + "-resumed"}).Wait(ctx)
		if err != nil {
			t.Fatalf("%s after Resume: %v", key, err)
		}
		all := fetchAll(t, d, "t", "x", key)
		if last := all[len(all)-1]; last.ID != key+"-resumed" || last.Offset != res.Offset {
			t.Fatalf("%s: last stored %s at %d, want %s-resumed at %d", key, last.ID, last.Offset, key, res.Offset)
		}
	}
}

// insertHeld is the real database with each insert held until release
// takes one from it.
type insertHeld struct {
	driver.Driver
	release chan struct{}
}

func (d insertHeld) InsertMessages(ctx context.Context, tx driver.DBTX, msgs []*driver.InsertMessage) error {
	select {
	case <-d.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	return d.Driver.InsertMessages(ctx, tx, msgs)
}

// Stop writes every message handed in before it, then refuses more; a
// full buffer with FailFast refuses at once, and without it waits for
// room.
func testProducerStopWritesWhatWasHandedIn(t *testing.T, open Open) {
	d, c := setup(t, open, nil)
	ctx := context.Background()
	p, err := c.Producer(&shardq.ProducerOptions{MaxBuffered: 10, Linger: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var fs []*shardq.PublishFuture
	for i := range 100 {
		fs = append(fs, p.Publish(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: fmt.Sprintf("k%d", i%4), ID: fmt.Sprint(i)}))
	}
	if err := p.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	for i, f := range fs {
		select {
		case <-f.Done():
		default:
			t.Fatalf("message %d not settled when Stop returned", i)
		}
		if _, err := f.Wait(ctx); err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	n := 0
	for k := range 4 {
		n += len(fetchAll(t, d, "t", "x", fmt.Sprintf("k%d", k)))
	}
	if n != 100 {
		t.Fatalf("%d of 100 messages stored", n)
	}
	if _, err := p.Publish(ctx, shardq.Message{Tenant: "t", Topic: "x"}).Wait(ctx); !errors.Is(err, shardq.ErrClosed) {
		t.Fatalf("publish after Stop: %v, want ErrClosed", err)
	}
	// A buffer of one, full while its write is held: FailFast refuses at
	// once; without it a publish waits for room, up to its ctx.
	release := make(chan struct{})
	gated, err := shardq.NewClient(insertHeld{d, release}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer gated.Close()
	for _, failFast := range []bool{true, false} {
		full, err := gated.Producer(&shardq.ProducerOptions{MaxBuffered: 1, FailFast: failFast})
		if err != nil {
			t.Fatal(err)
		}
		first := full.Publish(ctx, shardq.Message{Tenant: "t", Topic: "y", PartitionKey: "k", ID: fmt.Sprint("first-", failFast)})
		short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		_, err = full.Publish(short, shardq.Message{Tenant: "t", Topic: "y", PartitionKey: "k", ID: "second"}).Wait(ctx)
		cancel()
		if failFast && !errors.Is(err, shardq.ErrProducerFull) || !failFast && !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("FailFast %t: a message into a full buffer of one: %v", failFast, err)
		}
		release <- struct{}{} // the first message's write goes on
		if _, err := first.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		if err := full.Stop(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// scriptedInserts is the real database with the batches that hold the
// message id fail failing, and those that hold hold waiting for release.
type scriptedInserts struct {
	driver.Driver
	fail, hold string
	release    chan struct{}
}

func (d scriptedInserts) InsertMessages(ctx context.Context, tx driver.DBTX, msgs []*driver.InsertMessage) error {
	for _, m := range msgs {
		switch m.ID {
		case d.fail:
			return errInjectedInsert
		case d.hold:
			select {
			case <-d.release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	return d.Driver.InsertMessages(ctx, tx, msgs)
}

// A message of a key that waited in its lane behind the key's failure
// fails when the key is resumed, even if its turn comes after: stored
// then, it would come after what the caller publishes again once it
// resumed. A failure at hand-in (here a full buffer) pauses its key too.
func testProducerResumeFailsWhatWaited(t *testing.T, open Open) {
	d, _ := setup(t, open, nil)
	release := make(chan struct{})
	c, err := shardq.NewClient(scriptedInserts{Driver: d, fail: "a", hold: "x", release: release}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	p, err := c.Producer(&shardq.ProducerOptions{MaxBatch: 1, Lanes: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop(ctx)
	msg := func(key, id string) shardq.Message {
		return shardq.Message{Tenant: "t", Topic: "x", PartitionKey: key, ID: id}
	}
	a := p.Publish(ctx, msg("k", "a")) // fails
	x := p.Publish(ctx, msg("j", "x")) // held: the lane waits behind it
	b := p.Publish(ctx, msg("k", "b")) // waits behind x
	if _, err := a.Wait(ctx); !errors.Is(err, errInjectedInsert) {
		t.Fatalf("a: %v, want the injected failure", err)
	}
	p.Resume(shardq.TopicRef{Tenant: "t", Topic: "x"}, "k")
	again := p.Publish(ctx, msg("k", "a-again"))
	close(release)
	if _, err := x.Wait(ctx); err != nil {
		t.Fatalf("x: %v", err)
	}
	if _, err := b.Wait(ctx); !errors.Is(err, shardq.ErrKeyPaused) {
		t.Fatalf("b, handed in before a failed and resumed while it waited: %v, want ErrKeyPaused", err)
	}
	if _, err := again.Wait(ctx); err != nil {
		t.Fatalf("a-again after Resume: %v", err)
	}
	var got []string
	for _, m := range fetchAll(t, d, "t", "x", "k") {
		got = append(got, m.ID)
	}
	if !slices.Equal(got, []string{"a-again"}) {
		t.Fatalf("key k stored %v, want [a-again]", got)
	}
	// A full buffer (FailFast) fails a message at hand-in, and pauses its
	// key as a failed write does.
	full, err := c.Producer(&shardq.ProducerOptions{MaxBuffered: 1, FailFast: true})
	if err != nil {
		t.Fatal(err)
	}
	defer full.Stop(ctx)
	held := make(chan struct{})
	gated, err := shardq.NewClient(insertHeld{d, held}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer gated.Close()
	fp, err := gated.Producer(&shardq.ProducerOptions{MaxBuffered: 1, FailFast: true})
	if err != nil {
		t.Fatal(err)
	}
	first := fp.Publish(ctx, msg("m", "first"))
	if _, err := fp.Publish(ctx, msg("n", "refused")).Wait(ctx); !errors.Is(err, shardq.ErrProducerFull) {
		t.Fatalf("into a full buffer: %v, want ErrProducerFull", err)
	}
	held <- struct{}{}
	if _, err := first.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := fp.Publish(ctx, msg("n", "after")).Wait(ctx); !errors.Is(err, shardq.ErrKeyPaused) || !errors.Is(err, shardq.ErrProducerFull) {
		t.Fatalf("the key of a message refused at hand-in: %v, want ErrKeyPaused (ErrProducerFull)", err)
	}
	if err := fp.Stop(ctx); err != nil {
		t.Fatal(err)
	}
}
