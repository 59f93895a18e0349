// SPDX-License-Identifier: Apache-2.0

// Package publish is the publish pipeline behind shardq.Client's Publish,
// PublishTx, PublishLarge and transactional sends: it validates messages
// and turns them into rows (ids, headers, times, trace context), then
// writes them, either in group-committed transactions shared by
// concurrent calls of one tenant (internal/coalesce), retried on
// deadlocks, or inside the caller's own transaction.
package publish

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/coalesce"
	"github.com/shardq/shardq/internal/expiry"
	"github.com/shardq/shardq/internal/ident"
	"github.com/shardq/shardq/internal/lifecycle"
	"github.com/shardq/shardq/internal/retry"
	"github.com/shardq/shardq/internal/settings"
	"github.com/shardq/shardq/internal/telemetry"
	"github.com/shardq/shardq/internal/wakeup"
)

// HeaderQueueName is the header that mirrors a message's tenant.
const HeaderQueueName = "queue_name"

// Message is a shardq.Message as the pipeline reads it.
type Message struct {
	Tenant, Topic, PartitionKey, ID string
	Payload                         []byte
	Headers                         map[string]string
	CreatedAt, NotBefore            time.Time
	Delay                           time.Duration
	ExpiresAt                       time.Time
	TTL                             time.Duration
	// Select, when not nil, chooses the partition key (the message's
	// Selector with its argument); PartitionKey must then be empty.
	Select func() (string, error)
}

// Config is the client's publish settings, defaults filled.
type Config struct {
	MaxPayloadBytes int
	MaxDelay        time.Duration
	Retries         int // reruns of a transaction that failed with a retryable error
	MaxBatch        int
	MaxInflight     int
	Linger          time.Duration
	Timeout         time.Duration // bounds one shared transaction
	// Tenants, when not nil, are the only tenants served; nil reads
	// SHARDQ_TENANTS, and when that is unset too any tenant is served.
	Tenants []string
	// ReservedPrefix starts the header names only shardq may set
	// (large messages' chunks and end markers).
	ReservedPrefix string
	Clock          func() time.Time
	Logger         *slog.Logger
	// MessageError wraps the refusal err of the call's message i
	// (shardq.MessageError).
	MessageError func(i int, err error) error
	// Admit refuses rows of one tenant that it may not publish now (a
	// suspended tenant, or one over a quota), before anything is stored.
	// With wait, a rate quota may delay the call instead. What it admits
	// is held against the tenant's quotas until end says how the write
	// ended.
	Admit func(ctx context.Context, tenant string, rows []*driver.InsertMessage, wait bool) (end End, err error)
}

// Outcome is how an admitted write ended.
type Outcome int

const (
	// Ended: the write's transaction ended, committed or not, before end
	// was called.
	Ended Outcome = iota
	// EndsUnseen: the rows are in a transaction that ends later, out of
	// this process's sight (the caller's, of PublishTx; a transactional
	// message left to the check-back).
	EndsUnseen
)

// End reports how a write that Admit admitted ended; a second call does
// nothing.
type End func(Outcome)

// NoEnd is the End of a write that holds nothing.
func NoEnd(Outcome) {}

// Publisher writes messages to one database.
type Publisher struct {
	drv     driver.Driver
	cfg     Config
	tel     *telemetry.T
	local   *wakeup.Registry // told of every commit, to wake this client's consumers
	batcher *coalesce.Batcher[string, *driver.InsertMessage]
	halves  *coalesce.Batcher[string, *driver.HalfCommit]
	// served is the served tenant list as a set; nil when any tenant goes.
	served     map[string]bool
	servedList string
}

// New returns a publisher over drv; it fails when the served tenant list
// is invalid.
func New(drv driver.Driver, tel *telemetry.T, local *wakeup.Registry, cfg Config) (*Publisher, error) {
	p := &Publisher{drv: drv, cfg: cfg, tel: tel, local: local}
	if err := p.serve(); err != nil {
		return nil, err
	}
	p.batcher = coalesce.New[string](p.writeBatch, cfg.MaxBatch, cfg.MaxInflight, cfg.Linger, cfg.Timeout)
	p.halves = coalesce.New[string](p.commitHalves, cfg.MaxBatch, cfg.MaxInflight, 0, cfg.Timeout)
	return p, nil
}

