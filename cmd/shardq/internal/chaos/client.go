// SPDX-License-Identifier: Apache-2.0

// Package chaos runs shardq's clients as processes under injected faults
// and records what each did, for the independent checker
// (internal/chaoscheck; docs/chaos.md).
package chaos

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"sync"
	"time"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/cmd/shardq/internal/chaoscheck"
)

// The run's topics and groups.
const (
	Tenant        = "chaos"    // the run's tenant unless --tenants names others
	TopicOrdered  = "ordered"  // keyed messages: per-key order
	TopicSessions = "sessions" // keyed messages for group receivers, who take one message per round trip
	TopicWork     = "work"     // ungrouped messages: competing consumers
	GroupSub      = "sub"      // fair-share subscribers of TopicOrdered
	GroupRecv     = "recv"     // group receivers (next free group) of TopicSessions
	GroupUng      = "ung"      // competing consumers of TopicWork
	// Keys of TopicOrdered and TopicSessions; large messages go to keys
	// of their own (L0 in TopicOrdered, L1 in TopicSessions).
	orderedKeys  = 16
	sessionsKeys = 8
)

// groupTopics, orderedGroups and dlqTopics are the run's configuration,
// written to the history first.
var (
	groupTopics   = map[string]string{GroupSub: TopicOrdered, GroupRecv: TopicSessions, GroupUng: TopicWork, GroupHTTP: TopicHTTP}
	orderedGroups = []string{GroupSub, GroupRecv, GroupHTTP}
)

func dlqSuffix(group string) string {
	if group == GroupHTTP {
		return httpDLQSuffix
	}
	return ".dlq-" + group
}

func dlqTopics() map[string]string {
	m := map[string]string{}
	for g, t := range groupTopics {
		m[g] = t + dlqSuffix(g)
	}
	return m
}

// Event is a history line (docs/chaos.md has the format): the checker's
// type, which the runner writes and the checker reads.
type Event = chaoscheck.Event

// History appends events to a file, one line per write: a process killed
// mid-line leaves at most its last line torn, which the checker leaves out.
type History struct {
	mu sync.Mutex
	f  *os.File
}

// OpenHistory opens (or creates) a history file for appending.
func OpenHistory(name string) (*History, error) {
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	return &History{f: f}, nil
}

// Record writes one event.
func (h *History) Record(e Event) error {
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	_, err = h.f.Write(append(b, '\n'))
	return err
}

// Close closes the file.
func (h *History) Close() error { return h.f.Close() }

// ClientConfig is one client process's part.
type ClientConfig struct {
	Role     string        // publish, large, subscribe, ungrouped, receive
	Name     string        // process name with its incarnation: pub-0.2
	History  string        // its history file
	Batch    int           // publish: messages per call
	Interval time.Duration // publish, large, tx: between calls
	// SendUntil ends a tx client's sends; its check-back runs on until
	// stop (through the drain), resolving what its incarnations left.
	SendUntil time.Time
	Seed      uint64
	// ClockOffset is how far the process's clock is off (the clock
	// fault); ClockSync is its client's Config.ClockSync.
	ClockOffset, ClockSync time.Duration
	// Servers are the base URLs of the run's `shardq serve` processes
	// and Token a token of theirs (HTTP roles).
	Servers []string
	Token   string
	// Tenants are the run's: each publish call picks one, consumers
	// serve them all.
	Tenants []string
}

// ClockSync is the clients' Config.ClockSync: a client whose Clock is
// set (the clock fault's) keeps to it unless ClockSync is positive.
const ClockSync = 2 * time.Second

// Tune sets a client's configuration: its large writes given up soon,
// its clock off by ClockOffset.
func (cfg ClientConfig) Tune(c *shardq.Config) {
	c.LargeWriteTimeout = LargeWriteTimeout
	off := cfg.ClockOffset
	c.Clock = func() time.Time { return time.Now().Add(off) }
	c.ClockSync = cfg.ClockSync
}

