// SPDX-License-Identifier: Apache-2.0

package consumer

import (
	"context"
	"fmt"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/large"
	"github.com/shardq/shardq/internal/settle"
	"github.com/shardq/shardq/internal/telemetry"
)

// Process makes a member's Handle of deliver, which hands msgs to the
// application's handler: each call runs in a process span, bounded by
// timeout (when positive; the context's cause is then
// settle.ErrHandlerTimeout and the attempt fails), with a panic turned
// into an error.
func Process(tel *telemetry.T, topic, group string, timeout time.Duration,
	deliver func(ctx context.Context, msgs []driver.Message, whole *large.Whole, attempt int) error) func(context.Context, []driver.Message, *large.Whole, int) error {
	return func(ctx context.Context, msgs []driver.Message, whole *large.Whole, attempt int) (err error) {
		start := time.Now()
		tenant := msgs[0].Tenant
		ctx, span := tel.StartProcess(ctx, tenant, topic, group, msgs, attempt)
		if timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeoutCause(ctx, timeout, settle.ErrHandlerTimeout)
			defer cancel()
		}
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("handler panicked: %v", r)
			}
			if context.Cause(ctx) == settle.ErrHandlerTimeout {
				err = fmt.Errorf("%w after %s (it returned %v)", settle.ErrHandlerTimeout, timeout, err)
			}
			tel.EndProcess(ctx, span, tenant, topic, group, len(msgs), start, err)
		}()
		return deliver(ctx, msgs, whole, attempt)
	}
}
