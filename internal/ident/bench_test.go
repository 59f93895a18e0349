// SPDX-License-Identifier: Apache-2.0

package ident

import (
	"strings"
	"testing"
)

// go test -bench . -run '^$' ./internal/ident/
// The validation every published message goes through.
func BenchmarkMessage(b *testing.B) {
	headers := map[string]string{"queue_name": "acme", "trace-id": "4bf92f3577b34da6a3ce929d0e0e4736", "content-type": "application/json"}
	payload := []byte(strings.Repeat("x", 256))
	for b.Loop() {
		if err := Tenant("acme"); err != nil {
			b.Fatal(err)
		}
		if err := Topic("orders"); err != nil {
			b.Fatal(err)
		}
		if err := PartitionKey("order-4711"); err != nil {
			b.Fatal(err)
		}
		if err := MessageID("0193a8f2-6c1e-7b3a-9f00-5d2c1a7e8b90"); err != nil {
			b.Fatal(err)
		}
		if err := Headers(headers); err != nil {
			b.Fatal(err)
		}
		if err := Payload(payload, 1<<20); err != nil {
			b.Fatal(err)
		}
	}
}
