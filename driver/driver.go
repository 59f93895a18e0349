// SPDX-License-Identifier: Apache-2.0

// Package driver is the contract between shardq and a database. It speaks in
// the queue's terms (append messages, fetch after a cursor, list partitions
// with work) so that the root package holds no SQL. Each database has its own
// package (mysqldriver, sqlitedriver) with its SQL and embedded migrations,
// and every driver passes the conformance suite in drivertest unchanged.
//
// Drivers receive input that the root package has already validated; they
// do not validate again.
package driver

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
)

// ErrSchemaNewer is returned when the database was migrated by a newer
// shardq than this one: its schema version is above the latest this
// binary embeds.
var ErrSchemaNewer = errors.New("database schema is newer than this shardq")

// ErrNotMigrated is returned when the queue's tables are missing.
var ErrNotMigrated = errors.New("database schema is not migrated: run `shardq migrate` (or Client.Migrate)")

// DBTX is the part of *sql.DB, *sql.Conn and *sql.Tx that drivers use
// (and of PreparedTx, which wraps a caller's transaction).
type DBTX interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// Tx is a write transaction the driver began (BeginWrite): its caller
// commits or rolls it back. *sql.Tx is one.
type Tx interface {
	DBTX
	PrepareContext(ctx context.Context, query string) (*sql.Stmt, error)
	Commit() error
	Rollback() error
}

// TxSettler settles deliveries inside a transaction of the caller's on
// the driver's database (Driver.InTx): each fences as its counterpart in
// its own transaction does, and holds the fence's lock until the
// transaction ends; nothing is committed unless the transaction is, and
// on an error the caller rolls it back (part of it may have run).
type TxSettler interface {
	// CommitOffset is Leases.CommitOffset in the transaction.
	CommitOffset(ctx context.Context, l Lease, offset int64, now time.Time) error
	// DeferOffset is CommitOffset for the message at offset that is
	// being deferred: it fails with ErrPastHead past the partition's head
	// and with ErrSettled when the cursor is at or past offset already.
	DeferOffset(ctx context.Context, l Lease, offset int64, now time.Time) error
	// AckClaims is Groups.AckClaims in the transaction.
	AckClaims(ctx context.Context, cs []Claim, now time.Time) error
	// Defer records m as deferred for group, in the transaction that also
	// settles m under its lease or claim (DeferOffset, AckClaims); a
	// message deferred already stays as it is.
	Defer(ctx context.Context, group string, m Message, now time.Time) error
	// AckDeferred is Deferrals.AckDeferred in the transaction.
	AckDeferred(ctx context.Context, cs []Claim, now time.Time) error
}

// InsertMessage is one message to append. The driver sets Offset and
// Duplicate: a message whose (tenant, topic, partition key, id) is already
// stored, or appears earlier in the same call, is not stored again and gets
// the stored offset with Duplicate set.
type InsertMessage struct {
	Tenant       string
	Topic        string
	PartitionKey string
	ID           string
	Headers      map[string]string
	Payload      []byte
	CreatedAt    time.Time // UTC, microsecond precision
	// NotBefore delays delivery until then (zero: none); UTC, microsecond
	// precision.
	NotBefore time.Time

	Offset    int64
	Duplicate bool
}

// Message is a stored message.
type Message struct {
	Tenant       string
	Topic        string
	PartitionKey string
	ID           string
	Offset       int64
	Headers      map[string]string
	Payload      []byte
	CreatedAt    time.Time
	NotBefore    time.Time // delivery waits until then (zero: none)
}

// Partition is one partition's head and, where a consumer group was named,
// that group's committed cursor (0 when it has none). A group has work in a
// partition when HeadOffset > CommittedOffset.
type Partition struct {
	Tenant          string
	Topic           string
	PartitionKey    string
	HeadOffset      int64
	CommittedOffset int64
}

