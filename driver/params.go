// SPDX-License-Identifier: Apache-2.0

package driver

import "time"

// The parameters of the driver's methods that take more than three, one
// struct a method (as River's driver takes them): a call names what it
// passes, and a field added later breaks no caller.

// FetchWithinParams are FetchWithin's.
type FetchWithinParams struct {
	Partition TopicPartition
	After     int64 // messages with offsets greater than this
	Limit     int   // at most this many
	Budget    int64 // at most this many bytes of payload and headers (the first message whatever its size)
}

// AcquireLeaseParams are AcquireLease's.
type AcquireLeaseParams struct {
	Partition PartitionRef
	Owner     string // the member taking it
	Now       time.Time
	TTL       time.Duration // the lease lasts until Now+TTL
}

// ResumeLeaseBelowParams are ResumeLeaseBelow's.
type ResumeLeaseBelowParams struct {
	Lease  Lease
	Offset int64 // resumed while the cursor is below it
	Now    time.Time
	TTL    time.Duration
}

// CommitReceivedParams are CommitReceived's.
type CommitReceivedParams struct {
	Lease   Lease
	Offset  int64 // the cursor moves here (never back)
	Release bool  // free the lease in the same transaction
	Now     time.Time
}

// CommitReceivedKeepParams are CommitReceivedKeep's.
type CommitReceivedKeepParams struct {
	Lease  Lease
	Offset int64
	Owner  string // who keeps the lease
	Now    time.Time
	TTL    time.Duration
}

// SweepLeasesParams are SweepLeases's.
type SweepLeasesParams struct {
	Group       GroupScope
	Owners      []string  // the members whose leases may be freed
	StaleBefore time.Time // a heartbeat older than this is stale
	Now         time.Time
}

// TakeOverMemberParams are TakeOverMember's.
type TakeOverMemberParams struct {
	Group    GroupScope
	Previous []string // earlier incarnations of the static member
	Member   string   // the member taking their leases
	Now      time.Time
	TTL      time.Duration
}

// RecordAttemptParams are RecordAttempt's.
type RecordAttemptParams struct {
	Lease  Lease
	Offset int64
	State  DeliveryState
	Now    time.Time
}

// DeadLetterParams are DeadLetter's.
type DeadLetterParams struct {
	Lease  Lease
	Copy   *InsertMessage // the message copied to the dead-letter topic
	Offset int64          // the cursor moves here
	Now    time.Time
}

// DeleteBatchesParams are DeleteBatches's.
type DeleteBatchesParams struct {
	Tenant string
	Topic  string
	Cuts   []Cut
	Limit  int // the oldest messages of each cut deleted at most
}

// ClaimMessagesParams are ClaimMessages's.
type ClaimMessagesParams struct {
	Group      GroupRef
	Owner      string
	Now        time.Time
	Visibility time.Duration // each claim lasts until Now+Visibility
	Limit      ClaimLimit
}

// RetryClaimParams are RetryClaim's.
type RetryClaimParams struct {
	Claim     Claim
	RetryAt   time.Time // claimable again then
	LastError string
	Now       time.Time
}

// ClaimDeferredParams are ClaimDeferred's.
type ClaimDeferredParams struct {
	Group      GroupRef
	Offsets    []int64
	Owner      string
	Now        time.Time
	Visibility time.Duration
}

// RetentionHeadsParams are RetentionHeads's.
type RetentionHeadsParams struct {
	Tenant string
	Topic  string
	After  []string // resume after the key After[0] when it is not empty
	Limit  int
}

// StaleLeaseKeysParams are StaleLeaseKeys's.
type StaleLeaseKeysParams struct {
	Tenant string
	Topic  string
	Groups []string
	Before time.Time
}

// DeleteGroupParams are DeleteGroup's.
type DeleteGroupParams struct {
	Group     GroupRef
	LiveSince time.Time // a member seen since then is live
	Now       time.Time
	Force     bool // delete while the group is live
}
