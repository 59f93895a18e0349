// SPDX-License-Identifier: Apache-2.0

package shardq

import (
	"encoding/base64"
	"errors"
	"testing"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/ident"
)

// FuzzDecodeExportCursor: an export cursor comes from a client. Decoding
// never panics, refuses with a ValidationError naming "after", and what it
// accepts is a valid position that encodes back to the same cursor.
func FuzzDecodeExportCursor(f *testing.F) {
	for _, p := range []driver.ExportPosition{{Topic: "x", PartitionKey: "k", Offset: 7}, {Topic: "x", Offset: 1}, {Topic: "t.dlq", PartitionKey: "ключ", Offset: 1 << 40}} {
		f.Add(encodeExportCursor(p))
	}
	raw := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
	for _, s := range []string{"x\x00k\x00-1", "x\x00k\x0001", "x\x00k", "\x00k\x001", "x \x00k\x001", "x\x00k\x001\x00", "x\x00k\xff\x001"} {
		f.Add(raw(s))
	}
	f.Add("")
	f.Add("!!")
	f.Fuzz(func(t *testing.T, s string) {
		p, err := decodeExportCursor(s)
		if err != nil {
			var ve *ident.Error
			if !errors.As(err, &ve) || ve.Field != "after" {
				t.Fatalf("error %v is not a ValidationError of field after", err)
			}
			return
		}
		if ident.Topic(p.Topic) != nil || p.PartitionKey != "" && ident.PartitionKey(p.PartitionKey) != nil || p.Offset < 0 {
			t.Fatalf("accepted an invalid position %+v", p)
		}
		if again := encodeExportCursor(p); again != s {
			t.Fatalf("position %+v encodes to %q, not %q", p, again, s)
		}
	})
}
