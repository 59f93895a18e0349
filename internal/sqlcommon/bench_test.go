// SPDX-License-Identifier: Apache-2.0

package sqlcommon

import "testing"

// go test -bench . -run '^$' ./internal/sqlcommon/
// Headers are encoded once per published message and decoded once per
// fetched one.
func BenchmarkHeaders(b *testing.B) {
	h := map[string]string{"queue_name": "acme", "trace-id": "4bf92f3577b34da6a3ce929d0e0e4736", "content-type": "application/json"}
	enc, err := EncodeHeaders(h)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("encode", func(b *testing.B) {
		for b.Loop() {
			if _, err := EncodeHeaders(h); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("decode", func(b *testing.B) {
		for b.Loop() {
			if _, err := DecodeHeaders(enc); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("decode-queue-name", func(b *testing.B) {
		for b.Loop() {
			if _, err := DecodeHeaders([]byte(`{"queue_name":"acme"}`)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("decode-none", func(b *testing.B) {
		for b.Loop() {
			if _, err := DecodeHeaders([]byte("{}")); err != nil {
				b.Fatal(err)
			}
		}
	})
}