// Roles.
const (
	RolePublish   = "publish"
	RoleLarge     = "large"
	RoleSubscribe = "subscribe"
	RoleUngrouped = "ungrouped"
	RoleReceive   = "receive"
	RoleTx        = "tx"
	// Through the run's `shardq serve` processes.
	RoleHTTPPublish = "http-publish"
	RoleHTTPReceive = "http-receive"
)

// The clients' timings: short, so that faults cost leases and claims
// within a short run.
const (
	// LargeWriteTimeout is the clients' (shardq.Config): a large write
	// that a kill cut off is given up within the run.
	LargeWriteTimeout = 10 * time.Second
	leaseTTL          = 4 * time.Second
	handlerTimeout    = time.Second
	maxAttempts       = 3
)

// poisoned messages always fail (dead-lettered after maxAttempts); slow
// ones outlast the handler timeout on their first attempt.
func poisoned(id string) bool { return hashID(id)%53 == 7 }
func slow(id string) bool     { return hashID(id)%29 == 3 }

func hashID(id string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(id))
	return h.Sum32()
}

// RunClient runs one client until stop is closed (its parent closed its
// stdin), then stops it gracefully.
func RunClient(ctx context.Context, c *shardq.Client, cfg ClientConfig, stop <-chan struct{}, log *slog.Logger) error {
	h, err := OpenHistory(cfg.History)
	if err != nil {
		return err
	}
	defer h.Close()
	cl := &client{c: c, cfg: cfg, h: h, log: log, rng: rand.New(rand.NewPCG(cfg.Seed, hashID64(cfg.Name)))}
	switch cfg.Role {
	case RolePublish:
		return cl.publish(ctx, stop)
	case RoleLarge:
		return cl.publishLarge(ctx, stop)
	case RoleSubscribe, RoleUngrouped:
		return cl.subscribe(ctx, stop)
	case RoleReceive:
		return cl.receive(ctx, stop)
	case RoleTx:
		return cl.publishTx(ctx, stop)
	case RoleHTTPPublish, RoleHTTPReceive:
		if len(cfg.Servers) == 0 || cfg.Token == "" {
			return fmt.Errorf("chaos client: --role %s: --servers and %s: required", cfg.Role, TokenEnv)
		}
		if cfg.Role == RoleHTTPPublish {
			return cl.httpPublish(ctx, stop)
		}
		return cl.httpReceive(ctx, stop)
	}
	return fmt.Errorf("chaos client: --role %q: want publish, large, tx, subscribe, ungrouped, receive, http-publish or http-receive", cfg.Role)
}

func hashID64(s string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(s))
	return h.Sum64()
}

type client struct {
	c   *shardq.Client
	cfg ClientConfig
	h   *History
	log *slog.Logger
	rng *rand.Rand
}

func now() int64 { return time.Now().UnixNano() }

func (cl *client) record(e Event) {
	e.Proc = cl.cfg.Name
	if err := cl.h.Record(e); err != nil {
		// A history that cannot be written makes the run unjudgeable.
		cl.log.Error("chaos: history write failed", "err", err)
		os.Exit(3)
	}
}

// tenant picks the tenant of a publish call.
func (cl *client) tenant() string { return cl.cfg.Tenants[cl.rng.IntN(len(cl.cfg.Tenants))] }

// keyed picks a keyed message's topic and key: one in four goes to the
// receivers' sessions.
func (cl *client) keyed() (topic, key string) {
	if cl.rng.IntN(4) == 0 {
		return TopicSessions, fmt.Sprintf("s%02d", cl.rng.IntN(sessionsKeys))
	}
	return TopicOrdered, fmt.Sprintf("k%02d", cl.rng.IntN(orderedKeys))
}

// every runs f every interval until stop.
func every(ctx context.Context, stop <-chan struct{}, interval time.Duration, f func()) error {
	t := time.NewTicker(max(interval, time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-stop:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			f()
		}
	}
}

