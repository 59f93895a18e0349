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
	"context"
	"database/sql"
	"errors"
	"time"
)

// ErrNotMigrated is returned when the queue's tables are missing.
var ErrNotMigrated = errors.New("database schema is not migrated: run `shardq migrate` (or Client.Migrate)")

// DBTX is the part of *sql.DB, *sql.Conn and *sql.Tx that drivers use.
type DBTX interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
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

	// BeginWrite starts a transaction suited to InsertMessages (SQLite:
	// BEGIN IMMEDIATE; MySQL: READ COMMITTED).
	BeginWrite(ctx context.Context) (*sql.Tx, error)
	// InsertMessages appends msgs inside tx, which the caller commits or
	// rolls back. Within one partition, offsets become visible in increasing
	// order: a message committed later never gets a lower offset than one
	// committed earlier (DESIGN invariant 2).
	InsertMessages(ctx context.Context, tx DBTX, msgs []*InsertMessage) error
	// Retryable reports whether a failed write transaction may simply be run
	// again (deadlock, busy database).
	Retryable(err error) bool

	// FetchAfter returns up to limit messages of one partition with offsets
	// greater than after, in offset order.
	FetchAfter(ctx context.Context, tenant, topic, partitionKey string, after int64, limit int) ([]Message, error)
	// PartitionsWithWork lists the partitions of topic, in the given tenants
	// only, whose head is past the consumer group's committed cursor.
	PartitionsWithWork(ctx context.Context, tenants []string, topic, group string) ([]Partition, error)
	// PartitionHeads lists every partition of topic in the given tenants
	// with its head offset (CommittedOffset is 0).
	PartitionHeads(ctx context.Context, tenants []string, topic string) ([]Partition, error)
	// ResetOffset sets a consumer group's cursor for one partition without
	// a lease: an operator's tool. Subscribers commit through their lease.
	ResetOffset(ctx context.Context, tenant, topic, partitionKey, group string, offset int64) error
}
