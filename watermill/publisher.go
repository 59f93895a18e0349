// SPDX-License-Identifier: Apache-2.0

package shardqwm

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/shardq/shardq"
)

// KeyMetadata is the metadata key whose value the default PartitionKey
// takes as the message's partition key.
const KeyMetadata = "partition_key"

// RouteFunc maps a watermill topic to the shardq tenant and topic it is
// stored in. Publisher and Subscriber of one topic must agree.
type RouteFunc func(topic string) (tenant, shardqTopic string, err error)

// PartitionKeyFunc chooses a message's partition key: messages of one key
// are delivered in order, one at a time per consumer group; "" means
// ungrouped (competing consumers, no order).
type PartitionKeyFunc func(topic string, msg *message.Message) (string, error)

// MetadataOrTopic is the default PartitionKeyFunc: the metadata value
// KeyMetadata when set, else the topic, so that a topic without keys is
// one ordered partition (as watermill-sql orders a topic).
func MetadataOrTopic(topic string, msg *message.Message) (string, error) {
	if k := msg.Metadata.Get(KeyMetadata); k != "" {
		return k, nil
	}
	return topic, nil
}

// Ungrouped is a PartitionKeyFunc that makes every message ungrouped:
// competing consumers take them in parallel, in no particular order
// (SQS standard queues, watermill's non-ordered backends).
func Ungrouped(string, *message.Message) (string, error) { return "", nil }

// PublisherConfig configures a Publisher. Set one of Tenant and Route.
type PublisherConfig struct {
	// Tenant holds every topic: watermill topic T is shardq topic T of
	// this tenant.
	Tenant string
	// Route maps each watermill topic to a tenant and topic instead.
	Route RouteFunc
	// PartitionKey chooses each message's partition key [MetadataOrTopic].
	PartitionKey PartitionKeyFunc
}

// ErrPublisherClosed is returned by Publish after Close.
var ErrPublisherClosed = errors.New("shardqwm: publisher closed")

// Publisher publishes watermill messages through a shardq Client. It does
// not own the client: Close stops this publisher only.
type Publisher struct {
	client *shardq.Client
	route  RouteFunc
	key    PartitionKeyFunc
	log    watermill.LoggerAdapter
	closed atomic.Bool
}

// NewPublisher returns a Publisher on client. logger may be nil.
func NewPublisher(client *shardq.Client, cfg PublisherConfig, logger watermill.LoggerAdapter) (*Publisher, error) {
	if client == nil {
		return nil, fmt.Errorf("shardqwm: NewPublisher: %w", &shardq.ValidationError{Field: "client", Rule: "must not be nil"})
	}
	route, err := routeOf(cfg.Tenant, cfg.Route)
	if err != nil {
		return nil, fmt.Errorf("shardqwm: NewPublisher: %w", err)
	}
	key := cfg.PartitionKey
	if key == nil {
		key = MetadataOrTopic
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	return &Publisher{client: client, route: route, key: key, log: logger}, nil
}

// routeOf is the route of a config: Route, or every topic in tenant.
func routeOf(tenant string, route RouteFunc) (RouteFunc, error) {
	switch {
	case tenant != "" && route != nil:
		return nil, &shardq.ValidationError{Field: "Tenant", Rule: "set one of Tenant and Route, not both"}
	case route != nil:
		return route, nil
	case tenant == "":
		return nil, &shardq.ValidationError{Field: "Tenant", Rule: "must not be empty (or set Route)"}
	}
	return func(topic string) (string, string, error) { return tenant, topic, nil }, nil
}

// Publish stores messages in topic in one transaction: all of them, or
// none. Each message's UUID is its id; one that is stored already (in
// its partition) is not stored again. The first message's context is the
// call's (its deadline, its trace).
//
// Input shardq refuses (an empty or non-UTF-8 metadata key, a value over
// 8 KiB or not UTF-8, more than 64 entries, the reserved keys queue_name
// and shardq-large-*, a non-ASCII topic) fails the call before anything
// is written, naming the message, the key and the rule.
func (p *Publisher) Publish(topic string, messages ...*message.Message) error {
	if p.closed.Load() {
		return ErrPublisherClosed
	}
	if len(messages) == 0 {
		return nil
	}
	tenant, qtopic, err := p.route(topic)
	if err != nil {
		return fmt.Errorf("shardqwm: publish to topic %q: route: %w", topic, err)
	}
	batch := make([]shardq.Message, len(messages))
	for i, m := range messages {
		if _, ok := m.Metadata[shardq.HeaderQueueName]; ok {
			return fmt.Errorf("shardqwm: publish to topic %q: message %q: %w", topic, m.UUID, &shardq.ValidationError{
				Field: fmt.Sprintf("metadata %q", shardq.HeaderQueueName), Rule: "reserved: shardq sets it to the tenant (received messages do not carry it)"})
		}
		key, err := p.key(topic, m)
		if err != nil {
			return fmt.Errorf("shardqwm: publish to topic %q: message %q: partition key: %w", topic, m.UUID, err)
		}
		batch[i] = shardq.Message{Tenant: tenant, Topic: qtopic, PartitionKey: key, ID: m.UUID, Payload: m.Payload, Headers: m.Metadata}
	}
	if _, err := p.client.Publish(messages[0].Context(), batch...); err != nil {
		var me *shardq.MessageError
		if errors.As(err, &me) && me.Index < len(messages) {
			return fmt.Errorf("shardqwm: publish to topic %q: message %q: %w", topic, messages[me.Index].UUID, me.Err)
		}
		return fmt.Errorf("shardqwm: publish %d messages to topic %q: %w", len(messages), topic, err)
	}
	p.log.Trace("shardqwm: published", watermill.LogFields{"topic": topic, "messages": len(messages)})
	return nil
}

// Close makes later Publish calls fail. The client stays open.
func (p *Publisher) Close() error {
	p.closed.Store(true)
	return nil
}