// Driver is a database holding the queue's tables.
type Driver interface {
	// Name is the database's short name ("mysql", "sqlite").
	Name() string
	// DB is the pool the driver uses; PublishTx callers begin their
	// transactions on it (or on another pool to the same database).
	DB() *sql.DB
	// Close closes the pool if the driver opened it.
	Close() error

	// Migrate applies the embedded migrations that are not applied yet and
	// returns the versions it applied. It is safe to run from several
	// processes at once.
	Migrate(ctx context.Context) (applied []int, err error)
	// SchemaVersion reports the highest applied and the highest embedded
	// migration versions.
	SchemaVersion(ctx context.Context) (current, latest int, err error)
	// SchemaCompatible returns an error wrapping ErrSchemaNewer when the
	// database was migrated past what the driver embeds by a migration
	// that is not additive (a contract migration); nil otherwise.
	SchemaCompatible(ctx context.Context) error

	// BeginWrite starts a transaction suited to InsertMessages (SQLite:
	// BEGIN IMMEDIATE; MySQL: READ COMMITTED).
	BeginWrite(ctx context.Context) (Tx, error)
	// InTx settles deliveries inside tx, the caller's transaction on the
	// driver's database (a *sql.Tx, or BeginWrite's).
	InTx(tx DBTX) TxSettler
	// InsertMessages appends msgs inside tx, which the caller commits or
	// rolls back. Within one partition, offsets become visible in increasing
	// order: a message committed later never gets a lower offset than one
	// committed earlier (invariant 2 of docs/design.md). A ctx marked
	// Rerunnable allows faster paths that may, rarely, deadlock.
	InsertMessages(ctx context.Context, tx DBTX, msgs []*InsertMessage) error
	// Retryable reports whether a failed write transaction may simply be run
	// again (deadlock, busy database).
	Retryable(err error) bool

	// FetchAfter returns up to limit messages of one partition with offsets
	// greater than after, in offset order.
	FetchAfter(ctx context.Context, p TopicPartition, after int64, limit int) ([]Message, error)
	// FetchWithin reads what FetchAfter would, but no more than Budget
	// bytes of payload and headers (the first message whatever its
	// size); the messages are sized in the database before their bodies
	// are read. truncated reports a message the budget left out.
	FetchWithin(ctx context.Context, p FetchWithinParams) (msgs []Message, truncated bool, err error)
	// CountBetween counts one partition's messages with offsets greater
	// than after and at most upTo: whether a large message's chunks are
	// all that lies between its chunk 0 and its end marker.
	CountBetween(ctx context.Context, p TopicPartition, after, upTo int64) (int64, error)
	// PartitionsWithWork lists the partitions of topic, in the given tenants
	// only, whose head is past the consumer group's committed cursor.
	PartitionsWithWork(ctx context.Context, g GroupScope) ([]Partition, error)
	// PartitionsMovedSince is PartitionsWithWork of the partitions whose
	// head moved at or after since, by the publishers' clocks (an index
	// serves it: its cost follows what moved), in no particular order.
	PartitionsMovedSince(ctx context.Context, g GroupScope, since time.Time) ([]Partition, error)
	// PartitionsWithWorkOf is PartitionsWithWork of the partitions named
	// by each of tenants with each of keys, in no particular order.
	PartitionsWithWorkOf(ctx context.Context, g GroupScope, keys []string) ([]Partition, error)
	// PartitionHeads lists every partition of topic in the given tenants
	// with its head offset (CommittedOffset is 0).
	PartitionHeads(ctx context.Context, tenants []string, topic string) ([]Partition, error)
	// TenantsWithPartitions lists those of tenants that have a head row
	// in topic (one statement): the tenants discovery's sweep reads.
	TenantsWithPartitions(ctx context.Context, tenants []string, topic string) ([]string, error)
	// HeadsPage reads up to limit head rows of one tenant's topic in key
	// order, after the key after[0] when after is not empty, each with the
	// group's position (cursor, else start): drained ones included.
	HeadsPage(ctx context.Context, g GroupRef, after []string, limit int) ([]Partition, error)
	// HeadsOf reads the head offsets of topic's partitions named by each
	// of tenants with each of keys (absent: no such partition), in one
	// statement for up to 500 keys.
	HeadsOf(ctx context.Context, topic string, tenants, keys []string) (map[HeadKey]int64, error)
	// ResetOffset sets a consumer group's cursor for one partition: an
	// operator's tool. In the same transaction it fences the partition's
	// lease (frees it with the next token), so a live holder's next write
	// fails with ErrLeaseLost instead of committing over the reset.
	ResetOffset(ctx context.Context, p PartitionRef, offset int64) error

	Leases
	Deliveries
	Groups
	Deferrals
	Lifecycle
	HalfMessages
	Admin
	Tokens
}

// Errors of the lease protocol.
var (
	// ErrLeaseLost means the lease's token is no longer current: another
	// subscriber took the partition, or the lease was released or swept.
	// The write that returned it changed nothing.
	ErrLeaseLost = errors.New("lease lost")
	// ErrLeaseHeld means another subscriber holds an unexpired lease.
	ErrLeaseHeld = errors.New("lease held by another subscriber")
	// ErrPastHead means a commit named an offset past its partition's
	// head: it would skip every message published up to it. Nothing
	// changed.
	ErrPastHead = errors.New("offset past the partition's head")
	// ErrSettled means the message a write named was settled already
	// (the cursor passed it): nothing changed.
	ErrSettled = errors.New("message settled already")
)

// HeadKey names a partition of a topic known from context.
type HeadKey struct{ Tenant, PartitionKey string }

// Methods that name three or more things take them as one of these
// structs, so that a swapped pair of strings cannot compile.

// TopicPartition names one partition of one tenant's topic.
type TopicPartition struct {
	Tenant, Topic, PartitionKey string
}

// GroupRef names a consumer group's reading of one tenant's topic.
type GroupRef struct {
	Tenant, Topic, ConsumerGroup string
}

// GroupScope names a consumer group's reading of a topic in some tenants.
type GroupScope struct {
	Tenants              []string
	Topic, ConsumerGroup string
}

// RemovePartitionsRequest names the drained partitions RemovePartitions
// may remove: PartitionKeys of one tenant's topic whose head is idle since
// before IdleBefore and that no lease of ConsumerGroups holds unexpired
// at Now.
type RemovePartitionsRequest struct {
	Tenant, Topic   string
	ConsumerGroups  []string
	PartitionKeys   []string
	IdleBefore, Now time.Time
}

// HalfClaimRequest is a transaction producer's claim of due half
// messages: up to Limit of ProducerGroup in Tenants, for Owner, each
// claimed until Now + ClaimTTL.
type HalfClaimRequest struct {
	Tenants              []string
	ProducerGroup, Owner string
	Now                  time.Time
	ClaimTTL             time.Duration
	Limit                int
}

// Migration is one versioned schema change a driver embeds: the
// statements Migrate runs, in order (shardq migrate --print-sql shows
// them for review).
type Migration struct {
	Version    int
	Name       string
	Statements []string
}

type rerunnableKey struct{}

// Rerunnable marks ctx as that of a transaction its caller runs again
// when the database reports a deadlock (shardq's own Publish does), so
// that InsertMessages may take locks in an order that can, rarely,
// deadlock.
func Rerunnable(ctx context.Context) context.Context {
	return context.WithValue(ctx, rerunnableKey{}, true)
}

// IsRerunnable reports whether ctx was marked by Rerunnable.
func IsRerunnable(ctx context.Context) bool {
	v, _ := ctx.Value(rerunnableKey{}).(bool)
	return v
}

