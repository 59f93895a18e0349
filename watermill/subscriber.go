// SPDX-License-Identifier: Apache-2.0

package shardqwm

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/shardq/shardq"
)

// DefaultConsumerGroup is the consumer group of a SubscriberConfig
// without one: every Subscriber so configured shares one group per topic,
// and each message goes to one of them (as watermill-sql's default group).
const DefaultConsumerGroup = "watermill"

// SubscriberConfig configures a Subscriber. Set one of Tenant and Route.
type SubscriberConfig struct {
	// Tenant and Route as in PublisherConfig: they must map a topic the
	// same way the publisher's do.
	Tenant string
	Route  RouteFunc
	// ConsumerGroup is the shardq consumer group of every Subscribe call
	// [DefaultConsumerGroup]. Subscribers of one group share a topic's
	// messages; each group gets all of them.
	ConsumerGroup string
	// NackDelay is how long a Nacked message waits before it is delivered
	// again [0: at once, as in watermill-sql]. An ordered partition waits
	// with it.
	NackDelay time.Duration
	// MaxAttempts, when set, dead-letters a message (to topic + ".dlq")
	// after that many Nacks or handler timeouts [unlimited: a Nack
	// always redelivers, as in watermill].
	MaxAttempts int
	// MaxLargeBytes bounds the large messages (shardq PublishLarge) a
	// subscription assembles into one watermill message, whose Payload
	// is a byte slice held whole [DefaultMaxLargeBytes]. A larger one is
	// dead-lettered at once (to topic + ".dlq", whole) with an error
	// saying so: no retry would change it, and a raw chunk must never
	// reach a handler. Read such messages with shardq itself (Delivery.Body
	// streams them).
	MaxLargeBytes int64
	// Subscriber tunes the shardq subscriber behind each Subscribe call
	// (batch size, lease and visibility timeouts, Take, the handler
	// timeout, the start position...). Its ConsumerGroup, Topic, Tenants,
	// Handler, BatchHandler and MaxAttempts must be left zero: the fields
	// above set them. The handler timeout runs from when the application
	// takes a message from the channel, not while it waits there.
	Subscriber shardq.SubscriberConfig
}

// DefaultMaxLargeBytes is SubscriberConfig.MaxLargeBytes's default.
const DefaultMaxLargeBytes = 64 << 20

// ErrLargeTooBig is the dead-letter reason of a large message over
// MaxLargeBytes.
var ErrLargeTooBig = errors.New("shardqwm: large message over MaxLargeBytes")

// ErrSubscriberClosed is returned by Subscribe after Close.
var ErrSubscriberClosed = errors.New("shardqwm: subscriber closed")

// errNacked is the failure a Nack records.
var errNacked = errors.New("nacked")

// Subscriber subscribes to topics through a shardq Client. It does not
// own the client: Close stops this subscriber's subscriptions only.
type Subscriber struct {
	client *shardq.Client
	cfg    SubscriberConfig
	route  RouteFunc
	log    watermill.LoggerAdapter

	mu      sync.Mutex
	closed  bool
	closing chan struct{}  // closed by Close
	running sync.WaitGroup // one per subscription
	errs    []error        // stop failures, returned by Close
}

