// SPDX-License-Identifier: Apache-2.0

// Package settle is the one settle policy of every consumer (partition
// workers, ungrouped claims, group receivers, receipts): what a handler's
// result means for its message (ack, retry after a delay, dead-letter),
// and, through a Settler, the one place that writes a failure's verdict:
// the retry's bookkeeping, or the dead-letter copy and the message passed.
//
// Acks are not a Settler's: each runtime commits them its own way (a
// partition's worker moves its cursor in batches, claims' acks are
// coalesced, a receiver or a receipt commits one cursor), so Decide's
// Ack verdict is applied by the caller.
package settle

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/backoff"
	"github.com/shardq/shardq/internal/expiry"
	"github.com/shardq/shardq/internal/ident"
	"github.com/shardq/shardq/internal/large"
	"github.com/shardq/shardq/internal/lifecycle"
)

// RetryAfterError is a handler result: retry the message after After.
type RetryAfterError struct {
	After time.Duration
	Err   error
}

func (e *RetryAfterError) Error() string { return fmt.Sprintf("retry after %s: %v", e.After, e.Err) }
func (e *RetryAfterError) Unwrap() error { return e.Err }

// NackError is a failure whose retry delay its caller chose apart from
// its reason (a receipt's Nack): Decide retries it after After, as it does
// a RetryAfterError, but it reads as Err alone, so that the attempt and a
// dead letter record the caller's reason.
type NackError struct {
	After time.Duration
	Err   error
}

func (e *NackError) Error() string { return e.Err.Error() }
func (e *NackError) Unwrap() error { return e.Err }

// ErrHandlerTimeout is the failure of an attempt that ran past its
// handler timeout (a subscriber's handler call, a receiver's message in
// hand).
var ErrHandlerTimeout = errors.New("shardq: handler timed out")

// DeadLetterError is a handler result: dead-letter the message now.
type DeadLetterError struct{ Err error }

func (e *DeadLetterError) Error() string { return fmt.Sprintf("dead-letter: %v", e.Err) }
func (e *DeadLetterError) Unwrap() error { return e.Err }

// Unlimited as Policy.MaxAttempts never dead-letters for the count.
const Unlimited = -1

// Policy is how a failed message is settled.
type Policy struct {
	MaxAttempts            int // Unlimited: never dead-letter for the count
	BackoffMin, BackoffMax time.Duration
	// DeadLetterExpired dead-letters an expired message instead of
	// passing over it (internal/expiry).
	DeadLetterExpired bool
}

// Verdict is what a handler's result means for its message.
type Verdict struct {
	Ack, DeadLetter bool
	Delay           time.Duration // with a retry
	Cause           error         // with a dead-letter: the handler's reason, unwrapped
	// Due is, with a retry a Settler applied, when the message is due
	// again: the Settler's now plus Delay.
	Due time.Time
}

// Decide settles the result err of the attempt-th delivery: nil acks; a
// DeadLetterError, or a failure of the last allowed attempt, dead-letters;
// any other error retries after RetryAfterError's delay or the
// exponential backoff.
func (p Policy) Decide(err error, attempt int) Verdict {
	if err == nil {
		return Verdict{Ack: true}
	}
	var dl *DeadLetterError
	if errors.As(err, &dl) {
		return Verdict{DeadLetter: true, Cause: dl.Err}
	}
	if p.MaxAttempts != Unlimited && attempt >= p.MaxAttempts {
		return Verdict{DeadLetter: true, Cause: err}
	}
	var ra *RetryAfterError
	if errors.As(err, &ra) {
		return Verdict{Delay: ra.After}
	}
	var nk *NackError
	if errors.As(err, &nk) {
		return Verdict{Delay: nk.After}
	}
	return Verdict{Delay: backoff.Delay(attempt, p.BackoffMin, p.BackoffMax)}
}

// Headers a dead-lettered message carries besides its own.
const (
	HeaderOriginalTopic  = "dlq_original_topic"
	HeaderOriginalOffset = "dlq_original_offset"
	HeaderAttempts       = "dlq_attempts"
	HeaderLastError      = "dlq_last_error"
)

// DeadLetterCopy is m's copy for the dead-letter topic (m's topic +
// suffix): same tenant, partition key and id, with headers saying where it
// came from and why.
func DeadLetterCopy(m driver.Message, suffix string, attempts int, cause error) *driver.InsertMessage {
	headers := make(map[string]string, len(m.Headers)+4)
	maps.Copy(headers, m.Headers)
	delete(headers, expiry.Header) // a dead letter stays until it is handled
	headers[HeaderOriginalTopic] = m.Topic
	headers[HeaderOriginalOffset] = strconv.FormatInt(m.Offset, 10)
	headers[HeaderAttempts] = strconv.Itoa(attempts)
	headers[HeaderLastError] = ErrText(cause)
	return &driver.InsertMessage{Tenant: m.Tenant, Topic: m.Topic + suffix, PartitionKey: m.PartitionKey,
		ID: m.ID, Headers: headers, Payload: m.Payload, CreatedAt: m.CreatedAt}
}