// OffsetCommit is a cursor to commit under a lease.
type OffsetCommit struct {
	Lease  Lease
	Offset int64
}

// PartitionRef names one partition as one consumer group reads it.
type PartitionRef struct {
	Tenant        string
	ConsumerGroup string
	Topic         string
	PartitionKey  string
}

// Compare orders partitions by tenant, topic, group and key, the order in
// which a transaction that locks several of their rows takes them.
func (p PartitionRef) Compare(q PartitionRef) int {
	return cmp.Or(strings.Compare(p.Tenant, q.Tenant), strings.Compare(p.Topic, q.Topic),
		strings.Compare(p.ConsumerGroup, q.ConsumerGroup), strings.Compare(p.PartitionKey, q.PartitionKey))
}

func (p PartitionRef) String() string {
	return fmt.Sprintf("tenant %q topic %q partition %q group %q", p.Tenant, p.Topic, p.PartitionKey, p.ConsumerGroup)
}

// Lease is the exclusive right of Owner to deliver a partition to its
// group. Token grows with every acquisition; writes made under the lease
// name it and fail with ErrLeaseLost once it is no longer current.
type Lease struct {
	PartitionRef
	Owner     string
	Token     int64
	ExpiresAt time.Time
	// Committed is the group's cursor when the lease was acquired: read in
	// the acquiring transaction, so it includes the previous owner's last
	// commit (set by AcquireLease only).
	Committed int64
}

// ClaimLimit bounds one ClaimMessages: at most Messages messages and,
// when Bytes > 0, no message past the one that reaches Bytes of payload
// and headers (the first is always claimed).
type ClaimLimit struct {
	Messages int
	Bytes    int64
}

// LeaseHeldError reports who holds a partition (errors.Is ErrLeaseHeld).
type LeaseHeldError struct {
	Partition PartitionRef
	Owner     string
	ExpiresAt time.Time
}

func (e *LeaseHeldError) Error() string {
	return fmt.Sprintf("%s: held by %q until %s", e.Partition, e.Owner, e.ExpiresAt.Format(time.RFC3339Nano))
}
func (e *LeaseHeldError) Is(target error) bool { return target == ErrLeaseHeld }

// Subscriber is one heartbeat row.
type Subscriber struct {
	Tenant        string
	ConsumerGroup string
	Topic         string
	Name          string
	StartedAt     time.Time
	HeartbeatAt   time.Time
}

// Leases is the lease protocol: the part of a driver the subscriber
// runtime uses. Every time is the caller's clock (injected in tests).
type Leases interface {
	// AcquireLease takes the Partition for Owner when it is free,
	// expired, or already Owner's, with a new token, until Now+TTL;
	// otherwise *LeaseHeldError.
	AcquireLease(ctx context.Context, p AcquireLeaseParams) (Lease, error)
	// RenewLease extends l to now+ttl, or returns ErrLeaseLost.
	RenewLease(ctx context.Context, l Lease, now time.Time, ttl time.Duration) (Lease, error)
	// RenewLeases extends the leases of one owner in one group and topic
	// in one transaction; it returns those renewed and those lost.
	RenewLeases(ctx context.Context, ls []Lease, now time.Time, ttl time.Duration) (renewed, lost []Lease, err error)
	// ResumeLease extends l to now+ttl while its token and owner are
	// current, expired or not (a receipt's holder keeps its lease until
	// another takes it, as its acks do), and reads the group's cursor into
	// the Lease it returns; otherwise ErrLeaseLost.
	ResumeLease(ctx context.Context, l Lease, now time.Time, ttl time.Duration) (Lease, error)
	// ResumeLeaseBelow is ResumeLease when the group's cursor is below
	// Offset; at or past it, the lease is left as it is (its expiry too)
	// and returned with the cursor. The two happen in one transaction.
	ResumeLeaseBelow(ctx context.Context, p ResumeLeaseBelowParams) (Lease, error)
	// ExpireLeases ends now the leases owner holds in g, leaving them in
	// its name (a static member stopping, for its next process to take
	// over), and returns how many.
	ExpireLeases(ctx context.Context, g GroupScope, owner string, now time.Time) (int64, error)
	// ReleaseLease frees l, or returns ErrLeaseLost.
	ReleaseLease(ctx context.Context, l Lease, now time.Time) error
	// CommitOffset moves l's group cursor forward to offset (never back)
	// and drops the retry bookkeeping of the messages it passed, or
	// returns ErrLeaseLost and changes nothing.
	CommitOffset(ctx context.Context, l Lease, offset int64, now time.Time) error
	// CommitOffsets commits several leases' cursors in one transaction,
	// each as CommitOffset does; when any lease is lost it changes nothing
	// and returns ErrLeaseLost (the caller then commits them one by one).
	CommitOffsets(ctx context.Context, cs []OffsetCommit, now time.Time) error
	// CommitReceived is CommitOffset for an offset a client named (a
	// receipt): it returns ErrPastHead, changing nothing, when Offset is
	// past the partition's head, read in the fencing statement. With
	// Release it frees the lease in the same transaction (a receive's
	// last ack).
	CommitReceived(ctx context.Context, p CommitReceivedParams) error
	// CommitReceivedKeep is CommitReceived with Release, except that
	// while the partition's head is past Offset it gives the lease to
	// Owner under the next token until Now+TTL instead of freeing it, in
	// the same transaction (a receive that acks a group's last message
	// goes on with the group). kept says which; a kept lease's Committed
	// is Offset.
	CommitReceivedKeep(ctx context.Context, p CommitReceivedKeepParams) (next Lease, kept bool, err error)
	// ListLeases lists the lease rows of group on topic in tenants,
	// free ones (Owner "") included.
	ListLeases(ctx context.Context, g GroupScope) ([]Lease, error)
	// HeldLeases is ListLeases without the free rows (an index serves it:
	// its cost follows the leases held).
	HeldLeases(ctx context.Context, g GroupScope) ([]Lease, error)
	// SweepLeases frees every lease acquired before Now and held by one
	// of Owners (dead subscribers) whose heartbeat row in the lease's
	// tenant is older than StaleBefore or gone, checked in the same
	// statement, one per tenant; each token advances so their writes fail.
	SweepLeases(ctx context.Context, p SweepLeasesParams) (int64, error)
	// TakeOverMember gives Member, in one transaction per tenant, the
	// leases that one of Previous (earlier incarnations of a static
	// member, SubscriberConfig.InstanceID) holds, each with the next
	// token (so their writes fail) until Now+TTL, and replaces their
	// heartbeat rows with Member's. It returns the leases it moved, each
	// with the expiry its earlier holder knew (until which that holder
	// may still hand out messages).
	TakeOverMember(ctx context.Context, p TakeOverMemberParams) ([]Lease, error)

	// Heartbeat records that subscriber is alive, once per tenant.
	Heartbeat(ctx context.Context, g GroupScope, subscriber string, now time.Time) error
	// RefreshHeartbeat is Heartbeat of the rows subscriber has, adding
	// none; it returns how many it refreshed.
	RefreshHeartbeat(ctx context.Context, g GroupScope, subscriber string, now time.Time) (int64, error)
	// RemoveHeartbeat deletes subscriber's rows.
	RemoveHeartbeat(ctx context.Context, g GroupScope, subscriber string) error
	// Subscribers lists the heartbeat rows of group on topic in tenants.
	Subscribers(ctx context.Context, g GroupScope) ([]Subscriber, error)
}