// Close lets queued publishes and half-message commits finish and
// refuses new ones.
func (p *Publisher) Close() {
	p.batcher.Close()
	p.halves.Close()
}

// Timeout bounds one publish transaction.
func (p *Publisher) Timeout() time.Duration { return p.cfg.Timeout }

// Stored reads the message of ref as stored (nil when there is none).
func (p *Publisher) Stored(ctx context.Context, ref driver.MessageRef) (*driver.Message, error) {
	m, _, err := p.drv.GetMessage(ctx, ref)
	return m, err
}

// MaxPayloadBytes bounds one message's payload.
func (p *Publisher) MaxPayloadBytes() int { return p.cfg.MaxPayloadBytes }

// serve settles the served tenant list: Config.Tenants, else SHARDQ_TENANTS
// when set, else none (any tenant).
func (p *Publisher) serve() error {
	ts := p.cfg.Tenants
	if ts == nil {
		env, set, err := settings.EnvTenants()
		if err != nil || !set {
			return err // unset: any tenant
		}
		ts = env
	} else if err := ident.Tenants("tenants", ts); err != nil {
		return err
	}
	p.served = make(map[string]bool, len(ts))
	for _, t := range ts {
		p.served[t] = true
	}
	p.servedList = strings.Join(ts, ", ")
	return nil
}

// checkServed rejects a tenant outside the served list.
func (p *Publisher) checkServed(tenant string) error {
	if p.served != nil && !p.served[tenant] {
		return &ident.Error{Field: "tenant", Rule: fmt.Sprintf("%q is not served by this client (served: %s; Config.Tenants or SHARDQ_TENANTS)", tenant, p.servedList)}
	}
	return nil
}

// Publish stores msgs atomically, in a transaction shared with concurrent
// calls of their tenant, and returns their rows with offsets filled;
// reserved allows the headers under ReservedPrefix.
func (p *Publisher) Publish(ctx context.Context, msgs []Message, reserved bool) (_ []*driver.InsertMessage, err error) {
	start := time.Now()
	ctx, span := p.tel.StartSend(ctx, false)
	var sent []*driver.InsertMessage // what reached the database
	defer func() { p.tel.EndSend(ctx, span, start, sent, err) }()
	rows, err := p.Prepare(ctx, msgs, reserved)
	if err != nil || len(rows) == 0 {
		return nil, err
	}
	for i, r := range rows[1:] {
		if r.Tenant != rows[0].Tenant {
			return nil, p.cfg.MessageError(i+1, &ident.Error{Field: "tenant",
				Rule: fmt.Sprintf("%q differs from message 0's %q; one Publish call writes one tenant", r.Tenant, rows[0].Tenant)})
		}
	}
	end, err := p.Admit(ctx, rows, reserved)
	if err != nil {
		return nil, fmt.Errorf("shardq: publish: %w", err)
	}
	defer end(Ended)
	sent = rows
	wait := ctx
	if reserved {
		// A large message's rows, once admitted, are waited for whatever
		// ctx does (the transaction has its own timeout): returning first
		// would let the write's aborted end marker commit ahead of its
		// chunks, which readers would then take for a write in progress.
		wait = context.WithoutCancel(ctx)
	}
	if err := p.batcher.Submit(wait, rows[0].Tenant, rows); err != nil {
		if errors.Is(err, coalesce.ErrClosed) {
			return nil, lifecycle.ErrClosed
		}
		return nil, fmt.Errorf("shardq: publish: %w", err)
	}
	return rows, nil
}

