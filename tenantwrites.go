// SPDX-License-Identifier: Apache-2.0

package shardq

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/publish"
)

// tenantWrites is the client's driver with its tenants' checks on the
// writes a consumer makes besides settling: a message group's state and
// a deferral. Both add to what the tenant stores, so both are refused in
// a suspended tenant and held to its MaxBytes, whichever runtime makes
// them (subscriber, group receiver, receipts): the check sits at the
// write.
type tenantWrites struct {
	driver.Driver
	ts *tenantStates
}

func (d tenantWrites) SetGroupState(ctx context.Context, l driver.Lease, state []byte, now time.Time) error {
	end, err := d.ts.admitStored(ctx, l.Tenant, driver.GroupStateBytes(l.ConsumerGroup, l.PartitionKey, state))
	if err != nil {
		return fmt.Errorf("set the state of %s: %w", l.PartitionRef, err)
	}
	defer end(publish.Ended)
	return d.Driver.SetGroupState(ctx, l, state, now)
}

func (d tenantWrites) DeferTx(ctx context.Context, tx *sql.Tx, group string, m driver.Message, now time.Time) error {
	end, err := d.ts.admitStored(ctx, m.Tenant, driver.DeferredBytes(group, m.PartitionKey))
	if err != nil {
		return fmt.Errorf("defer offset %d of tenant %q topic %q partition %q for group %q: %w", m.Offset, m.Tenant, m.Topic, m.PartitionKey, group, err)
	}
	err = d.Driver.DeferTx(ctx, tx, group, m, now)
	// The row commits with tx, which its caller ends.
	end(publish.EndsUnseen)
	return err
}