// DeliveryState is the retry bookkeeping of one message for one group.
type DeliveryState struct {
	Attempts      int
	NextAttemptAt time.Time
	LastError     string
}

// Deliveries is the retry and dead-letter part of the lease protocol.
// Writes are fenced like CommitOffset.
type Deliveries interface {
	// RecordAttempt stores a failed attempt of the message at Offset.
	RecordAttempt(ctx context.Context, p RecordAttemptParams) error
	// DeliveryStates reads the bookkeeping of the messages with offsets in
	// (after, upTo], keyed by offset; messages without any are absent.
	DeliveryStates(ctx context.Context, p PartitionRef, after, upTo int64) (map[int64]DeliveryState, error)
	// DeadLetter appends Copy (the message copied to the dead-letter
	// topic), drops the message's bookkeeping and moves the cursor to
	// Offset, in one transaction.
	DeadLetter(ctx context.Context, p DeadLetterParams) error
}

// ErrHalfResolved means a half message is no longer pending: it was
// committed, rolled back or dead-lettered already.
var ErrHalfResolved = errors.New("half message already resolved")

// MessageRef names a message by its full identity.
type MessageRef struct {
	Tenant       string
	Topic        string
	PartitionKey string
	ID           string
}

// HalfMessage is a transactional message that no consumer can see yet.
type HalfMessage struct {
	InsertMessage
	ProducerGroup string
	Checks        int       // check-backs that answered "unknown"
	NextCheckAt   time.Time // when the next check-back is due
	ClaimOwner    string    // the producer checking it now ("" when none)
	ClaimToken    int64     // grows with every claim; fences the claim's writes
}

// Ref is h's identity.
func (h *HalfMessage) Ref() MessageRef {
	return MessageRef{Tenant: h.Tenant, Topic: h.Topic, PartitionKey: h.PartitionKey, ID: h.ID}
}

// HalfCommit is a half message to commit (CommitHalves).
type HalfCommit struct {
	Ref        MessageRef
	ClaimToken int64
	Message    *InsertMessage // as it entered its partition; set once committed
}

// HalfMessages stores transactional sends. A claim token of 0 means an
// unclaimed resolution (the sender's own, or an operator's); a positive one
// must still be current (ErrLeaseLost otherwise).
type HalfMessages interface {
	// InsertHalf stores h, due for its first check at h.NextCheckAt.
	InsertHalf(ctx context.Context, h *HalfMessage) error
	// CommitHalves deletes the half messages of hs, all of one tenant,
	// and appends them to their partitions with fresh offsets, in the
	// order of hs, in one transaction: all or none. ErrHalfResolved when
	// one is pending no more.
	CommitHalves(ctx context.Context, hs []*HalfCommit) error
	// RollbackHalf deletes the half message; ErrHalfResolved when it is
	// pending no more.
	RollbackHalf(ctx context.Context, ref MessageRef, claimToken int64) error
	// ClaimDueHalves claims up to limit half messages of group in tenants
	// whose check is due and that nobody else is checking.
	ClaimDueHalves(ctx context.Context, r HalfClaimRequest) ([]HalfMessage, error)
	// RescheduleHalf counts an "unknown" check and releases the claim.
	RescheduleHalf(ctx context.Context, h HalfMessage, nextCheckAt time.Time) error
	// DeadLetterHalf moves a claimed half message to queue_half_messages_dead.
	DeadLetterHalf(ctx context.Context, h HalfMessage, now time.Time) error
	// ListHalves lists a page of the pending half messages of s (every
	// tenant only when an operator asked for all). Sort key: (tenant,
	// topic, partition key, id).
	ListHalves(ctx context.Context, s Scope) ([]HalfMessage, error)
}

// LockBounded is a driver whose server ends a transaction left idle (a
// frozen process's, holding its row locks) after IdleTransaction, and
// fails a statement's wait for a row lock after LockWait: together, how
// long a frozen member can hold up another's lease renewals (docs/leases.md,
// "Bounded waits"). Zero when the driver does not know them; negative
// when the session sets none.
type LockBounded interface {
	LockBounds() (idleTransaction, lockWait time.Duration)
}

