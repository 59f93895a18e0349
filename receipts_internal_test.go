// SPDX-License-Identifier: Apache-2.0

package shardq

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/ident"
	"github.com/shardq/shardq/internal/receipts"
	"github.com/shardq/shardq/internal/testdb"
)

func newTestReceipts(t testing.TB, drv driver.Driver) (*Client, *Receipts) {
	t.Helper()
	c, err := NewClient(drv, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	r, err := c.Receipts(&ReceiptOptions{Name: "test", PollInterval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return c, r
}

// FuzzDecodeReceipt: a receipt comes from the network. Decoding never
// panics, refuses with a ValidationError naming "receipt", and what it
// accepts is a consistent receipt of the request's tenant, topic and
// group, signed by this database's key, that signs back to itself.
func FuzzDecodeReceipt(f *testing.F) {
	drv := testdb.Migrated(f, testdb.SQLite(f))
	_, r := newTestReceipts(f, drv)
	ctx := context.Background()
	for _, rc := range []receipt{
		{Tenant: "t", Topic: "p", Group: "g", Key: "k", Owner: "o#1", Token: 3, Offset: 7, Last: 9},
		{Tenant: "t", Topic: "p", Group: "g", Key: "k", Owner: "o#1", Token: 3, Offset: 7, Last: 9, Turn: MaxGroupTurns},
		{Tenant: "t", Topic: "p", Group: "g", Owner: "o#1", Token: 3, Offset: 7, Claim: true, Attempts: 2},
	} {
		s, err := r.sign(ctx, rc)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(s)
		f.Add(s[:len(s)-1] + "A")
		f.Add(strings.Replace(s, receiptPrefix+"1.", receiptPrefix+"2.", 1))
		f.Add(strings.Replace(s, receiptPrefix+"1.", receiptPrefix+"01.", 1))
		f.Add(signedJSON(f, drv, rc))
	}
	f.Add("r1.e30")
	f.Add("r2.1.e30.AAAA")
	f.Add("nonsense")
	f.Fuzz(func(t *testing.T, s string) {
		rc, err := r.decode(ctx, s, "t", "p", "g")
		if err != nil {
			var ve *ident.Error
			if !errors.As(err, &ve) || ve.Field != "receipt" {
				t.Fatalf("error %v is not a ValidationError of field receipt", err)
			}
			return
		}
		if rc.Tenant != "t" || rc.Topic != "p" || rc.Group != "g" || rc.Owner == "" || rc.Token <= 0 || rc.Offset <= 0 || rc.Claim != (rc.Key == "") ||
			rc.Turn < 0 || rc.Turn > MaxGroupTurns || rc.Turn != 0 && (rc.Claim || rc.Held) {
			t.Fatalf("accepted an inconsistent receipt %+v", rc)
		}
		again, err := r.sign(ctx, rc)
		if err != nil {
			t.Fatal(err)
		}
		back, err := r.decode(ctx, again, "t", "p", "g")
		want := rc
		if want.Issued == 0 && back.Issued > 0 { // of an earlier version: signing issues it
			want.Issued = back.Issued
		}
		if err != nil || back != want {
			t.Fatalf("re-signed receipt %+v decodes to %+v, %v", rc, back, err)
		}
	})
}

// eachDB runs fn on a migrated SQLite file and a migrated MariaDB database.
func eachDB(t *testing.T, fn func(t *testing.T, drv driver.Driver)) {
	t.Run("sqlite", func(t *testing.T) { fn(t, testdb.Migrated(t, testdb.SQLite(t))) })
	t.Run("mariadb", func(t *testing.T) { fn(t, testdb.Migrated(t, testdb.MySQL(t))) })
}

// editReceipt re-encodes a receipt's body with edit applied, keeping its
// key id and signature, as a client that edits one would.
func editReceipt(t *testing.T, s string, edit func(*receipt)) string {
	t.Helper()
	parts := strings.Split(s, ".")
	b, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil {
		t.Fatal(err)
	}
	rc, ok := receipts.ReadBinary(b)
	if !ok {
		t.Fatalf("receipt %s: body is not binary", s)
	}
	edit((*receipt)(&rc))
	parts[2] = base64.RawURLEncoding.EncodeToString(rc.AppendBinary(nil))
	return strings.Join(parts, ".")
}

// signedJSON is rc as a release before receipts' binary form signed it:
// "r2.", its JSON, and the MAC under the database's first key.
func signedJSON(t testing.TB, drv driver.Driver, rc receipt) string {
	t.Helper()
	var secret []byte
	if err := drv.DB().QueryRow("SELECT secret FROM shardq_receipt_keys WHERE key_id = 1").Scan(&secret); err != nil {
		t.Fatal(err)
	}
	signed := "r2.1." + base64.RawURLEncoding.EncodeToString(must(json.Marshal(rc)))
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(signed))
	return signed + "." + base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

// A receipt handed out before an upgrade, in the JSON form, still
// settles its message after it; the receipts signed now are binary.
func TestReceiptOfTheJSONFormSettles(t *testing.T) {
	drv := testdb.Migrated(t, testdb.SQLite(t))
	c, r := newTestReceipts(t, drv)
	ctx := context.Background()
	for _, id := range []string{"a", "b"} {
		if _, err := c.Publish(ctx, Message{Tenant: "acme", Topic: "orders", PartitionKey: "k", ID: id}); err != nil {
			t.Fatal(err)
		}
	}
	ref := GroupRef{Tenant: "acme", Topic: "orders", ConsumerGroup: "g"}
	got, err := r.Receive(ctx, ReceiveRequest{Tenant: "acme", Topic: "orders", ConsumerGroup: "g", PartitionKey: "k", Max: 1})
	if err != nil || len(got.Messages) != 1 || !strings.HasPrefix(got.Messages[0].Receipt, receiptPrefix) || receiptPrefix == "r2." {
		t.Fatalf("receive = %+v, %v; want one message with a receipt of the binary form", got, err)
	}
	rc, err := r.decode(ctx, got.Messages[0].Receipt, "acme", "orders", "g")
	if err != nil {
		t.Fatal(err)
	}
	old := signedJSON(t, drv, rc)
	if back, err := r.decode(ctx, old, "acme", "orders", "g"); err != nil || back != rc {
		t.Fatalf("the JSON form decodes to %+v, %v; want %+v", back, err, rc)
	}
	if err := r.Ack(ctx, ref, old); err != nil {
		t.Fatalf("ack with the JSON form: %v", err)
	}
	next, err := r.Receive(ctx, ReceiveRequest{Tenant: "acme", Topic: "orders", ConsumerGroup: "g", PartitionKey: "k", Max: 10})
	if err != nil || len(next.Messages) != 1 || next.Messages[0].ID != "b" {
		t.Fatalf("after the ack, receive = %+v, %v; want b alone", next, err)
	}
}

// Receipts a client made or edited settle nothing: the signature refuses
// them; and, whatever a receipt says, the stores settle a claim only for
// its owner and token, and never move a cursor past the head.
func TestReceiptsCannotBeForged(t *testing.T) {
	eachDB(t, func(t *testing.T, drv driver.Driver) {
		ctx := context.Background()
		c, r := newTestReceipts(t, drv)
		pub := func(key, id string, delay time.Duration) int64 {
			res, err := c.Publish(ctx, Message{Tenant: "acme", Topic: "orders", PartitionKey: key, ID: id, Delay: delay})
			if err != nil {
				t.Fatal(err)
			}
			return res[0].Offset
		}
		// A delayed ungrouped message has a claim row nobody holds (owner
		// "", token 0) once a receive has passed over it.
		delayed := pub("", "later", time.Hour)
		pub("", "now", 0)
		got, err := r.Receive(ctx, ReceiveRequest{Tenant: "acme", Topic: "orders", ConsumerGroup: "g", Ungrouped: true, Max: 10})
		if err != nil || len(got.Messages) != 1 || got.Messages[0].ID != "now" {
			t.Fatalf("receive = %+v, %v; want the message that is due", got, err)
		}
		forged := receipt{Tenant: "acme", Topic: "orders", Group: "victim", Owner: "anyone", Token: 0, Offset: delayed, Claim: true}
		unsigned := receiptPrefix + "1." + base64.RawURLEncoding.EncodeToString((*receipts.Receipt)(&forged).AppendBinary(nil)) + "." + base64.RawURLEncoding.EncodeToString(make([]byte, 32))
		if err := r.Ack(ctx, GroupRef{Tenant: "acme", Topic: "orders", ConsumerGroup: "victim"}, unsigned); !errors.Is(err, ErrBadReceipt) || !errors.Is(err, ErrInvalid) {
			t.Fatalf("ack of an unsigned receipt: %v, want ErrBadReceipt and ErrInvalid", err)
		}
		// Signed or not, the store settles no placeholder row.
		placeholder := driver.Claim{ConsumerGroup: "g", Owner: "", Token: 0, Message: driver.Message{Tenant: "acme", Topic: "orders", Offset: delayed}}
		if err := drv.AckClaims(ctx, []driver.Claim{placeholder}, time.Now()); !errors.Is(err, driver.ErrLeaseLost) {
			t.Fatalf("ack of the placeholder claim: %v, want ErrLeaseLost", err)
		}
		if err := drv.RetryClaim(ctx, driver.RetryClaimParams{Claim: placeholder, RetryAt: time.Now(), LastError: "x", Now: time.Now()}); !errors.Is(err, driver.ErrLeaseLost) {
			t.Fatalf("retry of the placeholder claim: %v, want ErrLeaseLost", err)
		}
		// Nor a real claim for anyone but its owner.
		real := got.Messages[0]
		rc, err := r.decode(ctx, real.Receipt, "acme", "orders", "g")
		if err != nil {
			t.Fatal(err)
		}
		other := rc.claim(driver.Message{})
		other.Owner = "someone-else"
		if err := drv.AckClaims(ctx, []driver.Claim{other}, time.Now()); !errors.Is(err, driver.ErrLeaseLost) {
			t.Fatalf("ack of a claim by another owner: %v, want ErrLeaseLost", err)
		}

		// A grouped receipt edited past the head: the signature refuses it,
		// and so does the head even when it is signed.
		for i := range 3 {
			pub("k", "k"+string(rune('1'+i)), 0)
		}
		grp, err := r.Receive(ctx, ReceiveRequest{Tenant: "acme", Topic: "orders", ConsumerGroup: "g", PartitionKey: "k", Max: 1})
		if err != nil || len(grp.Messages) != 1 {
			t.Fatalf("receive k = %+v, %v", grp, err)
		}
		edited := editReceipt(t, grp.Messages[0].Receipt, func(rc *receipt) { rc.Offset, rc.Last = 9e18, 9e18 })
		if err := r.Ack(ctx, GroupRef{Tenant: "acme", Topic: "orders", ConsumerGroup: "g"}, edited); !errors.Is(err, ErrBadReceipt) {
			t.Fatalf("ack of an edited receipt: %v, want ErrBadReceipt", err)
		}
		grc, err := r.decode(ctx, grp.Messages[0].Receipt, "acme", "orders", "g")
		if err != nil {
			t.Fatal(err)
		}
		grc.Offset, grc.Last = 9e18, 9e18
		past, err := r.sign(ctx, grc)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Ack(ctx, GroupRef{Tenant: "acme", Topic: "orders", ConsumerGroup: "g"}, past); !errors.Is(err, ErrInvalid) {
			t.Fatalf("ack of a signed receipt past the head: %v, want ErrInvalid", err)
		}
		// Nothing moved: the real receipt still settles, and k2, k3 follow.
		if err := r.Ack(ctx, GroupRef{Tenant: "acme", Topic: "orders", ConsumerGroup: "g"}, grp.Messages[0].Receipt); err != nil {
			t.Fatal(err)
		}
		rest, err := r.Receive(ctx, ReceiveRequest{Tenant: "acme", Topic: "orders", ConsumerGroup: "g", PartitionKey: "k", Max: 10})
		if err != nil || len(rest.Messages) != 2 || rest.Messages[0].ID != "k2" || rest.Messages[1].ID != "k3" {
			t.Fatalf("after the refused acks, receive k = %+v, %v; want k2, k3", rest, err)
		}
	})
}

// A receipt's turn count is signed and bounded: past MaxGroupTurns, or
// on a receipt that cannot go on (a session's message, a claim, a
// session id), even a signed one is refused as inconsistent.
func TestReceiptTurnsAreBounded(t *testing.T) {
	_, r := newTestReceipts(t, testdb.Migrated(t, testdb.SQLite(t)))
	ctx := context.Background()
	base := receipt{Tenant: "t", Topic: "p", Group: "g", Key: "k", Owner: "o#1", Token: 3, Offset: 7, Last: 9}
	for _, tc := range []struct {
		edit func(*receipt)
		ok   bool
	}{
		{func(rc *receipt) { rc.Turn = MaxGroupTurns }, true},
		{func(rc *receipt) { rc.Turn = MaxGroupTurns + 1 }, false},
		{func(rc *receipt) { rc.Turn = -1 }, false},
		{func(rc *receipt) { rc.Turn, rc.Held = 1, true }, false},
		{func(rc *receipt) { rc.Turn, rc.Key, rc.Last, rc.Claim = 1, "", 0, true }, false},
		{func(rc *receipt) { rc.Turn, rc.Offset, rc.Last, rc.Session = 1, 0, 0, true }, false},
	} {
		rc := base
		tc.edit(&rc)
		s, err := r.sign(ctx, rc)
		if err != nil {
			t.Fatal(err)
		}
		_, err = r.decode(ctx, s, "t", "p", "g")
		if tc.ok != (err == nil) || (err != nil && !errors.Is(err, ErrInvalid)) {
			t.Errorf("decode %+v: %v, want ok=%v", rc, err, tc.ok)
		}
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// A topic with no room for its dead letters' topic (topic + the suffix
// past 255 bytes) is refused before any SQL: a message this receiver
// dead-letters would otherwise fail to leave, and come again for ever.
func TestReceiveRefusesATopicWithoutRoomForItsDeadLetters(t *testing.T) {
	_, r := newTestReceipts(t, testdb.Migrated(t, testdb.SQLite(t)))
	ctx := context.Background()
	topic := strings.Repeat("t", 253)
	var bad *ident.Error
	if _, err := r.Receive(ctx, ReceiveRequest{Tenant: "t", Topic: topic, ConsumerGroup: "g"}); !errors.As(err, &bad) || bad.Field != "dead-letter topic" {
		t.Fatalf("receive on a %d-byte topic = %v, want a ValidationError naming the dead-letter topic", len(topic), err)
	}
	if err := r.Check(ctx, ReceiveRequest{Tenant: "t", Topic: topic, ConsumerGroup: "g"}); !errors.As(err, &bad) {
		t.Fatalf("check = %v, want the same refusal", err)
	}
	if _, err := r.ReceiveDeferred(ctx, DeferredRequest{Tenant: "t", Topic: topic, ConsumerGroup: "g", Offsets: []int64{1}}); !errors.As(err, &bad) {
		t.Fatalf("receive deferred = %v, want the same refusal", err)
	}
	if _, err := r.Receive(ctx, ReceiveRequest{Tenant: "t", Topic: strings.Repeat("t", 251), ConsumerGroup: "g"}); err != nil {
		t.Fatalf("receive on a 251-byte topic (its dead letters' 255): %v", err)
	}
}

// BenchmarkReceipt: a receipt's signature and its check, paid once per
// message a receive hands out and once per message acked.
func BenchmarkReceipt(b *testing.B) {
	_, r := newTestReceipts(b, testdb.Migrated(b, testdb.SQLite(b)))
	ctx := context.Background()
	rc := receipt{Tenant: "tenant-1", Topic: "orders", Group: "billing", Key: "customer-42", Owner: "host-1#3", Token: 17, Offset: 123456, Last: 123556}
	s, err := r.sign(ctx, rc)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("sign", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := r.sign(ctx, rc); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("decode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := r.decode(ctx, s, rc.Tenant, rc.Topic, rc.Group); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// The longest receipt a receive can hand out (every identifier at its
// limit, the key 255 characters of four bytes each) is signed and read
// back: a receipt too long to be read would leave its message unsettled
// for ever.
func TestLongestReceiptSettles(t *testing.T) {
	drv := testdb.Migrated(t, testdb.SQLite(t))
	_, r := newTestReceipts(t, drv)
	ctx := context.Background()
	long := func(s string, n int) string { return strings.Repeat(s, n) }
	rc := receipt{Tenant: long("t", 255), Topic: long("p", 255), Group: long("g", 255), Key: long("\U00010000", 255),
		Owner: long("o", 246) + "#12345678", Token: 1<<63 - 1, Offset: 1<<63 - 1, Last: 1<<63 - 1, End: 1<<63 - 1, Attempts: 1<<31 - 1,
		Issued: 1<<63 - 1}
	s, err := r.sign(ctx, rc)
	if err != nil {
		t.Fatal(err)
	}
	back, err := r.decode(ctx, s, rc.Tenant, rc.Topic, rc.Group)
	if err != nil || back != rc {
		t.Fatalf("a receipt of %d bytes: %+v, %v", len(s), back, err)
	}
}

// A server that dies in a nack, after it took the group's lease for the
// settlement and before it gave the group back, leaves the group held for
// 10 s (docs/server.md), not for a receive's default visibility or
// longer: a trigger refuses the give-back, as a process gone by then
// never sends it.
func TestNackCutHoldsTheGroupBriefly(t *testing.T) {
	drv := testdb.Migrated(t, testdb.SQLite(t))
	ctx := context.Background()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	c, err := NewClient(drv, &Config{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	receiver := func(name string) *Receipts {
		r, err := c.Receipts(&ReceiptOptions{Name: name, PollInterval: 5 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	a, b := receiver("a"), receiver("b")
	if _, err := c.Publish(ctx, Message{Tenant: "t", Topic: "p", PartitionKey: "k", ID: "m"}); err != nil {
		t.Fatal(err)
	}
	g := GroupRef{Tenant: "t", Topic: "p", ConsumerGroup: "g"}
	rq := ReceiveRequest{Tenant: g.Tenant, Topic: g.Topic, ConsumerGroup: g.ConsumerGroup, PartitionKey: "k", Visibility: time.Second}
	got, err := a.Receive(ctx, rq)
	if err != nil || len(got.Messages) != 1 {
		t.Fatalf("receive: %v, %v", got, err)
	}
	if _, err := drv.DB().ExecContext(ctx, `CREATE TRIGGER refuse_give_back BEFORE UPDATE OF owner ON queue_partition_leases
		WHEN NEW.owner = '' BEGIN SELECT RAISE(ABORT, 'the server died'); END`); err != nil {
		t.Fatal(err)
	}
	// The nack records its attempt; the give-back after it never lands.
	if err := a.Nack(ctx, g, got.Messages[0].Receipt, NackOptions{}); err != nil {
		t.Fatalf("nack: %v", err)
	}
	if _, err := drv.DB().ExecContext(ctx, "DROP TRIGGER refuse_give_back"); err != nil {
		t.Fatal(err)
	}
	cut := now
	for _, tc := range []struct {
		after time.Duration
		want  int
	}{{10*time.Second - time.Millisecond, 0}, {10 * time.Second, 1}} {
		mu.Lock()
		now = cut.Add(tc.after)
		mu.Unlock()
		got, err := b.Receive(ctx, rq)
		if err != nil || len(got.Messages) != tc.want {
			t.Fatalf("a receive %s after the cut nack got %d messages (%v), want %d", tc.after, len(got.Messages), err, tc.want)
		}
	}
}