func (cl *client) publish(ctx context.Context, stop <-chan struct{}) error {
	n := 0
	return every(ctx, stop, cl.cfg.Interval, func() {
		msgs := make([]shardq.Message, max(cl.cfg.Batch, 1))
		tenant := cl.tenant() // one call, one tenant
		for i := range msgs {
			n++
			m := shardq.Message{Tenant: tenant, Topic: TopicOrdered, ID: fmt.Sprintf("%s-%d", cl.cfg.Name, n),
				Payload: fmt.Appendf(nil, "payload of %s-%d", cl.cfg.Name, n)}
			// Of twenty messages, four are ungrouped work, four go to the
			// receivers' sessions, the rest to the subscribers.
			m.Topic, m.PartitionKey = cl.keyed()
			if cl.rng.IntN(5) == 0 {
				m.Topic, m.PartitionKey = TopicWork, ""
			}
			msgs[i] = m
			cl.record(Event{Op: "send", Tenant: tenant, Topic: m.Topic, Key: m.PartitionKey, ID: m.ID})
		}
		start := now()
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		res, err := cl.c.Publish(cctx, msgs...)
		cancel()
		end := now()
		if err != nil {
			cl.log.Warn("chaos: publish failed (outcome unknown)", "err", err)
			return
		}
		for i, r := range res {
			cl.record(Event{Op: "publish", Tenant: tenant, Topic: msgs[i].Topic, Key: msgs[i].PartitionKey, ID: msgs[i].ID, Offset: r.Offset, Start: start, End: end})
		}
	})
}

func (cl *client) publishLarge(ctx context.Context, stop <-chan struct{}) error {
	n := 0
	return every(ctx, stop, cl.cfg.Interval, func() {
		n++
		m := shardq.Message{Tenant: cl.tenant(), Topic: TopicOrdered, ID: fmt.Sprintf("%s-%d", cl.cfg.Name, n), PartitionKey: "L0"}
		if n%2 == 0 {
			m.Topic, m.PartitionKey = TopicSessions, "L1"
		}
		size := 64<<10 + cl.rng.IntN(1<<20)
		body := make([]byte, size)
		for i := range body {
			body[i] = byte(cl.rng.Uint32())
		}
		sum := sha256.Sum256(body)
		cl.record(Event{Op: "send", Tenant: m.Tenant, Topic: m.Topic, Key: m.PartitionKey, ID: m.ID, Size: int64(size), SHA256: hex.EncodeToString(sum[:])})
		start := now()
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		res, err := cl.c.PublishLarge(cctx, m, bytes.NewReader(body), &shardq.LargeOptions{ChunkSize: 64 << 10, ChunksPerTx: 4})
		cancel()
		end := now()
		if err != nil {
			cl.log.Warn("chaos: large publish failed (outcome unknown)", "err", err)
			return
		}
		cl.record(Event{Op: "publish", Tenant: m.Tenant, Topic: m.Topic, Key: m.PartitionKey, ID: m.ID, Offset: res.EndOffset, Start: start, End: end,
			Size: res.Bytes, SHA256: res.SHA256})
	})
}

// The transactional producer group's timings: short, so that halves
// left unknown (or by a killed sender) are checked back within the run.
const (
	producerGroup = "chaos-tx"
	txTimeout     = 2 * time.Second
	checkInterval = time.Second
)

// txIntent is how a transactional message's local transaction ends, from
// its id: committed or rolled back by the sender (three in five), or
// left unknown for the check-back, which answers the same intent.
func txIntent(id string) (intent string, direct bool) {
	switch hashID(id) % 5 {
	case 0, 1:
		return "commit", true
	case 2:
		return "commit", false
	case 3:
		return "rollback", true
	default:
		return "rollback", false
	}
}

func intentState(intent string) shardq.TxState {
	if intent == "commit" {
		return shardq.TxCommit
	}
	return shardq.TxRollback
}