// Logged is a driver with log lines of its own (its database library's,
// its change feed's): shardq.NewClient sends them to the client's logger.
type Logged interface {
	UseLogger(l *slog.Logger)
}

// Scope selects tenants for an operator's listing: an explicit list, or
// every tenant when AllTenants is set. Neither is never "all".
type Scope struct {
	Tenants    []string
	AllTenants bool
	// Limit bounds one page of a listing (0: no bound). After, when set,
	// starts the page after a sort key: the values of the listing's sort
	// columns (its doc names them) in the last row of the previous page.
	Limit int
	After []string
}

// TopicSummary is one topic of one tenant.
type TopicSummary struct {
	Tenant     string
	Topic      string
	Partitions int
	HeadOffset int64 // highest head among its partitions
}

// OffsetRow is one consumer group's position in one partition.
type OffsetRow struct {
	Tenant, Topic, PartitionKey, ConsumerGroup string
	HeadOffset, CommittedOffset                int64
	// Lag counts the messages after the cursor, up to LagCountLimit;
	// LagCapped says there are more.
	Lag       int64
	LagCapped bool
	// Scheduled counts those of the Lag messages delayed past now
	// (Message.NotBefore).
	Scheduled        int64
	OldestUnconsumed time.Time // the first unconsumed message's; zero when Lag is 0
	CommittedAt      time.Time // when the cursor last moved
	// NoCursor: the group has not committed in this partition yet, and
	// CommittedOffset is where it starts (its registry row's start).
	NoCursor bool
	// Deferred counts the group's deferred messages in the partition
	// (below the cursor, outside Lag).
	Deferred int64
}

// PartitionLag is a partition's backlog after a cursor.
type PartitionLag struct {
	Lag              int64
	Capped           bool
	OldestUnconsumed time.Time // zero when Lag is 0
}

// LagCountLimit bounds the messages an offset report counts per cursor:
// a report reads at most this many rows of each partition.
const LagCountLimit = 10000

// Cursor is one consumer group's committed offset in one partition.
type Cursor struct {
	ConsumerGroup, PartitionKey string
	Committed                   int64
}

// Admin is what operators' tools read and change, each statement scoped
// by tenant (or, for listings, explicitly by all tenants).
type Admin interface {
	// Listings are pages of s (Limit, After), each in the order of its
	// sort key. Topics: (tenant, topic).
	Topics(ctx context.Context, s Scope) ([]TopicSummary, error)
	// OffsetReport lists cursors of every group known in queue_offsets
	// (only group when it is not empty) with lag (counted up to
	// LagCountLimit). Sort key: (tenant, topic, group, partition key).
	OffsetReport(ctx context.Context, s Scope, group string) ([]OffsetRow, error)
	// PartitionLag counts the messages of one partition after offset
	// after (up to LagCountLimit: Capped says there are more), with the
	// first one's time: what the lag metrics read for a partition with
	// work.
	PartitionLag(ctx context.Context, p TopicPartition, after int64) (PartitionLag, error)
	// TopicCursors lists every group's cursor in one tenant's topic: what
	// retention and offset resets need, without counting messages.
	TopicCursors(ctx context.Context, tenant, topic string) ([]Cursor, error)
	// AllLeases: sort key (tenant, group, topic, partition key).
	AllLeases(ctx context.Context, s Scope) ([]Lease, error)
	// AllSubscribers: sort key (tenant, group, topic, subscriber name).
	AllSubscribers(ctx context.Context, s Scope) ([]Subscriber, error)
	// GetMessage reads one message and its retry bookkeeping per group.
	GetMessage(ctx context.Context, ref MessageRef) (*Message, map[string]DeliveryState, error)
	// DeleteMessage deletes one message by full identity.
	DeleteMessage(ctx context.Context, ref MessageRef) (bool, error)
	// TopicMessages lists a page of topic's messages in s. Sort key:
	// (tenant, offset).
	TopicMessages(ctx context.Context, s Scope, topic string) ([]Message, error)
	// Requeue moves the message ref (in a dead-letter topic) back to
	// toTopic, same tenant and partition key, with a fresh offset, in one
	// transaction; the original's retry bookkeeping is dropped.
	Requeue(ctx context.Context, ref MessageRef, toTopic string, headers map[string]string) (*InsertMessage, error)
	// OffsetBefore is the highest offset of the partition created before t
	// (0 when none).
	OffsetBefore(ctx context.Context, p TopicPartition, t time.Time) (int64, error)
	// DeleteBatches deletes, in one transaction, up to Limit of the oldest
	// messages of each cut, one statement a cut, and returns how many each
	// deleted.
	DeleteBatches(ctx context.Context, p DeleteBatchesParams) ([]int64, error)
	// TenantRows counts the tenant's rows in each table that holds any
	// of a tenant's.
	TenantRows(ctx context.Context, tenant string) ([]TableRows, error)
	// DeleteTenantBatch deletes up to limit of the tenant's rows from one
	// table (the first, in the driver's order, that has any) and reports
	// which and how many; 0 rows means the tenant has none left.
	DeleteTenantBatch(ctx context.Context, tenant string, limit int) (table string, rows int64, err error)
	// TenantLive lists the tenant's members with a heartbeat since since
	// and counts its leases unexpired at now.
	TenantLive(ctx context.Context, tenant string, since, now time.Time) (members []string, leases int, err error)
	// TenantSettings reads the settings rows of those of tenants that
	// have one.
	TenantSettings(ctx context.Context, tenants []string) ([]TenantSettings, error)
	// SetTenantSuspended sets (at now, adding the tenant's settings row
	// when it has none) or clears the tenant's suspension.
	SetTenantSuspended(ctx context.Context, tenant string, suspended bool, now time.Time) error
	// SetTenantLimits stores the tenant's limits (at now), its suspension
	// as it is.
	SetTenantLimits(ctx context.Context, tenant string, limits TenantLimits, now time.Time) error
	// ListTenants lists, in order, up to limit tenants after after that
	// have a head row or a settings row (a scatter read on Vitess).
	ListTenants(ctx context.Context, after string, limit int) ([]string, error)
	// TenantPartitions counts the tenant's head rows: its partitions,
	// drained ones included, in every topic (an index range).
	TenantPartitions(ctx context.Context, tenant string) (int64, error)
	// TenantUsage counts the tenant's messages, partitions with messages
	// and stored bytes per topic (MessageBytes of its messages,
	// GroupStateBytes of its message-group states, DeferredBytes of its
	// deferred rows, BookkeepingBytes of its groups' leases, cursors and
	// registry rows), in topic order: a topic with any of them.
	TenantUsage(ctx context.Context, tenant string) ([]TopicUsage, error)
	// ExportMessages reads up to limit of the tenant's messages after
	// the position after, in (topic, partition key, offset) order.
	ExportMessages(ctx context.Context, tenant string, after ExportPosition, limit int) ([]Message, error)
	// ExportGroups, ExportCursors and ExportGroupStates read up to limit
	// of the tenant's group registry rows, cursors and message-group
	// states after after's key, in key order.
	ExportGroups(ctx context.Context, tenant string, after GroupRow, limit int) ([]GroupRow, error)
	ExportCursors(ctx context.Context, tenant string, after CursorRow, limit int) ([]CursorRow, error)
	ExportGroupStates(ctx context.Context, tenant string, after GroupStateRow, limit int) ([]GroupStateRow, error)
}

