// SPDX-License-Identifier: Apache-2.0

package shardq

import (
	"time"

	"github.com/shardq/shardq/driver"
)

// The operator API's own types: what Admin takes and returns, independent
// of the driver's.

// Scope selects tenants for an operator's listing: Tenants, or every tenant
// with AllTenants. Exactly one must be given; nothing falls back to all.
// Every listing is a page: at most Limit rows (DefaultPageLimit when 0,
// at most MaxPageLimit), after the sort key After (each listing names its
// sort key; pass the last row's values to read the next page).
type Scope struct {
	Tenants    []string
	AllTenants bool
	Limit      int
	After      []string
}

func (s Scope) toDriver() driver.Scope {
	return driver.Scope{Tenants: s.Tenants, AllTenants: s.AllTenants, Limit: s.Limit, After: s.After}
}

// MessageRef names a message by its full identity.
type MessageRef struct {
	Tenant, Topic, PartitionKey, ID string
}

func (r MessageRef) toDriver() driver.MessageRef {
	return driver.MessageRef{Tenant: r.Tenant, Topic: r.Topic, PartitionKey: r.PartitionKey, ID: r.ID}
}

// StoredMessage is a message as stored.
type StoredMessage struct {
	Tenant, Topic, PartitionKey, ID string
	Offset                          int64
	Headers                         map[string]string
	Payload                         []byte
	CreatedAt                       time.Time
	NotBefore                       time.Time // scheduled: not delivered before then (zero: at once)
}

func storedMessage(m driver.Message) StoredMessage {
	return StoredMessage{Tenant: m.Tenant, Topic: m.Topic, PartitionKey: m.PartitionKey, ID: m.ID, Offset: m.Offset,
		Headers: m.Headers, Payload: m.Payload, CreatedAt: m.CreatedAt, NotBefore: m.NotBefore}
}

// DeliveryState is a consumer group's retry bookkeeping of one message.
type DeliveryState struct {
	Attempts      int
	NextAttemptAt time.Time
	LastError     string
}

// TopicInfo is one topic of one tenant.
type TopicInfo struct {
	Tenant, Topic string
	Partitions    int
	HeadOffset    int64 // the highest head among its partitions
}

// GroupOffset is one consumer group's position in one partition.
type GroupOffset struct {
	Tenant, Topic, PartitionKey, ConsumerGroup string
	HeadOffset, CommittedOffset                int64
	// Lag counts the messages after the cursor, up to LagCountLimit;
	// LagCapped says there are more.
	Lag              int64
	LagCapped        bool
	Scheduled        int64     // of those, delayed past now (Message.NotBefore)
	OldestUnconsumed time.Time // the first unconsumed message's; zero when Lag is 0
	// NoCursor: the group has not committed in this partition yet;
	// CommittedOffset is where it starts (its start position).
	NoCursor bool
	// Deferred counts the group's deferred messages in the partition
	// (Delivery.Defer): below the cursor, so outside Lag.
	Deferred int64
}

// LagCountLimit bounds the messages an offset report counts per cursor.
const LagCountLimit = 10_000 // the driver counts up to driver.LagCountLimit, the same (TestLagCountLimit)

// Lease is one partition lease row: free when Owner is "".
type Lease struct {
	Tenant, ConsumerGroup, Topic, PartitionKey string
	Owner                                      string // a member's identity (Name#suffix)
	Token                                      int64
	ExpiresAt                                  time.Time
}

// Member is one group member's heartbeat row.
type Member struct {
	Tenant, ConsumerGroup, Topic string
	ID                           string // the member's identity (Name#suffix)
	StartedAt, HeartbeatAt       time.Time
}

// PendingHalf is a transactional half message awaiting its outcome.
type PendingHalf struct {
	HalfMessage
	NextCheckAt time.Time
	ClaimOwner  string // the producer checking it now ("" when none)
	// Overdue says its check is more than HalfOverdueAfter late and no
	// producer has claimed it: no producer of its group seems to run.
	Overdue bool
}

func mapSlice[T, U any](in []T, f func(T) U) []U {
	if in == nil {
		return nil
	}
	out := make([]U, len(in))
	for i, v := range in {
		out[i] = f(v)
	}
	return out
}