// ErrText is an error as a header value: valid UTF-8, within the limit.
func ErrText(err error) string {
	t := strings.ToValidUTF8(err.Error(), "\uFFFD")
	if len(t) > ident.MaxHeaderValueBytes {
		t = strings.ToValidUTF8(t[:ident.MaxHeaderValueBytes], "")
	}
	return t
}

// Driver is what a Settler writes through (a driver.Driver is one).
type Driver interface {
	FetchWithin(ctx context.Context, p driver.FetchWithinParams) ([]driver.Message, bool, error)
	GetMessage(ctx context.Context, ref driver.MessageRef) (*driver.Message, map[string]driver.DeliveryState, error)
	BeginWrite(ctx context.Context) (driver.Tx, error)
	InsertMessages(ctx context.Context, tx driver.DBTX, msgs []*driver.InsertMessage) error
	RecordAttempt(ctx context.Context, p driver.RecordAttemptParams) error
	DeadLetter(ctx context.Context, p driver.DeadLetterParams) error
	RetryClaim(ctx context.Context, p driver.RetryClaimParams) error
	DeadLetterClaim(ctx context.Context, c driver.Claim, dlq *driver.InsertMessage, now time.Time) error
	AckDeferred(ctx context.Context, cs []driver.Claim, now time.Time) error
	DeadLetterDeferred(ctx context.Context, c driver.Claim, dlq *driver.InsertMessage, now time.Time) error
}

// Settler decides a failed attempt's verdict by Policy and applies it,
// one fenced write each: every consumer settles failures through one, so
// that the same failures end the same way on every path. Metrics and log
// lines stay with the caller, which knows its context.
type Settler struct {
	Driver    Driver
	Policy    Policy
	DLQSuffix string // dead-letter topic = the message's topic + DLQSuffix
	Clock     func() time.Time
}

// Leased settles err, the failure of the attempt-th delivery of m, a
// message of l's partition, under l's fence. A retry records the attempt
// at m's offset (attempts, when it is due, err's text); a dead-letter
// copies m to the dead-letter topic and moves the cursor to it. When span
// is not nil, m is the first chunk of a large message (or its end marker)
// and span what settling it covers: the dead letter is the whole message,
// its chunks copied first and its end marker with the cursor (to
// span.UpTo) last (copyChunks). A nil err is an ack, which
// Leased leaves to the caller. It returns the verdict and the write's
// error (driver.ErrLeaseLost when l is no longer current).
func (s Settler) Leased(ctx context.Context, l driver.Lease, m driver.Message, span *large.Span, attempt int, err error) (Verdict, error) {
	v := s.Policy.Decide(err, attempt)
	now := s.Clock()
	switch {
	case v.Ack:
		return v, nil
	case v.DeadLetter:
		copied, upTo := m, m.Offset
		if span != nil {
			if err := s.copyChunks(ctx, m, span.End); err != nil {
				return v, err
			}
			copied, upTo = *span.End, span.UpTo
			// The copy took as long as the message is large: the end
			// marker's write gets a bound of its own.
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), lifecycle.CallTimeout)
			defer cancel()
		}
		return v, s.Driver.DeadLetter(ctx, driver.DeadLetterParams{Lease: l, Copy: DeadLetterCopy(copied, s.DLQSuffix, attempt, v.Cause), Offset: upTo, Now: now})
	}
	v.Due = now.Add(v.Delay)
	return v, s.Driver.RecordAttempt(ctx, driver.RecordAttemptParams{Lease: l, Offset: m.Offset, State: driver.DeliveryState{Attempts: attempt, NextAttemptAt: v.Due, LastError: ErrText(err)}, Now: now})
}

// chunkCopyBudget bounds the chunk bytes copied to a dead-letter topic in
// one transaction (at least one chunk).
const chunkCopyBudget = 4 << 20