// TenantSettings is a tenant's settings row.
type TenantSettings struct {
	Tenant      string
	SuspendedAt time.Time // zero: active
	UpdatedAt   time.Time
	Limits      TenantLimits
}

// TenantLimits are a tenant's quotas and retention; zero is no limit (the
// retention's default).
type TenantLimits struct {
	PublishRate, PublishByteRate         int64 // messages, bytes (MessageBytes) per second
	MaxMessages, MaxBytes, MaxPartitions int64 // stored
	MinRetention, MaxRetention           time.Duration
}

// TopicUsage is what one topic of a tenant stores.
type TopicUsage struct {
	Topic                string
	Messages, Partitions int64
	// Bytes is all the topic's stored bytes, StateBytes, DeferredBytes
	// and GroupBytes included.
	Bytes, StateBytes, DeferredBytes int64
	// GroupBytes is the consumer groups' bookkeeping in the topic, which
	// anyone who consumes makes: leases, cursors and registry rows
	// (BookkeepingBytes).
	GroupBytes int64
}

// ExportPosition is where a tenant's export of messages stands: after
// the message at (Topic, PartitionKey, Offset); the zero value is before
// the first.
type ExportPosition struct {
	Topic, PartitionKey string
	Offset              int64
}

// CursorRow is a consumer group's cursor in a partition of a tenant's
// topic.
type CursorRow struct {
	Topic, PartitionKey, ConsumerGroup string
	Committed                          int64
}

// GroupRow is a consumer group's registry row in a tenant's topic.
type GroupRow struct {
	Topic, ConsumerGroup string
	StartOffset          int64
	CreatedAt, PausedAt  time.Time // PausedAt zero: running
}

// GroupStateRow is a message group's state as its group stored it.
type GroupStateRow struct {
	Topic, ConsumerGroup, PartitionKey string
	State                              []byte
}

// TableRows is a tenant's row count in one table.
type TableRows struct {
	Table string
	Rows  int64
}

// Cut is what retention deletes from one partition: its messages with
// offset <= UpTo (any offset when UpTo < 0) created before Before.
type Cut struct {
	PartitionKey string
	UpTo         int64
	Before       time.Time
}

// ErrNoMessage means no message has the given identity.
var ErrNoMessage = errors.New("no such message")

// ReadyGroup is a partition with a message after a group's cursor and no
// unexpired lease: a message group an explicit receiver may accept.
type ReadyGroup struct {
	Tenant       string
	Topic        string
	PartitionKey string
	// NextOffset is the offset of the group's next message.
	NextOffset int64
}

// Claim is one ungrouped message (empty partition key) claimed by Owner
// for a consumer group until its visibility timeout. Token changes with
// every claim; the claim's writes name it and fail with ErrLeaseLost once
// the message was claimed again.
type Claim struct {
	ConsumerGroup string
	Owner         string
	Token         int64
	// Attempts counts claims of the message, this one included.
	Attempts  int
	LastError string
	Message   Message
	// VisibleUntil is when the claim lapses by the claimer's clock (its
	// now plus the visibility timeout): after it, another member may
	// claim the message, so the claimer must not hand it out.
	VisibleUntil time.Time
}

