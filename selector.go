// SPDX-License-Identifier: Apache-2.0

package shardq

import (
	"fmt"
	"hash/fnv"
	"strconv"
)

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
var KeySelector Selector = SelectorFunc(func(_ *Message, arg any) (string, error) {
	k, ok := arg.(string)
	if !ok {
		return "", fmt.Errorf("KeySelector: argument is %T, want string", arg)
	}
	return k, nil
})

// HashSelector maps a business key (the argument: a string, []byte, an
// integer or a fmt.Stringer) onto one of n lanes, named "0" to "n-1". Messages
// with the same business key land in the same lane, so they keep their
// order while unrelated keys spread across n partitions. The mapping is
// FNV-1a (32-bit) of the key's bytes modulo n and will not change between
// versions: changing n moves keys, like adding Kafka partitions.
func HashSelector(n int) Selector {
	return SelectorFunc(func(_ *Message, arg any) (string, error) {
		if n <= 0 {
			return "", fmt.Errorf("HashSelector: %d lanes, want at least 1", n)
		}
		var b []byte
		switch v := arg.(type) {
		case string:
			b = []byte(v)
		case []byte:
			b = v
		case int:
			b = strconv.AppendInt(nil, int64(v), 10)
		case int64:
			b = strconv.AppendInt(nil, v, 10)
		case uint64:
			b = strconv.AppendUint(nil, v, 10)
		case fmt.Stringer:
			b = []byte(v.String())
		default:
			return "", fmt.Errorf("HashSelector: argument is %T, want string, []byte, int, int64, uint64 or fmt.Stringer", arg)
		}
		h := fnv.New32a()
		h.Write(b)
		return strconv.FormatUint(uint64(h.Sum32()%uint32(n)), 10), nil
	})
}
