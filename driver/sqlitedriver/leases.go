package sqlitedriver

import (
	"context"
	"time"

	"github.com/shardq/shardq/driver"
)

// The lease protocol (driver.Leases), shared with SQLite in sqlcommon.

func (d *Driver) AcquireLease(ctx context.Context, p driver.PartitionRef, owner string, now time.Time, ttl time.Duration) (driver.Lease, error) {
	return dialect.AcquireLease(ctx, d, p, owner, now, ttl)
}

func (d *Driver) RenewLease(ctx context.Context, l driver.Lease, now time.Time, ttl time.Duration) (driver.Lease, error) {
	return dialect.RenewLease(ctx, d, l, now, ttl)
}

func (d *Driver) RenewLeases(ctx context.Context, ls []driver.Lease, now time.Time, ttl time.Duration) ([]driver.Lease, []driver.Lease, error) {
	return dialect.RenewLeases(ctx, d, ls, now, ttl)
}

func (d *Driver) ReleaseLease(ctx context.Context, l driver.Lease, now time.Time) error {
	return dialect.ReleaseLease(ctx, d, l, now)
}

func (d *Driver) CommitOffset(ctx context.Context, l driver.Lease, offset int64, now time.Time) error {
	return dialect.CommitOffset(ctx, d, l, offset, now)
}

func (d *Driver) ListLeases(ctx context.Context, tenants []string, group, topic string) ([]driver.Lease, error) {
	return dialect.ListLeases(ctx, d.read, tenants, group, topic)
}

func (d *Driver) SweepLeases(ctx context.Context, tenants []string, group, topic string, owners []string, now time.Time) (int64, error) {
	return dialect.SweepLeases(ctx, d.write, tenants, group, topic, owners, now)
}

func (d *Driver) Heartbeat(ctx context.Context, tenants []string, group, topic, subscriber string, now time.Time) error {
	return dialect.Heartbeat(ctx, d.write, tenants, group, topic, subscriber, now)
}

func (d *Driver) RemoveHeartbeat(ctx context.Context, tenants []string, group, topic, subscriber string) error {
	return dialect.RemoveHeartbeat(ctx, d.write, tenants, group, topic, subscriber)
}

func (d *Driver) Subscribers(ctx context.Context, tenants []string, group, topic string) ([]driver.Subscriber, error) {
	return dialect.Subscribers(ctx, d.read, tenants, group, topic)
}

func (d *Driver) RecordAttempt(ctx context.Context, l driver.Lease, offset int64, st driver.DeliveryState, now time.Time) error {
	return dialect.RecordAttempt(ctx, d, l, offset, st, now)
}

func (d *Driver) DeliveryStates(ctx context.Context, p driver.PartitionRef, after, upTo int64) (map[int64]driver.DeliveryState, error) {
	return dialect.DeliveryStates(ctx, d.read, p, after, upTo)
}

func (d *Driver) DeadLetter(ctx context.Context, l driver.Lease, dlq *driver.InsertMessage, offset int64, now time.Time) error {
	return dialect.DeadLetter(ctx, d, d.InsertMessages, l, dlq, offset, now)
}