// Groups is the message-group part of a driver: explicit receivers of one
// partition, per-group state, and per-message claims of ungrouped
// messages. Every time is the caller's clock.
type Groups interface {
	// ReadyGroups lists up to limit partitions of topic in tenants (the
	// ungrouped partition "" excluded) that have a message after group's
	// cursor and no unexpired lease: lowest next offset first on one
	// database; when tenants live on shards of their own (Vitess), whose
	// offsets are not comparable, oldest next message (by CreatedAt, then
	// offset) first.
	ReadyGroups(ctx context.Context, g GroupScope, now time.Time, limit int) ([]ReadyGroup, error)
	// GroupState reads the state of l's partition under l's fence (nil when
	// none was set), or returns ErrLeaseLost.
	GroupState(ctx context.Context, l Lease) ([]byte, error)
	// SetGroupState stores the state of l's partition under l's fence, or
	// returns ErrLeaseLost and changes nothing.
	SetGroupState(ctx context.Context, l Lease, state []byte, now time.Time) error

	// ClaimMessages claims ungrouped messages of the Group's topic and
	// tenant, within Limit: never claimed, or whose claim is visible again
	// (expired, or retry due) and not done. Each claim lasts until
	// Now+Visibility. A claim is owned by Owner under a token > 0; only
	// the two together settle it. truncated reports that Limit.Bytes left
	// a ready message behind.
	ClaimMessages(ctx context.Context, p ClaimMessagesParams) (claims []Claim, truncated bool, err error)
	// AckClaims marks the messages of cs (one tenant, topic and group)
	// done in one transaction, or, when any claim is no longer current
	// (its token and owner),
	// returns ErrLeaseLost and changes nothing.
	AckClaims(ctx context.Context, cs []Claim, now time.Time) error
	// RetryClaim makes the Claim's message claimable again at RetryAt,
	// recording LastError, or returns ErrLeaseLost.
	RetryClaim(ctx context.Context, p RetryClaimParams) error
	// ExtendClaim makes c's message claimable again at visibleAt instead
	// (its visibility timeout changed), or returns ErrLeaseLost.
	ExtendClaim(ctx context.Context, c Claim, visibleAt, now time.Time) error
	// ReleaseClaim gives c's message back unhandled: claimable at once, and
	// the claim's attempt uncounted (a stopping member's queue, or a
	// handler that a stop cancelled, is not the message's failure), or
	// returns ErrLeaseLost.
	ReleaseClaim(ctx context.Context, c Claim, now time.Time) error
	// DeadLetterClaim appends dlq and marks c's message done in one
	// transaction, or returns ErrLeaseLost and changes nothing.
	DeadLetterClaim(ctx context.Context, c Claim, dlq *InsertMessage, now time.Time) error
	// AdvanceUngrouped moves group's cursor of tenant's ungrouped partition
	// past every message that is done, and drops their claims. It returns
	// the cursor.
	AdvanceUngrouped(ctx context.Context, g GroupRef, now time.Time) (int64, error)
}

// Deferred is a message a consumer group set aside (deferred), as listed.
type Deferred struct {
	ConsumerGroup string
	// Message is the deferred message without its payload and headers.
	Message    Message
	DeferredAt time.Time
	// Attempts counts the message's deliveries since it was deferred.
	Attempts int
	// Owner holds the message until VisibleUntil ("" or past: nobody).
	Owner        string
	VisibleUntil time.Time
}

// Deferrals is the part of a driver that keeps deferred messages:
// messages a consumer group's cursor or claim has passed that a member
// set aside to fetch later by offset. A deferred message is delivered
// under a Claim of its own (Token > 0, changed at every claim), as an
// ungrouped message is.
type Deferrals interface {
	// ClaimDeferred claims those of Offsets that the Group deferred, whose
	// message is stored and that no claim holds unexpired by Now, for
	// Owner until Now+Visibility, and returns them with their messages in
	// offset order.
	ClaimDeferred(ctx context.Context, p ClaimDeferredParams) ([]Claim, error)
	// AckDeferred settles the deferred messages of cs (one tenant, topic
	// and group) in one transaction: they are no longer deferred. When any
	// claim is no longer current it returns ErrLeaseLost and changes
	// nothing.
	AckDeferred(ctx context.Context, cs []Claim, now time.Time) error
	// ReleaseDeferred gives c's message back, deferred still and
	// claimable from visibleAt, or returns ErrLeaseLost.
	ReleaseDeferred(ctx context.Context, c Claim, visibleAt, now time.Time) error
	// ExtendDeferred keeps c's claim until visibleAt instead, or returns
	// ErrLeaseLost.
	ExtendDeferred(ctx context.Context, c Claim, visibleAt, now time.Time) error
	// DeadLetterDeferred appends dlq and settles c's message in one
	// transaction, or returns ErrLeaseLost and changes nothing.
	DeadLetterDeferred(ctx context.Context, c Claim, dlq *InsertMessage, now time.Time) error
	// ListDeferred lists up to limit of g's deferred messages with
	// offsets above after whose message is stored, in offset order.
	ListDeferred(ctx context.Context, g GroupRef, after int64, limit int) ([]Deferred, error)
	// DeferredCounts counts g's deferred messages in the partitions named
	// by keys, per key (a schema without deferral has none).
	DeferredCounts(ctx context.Context, g GroupRef, keys []string) (map[string]int64, error)
	// DeferredFloors reads, for each partition of a tenant's topic with a
	// deferred message, the lowest deferred offset of any group:
	// retention keeps the messages from there. A schema without deferral
	// (a release ahead of its migration) has none.
	DeferredFloors(ctx context.Context, tenant, topic string) (map[string]int64, error)
	// DropDeferredGone deletes the deferred rows of a tenant's topic whose
	// message is no longer stored, a bounded number of batches a call,
	// and returns how many.
	DropDeferredGone(ctx context.Context, tenant, topic string) (int64, error)
}

// RetentionGroup is the reserved consumer group whose lease on partition
// "" of a topic is the retention claim for (tenant, topic). It is not a
// group that reads the topic.
const RetentionGroup = "$retention"

// RetentionHead is a partition as retention sees it.
type RetentionHead struct {
	PartitionKey string
	HeadOffset   int64
	// MovedAt is when the head last moved (a publish, or an operator's
	// offset reset), by the writer's clock.
	MovedAt time.Time
	// FirstOffset is the partition's oldest remaining message (0: none is
	// left), FirstCreatedAt its creation time.
	FirstOffset    int64
	FirstCreatedAt time.Time
}

// GroupLiveError refuses to delete a consumer group that has a member
// with a recent heartbeat or an unexpired lease.
type GroupLiveError struct {
	Tenant, Topic, Group string
	Members              []string // members whose heartbeat is recent
	Leases               int      // unexpired leases
}

