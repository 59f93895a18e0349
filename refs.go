// SPDX-License-Identifier: Apache-2.0

package shardq

import (
	"context"
	"time"
)

// Calls that name three or more things take them as one of these
// structs, so that a swapped pair of strings cannot compile into a call
// on the wrong topic or group.

// GroupRef names a consumer group's reading of one tenant's topic.
type GroupRef struct {
	Tenant, Topic, ConsumerGroup string
}

// TopicRef names one tenant's topic.
type TopicRef struct {
	Tenant, Topic string
}

// NextGroupRequest says where AcceptNextGroup looks for a free message
// group: Topic in Tenants (SHARDQ_TENANTS when empty), for ConsumerGroup.
type NextGroupRequest struct {
	Tenants              []string
	Topic, ConsumerGroup string
}

// NackOptions say when a nacked message is delivered again and why it
// failed.
type NackOptions struct {
	// RetryAfter is the wait before the message is delivered again, 0 to
	// MaxVisibility.
	RetryAfter time.Duration
	// Reason is recorded as the attempt's error and, after the last
	// attempt, as the dead letter's dlq_last_error ["nacked"].
	Reason string
}

// DeleteGroupOptions guard Admin.DeleteGroup.
type DeleteGroupOptions struct {
	// StaleAfter is how long a member may be silent and still count as
	// live [three DefaultHeartbeatIntervals].
	StaleAfter time.Duration
	// Force deletes the group even while it has live members.
	Force bool
}

// DeadLetterRequest selects the dead letters of Topic (whose dead-letter
// topic is Topic + Suffix, DefaultDLQSuffix when empty) in Scope's
// tenants, one page at a time.
type DeadLetterRequest struct {
	Scope         Scope
	Topic, Suffix string
}

// PauseRequest names a consumer group's reading of a topic in Scope's
// tenants, for PauseGroup and ResumeGroup.
type PauseRequest struct {
	Scope                Scope
	Topic, ConsumerGroup string
}

// Handle is how every running part a Client starts stops: Subscriber,
// GroupReceiver, Producer, TransactionProducer and Cleaner. Stop ends it, letting
// work in flight finish until ctx ends, and is safe to call more than
// once; Done is closed once it has stopped (by Stop, by Client.Close, or
// on its own: a subscriber whose context ended, a receiver that lost its
// group).
type Handle interface {
	Stop(ctx context.Context) error
	Done() <-chan struct{}
}

var (
	_ Handle = (*Subscriber)(nil)
	_ Handle = (*GroupReceiver)(nil)
	_ Handle = (*Cleaner)(nil)
	_ Handle = (*TransactionProducer)(nil)
)
