// SPDX-License-Identifier: Apache-2.0

package conformance

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
)

var settleTests = []conformanceTest{
	{"SettleSameOutcomeOnEveryPath", testSettleSameOutcome},
}

// settlePath delivers the message of topic (partition key: "" for an
// ungrouped one) until it is settled, failing each attempt with fail's
// result, and returns the attempts it saw.
type settlePath func(t *testing.T, c *shardq.Client, topic, key string, fail func(attempt int) error) []int

// The same failures end the same way on every consumer path (one
// settle.Settler applies every verdict): with MaxAttempts 3, a message
// that fails every attempt is delivered as attempts 1, 2, 3 and then
// dead-lettered once, carrying dlq_attempts=3 and the reason; one whose
// first attempt asks for the dead-letter topic goes there at once
// (dlq_attempts=1). Either way its source is settled: the group's cursor
// passes it and it is not delivered again. Receipts have no explicit
// dead-letter: their dead-letter case is not run.
func testSettleSameOutcome(t *testing.T, open Open) {
	d, c := setup(t, open, nil)
	paths := []struct {
		name       string
		key        string
		deadLetter bool // the path can ask for a dead letter at once
		run        settlePath
	}{
		{"subscriber-grouped", "k", true, settleBySubscriber(shardq.TakeGrouped)},
		{"subscriber-ungrouped", "", true, settleBySubscriber(shardq.TakeUngrouped)},
		{"subscriber-batch", "k", true, settleByBatch},
		{"receiver", "k", true, settleByReceiver},
		{"receipts-grouped", "k", false, settleByReceipts},
		{"receipts-ungrouped", "", false, settleByReceipts},
	}
	boom := errors.New("boom: cannot parse")
	for i, p := range paths {
		for _, dl := range []bool{false, true} {
			if dl && !p.deadLetter {
				continue
			}
			name, want := p.name+"/fails", []int{1, 2, 3}
			fail := func(int) error { return boom }
			if dl {
				name, want = p.name+"/dead-letter", []int{1}
				fail = func(int) error { return errDeadLetterNow }
			}
			t.Run(name, func(t *testing.T) {
				topic := fmt.Sprintf("settle%d-%t", i, dl)
				res := mustPublish(t, c, shardq.Message{Tenant: "t", Topic: topic, PartitionKey: p.key, ID: "poison",
					Payload: []byte("payload"), Headers: map[string]string{"trace": "abc"}})
				got := p.run(t, c, topic, p.key, fail)
				if !slices.Equal(got, want) {
					t.Fatalf("attempts %v, want %v", got, want)
				}
				checkDeadLettered(t, d, topic, p.key, res[0].Offset, len(want), boom.Error())
			})
		}
	}
}

// errDeadLetterNow stands for the path's own dead-letter request: each
// path turns it into shardq.DeadLetter or GroupReceiver.DeadLetter.
var errDeadLetterNow = errors.New("boom: cannot parse")

// settleMaxAttempts is every path's MaxAttempts.
const settleMaxAttempts = 3

// checkDeadLettered checks that the message at offset of topic is in the
// dead-letter topic once, whole, with attempts and reason, and that the
// group "g" is past it.
func checkDeadLettered(t *testing.T, d driver.Driver, topic, key string, offset int64, attempts int, reason string) {
	t.Helper()
	ctx := context.Background()
	dlq := fetchAll(t, d, "t", topic+".dlq", key)
	if len(dlq) != 1 {
		t.Fatalf("dead-letter topic holds %d messages, want 1: %+v", len(dlq), dlq)
	}
	m := dlq[0]
	h := m.Headers
	if m.ID != "poison" || string(m.Payload) != "payload" || h["trace"] != "abc" || h[shardq.HeaderDLQOriginalTopic] != topic ||
		h[shardq.HeaderDLQOriginalOffset] != fmt.Sprint(offset) || h[shardq.HeaderDLQAttempts] != fmt.Sprint(attempts) ||
		h[shardq.HeaderDLQLastError] != reason {
		t.Fatalf("dead letter %s %q headers %v; want poison, its payload and headers, %d attempts, reason %q", m.ID, m.Payload, h, attempts, reason)
	}
	var cursor int64
	if key == "" {
		var err error
		if cursor, err = d.AdvanceUngrouped(ctx, driver.GroupRef{Tenant: "t", Topic: topic, ConsumerGroup: "g"}, time.Now()); err != nil {
			t.Fatal(err)
		}
	} else {
		cursors, err := d.TopicCursors(ctx, "t", topic)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cursors {
			if c.ConsumerGroup == "g" && c.PartitionKey == key {
				cursor = c.Committed
			}
		}
	}
	if cursor < offset {
		t.Fatalf("group cursor %d, want past the dead letter at %d", cursor, offset)
	}
}