// PublishTx stores msgs inside tx, the caller's transaction.
func (p *Publisher) PublishTx(ctx context.Context, tx *sql.Tx, msgs []Message) (_ []*driver.InsertMessage, err error) {
	if tx == nil {
		return nil, fmt.Errorf("shardq: PublishTx: %w", &ident.Error{Field: "tx", Rule: "must not be nil"})
	}
	start := time.Now()
	ctx, span := p.tel.StartSend(ctx, true)
	rows, err := p.Prepare(ctx, msgs, false)
	if err != nil {
		p.tel.EndSend(ctx, span, start, nil, err)
		return nil, err
	}
	defer func() { p.tel.EndSend(ctx, span, start, rows, err) }()
	if len(rows) == 0 {
		return nil, nil
	}
	end, err := p.Admit(ctx, rows, false)
	if err != nil {
		return nil, fmt.Errorf("shardq: publish in transaction: %w", err)
	}
	// The caller's pool is the caller's: whatever it is set to do, shardq's
	// statements run prepared on tx, their values bound, never spliced.
	if err := p.drv.InsertMessages(ctx, driver.PreparedTx(tx), rows); err != nil {
		end(Ended) // the caller must roll tx back
		return nil, fmt.Errorf("shardq: publish in transaction: %w", err)
	}
	end(EndsUnseen)
	return rows, nil
}

// Admit checks that each tenant of rows may publish its rows now
// (Config.Admit); wait: large messages' chunks, which wait for a rate
// quota rather than fail part of the way. Call end once the write ended.
func (p *Publisher) Admit(ctx context.Context, rows []*driver.InsertMessage, wait bool) (end End, err error) {
	if p.cfg.Admit == nil {
		return NoEnd, nil
	}
	var ends []End
	end = func(o Outcome) {
		for _, e := range ends {
			e(o)
		}
	}
	for i := 0; i < len(rows); {
		j := i + 1
		for j < len(rows) && rows[j].Tenant == rows[i].Tenant {
			j++
		}
		e, err := p.cfg.Admit(ctx, rows[i].Tenant, rows[i:j], wait)
		if err != nil {
			end(Ended) // nothing was written
			return nil, err
		}
		ends = append(ends, e)
		i = j
	}
	return end, nil
}

// Prepare validates every message, runs selectors, fills ids, headers and
// times, and returns the rows to insert; each carries ctx's trace context
// (the send span's) in its headers. Nothing touches the database.
// Headers under ReservedPrefix are refused unless reserved.
func (p *Publisher) Prepare(ctx context.Context, msgs []Message, reserved bool) ([]*driver.InsertMessage, error) {
	rows := make([]*driver.InsertMessage, len(msgs))
	now := p.cfg.Clock().UTC().Truncate(time.Microsecond)
	for i := range msgs {
		if !reserved {
			if err := p.CheckReserved(msgs[i].Headers, " (PublishLarge)"); err != nil {
				return nil, p.cfg.MessageError(i, err)
			}
		}
		r, err := p.prepareOne(ctx, &msgs[i], now)
		if err != nil {
			return nil, p.cfg.MessageError(i, err)
		}
		rows[i] = r
	}
	return rows, nil
}

// CheckReserved refuses a header under ReservedPrefix; note ends the
// rule.
func (p *Publisher) CheckReserved(headers map[string]string, note string) error {
	for k := range headers {
		if strings.HasPrefix(k, p.cfg.ReservedPrefix) {
			return &ident.Error{Field: fmt.Sprintf("header %q", k), Rule: "the prefix " + p.cfg.ReservedPrefix + " is shardq's" + note}
		}
	}
	return nil
}