// publishTx sends transactional messages until SendUntil, each local
// transaction taking a few milliseconds (a window for a kill), and
// answers check-backs from the intent until stop.
func (cl *client) publishTx(ctx context.Context, stop <-chan struct{}) error {
	p, err := cl.c.StartTransactionProducer(ctx, shardq.TransactionProducerConfig{
		ProducerGroup: producerGroup, Tenants: cl.cfg.Tenants, Name: cl.cfg.Name,
		TransactionTimeout: txTimeout, CheckInterval: checkInterval, PollInterval: 250 * time.Millisecond, ClaimTTL: leaseTTL,
		Checker: func(_ context.Context, h *shardq.HalfMessage) (shardq.TxState, error) {
			intent, _ := txIntent(h.ID)
			cl.record(Event{Op: "check", Tenant: h.Tenant, Topic: h.Topic, Key: h.PartitionKey, ID: h.ID, Intent: intent})
			return intentState(intent), nil
		},
	})
	if err != nil {
		return err
	}
	n := 0
	err = every(ctx, stop, cl.cfg.Interval, func() {
		if !time.Now().Before(cl.cfg.SendUntil) {
			return
		}
		n++
		m := shardq.Message{Tenant: cl.tenant(), Topic: TopicOrdered, ID: fmt.Sprintf("%s-%d", cl.cfg.Name, n),
			Payload: fmt.Appendf(nil, "transactional payload of %s-%d", cl.cfg.Name, n)}
		intent, direct := txIntent(m.ID)
		pause := time.Duration(cl.rng.IntN(20)) * time.Millisecond
		sel := shardq.SelectorFunc(func(_ *shardq.Message, arg any) (string, error) { return arg.(string), nil })
		topic, key := cl.keyed()
		m.Topic = topic
		cl.record(Event{Op: "send", Tenant: m.Tenant, Topic: m.Topic, Key: key, ID: m.ID, Intent: intent})
		start := now()
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		res, err := p.SendInTransaction(cctx, m, sel, key, func(ctx context.Context, _ *shardq.HalfMessage) (shardq.TxState, error) {
			sleep(ctx, pause)
			if !direct {
				return shardq.TxUnknown, nil
			}
			return intentState(intent), nil
		})
		cancel()
		end := now()
		switch {
		case err != nil:
			cl.log.Warn("chaos: transactional send failed (the check-back resolves it)", "id", m.ID, "err", err)
		case res.State == shardq.TxCommit:
			cl.record(Event{Op: "publish", Tenant: m.Tenant, Topic: m.Topic, Key: res.PartitionKey, ID: m.ID, Offset: res.Offset, Start: start, End: end})
		}
	})
	sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer scancel()
	return errors.Join(err, p.Stop(sctx))
}

// handle runs the handler's behaviour for d and records the call.
func (cl *client) handle(ctx context.Context, group string, d *shardq.Delivery) error {
	e, err := cl.run(ctx, group, d)
	cl.record(e)
	return err
}

// run is the handler's behaviour: it reads a large message whole, fails
// poisoned messages, and outlasts its timeout on a slow one's first
// attempt. The event says what happened.
func (cl *client) run(ctx context.Context, group string, d *shardq.Delivery) (Event, error) {
	start := now()
	var size int64
	var sum string
	err := func() error {
		if d.Chunks > 0 {
			hash := sha256.New()
			n, err := io.Copy(hash, d.Body())
			if err != nil {
				return fmt.Errorf("read large message: %w", err)
			}
			size, sum = n, hex.EncodeToString(hash.Sum(nil))
		}
		if poisoned(d.ID) {
			return errors.New("poisoned message")
		}
		if slow(d.ID) && d.Attempt == 1 {
			<-ctx.Done()
			return ctx.Err()
		}
		return ctx.Err()
	}()
	result := "ok"
	if err != nil {
		result = "error"
	}
	return Event{Op: "handle", Tenant: d.Tenant, Group: group, Topic: d.Topic, Key: d.PartitionKey, ID: d.ID, Offset: d.Offset,
		Start: start, End: now(), Result: result, Size: size, SHA256: sum}, err
}

