// SPDX-License-Identifier: Apache-2.0

package publish

import (
	"fmt"
	"hash/fnv"
	"strconv"
)

// KeyArg is shardq.KeySelector's choice: arg, which must be a string.
func KeyArg(arg any) (string, error) {
	k, ok := arg.(string)
	if !ok {
		return "", fmt.Errorf("KeySelector: argument is %T, want string", arg)
	}
	return k, nil
}

// HashLane is shardq.HashSelector(n)'s choice for the business key arg:
// FNV-1a (32-bit) of the key's bytes modulo n, in decimal. The mapping is
// part of the API: it must not change between versions.
func HashLane(n int, arg any) (string, error) {
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
}
