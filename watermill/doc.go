// SPDX-License-Identifier: Apache-2.0

// Package shardqwm is a watermill Pub/Sub (message.Publisher and
// message.Subscriber) backed by shardq: switching from watermill-sql, or
// any other watermill backend, is a change of constructor.
//
//	pub, err := shardqwm.NewPublisher(client, shardqwm.PublisherConfig{Tenant: "acme"}, logger)
//	sub, err := shardqwm.NewSubscriber(client, shardqwm.SubscriberConfig{Tenant: "acme", ConsumerGroup: "billing"}, logger)
//
// The mapping:
//
//   - a watermill topic is the shardq topic of the same name in one tenant
//     (Tenant), or in the tenant and topic a Route function chooses;
//   - the partition key (shardq's ordering unit) is the metadata value
//     "partition_key" when set, else the topic: one ordered partition per
//     topic, as watermill-sql orders a topic. PartitionKey replaces this;
//     Ungrouped sends every message to competing consumers;
//   - the message UUID is the shardq message id (an empty UUID gets a
//     UUIDv7), and publishing an id already stored in its partition stores
//     nothing: publishes are idempotent;
//   - metadata are headers, both ways, unchanged; received messages also
//     carry queue_name (the tenant) and, with an OpenTelemetry propagator
//     installed, the trace context;
//   - Ack settles the message; Nack delivers it again after NackDelay,
//     without limit unless MaxAttempts is set (then the message goes to
//     the dead-letter topic, topic + ".dlq", after that many);
//   - every Subscribe call is a member of ConsumerGroup for that topic;
//     Close, or the end of the Subscribe context, gives back the messages
//     not yet acked without counting an attempt.
//
// This package is its own Go module, so that shardq itself does not
// depend on watermill.
package shardqwm
