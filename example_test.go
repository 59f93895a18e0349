// SPDX-License-Identifier: Apache-2.0

package shardq_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver/sqlitedriver"
)

// openExample opens a client on a new SQLite file; MySQL works the same
// with mysqldriver.Open("user:pass@tcp(host:3306)/db").
func openExample() (*shardq.Client, *sqlitedriver.Driver, func()) {
	dir, err := os.MkdirTemp("", "shardq-example")
	if err != nil {
		log.Fatal(err)
	}
	drv, err := sqlitedriver.Open(filepath.Join(dir, "shardq.db"), nil)
	if err != nil {
		log.Fatal(err)
	}
	client, err := shardq.NewClient(drv, nil)
	if err != nil {
		log.Fatal(err)
	}
	if err := client.Migrate(context.Background()); err != nil {
		log.Fatal(err)
	}
	return client, drv, func() { client.Close(); drv.Close(); os.RemoveAll(dir) }
}

func Example() {
	ctx := context.Background()
	client, _, done := openExample()
	defer done()

	msg := shardq.Message{
		Tenant:       "acme",
		Topic:        "orders",
		PartitionKey: "order-42", // messages of one order stay in order
		ID:           "order-42-paid",
		Payload:      []byte(`{"status":"paid"}`),
	}
	res, err := client.Publish(ctx, msg)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("offset", res[0].Offset, "duplicate", res[0].Duplicate)

	// Publishing the same id again stores nothing and reports the offset.
	res, err = client.Publish(ctx, msg)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("offset", res[0].Offset, "duplicate", res[0].Duplicate)
	// Output:
	// offset 1 duplicate false
	// offset 1 duplicate true
}

