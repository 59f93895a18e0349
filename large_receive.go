// SPDX-License-Identifier: Apache-2.0

package shardq

import (
	"bytes"
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
	// Body yields the payload. For a large message it reads one chunk at
	// a time from the database and fails, at the end, if the size or the
	// SHA-256 differs from the end marker's.
	Body   io.Reader
	Size   int64
	Chunks int // 0 for an ordinary message
}

// ErrLargeCorrupt means a large message's stored chunks do not add up to
// what its end marker says.
var ErrLargeCorrupt = receiver.ErrLargeCorrupt

// ReceiveLarge is Receive for groups that carry large messages
// (PublishLarge): it returns the next message whole. A large message is
// handed out only once its end marker is stored (it waits for it, until
// ctx ends; ctx bounds only that wait, not the reading of Body, which
// goes on after ReceiveLarge returns and fails once the receiver is
// stopped), so a reader never sees half of one; one whose writer failed
// (an aborted end marker) is passed over. Settle the result like any
// delivery: Ack passes the cursor over every chunk and the end marker;
// Nack, Stop or a crash before Ack deliver it again from its first chunk
// (the next reader starts over; nothing resumes mid-message).
func (r *GroupReceiver) ReceiveLarge(ctx context.Context) (*LargeDelivery, error) {
	l, err := r.rt.ReceiveLarge(ctx)
	if err != nil {
		return nil, err
	}
	body := l.Body
	if body == nil {
		body = bytes.NewReader(l.Message.Payload)
	}
	return &LargeDelivery{Delivery: newDelivery(l.Message, l.Attempt), Body: body, Size: l.Size, Chunks: l.Chunks}, nil
}
