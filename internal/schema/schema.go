// SPDX-License-Identifier: Apache-2.0

// Package schema brings a database up to the version this module needs:
// the driver's migrations, then the key that signs receipts.
package schema

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/receiptkey"
)

// Migrate applies drv's migrations that are not applied yet, logging
// those it applied, and creates the receipt key when there is none.
func Migrate(ctx context.Context, drv driver.Driver, log *slog.Logger) error {
	applied, err := drv.Migrate(ctx)
	if err != nil {
		return fmt.Errorf("shardq: %w", err)
	}
	if len(applied) > 0 {
		log.Info("shardq: migrations applied", "driver", drv.Name(), "versions", applied)
	}
	// The key that signs receipts (shardq serve); a server that finds none
	// creates it too.
	if _, err := receiptkey.Ensure(ctx, drv, time.Now()); err != nil {
		return fmt.Errorf("shardq: create the receipt key: %w", err)
	}
	return nil
}
