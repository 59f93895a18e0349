// SPDX-License-Identifier: Apache-2.0

package receipts

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/shardq/shardq/internal/ident"
	"github.com/shardq/shardq/internal/receiptkey"
)

// Receipt is what a receipt names. It travels as
// "r3.<key id>.<base64url body>.<base64url HMAC-SHA256>", the MAC taken
// over everything before its last dot under the database's receipt key
// (internal/receiptkey): a client can neither make nor edit one. The body
// is binary (AppendBinary); "r2." receipts, whose body is the JSON below,
// are still read, so that receipts handed out before an upgrade settle
// after it.
type Receipt struct {
	Tenant string `json:"t"`
	Topic  string `json:"p"`
	Group  string `json:"g"`
	Key    string `json:"k,omitempty"`
	Owner  string `json:"w"`
	Token  int64  `json:"n"`
	Offset int64  `json:"o"`
	Last   int64  `json:"l,omitempty"` // grouped: the receive's last offset, whose ack gives the group back
	// End is, for a large message (Offset its chunk 0, or End itself
	// without chunks), its end marker's offset; Last is then where its
	// ack commits the cursor (large.Span.UpTo).
	End   int64 `json:"e,omitempty"`
	Claim bool  `json:"c,omitempty"` // an ungrouped message's claim
	// Held marks a message of a session: its ack does not give the
	// group back, nor does its nack.
	Held bool `json:"h,omitempty"`
	// Session marks a session id: the lease of a group held across
	// receives (Offset 0). It settles no message.
	Session bool `json:"s,omitempty"`
	// Deferred marks a deferred message's claim (ReceiveDeferred): Key
	// is its partition key, and its ack settles the deferral.
	Deferred bool `json:"d,omitempty"`
	// Attempts counts an ungrouped or a deferred message's claims, this
	// one included (a message group's failures are stored under its
	// lease instead).
	Attempts int `json:"a,omitempty"`
	// Turn counts the receives in a row that went on with this group
	// after an ack of the whole of the one before (goesOn).
	Turn int `json:"u,omitempty"`
	// Issued is when the receive that handed the message out signed it
	// (Unix seconds; 0 in receipts of an earlier version): visibility
	// changes hold a message at most Config.MaxHold from then.
	Issued int64 `json:"i,omitempty"`
}

// Prefix starts every receipt this version signs; prefixJSON the
// receipts of the JSON form it still reads. maxBytes bounds one: the
// longest receipt this version signs (five identifiers at their limits,
// the key 255 characters of four bytes: about 2,900 bytes) fits it, and
// Sign refuses to make one that would not.
const (
	Prefix     = "r3."
	prefixJSON = "r2."
	maxBytes   = 4096
)

// The flags byte of a binary receipt; any other bit refuses it.
const (
	flagClaim = 1 << iota
	flagHeld
	flagSession
	flagDeferred
	flagIssued
	flagsKnown byte = flagClaim | flagHeld | flagSession | flagDeferred | flagIssued
)

