// SPDX-License-Identifier: Apache-2.0

package shardq

import (
	"context"
	"io"

	"github.com/shardq/shardq/internal/receiver"
)

// LargeDelivery is the group's next message whole: a large message (its
// chunks as one stream) or an ordinary one (its payload).
type LargeDelivery struct {
	// Delivery settles it (Ack, Nack, DeadLetter on the receiver). For a
	// large message its ID and Headers are the end marker's (the
	// caller's id and headers), its Offset the first chunk's, and its
	// Payload nil: read Body.
	*Delivery
	// Body is Delivery.Body(): the payload, for a large message read one
	// chunk at a time and checked at the end.
	Body   io.Reader
	Size   int64
	Chunks int // 0 for an ordinary message
}

// ErrLargeCorrupt means a large message's stored chunks do not add up to
// what its end marker says.
var ErrLargeCorrupt = receiver.ErrLargeCorrupt

// ReceiveLarge is Receive with the body and size of the message at hand:
// Receive hands out large messages whole too (Delivery.Body).
func (r *GroupReceiver) ReceiveLarge(ctx context.Context) (*LargeDelivery, error) {
	d, err := r.Receive(ctx)
	if err != nil {
		return nil, err
	}
	return &LargeDelivery{Delivery: d, Body: d.Body(), Size: d.Size, Chunks: d.Chunks}, nil
}