func ExampleClient_PublishTx() {
	ctx := context.Background()
	client, drv, done := openExample()
	defer done()
	if _, err := drv.DB().ExecContext(ctx, "CREATE TABLE orders (id TEXT PRIMARY KEY, status TEXT)"); err != nil {
		log.Fatal(err)
	}

	// The order row and its event commit together, or neither does.
	tx, err := drv.DB().BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, "INSERT INTO orders (id, status) VALUES ('42', 'paid')"); err != nil {
		log.Fatal(err)
	}
	res, err := client.PublishTx(ctx, tx, shardq.Message{
		Tenant: "acme", Topic: "orders", PartitionKey: "order-42", Payload: []byte(`{"status":"paid"}`),
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
	fmt.Println("committed at offset", res[0].Offset)
	// Output: committed at offset 1
}

func ExampleHashSelector() {
	ctx := context.Background()
	client, _, done := openExample()
	defer done()

	// Spread customers over 8 ordered lanes; one customer's events keep
	// their order because they always land in the same lane.
	lanes := shardq.HashSelector(8)
	for _, customer := range []string{"c-1001", "c-1002", "c-1001"} {
		res, err := client.Publish(ctx, shardq.Message{
			Tenant: "acme", Topic: "invoices", Selector: lanes, SelectorArg: customer,
		})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(customer, "-> lane", res[0].PartitionKey)
	}
	// Output:
	// c-1001 -> lane 7
	// c-1002 -> lane 2
	// c-1001 -> lane 7
}

func ExampleClient_AcceptGroup() {
	ctx := context.Background()
	client, _, done := openExample()
	defer done()
	for _, step := range []string{"created", "paid", "shipped"} {
		if _, err := client.Publish(ctx, shardq.Message{Tenant: "acme", Topic: "orders", PartitionKey: "order-42",
			ID: "order-42-" + step, Payload: []byte(step)}); err != nil {
			log.Fatal(err)
		}
	}

	// Hold the message group "order-42" of consumer group "billing".
	r, err := client.AcceptGroup(ctx, shardq.GroupRef{Tenant: "acme", Topic: "orders", ConsumerGroup: "billing"}, "order-42", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer r.Stop(ctx)

	// A second receiver is told who holds it.
	_, err = client.AcceptGroup(ctx, shardq.GroupRef{Tenant: "acme", Topic: "orders", ConsumerGroup: "billing"}, "order-42", &shardq.ReceiverOptions{Name: "other"})
	fmt.Println("second receiver refused:", errors.Is(err, shardq.ErrGroupOwned))

	for range 3 {
		d, err := r.Receive(ctx)
		if err != nil {
			log.Fatal(err)
		}
		state, err := r.State(ctx) // the group's state, kept across owners
		if err != nil {
			log.Fatal(err)
		}
		if err := r.SetState(ctx, append(state, d.Payload[0])); err != nil {
			log.Fatal(err)
		}
		if err := r.Ack(ctx, d); err != nil {
			log.Fatal(err)
		}
		fmt.Println(string(d.Payload))
	}
	state, _ := r.State(ctx)
	fmt.Println("state:", string(state))
	// Output:
	// second receiver refused: true
	// created
	// paid
	// shipped
	// state: cps
}

// A receiver settles each message in the same transaction as the work
// it does: the shipment row and the group's cursor commit together, so a
// crash can neither lose the shipment nor ship twice.
func ExampleDelivery_AckTx() {
	ctx := context.Background()
	client, drv, done := openExample()
	defer done()
	if _, err := drv.DB().ExecContext(ctx, "CREATE TABLE shipments (order_id TEXT PRIMARY KEY)"); err != nil {
		log.Fatal(err)
	}
	if _, err := client.Publish(ctx, shardq.Message{Tenant: "acme", Topic: "orders", PartitionKey: "order-42", Payload: []byte("42")}); err != nil {
		log.Fatal(err)
	}
	r, err := client.AcceptGroup(ctx, shardq.GroupRef{Tenant: "acme", Topic: "orders", ConsumerGroup: "shipping"}, "order-42", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer r.Stop(ctx)
	d, err := r.Receive(ctx)
	if err != nil {
		log.Fatal(err)
	}

	tx, err := drv.DB().BeginTx(ctx, nil) // the application's transaction, on the driver's database
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, "INSERT INTO shipments (order_id) VALUES (?)", string(d.Payload)); err != nil {
		log.Fatal(err)
	}
	if err := d.AckTx(ctx, tx); err != nil { // the cursor passes d in tx, under the lease's fence
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
	if err := r.Ack(ctx, d); err != nil { // finds the cursor already there
		log.Fatal(err)
	}
	fmt.Println("shipped", string(d.Payload))
	// Output: shipped 42
}

// A receiver sets aside an order whose stock has not arrived and goes on
// with the next; later, any member of the group fetches it by its offset
// and settles it.
func ExampleDelivery_Defer() {
	ctx := context.Background()
	client, _, done := openExample()
	defer done()
	for _, p := range []string{"needs-stock", "ready"} {
		if _, err := client.Publish(ctx, shardq.Message{Tenant: "acme", Topic: "orders", PartitionKey: "order-7", Payload: []byte(p)}); err != nil {
			log.Fatal(err)
		}
	}
	g := shardq.GroupRef{Tenant: "acme", Topic: "orders", ConsumerGroup: "packing"}
	r, err := client.AcceptGroup(ctx, g, "order-7", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer r.Stop(ctx)
	d, err := r.Receive(ctx)
	if err != nil {
		log.Fatal(err)
	}
	if err := r.Defer(ctx, d); err != nil { // the cursor passes it; it is recorded as deferred
		log.Fatal(err)
	}
	next, err := r.Receive(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("packed", string(next.Payload))
	if err := r.Ack(ctx, next); err != nil {
		log.Fatal(err)
	}

	ds, err := client.ReceiveDeferred(ctx, shardq.DeferredRequest{Tenant: g.Tenant, Topic: g.Topic, ConsumerGroup: g.ConsumerGroup, Offsets: []int64{d.Offset}})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("deferred", string(ds[0].Payload))
	if err := client.AckDeferred(ctx, ds...); err != nil { // no longer deferred
		log.Fatal(err)
	}
	// Output:
	// packed ready
	// deferred needs-stock
}

// A group made with StartLatest reads only what is published after it;
// Admin.Groups shows what each group has read, and retention removes the
// partitions every group has drained.
func ExampleAdmin_Groups() {
	ctx := context.Background()
	client, _, done := openExample()
	defer done()
	publish := func(key, payload string) {
		if _, err := client.Publish(ctx, shardq.Message{Tenant: "acme", Topic: "builds", PartitionKey: key, Payload: []byte(payload)}); err != nil {
			log.Fatal(err)
		}
	}
	publish("build-1", "old")
	got := make(chan string, 10)
	sub, err := client.Subscribe(ctx, shardq.SubscriberConfig{
		ConsumerGroup: "notifier", Topic: "builds", Tenants: []string{"acme"}, StartPosition: shardq.StartLatest,
		Handler: func(_ context.Context, d *shardq.Delivery) error { got <- string(d.Payload); return nil },
	})
	if err != nil {
		log.Fatal(err)
	}
	publish("build-2", "new")
	fmt.Println("notifier read:", <-got)
	if err := sub.Stop(ctx); err != nil {
		log.Fatal(err)
	}
	groups, err := client.Admin().Groups(ctx, shardq.Scope{Tenants: []string{"acme"}}, "builds", 0)
	if err != nil {
		log.Fatal(err)
	}
	for _, g := range groups {
		fmt.Printf("%s: %d partition read, %d unread, lag %d\n", g.ConsumerGroup, g.Partitions, g.Unread, g.Lag)
	}
	// Output:
	// notifier read: new
	// notifier: 1 partition read, 0 unread, lag 0
}

// Receipts receive as SQS FIFO's ReceiveMessage does: a message group's
// messages in order under a visibility timeout, each with a signed
// receipt that any process of the database can settle later.
func ExampleReceipts() {
	ctx := context.Background()
	client, _, done := openExample()
	defer done()

	for _, id := range []string{"created", "paid", "shipped"} {
		if _, err := client.Publish(ctx, shardq.Message{Tenant: "acme", Topic: "orders", PartitionKey: "order-42", ID: id}); err != nil {
			log.Fatal(err)
		}
	}
	rc, err := client.Receipts(nil)
	if err != nil {
		log.Fatal(err)
	}
	rq := shardq.ReceiveRequest{Tenant: "acme", Topic: "orders", ConsumerGroup: "billing", PartitionKey: "order-42",
		Max: 2, MaxBytes: 8 << 20} // at most two messages, and no more than 8 MiB of them
	got, err := rc.Receive(ctx, rq)
	if err != nil {
		log.Fatal(err)
	}
	var receipts []string
	for _, m := range got.Messages {
		fmt.Println("received", m.ID, "attempt", m.Attempt)
		receipts = append(receipts, m.Receipt)
	}
	// Acks are cumulative within a receive; acking its last message gives
	// the group back at once.
	if stale, err := rc.AckAll(ctx, shardq.GroupRef{Tenant: "acme", Topic: "orders", ConsumerGroup: "billing"}, receipts); err != nil || len(stale) > 0 {
		log.Fatal(stale, err)
	}
	// A receipt a client made or edited settles nothing.
	err = rc.Ack(ctx, shardq.GroupRef{Tenant: "acme", Topic: "orders", ConsumerGroup: "billing"}, receipts[0][:len(receipts[0])-2]+"AA")
	fmt.Println("edited receipt:", errors.Is(err, shardq.ErrBadReceipt))

	got, err = rc.Receive(ctx, rq)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("next:", got.Messages[0].ID, "truncated:", got.Truncated)
	// Output:
	// received created attempt 1
	// received paid attempt 1
	// edited receipt: true
	// next: shipped truncated: false
}

// A tenant's life: suspended (its publishes fail, nothing stored
// changes), resumed, and exported as JSON lines.
func ExampleAdmin_SuspendTenant() {
	ctx := context.Background()
	client, _, done := openExample()
	defer done()
	msg := shardq.Message{Tenant: "acme", Topic: "orders", PartitionKey: "order-42", ID: "paid", Payload: []byte("paid")}
	if _, err := client.Publish(ctx, msg); err != nil {
		log.Fatal(err)
	}
	admin := client.Admin()
	if err := admin.SuspendTenant(ctx, "acme"); err != nil {
		log.Fatal(err)
	}
	msg.ID = "shipped"
	_, err := client.Publish(ctx, msg)
	fmt.Println("suspended:", errors.Is(err, shardq.ErrTenantSuspended))
	if err := admin.ResumeTenant(ctx, "acme"); err != nil {
		log.Fatal(err)
	}
	if _, err := client.Publish(ctx, msg); err != nil {
		log.Fatal(err)
	}
	info, err := admin.Tenant(ctx, "acme")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(info.Tenant, "stores", info.Messages, "messages,", info.Bytes, "bytes")

	var export bytes.Buffer
	n, err := admin.ExportTenant(ctx, "acme", &export, shardq.ExportOptions{})
	if err != nil {
		log.Fatal(err)
	}
	dec := json.NewDecoder(&export)
	for dec.More() {
		var l shardq.ExportLine
		if err := dec.Decode(&l); err != nil {
			log.Fatal(err)
		}
		fmt.Println(strings.TrimSpace(l.Kind + " " + l.ID))
	}
	fmt.Println("exported", n, "messages")
	// Output:
	// suspended: true
	// acme stores 2 messages, 77 bytes
	// tenant
	// message paid
	// message shipped
	// end
	// exported 2 messages
}

// A tenant's quotas: a publish over one fails whole, naming the quota.
func ExampleAdmin_SetTenantLimits() {
	ctx := context.Background()
	client, _, done := openExample()
	defer done()
	admin := client.Admin()
	limits := shardq.TenantLimits{MaxMessages: 2, Retention: shardq.RetentionPolicy{MaxRetention: 24 * time.Hour}}
	if err := admin.SetTenantLimits(ctx, "acme", limits); err != nil {
		log.Fatal(err)
	}
	msg := func(id string) shardq.Message {
		return shardq.Message{Tenant: "acme", Topic: "orders", PartitionKey: "order-42", ID: id}
	}
	if _, err := client.Publish(ctx, msg("paid"), msg("packed")); err != nil {
		log.Fatal(err)
	}
	_, err := client.Publish(ctx, msg("shipped"))
	var qe *shardq.QuotaExceededError
	if errors.As(err, &qe) {
		fmt.Println("refused by", qe.Quota, "of", qe.Limit)
	}
	// Output:
	// refused by max_messages of 2
}

// A Producer publishes without waiting for each commit: messages are
// written in batches behind the caller's back, each key's in the order
// they were handed in.
func ExampleProducer() {
	ctx := context.Background()
	client, _, done := openExample()
	defer done()

	p, err := client.Producer(nil)
	if err != nil {
		log.Fatal(err)
	}
	var futures []*shardq.PublishFuture
	for i := range 3 {
		futures = append(futures, p.Publish(ctx, shardq.Message{Tenant: "acme", Topic: "events", PartitionKey: "user-7",
			ID: fmt.Sprintf("event-%d", i), Payload: []byte("clicked")}))
	}
	for _, f := range futures {
		res, err := f.Wait(ctx)
		if err != nil {
			log.Fatal(err) // and every later message of user-7 fails too, until p.Resume
		}
		fmt.Println(res.ID, "at offset", res.Offset)
	}
	if err := p.Stop(ctx); err != nil {
		log.Fatal(err)
	}
	// Output:
	// event-0 at offset 1
	// event-1 at offset 2
	// event-2 at offset 3
}