func (p *Publisher) prepareOne(ctx context.Context, m *Message, now time.Time) (*driver.InsertMessage, error) {
	if err := ident.Tenant(m.Tenant); err != nil {
		return nil, err
	}
	if err := p.checkServed(m.Tenant); err != nil {
		return nil, err
	}
	if err := ident.Topic(m.Topic); err != nil {
		return nil, err
	}
	key := m.PartitionKey
	if m.Select != nil {
		if key != "" {
			return nil, &ident.Error{Field: "partition key", Rule: "must be empty when a Selector chooses it"}
		}
		var err error
		if key, err = m.Select(); err != nil {
			return nil, &ident.Error{Field: "partition key", Rule: "selector: " + err.Error()}
		}
	}
	if err := ident.PartitionKey(key); err != nil {
		return nil, err
	}
	id := m.ID
	if id == "" {
		var err error
		if id, err = NewID(); err != nil {
			return nil, fmt.Errorf("generate message id: %w", err)
		}
	} else if err := ident.MessageID(id); err != nil {
		return nil, err
	}
	if err := ident.Payload(m.Payload, p.cfg.MaxPayloadBytes); err != nil {
		return nil, err
	}
	if v, ok := m.Headers[HeaderQueueName]; ok && v != m.Tenant {
		return nil, &ident.Error{Field: `header "queue_name"`,
			Rule: fmt.Sprintf("%q differs from tenant %q; it mirrors the tenant and may be omitted", v, m.Tenant)}
	}
	// The limits apply to the caller's headers; queue_name, which shardq
	// adds, does not count against them.
	if err := ident.Headers(m.Headers); err != nil {
		return nil, err
	}
	headers := make(map[string]string, len(m.Headers)+1)
	maps.Copy(headers, m.Headers)
	headers[HeaderQueueName] = m.Tenant
	// Like queue_name, the trace context shardq adds does not count
	// against the caller's header limits.
	telemetry.Inject(ctx, headers)
	created := now
	if !m.CreatedAt.IsZero() {
		created = m.CreatedAt.UTC().Truncate(time.Microsecond)
	}
	notBefore, err := p.notBefore(m, now)
	if err != nil {
		return nil, err
	}
	if err := expires(m, headers, now, notBefore); err != nil {
		return nil, err
	}
	return &driver.InsertMessage{
		Tenant: m.Tenant, Topic: m.Topic, PartitionKey: key, ID: id,
		Headers: headers, Payload: m.Payload, CreatedAt: created, NotBefore: notBefore,
	}, nil
}

// expires sets headers' expiry from m's TTL or ExpiresAt (at most one
// of them, or the header itself), after now and after notBefore.
func expires(m *Message, headers map[string]string, now, notBefore time.Time) error {
	v, inHeader := m.Headers[expiry.Header]
	field := "expires at"
	at := m.ExpiresAt
	switch {
	case m.TTL < 0:
		return &ident.Error{Field: "ttl", Rule: fmt.Sprintf("%s is negative", m.TTL)}
	case (m.TTL > 0 && !at.IsZero()) || (inHeader && (m.TTL > 0 || !at.IsZero())):
		return &ident.Error{Field: "ttl", Rule: "set one of TTL, ExpiresAt and the header " + expiry.Header}
	case m.TTL > 0:
		at, field = now.Add(m.TTL), "ttl"
	case inHeader:
		var err error
		if at, err = expiry.Parse(v); err != nil {
			return &ident.Error{Field: fmt.Sprintf("header %q", expiry.Header), Rule: "an RFC 3339 time"}
		}
		field = fmt.Sprintf("header %q", expiry.Header)
	case at.IsZero():
		return nil
	}
	at = at.UTC().Truncate(time.Millisecond) // as stored: the checks hold for the stored value
	switch {
	case !at.After(now):
		return &ident.Error{Field: field, Rule: fmt.Sprintf("%s is not after now (%s): the message would never be delivered", expiry.Format(at), expiry.Format(now))}
	case !notBefore.IsZero() && !at.After(notBefore):
		return &ident.Error{Field: field, Rule: fmt.Sprintf("%s is not after the message's delivery time %s", expiry.Format(at), expiry.Format(notBefore))}
	}
	headers[expiry.Header] = expiry.Format(at)
	return nil
}

// NewID is a fresh message id: a UUIDv7, unique and time-ordered.
func NewID() (string, error) {
	u, err := uuid.NewV7()
	if err != nil {
		return "", err
	}
	return u.String(), nil
}

// notBefore is when m may be delivered: zero for at once.
func (p *Publisher) notBefore(m *Message, now time.Time) (time.Time, error) {
	at := m.NotBefore
	switch {
	case m.Delay < 0:
		return time.Time{}, &ident.Error{Field: "delay", Rule: fmt.Sprintf("%s is negative", m.Delay)}
	case m.Delay > 0 && !at.IsZero():
		return time.Time{}, &ident.Error{Field: "delay", Rule: "set Delay or NotBefore, not both"}
	case m.Delay > 0:
		at = now.Add(m.Delay)
	}
	if at.IsZero() || !at.After(now) {
		return time.Time{}, nil
	}
	if ahead := at.Sub(now); ahead > p.cfg.MaxDelay {
		field := "not before"
		if m.Delay > 0 {
			field = "delay"
		}
		return time.Time{}, &ident.Error{Field: field, Rule: fmt.Sprintf("%s ahead, limit %s (Config.MaxDelay)", ahead.Round(time.Second), p.cfg.MaxDelay)}
	}
	return at.UTC().Truncate(time.Microsecond), nil
}