func (e *GroupLiveError) Error() string {
	return fmt.Sprintf("consumer group %q of tenant %q topic %q is live (%d recent members %v, %d unexpired leases); stop its members or force the delete",
		e.Group, e.Tenant, e.Topic, len(e.Members), e.Members, e.Leases)
}

// Is makes errors.Is(err, ErrGroupLive) match.
func (e *GroupLiveError) Is(target error) bool { return target == ErrGroupLive }

// ErrGroupLive is what a *GroupLiveError matches.
var ErrGroupLive = errors.New("consumer group is live")

// Lifecycle removes what no longer has work (docs/design.md, "Partition
// lifecycle") and keeps the registry of consumer groups.
type Lifecycle interface {
	// RetentionHeads reads up to Limit head rows of a tenant's topic in
	// key order, after the key After[0] when After is not empty.
	RetentionHeads(ctx context.Context, p RetentionHeadsParams) ([]RetentionHead, error)
	// TopicGroups lists the groups that read a tenant's topic (registered,
	// or with a cursor, lease or member there), sorted.
	TopicGroups(ctx context.Context, tenant, topic string) ([]string, error)
	// RegisterGroup adds the group's registry row in each tenant lacking
	// one, starting at 0, or, when latest is set and the group has no
	// cursor there, at the topic's highest head.
	RegisterGroup(ctx context.Context, g GroupScope, latest bool, now time.Time) error
	// SetGroupPaused marks (or unmarks) the group paused on topic in each
	// of tenants, in its registry row (made, starting at 0, where none is).
	SetGroupPaused(ctx context.Context, g GroupScope, paused bool, now time.Time) error
	// PausedTenants lists those of tenants where the group is paused on
	// topic: one statement, read by members at each rebalance tick.
	PausedTenants(ctx context.Context, g GroupScope) ([]string, error)
	// StaleLeaseKeys lists the keys of a topic's lease rows of Groups
	// freed or expired before Before.
	StaleLeaseKeys(ctx context.Context, p StaleLeaseKeysParams) ([]string, error)
	// RemovePartitions removes the drained partitions among keys (no
	// message left, head idle since before idleBefore, no lease of groups
	// unexpired by now) with every row that belongs to them, in one
	// transaction fenced by claim, and returns the keys it removed.
	RemovePartitions(ctx context.Context, claim Lease, r RemovePartitionsRequest) ([]string, error)
	// UnreadPartitions lists up to limit partitions of a tenant's topic the
	// group has no cursor for, in key order, with lag counted from where
	// the group starts.
	UnreadPartitions(ctx context.Context, g GroupRef, limit int) ([]OffsetRow, error)
	// DeleteGroup removes a group's rows from a tenant's topic; without
	// Force it returns *GroupLiveError while a lease is unexpired by Now
	// or a heartbeat is at or after LiveSince.
	DeleteGroup(ctx context.Context, p DeleteGroupParams) error
}

// APIToken is a bearer token of `shardq serve` (docs/server.md): a role
// in some tenants. Only the SHA-256 of its secret is stored.
type APIToken struct {
	ID         string
	Tenants    []string
	Role       string
	SecretHash []byte
	CreatedAt  time.Time
	ExpiresAt  time.Time // zero: never
	RevokedAt  time.Time // zero: not revoked
}

// ErrNoToken means no token of that id may use that tenant.
var ErrNoToken = errors.New("no such token")

// ErrTokenIDTaken means a row of another token (another secret hash)
// holds the id, in some tenant: a token id names one token.
var ErrTokenIDTaken = errors.New("the id is held by another token")

// Tokens stores the server's bearer tokens, a row per tenant a token may
// use (sharded by tenant like every queue table).
type Tokens interface {
	// CreateToken stores t, a row for each of its tenants, in one
	// transaction. A token id names one token in every tenant: when a row
	// of t.ID in any tenant holds another SecretHash, it fails with
	// ErrTokenIDTaken and stores nothing. Rows of t.ID with its hash are
	// the same token, which t gives more tenants.
	CreateToken(ctx context.Context, t APIToken) error
	// TokenIn reads token id as stored for tenant (Tenants holds just
	// tenant), or returns ErrNoToken.
	TokenIn(ctx context.Context, tenant, id string) (APIToken, error)
	// ListTokens lists the tokens stored in the scope's tenants (every
	// shard when AllTenants), with the tenants of each in the scope and
	// its SecretHash, by id. Two tokens of one id (stored before
	// CreateToken checked ids across tenants) are listed apart. Limit and
	// After are not used: tokens are few.
	ListTokens(ctx context.Context, s Scope) ([]APIToken, error)
	// RevokeToken marks token id revoked in tenants (the shards of those
	// tenants only; ListTokens finds a token's tenants) and returns the
	// rows it changed (0: none, or revoked already).
	RevokeToken(ctx context.Context, tenants []string, id string, now time.Time) (int64, error)

	// ReceiptKeys reads every receipt-signing key, by ID.
	ReceiptKeys(ctx context.Context) ([]ReceiptKey, error)
	// AddReceiptKey stores k unless a key with its ID exists, and reports
	// whether it stored it (two servers adding the same ID: one wins).
	AddReceiptKey(ctx context.Context, k ReceiptKey) (bool, error)
	// DeleteReceiptKey removes key id (routed by id: never a scatter).
	DeleteReceiptKey(ctx context.Context, id int64) error
}

// ReceiptKey signs and verifies the receipts of `shardq serve`
// (HMAC-SHA256). The newest key signs; a key is replaced by the next ID
// at that key's CreatedAt.
type ReceiptKey struct {
	ID        int64
	Secret    []byte
	CreatedAt time.Time
}
