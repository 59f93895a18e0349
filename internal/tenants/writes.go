// SPDX-License-Identifier: Apache-2.0

package tenants

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/publish"
)

// Writes is drv with ts's checks on the writes a consumer makes besides
// settling: a message group's state, a deferral, and the lease of a
// message group that holds no message (a group accepted by name before
// anything is published to it). Each adds to what the tenant stores, so
// each is refused in a suspended tenant (the state and the deferral) or
// past its MaxBytes, whichever runtime makes it (subscriber, group
// receiver, receipts): the check sits at the write.
func Writes(drv driver.Driver, ts *States) driver.Driver {
	return writes{Driver: drv, ts: ts}
}

// writes is the driver Writes returns.
type writes struct {
	driver.Driver
	ts *States
}

func (d writes) SetGroupState(ctx context.Context, l driver.Lease, state []byte, now time.Time) error {
	end, err := d.ts.admitStored(ctx, l.Tenant, driver.GroupStateBytes(l.ConsumerGroup, l.PartitionKey, state))
	if err != nil {
		return fmt.Errorf("set the state of %s: %w", l.PartitionRef, err)
	}
	defer end(publish.Ended)
	return d.Driver.SetGroupState(ctx, l, state, now)
}

// InTx checks the deferrals made in a caller's transaction.
func (d writes) InTx(tx driver.DBTX) driver.TxSettler {
	return txSettler{d.Driver.InTx(tx), d.ts}
}

type txSettler struct {
	driver.TxSettler
	ts *States
}

func (t txSettler) Defer(ctx context.Context, group string, m driver.Message, now time.Time) error {
	end, err := t.ts.admitStored(ctx, m.Tenant, driver.DeferredBytes(group, m.PartitionKey))
	if err != nil {
		return fmt.Errorf("defer offset %d of tenant %q topic %q partition %q for group %q: %w", m.Offset, m.Tenant, m.Topic, m.PartitionKey, group, err)
	}
	err = t.TxSettler.Defer(ctx, group, m, now)
	// The row commits with the caller's transaction, which its caller ends.
	end(publish.EndsUnseen)
	return err
}

// AcquireLease refuses, in a tenant that stores what its MaxBytes allows,
// the lease of a partition that holds no message: a group accepted by a
// name nothing was published to makes rows that hold nothing to consume.
// The leases of partitions with messages, which consuming needs, go on.
func (d writes) AcquireLease(ctx context.Context, in driver.AcquireLeaseParams) (driver.Lease, error) {
	p := in.Partition
	if strings.HasPrefix(p.ConsumerGroup, "$") { // shardq's own (retention's claim): it frees what the tenant stores
		return d.Driver.AcquireLease(ctx, in)
	}
	limit, stored, err := d.ts.full(ctx, p.Tenant)
	if err == nil && limit > 0 {
		var heads map[driver.HeadKey]int64
		if heads, err = d.Driver.HeadsOf(ctx, p.Topic, []string{p.Tenant}, []string{p.PartitionKey}); err == nil && len(heads) == 0 {
			err = &QuotaExceededError{Tenant: p.Tenant, Quota: QuotaMaxBytes, Limit: limit, Usage: stored,
				Call: driver.BookkeepingBytes(p.ConsumerGroup, p.PartitionKey, in.Owner)}
		}
	}
	if err != nil {
		return driver.Lease{}, fmt.Errorf("acquire the lease of %s: %w", p, err)
	}
	return d.Driver.AcquireLease(ctx, in)
}