func (cl *client) subscribe(ctx context.Context, stop <-chan struct{}) error {
	group, topic, take := GroupSub, TopicOrdered, shardq.TakeGrouped
	if cl.cfg.Role == RoleUngrouped {
		group, topic, take = GroupUng, TopicWork, shardq.TakeUngrouped
	}
	s, err := cl.c.Subscribe(ctx, shardq.SubscriberConfig{
		ConsumerGroup: group, Topic: topic, Tenants: cl.cfg.Tenants, Name: cl.cfg.Name, Take: take,
		Handler:  func(ctx context.Context, d *shardq.Delivery) error { return cl.handle(ctx, group, d) },
		LeaseTTL: leaseTTL, HeartbeatInterval: leaseTTL / 4, HandlerTimeout: handlerTimeout,
		VisibilityTimeout: leaseTTL, UngroupedConcurrency: 4,
		MaxAttempts: maxAttempts, BackoffMin: 100 * time.Millisecond, BackoffMax: time.Second, DLQSuffix: dlqSuffix(group),
	})
	if err != nil {
		return err
	}
	select {
	case <-stop:
	case <-s.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	return s.Stop(sctx)
}

// receive takes the next free message group, handles what it holds, and
// gives it back when it has nothing more for a moment.
func (cl *client) receive(ctx context.Context, stop <-chan struct{}) error {
	ctx, cancel := untilStop(ctx, stop)
	defer cancel()
	opts := &shardq.ReceiverOptions{Name: cl.cfg.Name, Wait: time.Second, LeaseTTL: leaseTTL,
		MaxAttempts: maxAttempts, BackoffMin: 100 * time.Millisecond, BackoffMax: time.Second, DLQSuffix: dlqSuffix(GroupRecv)}
	for ctx.Err() == nil {
		r, err := cl.c.AcceptNextGroup(ctx, shardq.NextGroupRequest{Tenants: cl.cfg.Tenants, Topic: TopicSessions, ConsumerGroup: GroupRecv}, opts)
		if err != nil {
			if !errors.Is(err, shardq.ErrAcceptTimeout) && !errors.Is(err, shardq.ErrNoReadyGroup) && ctx.Err() == nil {
				cl.log.Warn("chaos: accept failed", "err", err)
				sleep(ctx, 200*time.Millisecond)
			}
			continue
		}
		cl.drainGroup(ctx, r)
		sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		if err := r.Stop(sctx); err != nil {
			cl.log.Warn("chaos: receiver stop", "err", err)
		}
		scancel()
	}
	return nil
}

func (cl *client) drainGroup(ctx context.Context, r *shardq.GroupReceiver) {
	for ctx.Err() == nil {
		rctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		d, err := r.Receive(rctx)
		cancel()
		if err != nil {
			if !errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
				cl.log.Warn("chaos: receive", "key", r.PartitionKey(), "err", err)
			}
			return
		}
		hctx, hcancel := context.WithTimeout(ctx, handlerTimeout)
		e, herr := cl.run(hctx, GroupRecv, d)
		hcancel()
		// Written before the settlement, as a subscriber's handler's is: a
		// kill between a committed ack and its line would hide a delivery.
		// An ack that then fails leaves the message to be delivered again,
		// which the checker explains by the fault that failed it.
		cl.record(e)
		if herr == nil {
			err = r.Ack(ctx, d)
		} else {
			err = r.Nack(ctx, d, herr)
		}
		if err != nil {
			cl.log.Warn("chaos: settle", "key", r.PartitionKey(), "err", err)
			return
		}
	}
}

// untilStop is ctx, cancelled when stop closes.
func untilStop(ctx context.Context, stop <-chan struct{}) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
