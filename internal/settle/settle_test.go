// SPDX-License-Identifier: Apache-2.0

package settle

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/large"
)

// The one settle policy, as partition workers, ungrouped claims and
// receivers apply it.
func TestDecide(t *testing.T) {
	p := Policy{MaxAttempts: 3, BackoffMin: time.Second, BackoffMax: time.Minute}
	boom := errors.New("boom")
	for _, tc := range []struct {
		name    string
		err     error
		attempt int
		want    Verdict
	}{
		{"nil acks", nil, 1, Verdict{Ack: true}},
		{"dead-letter at once, with the handler's reason", &DeadLetterError{boom}, 1, Verdict{DeadLetter: true, Cause: boom}},
		{"the last attempt dead-letters", boom, 3, Verdict{DeadLetter: true, Cause: boom}},
		{"RetryAfter chooses the delay", &RetryAfterError{7 * time.Second, boom}, 1, Verdict{Delay: 7 * time.Second}},
		{"RetryAfter on the last attempt still dead-letters", &RetryAfterError{7 * time.Second, boom}, 3, Verdict{DeadLetter: true}},
	} {
		got := p.Decide(tc.err, tc.attempt)
		if got.Ack != tc.want.Ack || got.DeadLetter != tc.want.DeadLetter || got.Delay != tc.want.Delay ||
			(tc.want.Cause != nil && !errors.Is(got.Cause, tc.want.Cause)) {
			t.Errorf("%s: Decide(%v, %d) = %+v, want %+v", tc.name, tc.err, tc.attempt, got, tc.want)
		}
	}
	for attempt := 1; attempt < 3; attempt++ {
		v := p.Decide(boom, attempt)
		if v.Ack || v.DeadLetter || v.Delay <= 0 || v.Delay > p.BackoffMax {
			t.Errorf("attempt %d: %+v", attempt, v)
		}
	}
	u := Policy{MaxAttempts: Unlimited, BackoffMin: time.Millisecond, BackoffMax: time.Second}
	if v := u.Decide(boom, 1_000_000); v.DeadLetter || v.Ack || v.Delay <= 0 {
		t.Fatalf("attempt 1e6 with Unlimited: %+v", v)
	}
	if v := u.Decide(&DeadLetterError{boom}, 1); !v.DeadLetter {
		t.Fatalf("DeadLetter with Unlimited: %+v", v)
	}
}

// recorder is a Driver that records the writes a Settler makes.
type recorder struct {
	attempt  *driver.DeliveryState
	at       int64
	dlq      *driver.InsertMessage
	upTo     int64
	retryAt  time.Time
	lastErr  string
	claimDLQ *driver.InsertMessage
}

func (r *recorder) RecordAttempt(_ context.Context, in driver.RecordAttemptParams) error {
	offset, st := in.Offset, in.State
	r.attempt, r.at = &st, offset
	return nil
}

func (r *recorder) DeadLetter(_ context.Context, in driver.DeadLetterParams) error {
	dlq, offset := in.Copy, in.Offset
	r.dlq, r.upTo = dlq, offset
	return nil
}

// The chunk copies of a large dead letter are tested on real databases
// (drivertest's LargeDeadLetterWhole); here there are no chunks to copy.
func (r *recorder) FetchWithin(context.Context, driver.FetchWithinParams) ([]driver.Message, bool, error) {
	return nil, false, nil
}

func (r *recorder) GetMessage(context.Context, driver.MessageRef) (*driver.Message, map[string]driver.DeliveryState, error) {
	return nil, nil, nil
}

func (r *recorder) BeginWrite(context.Context) (driver.Tx, error) {
	return nil, errors.New("recorder: no database")
}

func (r *recorder) InsertMessages(context.Context, driver.DBTX, []*driver.InsertMessage) error {
	return errors.New("recorder: no database")
}

func (r *recorder) RetryClaim(_ context.Context, in driver.RetryClaimParams) error {
	retryAt, lastError := in.RetryAt, in.LastError
	r.retryAt, r.lastErr = retryAt, lastError
	return nil
}