// AppendBinary appends rc's binary body: a flags byte, then tenant,
// topic, group, key and owner, each a uvarint length and its bytes, then
// token, offset, last, end, attempts and turn as varints, and issued when
// its flag says so. A receipt is
// signed once per message handed out and checked once per message
// settled, so its form is one a decoder reads without reflection.
func (rc *Receipt) AppendBinary(b []byte) []byte {
	flags := flag(rc.Claim, flagClaim) | flag(rc.Held, flagHeld) | flag(rc.Session, flagSession) | flag(rc.Deferred, flagDeferred) |
		flag(rc.Issued != 0, flagIssued)
	b = append(b, flags)
	for _, s := range [...]string{rc.Tenant, rc.Topic, rc.Group, rc.Key, rc.Owner} {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	for _, n := range [...]int64{rc.Token, rc.Offset, rc.Last, rc.End, int64(rc.Attempts), int64(rc.Turn)} {
		b = binary.AppendVarint(b, n)
	}
	if rc.Issued != 0 {
		b = binary.AppendVarint(b, rc.Issued)
	}
	return b
}

func flag(on bool, bit byte) byte {
	if on {
		return bit
	}
	return 0
}

// ReadBinary reads a body AppendBinary wrote; ok is false for anything
// else: unknown flags, trailing bytes and varints longer than they need
// be included, so that one receipt has one encoding.
func ReadBinary(b []byte) (rc Receipt, ok bool) {
	rc, ok = readBinary(b)
	var again [128]byte
	return rc, ok && bytes.Equal(rc.AppendBinary(again[:0]), b)
}

func readBinary(b []byte) (rc Receipt, ok bool) {
	if len(b) == 0 || b[0]&^flagsKnown != 0 {
		return rc, false
	}
	flags := b[0]
	rc.Claim, rc.Held, rc.Session, rc.Deferred = flags&flagClaim != 0, flags&flagHeld != 0, flags&flagSession != 0, flags&flagDeferred != 0
	b = b[1:]
	for _, s := range [...]*string{&rc.Tenant, &rc.Topic, &rc.Group, &rc.Key, &rc.Owner} {
		n, w := binary.Uvarint(b)
		if w <= 0 || n > uint64(len(b)-w) {
			return rc, false
		}
		*s, b = string(b[w:w+int(n)]), b[w+int(n):]
	}
	var attempts, turn int64
	fields, n := [...]*int64{&rc.Token, &rc.Offset, &rc.Last, &rc.End, &attempts, &turn, &rc.Issued}, 6
	if flags&flagIssued != 0 {
		n++
	}
	for _, p := range fields[:n] {
		n, w := binary.Varint(b)
		if w <= 0 {
			return rc, false
		}
		*p, b = n, b[w:]
	}
	if flags&flagIssued != 0 && rc.Issued <= 0 {
		return rc, false
	}
	if attempts != int64(int32(attempts)) || turn != int64(int32(turn)) {
		return rc, false
	}
	rc.Attempts, rc.Turn = int(attempts), int(turn)
	return rc, len(b) == 0
}

// Sign encodes rc with its MAC under the newest receipt key; a receipt
// not yet issued is issued now.
func (r *Receipts) Sign(ctx context.Context, rc Receipt) (string, error) {
	if rc.Issued == 0 {
		rc.Issued = r.now().Unix()
	}
	var body [128]byte
	raw := rc.AppendBinary(body[:0])
	msg, sum, err := r.keys.Sign(ctx, func(id int64) []byte {
		enc := base64.RawURLEncoding
		b := make([]byte, 0, len(Prefix)+20+1+enc.EncodedLen(len(raw))+1+enc.EncodedLen(receiptkey.Size))
		b = append(b, Prefix...)
		b = strconv.AppendInt(b, id, 10)
		b = append(b, '.')
		return enc.AppendEncode(b, raw)
	})
	if err != nil {
		return "", fmt.Errorf("sign receipt: %w", err)
	}
	out := string(base64.RawURLEncoding.AppendEncode(append(msg, '.'), sum))
	if len(out) > maxBytes {
		return "", fmt.Errorf("sign receipt: %d bytes, more than the %d a receipt may take", len(out), maxBytes)
	}
	return out, nil
}

// split splits a receipt into its key id, the signed text, the body it
// carries and its MAC, checking only their form; binaryBody says which
// form the body has.
func split(s, field string) (keyID int64, signed string, body, sum []byte, binaryBody bool, err error) {
	bad := func(rule string) error { return &ident.Error{Field: field, Rule: rule} }
	rest, binaryBody := strings.CutPrefix(s, Prefix)
	if !binaryBody {
		var ok bool
		if rest, ok = strings.CutPrefix(s, prefixJSON); !ok {
			rest = ""
		}
	}
	if rest == "" || len(s) > maxBytes {
		return 0, "", nil, nil, false, bad(fmt.Sprintf("not a receipt of this server (want %s…, at most %d bytes)", Prefix, maxBytes))
	}
	id, rest, ok1 := strings.Cut(rest, ".")
	enc, mac, ok2 := strings.Cut(rest, ".")
	if !ok1 || !ok2 {
		return 0, "", nil, nil, false, bad("malformed")
	}
	keyID, err = strconv.ParseInt(id, 10, 64)
	if err != nil || keyID <= 0 || strconv.FormatInt(keyID, 10) != id {
		return 0, "", nil, nil, false, bad("malformed key id")
	}
	if body, err = base64.RawURLEncoding.Strict().DecodeString(enc); err != nil {
		return 0, "", nil, nil, false, bad("not base64url")
	}
	if sum, err = base64.RawURLEncoding.Strict().DecodeString(mac); err != nil || len(sum) != receiptkey.Size {
		return 0, "", nil, nil, false, bad("malformed signature")
	}
	return keyID, s[:len(s)-len(mac)-1], body, sum, binaryBody, nil
}

// Decode checks a message's receipt: its signature, then its form and
// that it belongs to tenant, topic and group (a receipt is not a
// credential: the caller's access to them is checked elsewhere).
func (r *Receipts) Decode(ctx context.Context, s, tenant, topic, group string) (Receipt, error) {
	rc, err := r.decode(ctx, s, "receipt", tenant, topic, group)
	if err == nil && rc.Session {
		return Receipt{}, &ident.Error{Field: "receipt", Rule: "a session id, not a message's receipt"}
	}
	return rc, err
}

// decode checks a receipt or a session id (named field in errors).
func (r *Receipts) decode(ctx context.Context, s, field, tenant, topic, group string) (Receipt, error) {
	keyID, signed, body, sum, binaryBody, err := split(s, field)
	if err != nil {
		return Receipt{}, err
	}
	switch err := r.keys.Verify(ctx, keyID, []byte(signed), sum); {
	case errors.Is(err, receiptkey.ErrSignature), errors.Is(err, receiptkey.ErrUnknownKey):
		return Receipt{}, fmt.Errorf("%w: %w", &ident.Error{Field: field, Rule: "not issued by a server of this database (" + err.Error() + ")"}, ErrBad)
	case err != nil:
		return Receipt{}, fmt.Errorf("verify %s: %w", field, err)
	}
	return parse(body, binaryBody, field, tenant, topic, group)
}

// parse checks a signed receipt's body. It touches no database.
func parse(b []byte, binaryBody bool, field, tenant, topic, group string) (Receipt, error) {
	bad := func(rule string) error { return &ident.Error{Field: field, Rule: rule} }
	var r Receipt
	ok := false
	if binaryBody {
		r, ok = ReadBinary(b)
	} else {
		dec := json.NewDecoder(strings.NewReader(string(b)))
		dec.DisallowUnknownFields()
		ok = dec.Decode(&r) == nil
	}
	if !ok {
		return r, bad("malformed")
	}
	if r.Issued < 0 {
		return r, bad("inconsistent")
	}
	if r.Tenant != tenant || r.Topic != topic || r.Group != group {
		return r, bad(fmt.Sprintf("belongs to tenant %q topic %q group %q, not this one", r.Tenant, r.Topic, r.Group))
	}
	switch {
	case r.Session:
		if r.Claim || r.Held || r.Deferred || r.Key == "" || r.Owner == "" || r.Token <= 0 || r.Offset != 0 || r.Last != 0 || r.End != 0 || r.Attempts != 0 || r.Turn != 0 {
			return r, bad("inconsistent")
		}
	case r.Deferred:
		if r.Claim || r.Held || r.Owner == "" || r.Token <= 0 || r.Offset <= 0 || r.Last != 0 || r.End != 0 || r.Attempts < 0 || r.Turn != 0 {
			return r, bad("inconsistent")
		}
	case r.Claim != (r.Key == "") || r.Owner == "" || r.Token <= 0 || r.Offset <= 0 || (!r.Claim && r.Last < r.Offset) || r.Attempts < 0 ||
		r.End != 0 && (r.Claim || r.End < r.Offset || r.Last > r.End) || r.Held && r.Claim ||
		r.Turn < 0 || r.Turn > MaxTurns || r.Turn != 0 && (r.Claim || r.Held):
		return r, bad("inconsistent")
	}
	if err := ident.PartitionKey(r.Key); err != nil && r.Key != "" {
		return r, bad("inconsistent")
	}
	if err := ident.ASCII("owner", r.Owner); err != nil {
		return r, bad("inconsistent")
	}
	return r, nil
}
