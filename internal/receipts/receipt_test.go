// SPDX-License-Identifier: Apache-2.0

package receipts

import (
	"bytes"
	"testing"
)

// FuzzReadBinary: a receipt's body is read only after its MAC checked,
// yet reading never panics on any bytes, and what it accepts is the one
// encoding of what it read.
func FuzzReadBinary(f *testing.F) {
	for _, rc := range []Receipt{
		{Tenant: "t", Topic: "p", Group: "g", Key: "k", Owner: "o#1", Token: 3, Offset: 7, Last: 9, Turn: 2},
		{Tenant: "t", Topic: "p", Group: "g", Owner: "o#1", Token: 3, Offset: 7, Claim: true, Attempts: 2},
		{Tenant: "t", Topic: "p", Group: "g", Key: "k", Owner: "o#1", Token: 1, Session: true},
		{Tenant: "t", Topic: "p", Group: "g", Key: "k", Owner: "o#1", Token: 1, Offset: -1 << 63, Last: 1<<63 - 1, Deferred: true, Held: true},
		{Tenant: "t", Topic: "p", Group: "g", Key: "k", Owner: "o#1", Token: 3, Offset: 7, Last: 9, Issued: 1796000000},
	} {
		b := rc.AppendBinary(nil)
		if back, ok := ReadBinary(b); !ok || back != rc {
			f.Fatalf("%+v reads back as %+v, %v", rc, back, ok)
		}
		f.Add(b)
		f.Add(append(b, 0))
		f.Add(b[:len(b)-1])
	}
	f.Add([]byte{0x20})
	f.Add(append((&Receipt{Tenant: "t", Topic: "p", Group: "g", Owner: "o", Token: 1, Offset: 1, Claim: true}).AppendBinary(nil)[1:], 0)) // issued 0 under its flag
	f.Add([]byte{0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01})
	f.Add([]byte{0, 0x81, 0x00, 't', 1, 'p', 1, 'g', 0, 1, 'o', 2, 2, 2, 0, 0, 0}) // an overlong length
	f.Fuzz(func(t *testing.T, b []byte) {
		rc, ok := ReadBinary(b)
		if !ok {
			return
		}
		if again := rc.AppendBinary(nil); !bytes.Equal(again, b) {
			t.Fatalf("%x reads as %+v, which encodes as %x", b, rc, again)
		}
	})
}