func (r *recorder) DeadLetterClaim(_ context.Context, _ driver.Claim, dlq *driver.InsertMessage, _ time.Time) error {
	r.claimDLQ = dlq
	return nil
}

func (r *recorder) AckDeferred(context.Context, []driver.Claim, time.Time) error {
	return errors.New("recorder: no deferred messages")
}

func (r *recorder) DeadLetterDeferred(context.Context, driver.Claim, *driver.InsertMessage, time.Time) error {
	return errors.New("recorder: no deferred messages")
}

// A Settler writes what Decide chose: the attempt at the delivery's
// offset, or the dead-letter copy with the cursor passing it (a large
// message's end marker, past its chunks); an ack writes nothing.
func TestSettlerApplies(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	rec := &recorder{}
	s := Settler{Driver: rec, Policy: Policy{MaxAttempts: 3, BackoffMin: time.Second, BackoffMax: time.Second}, DLQSuffix: ".dlq",
		Clock: func() time.Time { return now }}
	ctx := context.Background()
	first := driver.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "big#0", Offset: 10}
	end := &large.Span{End: &driver.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "big", Offset: 14}, UpTo: 14}

	if v, err := s.Leased(ctx, driver.Lease{}, first, end, 1, nil); err != nil || !v.Ack || rec.attempt != nil || rec.dlq != nil {
		t.Fatalf("ack: %+v, %v; wrote %+v %+v", v, err, rec.attempt, rec.dlq)
	}
	v, err := s.Leased(ctx, driver.Lease{}, first, end, 1, errors.New("boom"))
	if err != nil || v.DeadLetter || rec.at != 10 || rec.attempt.Attempts != 1 || rec.attempt.LastError != "boom" ||
		!rec.attempt.NextAttemptAt.Equal(now.Add(v.Delay)) || !v.Due.Equal(rec.attempt.NextAttemptAt) {
		t.Fatalf("retry: %+v, %v; recorded %+v at %d", v, err, rec.attempt, rec.at)
	}
	v, err = s.Leased(ctx, driver.Lease{}, first, end, 3, errors.New("boom"))
	if err != nil || !v.DeadLetter || rec.upTo != 14 || rec.dlq.ID != "big" || rec.dlq.Topic != "x.dlq" ||
		rec.dlq.Headers[HeaderAttempts] != "3" || rec.dlq.Headers[HeaderLastError] != "boom" {
		t.Fatalf("dead-letter: %+v, %v; copied %+v up to %d", v, err, rec.dlq, rec.upTo)
	}
	// Other messages stored among its chunks: the cursor stops at chunk 0.
	end.UpTo = 10
	if v, err = s.Leased(ctx, driver.Lease{}, first, end, 3, errors.New("boom")); err != nil || !v.DeadLetter || rec.upTo != 10 || rec.dlq.ID != "big" {
		t.Fatalf("dead-letter among other messages: %+v, %v; copied %+v up to %d", v, err, rec.dlq, rec.upTo)
	}

	c := driver.Claim{Attempts: 1, Message: driver.Message{Tenant: "t", Topic: "x", ID: "u", Offset: 3}}
	v, err = s.Claim(ctx, c, &NackError{After: time.Minute, Err: errors.New("later")})
	if err != nil || v.Delay != time.Minute || !rec.retryAt.Equal(now.Add(time.Minute)) || rec.lastErr != "later" {
		t.Fatalf("claim retry: %+v, %v; retry at %s, %q", v, err, rec.retryAt, rec.lastErr)
	}
	c.Attempts = 3
	v, err = s.Claim(ctx, c, &NackError{After: time.Minute, Err: errors.New("still")})
	if err != nil || !v.DeadLetter || rec.claimDLQ.ID != "u" || rec.claimDLQ.Headers[HeaderLastError] != "still" {
		t.Fatalf("claim dead-letter: %+v, %v; copied %+v", v, err, rec.claimDLQ)
	}
}
