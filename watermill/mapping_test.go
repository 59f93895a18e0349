// SPDX-License-Identifier: Apache-2.0

package shardqwm_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/internal/testdb"
	shardqwm "github.com/shardq/shardq/watermill"
)

// newClient is a client on a fresh SQLite file or MariaDB database.
func newClient(t testing.TB, mysql bool) *shardq.Client {
	t.Helper()
	var c *shardq.Client
	var err error
	if mysql {
		c, err = shardq.NewClient(testdb.Migrated(t, testdb.MySQL(t)), nil)
	} else {
		c, err = shardq.NewClient(testdb.Migrated(t, testdb.SQLite(t)), nil)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func stored(t testing.TB, c *shardq.Client, topic string) []shardq.StoredMessage {
	t.Helper()
	ms, err := c.Admin().Messages(context.Background(), shardq.BrowseRequest{Tenant: "acme", Topic: topic})
	if err != nil {
		t.Fatal(err)
	}
	return ms
}

// receive reads one message from ch or fails t.
func receive(t *testing.T, ch <-chan *message.Message) *message.Message {
	t.Helper()
	select {
	case m, ok := <-ch:
		if !ok {
			t.Fatal("channel closed")
		}
		return m
	case <-time.After(20 * time.Second):
		t.Fatal("no message in 20 s")
		return nil
	}
}

// Metadata round-trips exactly (shardq's queue_name is not delivered);
// the partition key comes from the metadata, else the topic.
func TestMetadataRoundTrip(t *testing.T) {
	for _, mysql := range []bool{false, true} {
		c := newClient(t, mysql)
		pub, _ := shardqwm.NewPublisher(c, shardqwm.PublisherConfig{Tenant: "acme"}, nil)
		sub, _ := shardqwm.NewSubscriber(c, shardqwm.SubscriberConfig{Tenant: "acme"}, nil)
		md := message.Metadata{"ü-key": "värde ✓", "empty": "", "big": strings.Repeat("x", 8<<10), shardqwm.KeyMetadata: "order-7"}
		m1 := message.NewMessage("id-1", []byte("one"))
		maps.Copy(m1.Metadata, md)
		m2 := message.NewMessage("id-2", []byte("two")) // no key: the topic's partition
		if err := pub.Publish("orders", m1, m2); err != nil {
			t.Fatal(err)
		}
		keys := map[string]string{}
		for _, s := range stored(t, c, "orders") {
			keys[s.ID] = s.PartitionKey
		}
		if keys["id-1"] != "order-7" || keys["id-2"] != "orders" {
			t.Fatalf("partition keys %v, want id-1 in order-7 and id-2 in orders", keys)
		}
		ch, err := sub.Subscribe(context.Background(), "orders")
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]*message.Message{}
		for range 2 {
			m := receive(t, ch)
			got[m.UUID] = m
			m.Ack()
		}
		if !maps.Equal(got["id-1"].Metadata, md) || string(got["id-1"].Payload) != "one" {
			t.Errorf("received metadata %q payload %q, want %q", got["id-1"].Metadata, got["id-1"].Payload, md)
		}
		if len(got["id-2"].Metadata) != 0 {
			t.Errorf("message without metadata received with %q", got["id-2"].Metadata)
		}
		if err := sub.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// Metadata or topics that shardq cannot store are refused before anything
// is written, naming the message, the key and the rule; a batch is all or
// nothing.
func TestRefusedInput(t *testing.T) {
	c := newClient(t, false)
	pub, _ := shardqwm.NewPublisher(c, shardqwm.PublisherConfig{Tenant: "acme"}, nil)
	good := message.NewMessage("good", nil)
	for _, tc := range []struct {
		topic string
		md    message.Metadata
		want  string
	}{
		{"t", message.Metadata{"": "v"}, `message "bad": header "": the key must not be empty`},
		{"t", message.Metadata{strings.Repeat("k", 300): "v"}, `message "bad": header key "kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk…": 300 bytes, limit 255`},
		{"t", message.Metadata{"k": strings.Repeat("v", 8<<10+1)}, `message "bad": header "k": value 8193 bytes, limit 8192`},
		{"t", message.Metadata{"k": "\xff"}, `message "bad": header "k": value is not valid UTF-8`},
		{"t", message.Metadata{"k\xfe": "v"}, `message "bad": header key "k\xfe": invalid UTF-8 at byte 1`},
		{"t", message.Metadata{"queue_name": "acme"}, `message "bad": metadata "queue_name": reserved`},
		{"t", message.Metadata{"shardq-large-id": "x"}, `message "bad": header "shardq-large-id": the prefix shardq-large- is shardq's`},
		{"tópico", nil, `topic: byte 0xc3 at index 1 is not ASCII`},
	} {
		bad := message.NewMessage("bad", nil)
		maps.Copy(bad.Metadata, tc.md)
		err := pub.Publish(tc.topic, good, bad)
		if !errors.Is(err, shardq.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("publish with %q to %q = %v, want ErrInvalid containing %q", tc.md, tc.topic, err, tc.want)
		}
	}
	if ms := stored(t, c, "t"); len(ms) != 0 {
		t.Fatalf("refused batches stored %d messages", len(ms))
	}
	if _, err := shardqwm.NewPublisher(c, shardqwm.PublisherConfig{}, nil); !errors.Is(err, shardq.ErrInvalid) {
		t.Errorf("publisher without a tenant: %v", err)
	}
	if _, err := shardqwm.NewSubscriber(c, shardqwm.SubscriberConfig{Tenant: "acme", Subscriber: shardq.SubscriberConfig{Topic: "x"}}, nil); !errors.Is(err, shardq.ErrInvalid) ||
		!strings.Contains(err.Error(), "Subscriber.Topic") {
		t.Errorf("subscriber with Subscriber.Topic set: %v", err)
	}
	if err := pub.Close(); err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish("t", good); !errors.Is(err, shardqwm.ErrPublisherClosed) {
		t.Errorf("publish after close = %v", err)
	}
}

// FuzzMetadata: whatever metadata a watermill message carries is either
// stored exactly or refused with a validation error naming the message,
// and a refused publish stores nothing.
func FuzzMetadata(f *testing.F) {
	f.Add("k", "v", "id")
	f.Add("", "v", "id")
	f.Add("k\xff", "v", "id")
	f.Add("k", "\xc3", "id")
	f.Add("queue_name", "acme", "id")
	f.Add("k", "v", "")
	f.Add("k", "v", "\x00")
	f.Add(strings.Repeat("é", 200), "v", strings.Repeat("i", 256))
	c := newClient(f, false)
	pub, _ := shardqwm.NewPublisher(c, shardqwm.PublisherConfig{Tenant: "acme"}, nil)
	var topics atomic.Int64
	f.Fuzz(func(t *testing.T, key, value, id string) {
		topic := fmt.Sprintf("fuzz-%d", topics.Add(1)) // one message per topic
		m := message.NewMessage(id, nil)
		m.Metadata[key] = value
		err := pub.Publish(topic, m)
		after := stored(t, c, topic)
		if err != nil {
			if !errors.Is(err, shardq.ErrInvalid) || !strings.Contains(err.Error(), "message ") {
				t.Fatalf("publish %q=%q id %q: %v, want a validation error naming the message", key, value, id, err)
			}
			if len(after) != 0 {
				t.Fatalf("a refused publish stored a message")
			}
			return
		}
		if !utf8.ValidString(key) || !utf8.ValidString(value) {
			t.Fatalf("invalid UTF-8 accepted: %q=%q", key, value)
		}
		if len(after) == 1 && (after[0].ID == id || id == "") && after[0].Headers[key] == value {
			return
		}
		t.Fatalf("accepted %q=%q id %q, not stored as given", key, value, id)
	})
}

// Close and the end of the Subscribe context give back the message in
// hand without counting an attempt: with MaxAttempts 2, a message
// abandoned three times is still redelivered after one Nack, and
// dead-lettered after the second.
func TestAbandonIsNotAnAttempt(t *testing.T) {
	for _, key := range []shardqwm.PartitionKeyFunc{nil, shardqwm.Ungrouped} {
		c := newClient(t, false)
		pub, _ := shardqwm.NewPublisher(c, shardqwm.PublisherConfig{Tenant: "acme", PartitionKey: key}, nil)
		if err := pub.Publish("jobs", message.NewMessage("m", []byte("x"))); err != nil {
			t.Fatal(err)
		}
		cfg := shardqwm.SubscriberConfig{Tenant: "acme", MaxAttempts: 2}
		for i := range 3 {
			sub, _ := shardqwm.NewSubscriber(c, cfg, nil)
			ctx, cancel := context.WithCancel(context.Background())
			ch, err := sub.Subscribe(ctx, "jobs")
			if err != nil {
				t.Fatal(err)
			}
			m := receive(t, ch)
			if i%2 == 0 {
				cancel() // the subscription's context ends
				for range ch {
				}
			}
			if err := sub.Close(); err != nil {
				t.Fatal(err)
			}
			cancel()
			if !closedNow(m.Context()) {
				t.Fatal("the message's context outlived its subscription")
			}
		}
		sub, _ := shardqwm.NewSubscriber(c, cfg, nil)
		ch, err := sub.Subscribe(context.Background(), "jobs")
		if err != nil {
			t.Fatal(err)
		}
		receive(t, ch).Nack()
		receive(t, ch).Nack() // the second attempt: now dead-lettered
		dlq := stored(t, c, "jobs.dlq")
		for deadline := time.Now().Add(20 * time.Second); len(dlq) == 0 && time.Now().Before(deadline); dlq = stored(t, c, "jobs.dlq") {
			time.Sleep(10 * time.Millisecond)
		}
		if len(dlq) != 1 || dlq[0].Headers[shardq.HeaderDLQAttempts] != "2" {
			t.Fatalf("dead letters %+v, want m after 2 attempts", dlq)
		}
		if err := sub.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func closedNow(ctx context.Context) bool {
	select {
	case <-ctx.Done():
		return true
	default:
		return false
	}
}

// The handler timeout runs from the hand-over: a message that waited in
// the channel past the timeout, while the application held another, is
// still handed out with a live context, not timed out (and, with
// MaxAttempts 1, dead-lettered) before anybody saw it.
func TestHandlerTimeoutStartsAtHandOver(t *testing.T) {
	c := newClient(t, false)
	byID := func(_ string, m *message.Message) (string, error) { return m.UUID, nil }
	pub, _ := shardqwm.NewPublisher(c, shardqwm.PublisherConfig{Tenant: "acme", PartitionKey: byID}, nil)
	if err := pub.Publish("jobs", message.NewMessage("a", []byte("a")), message.NewMessage("b", []byte("b"))); err != nil {
		t.Fatal(err)
	}
	const timeout = 500 * time.Millisecond
	sub, err := shardqwm.NewSubscriber(c, shardqwm.SubscriberConfig{Tenant: "acme", MaxAttempts: 1,
		Subscriber: shardq.SubscriberConfig{HandlerTimeout: timeout}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	ch, err := sub.Subscribe(context.Background(), "jobs")
	if err != nil {
		t.Fatal(err)
	}
	held := receive(t, ch)
	select {
	case <-held.Context().Done(): // its own timeout: the other has waited as long
	case <-time.After(20 * time.Second):
		t.Fatalf("the held message's context outlived its %s timeout by 20 s", timeout)
	}
	waited := receive(t, ch)
	if waited.UUID == held.UUID || waited.Context().Err() != nil {
		t.Fatalf("after %s held past its timeout, got %s with context error %v; want the other message, live", held.UUID, waited.UUID, waited.Context().Err())
	}
	waited.Ack()
	dlq := stored(t, c, "jobs.dlq")
	for deadline := time.Now().Add(20 * time.Second); len(dlq) == 0 && time.Now().Before(deadline); dlq = stored(t, c, "jobs.dlq") {
		time.Sleep(10 * time.Millisecond)
	}
	if len(dlq) != 1 || dlq[0].ID != held.UUID {
		t.Fatalf("dead letters %+v; want only %s, the message held past its timeout", dlq, held.UUID)
	}
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
}

// A large message (PublishLarge) reaches a watermill handler assembled,
// as one message, up to MaxLargeBytes; a larger one is dead-lettered
// whole with ErrLargeTooBig, and the partition goes on.
func TestLargeMessagesAssembledUpToALimit(t *testing.T) {
	for _, mysql := range []bool{false, true} {
		c := newClient(t, mysql)
		ctx := context.Background()
		small := []byte(strings.Repeat("s", 300<<10))
		big := []byte(strings.Repeat("b", 700<<10))
		opts := &shardq.LargeOptions{ChunkSize: 100 << 10}
		if _, err := c.PublishLarge(ctx, shardq.Message{Tenant: "acme", Topic: "files", PartitionKey: "k", ID: "small"}, strings.NewReader(string(small)), opts); err != nil {
			t.Fatal(err)
		}
		if _, err := c.PublishLarge(ctx, shardq.Message{Tenant: "acme", Topic: "files", PartitionKey: "k", ID: "big"}, strings.NewReader(string(big)), opts); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Publish(ctx, shardq.Message{Tenant: "acme", Topic: "files", PartitionKey: "k", ID: "after", Payload: []byte("a")}); err != nil {
			t.Fatal(err)
		}
		sub, err := shardqwm.NewSubscriber(c, shardqwm.SubscriberConfig{Tenant: "acme", MaxLargeBytes: 512 << 10}, nil)
		if err != nil {
			t.Fatal(err)
		}
		ch, err := sub.Subscribe(ctx, "files")
		if err != nil {
			t.Fatal(err)
		}
		m := receive(t, ch)
		if m.UUID != "small" || string(m.Payload) != string(small) || m.Metadata[shardq.HeaderLargeBytes] != "307200" {
			t.Fatalf("first message %q with %d bytes; want small, assembled", m.UUID, len(m.Payload))
		}
		m.Ack()
		if m = receive(t, ch); m.UUID != "after" {
			t.Fatalf("second message %q; want after (big dead-lettered)", m.UUID)
		}
		m.Ack()
		if err := sub.Close(); err != nil {
			t.Fatal(err)
		}
		dls, err := c.Admin().DeadLetters(ctx, shardq.DeadLetterRequest{Scope: shardq.Scope{Tenants: []string{"acme"}}, Topic: "files"})
		if err != nil || len(dls) != 1 || dls[0].ID != "big" || !strings.Contains(dls[0].Headers[shardq.HeaderDLQLastError], "MaxLargeBytes") {
			t.Fatalf("dead letters %+v, %v; want big, saying why", dls, err)
		}
	}
}
