// SPDX-License-Identifier: Apache-2.0

package driver

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// What a tenant's rows count against its byte quotas (max_bytes,
// publish_byte_rate): the bytes of what its callers chose, as stored.
// TenantUsage sums the same in SQL, so that a client's own count between
// measures and the measure agree.

// EncodeHeaders is headers as stored: a JSON object (keys sorted by
// encoding/json). Validation has ensured valid UTF-8, so nothing changes.
func EncodeHeaders(h map[string]string) ([]byte, error) {
	if len(h) == 0 {
		return []byte("{}"), nil
	}
	// HTML escaping off: '<', '>' and '&' stay one byte each (escaped, a
	// header of them is stored six times its size).
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(h); err != nil {
		return nil, fmt.Errorf("encode headers: %w", err)
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// MessageBytes is a message's stored size: payload, headers as stored,
// partition key and id. A message of empty payload still counts its
// headers (at least the queue_name header that Publish adds).
func MessageBytes(m *InsertMessage) (int64, error) {
	h, err := EncodeHeaders(m.Headers)
	if err != nil {
		return 0, err
	}
	return int64(len(m.Payload) + len(h) + len(m.PartitionKey) + len(m.ID)), nil
}

// GroupStateBytes is a message group's state row's size: the state, the
// partition key and the consumer group.
func GroupStateBytes(group, key string, state []byte) int64 {
	return int64(len(state) + len(key) + len(group))
}

// DeferredBytes is a deferred row's size: the partition key and the
// consumer group (the message it keeps is counted as a message).
func DeferredBytes(group, key string) int64 { return int64(len(key) + len(group)) }

// BookkeepingBytes is a consumer group's row of bookkeeping in a topic (a
// lease, a cursor, a registry row): the names it holds, its partition
// key and consumer group (a lease's owner too), and its other columns'
// BookkeepingRowBytes.
func BookkeepingBytes(group, key, owner string) int64 {
	return int64(len(group)+len(key)+len(owner)) + BookkeepingRowBytes
}

// BookkeepingRowBytes is what a bookkeeping row holds besides its names:
// offsets, tokens and times.
const BookkeepingRowBytes = 32