// writeBatch is the coalescer's flush: one write transaction, run again on
// a retryable error (deadlock, busy file). Running it again is safe because
// publish is idempotent by id.
func (p *Publisher) writeBatch(ctx context.Context, rows []*driver.InsertMessage, calls int) error {
	err := retry.Do(ctx, p.cfg.Retries, p.drv.Retryable, func(n int, err error) {
		p.cfg.Logger.Warn("shardq: publish transaction retried", "tenant", rows[0].Tenant, "attempt", n, "err", err)
	}, func() error { return p.writeOnce(ctx, rows) })
	if err == nil {
		p.tel.Batch(ctx, rows[0].Tenant, len(rows), calls)
	}
	return err
}

func (p *Publisher) writeOnce(ctx context.Context, rows []*driver.InsertMessage) error {
	tx, err := p.drv.BeginWrite(ctx)
	if err != nil {
		return err
	}
	// retry.Do in writeBatch runs this again on a deadlock.
	if err := p.drv.InsertMessages(driver.Rerunnable(ctx), tx, rows); err != nil {
		return errors.Join(err, ignoreDone(tx.Rollback()))
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	p.local.Committed(rows)
	return nil
}

// CommitHalf commits the unclaimed half message ref: it enters its
// partition with a fresh offset. Commits of one tenant share transactions
// as publishes do, so however many senders commit at once, at most
// MaxInflight transactions of this client wait on a partition's head row.
//
// A half message found resolved whose message is stored was committed:
// by a shared transaction that reported an error after its commit (the
// coalescer then ran this one alone, and found it gone), or by a
// check-back or an operator. Either way the sender's answer is the
// stored message, not ErrHalfResolved.
func (p *Publisher) CommitHalf(ctx context.Context, ref driver.MessageRef) (*driver.InsertMessage, error) {
	hc := &driver.HalfCommit{Ref: ref}
	err := p.halves.Submit(ctx, ref.Tenant, []*driver.HalfCommit{hc})
	switch {
	case err == nil:
		return hc.Message, nil
	case errors.Is(err, coalesce.ErrClosed):
		return nil, lifecycle.ErrClosed
	case errors.Is(err, driver.ErrHalfResolved):
		m, serr := p.Stored(ctx, ref)
		if serr != nil {
			return nil, errors.Join(err, serr)
		}
		if m != nil {
			return &driver.InsertMessage{Tenant: m.Tenant, Topic: m.Topic, PartitionKey: m.PartitionKey, ID: m.ID, Offset: m.Offset,
				Headers: m.Headers, Payload: m.Payload, CreatedAt: m.CreatedAt, NotBefore: m.NotBefore}, nil
		}
	}
	return nil, err
}

func (p *Publisher) commitHalves(ctx context.Context, hs []*driver.HalfCommit, _ int) error {
	err := retry.Do(ctx, p.cfg.Retries, p.drv.Retryable, func(n int, err error) {
		p.cfg.Logger.Warn("shardq: half-message commit retried", "tenant", hs[0].Ref.Tenant, "attempt", n, "err", err)
	}, func() error { return p.drv.CommitHalves(ctx, hs) })
	if err != nil {
		return err
	}
	msgs := make([]*driver.InsertMessage, len(hs))
	for i, hc := range hs {
		msgs[i] = hc.Message
	}
	p.local.Committed(msgs)
	return nil
}

// ignoreDone drops the error of rolling back a transaction the database
// already ended (it aborts on deadlock).
func ignoreDone(err error) error {
	if errors.Is(err, sql.ErrTxDone) {
		return nil
	}
	return err
}
