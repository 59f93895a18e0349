// SPDX-License-Identifier: Apache-2.0

package shardq

import (
	"errors"
	"testing"

	"github.com/shardq/shardq/internal/ident"
)

// FuzzDecodeReceipt: a receipt comes from the network. Decoding never
// panics, refuses with a ValidationError naming "receipt", and what it
// accepts is a consistent receipt of the request's tenant, topic and
// group that encodes back to itself.
func FuzzDecodeReceipt(f *testing.F) {
	for _, r := range []receipt{
		{Tenant: "t", Topic: "p", Group: "g", Key: "k", Owner: "o#1", Token: 3, Offset: 7, Last: 9},
		{Tenant: "t", Topic: "p", Group: "g", Owner: "o#1", Token: 3, Offset: 7, Claim: true, Attempts: 2},
	} {
		f.Add(r.encode())
	}
	f.Add("r1.")
	f.Add("r1.e30")
	f.Add("nonsense")
	f.Fuzz(func(t *testing.T, s string) {
		r, err := decodeReceipt(s, "t", "p", "g")
		if err != nil {
			var ve *ident.Error
			if !errors.As(err, &ve) || ve.Field != "receipt" {
				t.Fatalf("error %v is not a ValidationError of field receipt", err)
			}
			return
		}
		if r.Tenant != "t" || r.Topic != "p" || r.Group != "g" || r.Owner == "" || r.Offset <= 0 || r.Claim != (r.Key == "") {
			t.Fatalf("accepted an inconsistent receipt %+v", r)
		}
		again, err := decodeReceipt(r.encode(), "t", "p", "g")
		if err != nil || again != r {
			t.Fatalf("re-encoded receipt %+v decodes to %+v, %v", r, again, err)
		}
	})
}
