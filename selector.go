// SPDX-License-Identifier: Apache-2.0

package shardq

import "github.com/shardq/shardq/internal/publish"

// A Selector chooses a message's partition key from the message and an
// argument, before anything is written (RocketMQ's MessageQueueSelector).
// Set Message.Selector and Message.SelectorArg; the transactional send takes
// the same selectors.
type Selector interface {
	SelectPartition(msg *Message, arg any) (string, error)
}

// SelectorFunc adapts a function to a Selector: custom lanes, routing
// tables, anything deterministic.
type SelectorFunc func(msg *Message, arg any) (string, error)

func (f SelectorFunc) SelectPartition(msg *Message, arg any) (string, error) { return f(msg, arg) }

// KeySelector uses the argument, which must be a string, as the partition
// key.
var KeySelector Selector = SelectorFunc(func(_ *Message, arg any) (string, error) { return publish.KeyArg(arg) })

// HashSelector maps a business key (the argument: a string, []byte, an
// integer or a fmt.Stringer) onto one of n lanes, named "0" to "n-1". Messages
// with the same business key land in the same lane, so they keep their
// order while unrelated keys spread across n partitions. The mapping is
// FNV-1a (32-bit) of the key's bytes modulo n and will not change between
// versions: changing n moves keys, like adding Kafka partitions.
func HashSelector(n int) Selector {
	return SelectorFunc(func(_ *Message, arg any) (string, error) { return publish.HashLane(n, arg) })
}