// NewSubscriber returns a Subscriber on client. logger may be nil.
func NewSubscriber(client *shardq.Client, cfg SubscriberConfig, logger watermill.LoggerAdapter) (*Subscriber, error) {
	if client == nil {
		return nil, fmt.Errorf("shardqwm: NewSubscriber: %w", &shardq.ValidationError{Field: "client", Rule: "must not be nil"})
	}
	route, err := routeOf(cfg.Tenant, cfg.Route)
	if err != nil {
		return nil, fmt.Errorf("shardqwm: NewSubscriber: %w", err)
	}
	sc := cfg.Subscriber
	for field, set := range map[string]bool{
		"Subscriber.ConsumerGroup": sc.ConsumerGroup != "", "Subscriber.Topic": sc.Topic != "", "Subscriber.Tenants": sc.Tenants != nil,
		"Subscriber.Handler": sc.Handler != nil, "Subscriber.BatchHandler": sc.BatchHandler != nil, "Subscriber.MaxAttempts": sc.MaxAttempts != 0,
	} {
		if set {
			return nil, fmt.Errorf("shardqwm: NewSubscriber: %w", &shardq.ValidationError{Field: field,
				Rule: "must be left zero: SubscriberConfig's own fields and Subscribe set it"})
		}
	}
	if cfg.NackDelay < 0 {
		return nil, fmt.Errorf("shardqwm: NewSubscriber: %w", &shardq.ValidationError{Field: "NackDelay", Rule: "must not be negative"})
	}
	if cfg.MaxLargeBytes < 0 {
		return nil, fmt.Errorf("shardqwm: NewSubscriber: %w", &shardq.ValidationError{Field: "MaxLargeBytes", Rule: "must not be negative (0: DefaultMaxLargeBytes)"})
	}
	if cfg.MaxAttempts < 0 {
		return nil, fmt.Errorf("shardqwm: NewSubscriber: %w", &shardq.ValidationError{Field: "MaxAttempts", Rule: "must not be negative (0: unlimited)"})
	}
	if t := sc.HandlerTimeout; t < 0 && t != shardq.NoHandlerTimeout {
		return nil, fmt.Errorf("shardqwm: NewSubscriber: %w", &shardq.ValidationError{Field: "Subscriber.HandlerTimeout",
			Rule: fmt.Sprintf("%s is negative; shardq.NoHandlerTimeout (-1ns) means no limit", t)})
	}
	if cfg.ConsumerGroup == "" {
		cfg.ConsumerGroup = DefaultConsumerGroup
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	return &Subscriber{client: client, cfg: cfg, route: route, log: logger, closing: make(chan struct{})}, nil
}

// Subscribe starts a member of the consumer group on topic and returns
// its messages. Each must be acked or nacked; the next message of its
// partition comes after that. The channel closes once the subscription
// has stopped: when ctx ends or Close is called, either of which gives
// back the messages not yet acked, uncounted, to the group's other
// members.
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	tenant, qtopic, err := s.route(topic)
	if err != nil {
		return nil, fmt.Errorf("shardqwm: subscribe to topic %q: route: %w", topic, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrSubscriberClosed
	}
	out := make(chan *message.Message)
	cfg := s.cfg.Subscriber
	h := &handler{out: out, nackDelay: s.cfg.NackDelay, timeout: cfg.HandlerTimeout, maxLarge: cmp.Or(s.cfg.MaxLargeBytes, DefaultMaxLargeBytes)}
	if h.timeout == 0 {
		h.timeout = shardq.DefaultHandlerTimeout
	}
	// The handler timeout runs from the hand-over (handler.handle): a
	// message waiting in the channel for the application to take it is
	// not being handled, and must not time out (and count an attempt, or
	// be dead-lettered) before anybody saw it.
	cfg.HandlerTimeout = shardq.NoHandlerTimeout
	cfg.ConsumerGroup, cfg.Topic, cfg.Tenants, cfg.Handler = s.cfg.ConsumerGroup, qtopic, []string{tenant}, h.handle
	cfg.MaxAttempts = shardq.UnlimitedAttempts
	if s.cfg.MaxAttempts > 0 {
		cfg.MaxAttempts = s.cfg.MaxAttempts
	}
	// The subscription's life is ctx's and Close's, which stop it hard
	// (below): shardq's own watch of ctx would stop it gracefully,
	// waiting for messages that nobody will ack.
	sub, err := s.client.Subscribe(context.Background(), cfg)
	if err != nil {
		return nil, fmt.Errorf("shardqwm: subscribe to topic %q: %w", topic, err)
	}
	fields := watermill.LogFields{"topic": topic, "tenant": tenant, "consumer_group": s.cfg.ConsumerGroup, "member": sub.ID()}
	s.log.Debug("shardqwm: subscribed", fields)
	s.running.Add(1)
	go func() {
		defer s.running.Done()
		select {
		case <-ctx.Done():
		case <-s.closing:
		case <-sub.Done(): // the client was closed
		}
		// A cancelled context stops the member hard: the handlers waiting
		// for an ack return at once, and shardq gives their messages back
		// without counting an attempt; what was acked is committed.
		hard, cancel := context.WithCancel(context.Background())
		cancel()
		if err := sub.Stop(hard); err != nil {
			s.log.Error("shardqwm: stopping a subscription failed", err, fields)
			s.mu.Lock()
			s.errs = append(s.errs, fmt.Errorf("topic %q: %w", topic, err))
			s.mu.Unlock()
		}
		close(out) // every handler has returned: nothing sends any more
		s.log.Debug("shardqwm: subscription stopped", fields)
	}()
	return out, nil
}

// Close stops every subscription, giving back the messages not yet acked,
// and waits until their channels are closed. Later calls return nil.
func (s *Subscriber) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.closing)
	s.mu.Unlock()
	s.running.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.errs) > 0 {
		return fmt.Errorf("shardqwm: close: %w", errors.Join(s.errs...))
	}
	return nil
}

// handler hands shardq deliveries to a subscription's channel and waits
// for their ack.
type handler struct {
	out       chan<- *message.Message
	nackDelay time.Duration
	maxLarge  int64
	timeout   time.Duration // from the hand-over; negative: none
}

func (h *handler) handle(ctx context.Context, d *shardq.Delivery) error {
	payload := d.Payload
	if d.IsLarge() {
		if d.Size > h.maxLarge {
			return shardq.DeadLetter(fmt.Errorf("%w: message %q of tenant %q topic %q is %d bytes, MaxLargeBytes %d",
				ErrLargeTooBig, d.ID, d.Tenant, d.Topic, d.Size, h.maxLarge))
		}
		var err error
		if payload, err = io.ReadAll(io.LimitReader(d.Body(), h.maxLarge+1)); err != nil {
			return fmt.Errorf("shardqwm: read large message %q: %w", d.ID, err) // counted, retried; ErrLargeCorrupt among them
		}
	}
	msg := message.NewMessage(d.ID, payload)
	msg.Metadata = make(message.Metadata, len(d.Headers))
	maps.Copy(msg.Metadata, d.Headers)
	delete(msg.Metadata, shardq.HeaderQueueName) // the tenant: the topic's route says it
	// The message's context is the handler's (it carries the process
	// span): it ends once the message is settled, when the subscription
	// stops, or at the handler timeout.
	mctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	msg.SetContext(mctx)
	select {
	case h.out <- msg:
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	if h.timeout > 0 {
		t := time.AfterFunc(h.timeout, func() { cancel(shardq.ErrHandlerTimeout) })
		defer t.Stop()
	}
	select {
	case <-msg.Acked():
		return nil
	case <-msg.Nacked():
		return shardq.RetryAfter(h.nackDelay, errNacked)
	case <-mctx.Done(): // stopped, lease lost, or the handler timeout
		if ctx.Err() == nil && errors.Is(context.Cause(mctx), shardq.ErrHandlerTimeout) {
			return fmt.Errorf("%w after %s", shardq.ErrHandlerTimeout, h.timeout)
		}
		return context.Cause(ctx)
	}
}