// copyChunks copies the chunks of the large message that first starts,
// up to its end marker end, to the dead-letter topic as they are (same
// partition key, ids and headers), a few to a transaction. The dead
// letter exists for its readers once its end marker is stored, which
// comes last, with the cursor, under the lease: so it appears whole or
// not at all. A copy cut short is finished by the next attempt (ids are
// deterministic and inserts idempotent).
func (s Settler) copyChunks(ctx context.Context, first driver.Message, end *driver.Message) error {
	if first.Offset == end.Offset {
		return nil // no chunks
	}
	// Each step is bounded on its own: the whole takes as long as the
	// message is large.
	step := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.WithoutCancel(ctx), lifecycle.CallTimeout)
	}
	if n, err := strconv.Atoi(end.Headers[large.HeaderChunks]); err == nil && n > 0 {
		// Copied by an earlier attempt cut short before the end marker.
		sctx, cancel := step()
		last, _, err := s.Driver.GetMessage(sctx, driver.MessageRef{Tenant: first.Tenant, Topic: first.Topic + s.DLQSuffix,
			PartitionKey: first.PartitionKey, ID: large.ChunkID(end.ID, n-1)})
		cancel()
		if err != nil {
			return fmt.Errorf("dead-letter large %q: %w", end.ID, err)
		}
		if last != nil {
			return nil
		}
	}
	tp := driver.TopicPartition{Tenant: first.Tenant, Topic: first.Topic, PartitionKey: first.PartitionKey}
	for after := first.Offset - 1; after < end.Offset; {
		sctx, cancel := step()
		ms, _, err := s.Driver.FetchWithin(sctx, driver.FetchWithinParams{Partition: tp, After: after, Limit: 64, Budget: chunkCopyBudget})
		cancel()
		if err != nil {
			return fmt.Errorf("dead-letter large %q: read chunks after offset %d: %w", end.ID, after, err)
		}
		var rows []*driver.InsertMessage
		read := 0
		for _, m := range ms {
			if m.Offset >= end.Offset {
				break
			}
			read++
			if m.Headers[large.HeaderID] != end.ID {
				continue // another message, stored among the chunks: it stays (large.Span)
			}
			rows = append(rows, &driver.InsertMessage{Tenant: m.Tenant, Topic: m.Topic + s.DLQSuffix, PartitionKey: m.PartitionKey,
				ID: m.ID, Headers: m.Headers, Payload: m.Payload, CreatedAt: m.CreatedAt})
		}
		if read == 0 {
			return nil
		}
		if len(rows) > 0 {
			sctx, cancel = step()
			err = s.insert(sctx, rows)
			cancel()
			if err != nil {
				return fmt.Errorf("dead-letter large %q: copy chunks: %w", end.ID, err)
			}
		}
		after = ms[read-1].Offset
	}
	return nil
}

func (s Settler) insert(ctx context.Context, rows []*driver.InsertMessage) error {
	tx, err := s.Driver.BeginWrite(ctx)
	if err != nil {
		return err
	}
	if err := s.Driver.InsertMessages(ctx, tx, rows); err != nil {
		return errors.Join(err, tx.Rollback())
	}
	return tx.Commit()
}

// ExpiredDeferred settles expired deferred messages, claimed by cs,
// without handing them out: each is dead-lettered with Policy's
// DeadLetterExpired, else their deferral ends. A claim taken over
// meanwhile is left to its new holder.
func (s Settler) ExpiredDeferred(ctx context.Context, cs []driver.Claim) error {
	if !s.Policy.DeadLetterExpired {
		if err := s.Driver.AckDeferred(ctx, cs, s.Clock()); err != nil && !errors.Is(err, driver.ErrLeaseLost) {
			return err
		}
		return nil
	}
	for _, c := range cs {
		dlq := DeadLetterCopy(c.Message, s.DLQSuffix, c.Attempts, expiry.Cause(&c.Message))
		if err := s.Driver.DeadLetterDeferred(ctx, c, dlq, s.Clock()); err != nil && !errors.Is(err, driver.ErrLeaseLost) {
			return err
		}
	}
	return nil
}

// Claim settles err, the failure of c's delivery (its c.Attempts-th),
// under c's token: a retry makes the message claimable again when it is
// due, recording err's text; a dead-letter copies it to the dead-letter
// topic and marks it done. A nil err is an ack, left to the caller (acks
// of claims are coalesced). It returns the verdict and the write's error
// (driver.ErrLeaseLost when the message was claimed again).
func (s Settler) Claim(ctx context.Context, c driver.Claim, err error) (Verdict, error) {
	v := s.Policy.Decide(err, c.Attempts)
	now := s.Clock()
	switch {
	case v.Ack:
		return v, nil
	case v.DeadLetter:
		return v, s.Driver.DeadLetterClaim(ctx, c, DeadLetterCopy(c.Message, s.DLQSuffix, c.Attempts, v.Cause), now)
	}
	v.Due = now.Add(v.Delay)
	return v, s.Driver.RetryClaim(ctx, driver.RetryClaimParams{Claim: c, RetryAt: v.Due, LastError: ErrText(err), Now: now})
}