func settleBySubscriber(take shardq.Take) settlePath {
	return func(t *testing.T, c *shardq.Client, topic, key string, fail func(int) error) []int {
		var mu sync.Mutex
		var attempts []int
		cfg := fastConfig("g", topic, []string{"t"}, func(_ context.Context, dl *shardq.Delivery) error {
			mu.Lock()
			defer mu.Unlock()
			attempts = append(attempts, dl.Attempt)
			err := fail(dl.Attempt)
			if err == errDeadLetterNow {
				return shardq.DeadLetter(errors.New(err.Error()))
			}
			return err
		})
		cfg.Take, cfg.MaxAttempts = take, settleMaxAttempts
		s, err := c.Subscribe(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer stopAll(t, s)
		dlqLen := func() int {
			ms, err := c.Admin().DeadLetters(context.Background(), shardq.DeadLetterRequest{Scope: shardq.Scope{Tenants: []string{"t"}}, Topic: topic, Suffix: ""})
			if err != nil {
				t.Fatal(err)
			}
			return len(ms)
		}
		waitFor(t, "the dead letter", 30*time.Second, func() bool { return dlqLen() > 0 })
		time.Sleep(100 * time.Millisecond) // ten polls: a redelivery would show
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(attempts)
	}
}

// settleByBatch is settleBySubscriber with a batch handler, whose failure
// settles every message of its batch (here one).
func settleByBatch(t *testing.T, c *shardq.Client, topic, key string, fail func(int) error) []int {
	var mu sync.Mutex
	var attempts []int
	cfg := fastConfig("g", topic, []string{"t"}, nil)
	cfg.Handler, cfg.MaxAttempts = nil, settleMaxAttempts
	cfg.BatchHandler = func(_ context.Context, ds []*shardq.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		attempts = append(attempts, ds[0].Attempt)
		err := fail(ds[0].Attempt)
		if err == errDeadLetterNow {
			return shardq.DeadLetter(errors.New(err.Error()))
		}
		return err
	}
	s, err := c.Subscribe(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer stopAll(t, s)
	waitFor(t, "the dead letter", 30*time.Second, func() bool {
		ms, err := c.Admin().DeadLetters(context.Background(), shardq.DeadLetterRequest{Scope: shardq.Scope{Tenants: []string{"t"}}, Topic: topic})
		return err == nil && len(ms) > 0
	})
	time.Sleep(100 * time.Millisecond) // ten polls: a redelivery would show
	mu.Lock()
	defer mu.Unlock()
	return slices.Clone(attempts)
}

func settleByReceiver(t *testing.T, c *shardq.Client, topic, key string, fail func(int) error) []int {
	ctx := context.Background()
	o := receiverOpts("r")
	o.MaxAttempts = settleMaxAttempts
	r, err := c.AcceptGroup(ctx, shardq.GroupRef{Tenant: "t", Topic: topic, ConsumerGroup: "g"}, key, o)
	if err != nil {
		t.Fatal(err)
	}
	defer closeReceiver(t, r)
	var attempts []int
	for {
		rctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		dl, err := r.Receive(rctx)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			return attempts // settled: nothing more comes
		}
		if err != nil {
			t.Fatal(err)
		}
		attempts = append(attempts, dl.Attempt)
		if cause := fail(dl.Attempt); cause == errDeadLetterNow {
			err = r.DeadLetter(ctx, dl, errors.New(cause.Error()))
		} else {
			err = r.Nack(ctx, dl, cause)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

func settleByReceipts(t *testing.T, c *shardq.Client, topic, key string, fail func(int) error) []int {
	ctx := context.Background()
	r := receipts(t, c, nil, settleMaxAttempts)
	rq := shardq.ReceiveRequest{Tenant: "t", Topic: topic, ConsumerGroup: "g", PartitionKey: key, Ungrouped: key == ""}
	var attempts []int
	for {
		res, err := r.Receive(ctx, rq)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Messages) == 0 {
			return attempts // settled: nothing more comes
		}
		m := res.Messages[0]
		attempts = append(attempts, m.Attempt)
		if err := r.Nack(ctx, shardq.GroupRef{Tenant: "t", Topic: topic, ConsumerGroup: "g"}, m.Receipt, shardq.NackOptions{RetryAfter: 0, Reason: fail(m.Attempt).Error()}); err != nil {
			t.Fatal(err)
		}
	}
}
