// SPDX-License-Identifier: Apache-2.0

package shardq

import (
	"fmt"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/ident"
	"github.com/shardq/shardq/internal/lifecycle"
	"github.com/shardq/shardq/internal/settle"
)

var (
	// ErrInvalid matches every validation error (errors.Is). Validation
	// runs before any SQL, so nothing was written.
	ErrInvalid = ident.ErrInvalid
	// ErrNotMigrated means the queue's tables are missing: run
	// `shardq migrate` or Client.Migrate.
	ErrNotMigrated = driver.ErrNotMigrated
	// ErrClosed is returned by calls on a closed Client.
	ErrClosed = lifecycle.ErrClosed
	// ErrHandlerTimeout is the failure of a handler call that ran past
	// SubscriberConfig.HandlerTimeout: its context was cancelled with this
	// cause (context.Cause) and the attempt counts as failed, whatever the
	// handler returned after.
	ErrHandlerTimeout = settle.ErrHandlerTimeout
)

// ValidationError names the field and the rule that input broke, as in
// "message 2: partition key: 256 characters, limit 255". Use errors.As.
type ValidationError = ident.Error

// MessageError says which message of a Publish call (or PublishTx,
// PublishLarge) was refused: Index counts from 0 in the call's
// arguments. Err is the reason, usually a ValidationError, and errors.As
// finds it through MessageError.
type MessageError struct {
	Index int
	Err   error
}

func (e *MessageError) Error() string { return fmt.Sprintf("shardq: message %d: %v", e.Index, e.Err) }
func (e *MessageError) Unwrap() error { return e.Err }
