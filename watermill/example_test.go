// SPDX-License-Identifier: Apache-2.0

package shardqwm_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver/sqlitedriver"
	shardqwm "github.com/shardq/shardq/watermill"
)

// A watermill publisher and subscriber on an embedded SQLite file. With
// MariaDB or MySQL, open the driver with mysqldriver.Open instead.
func Example() {
	dir, _ := os.MkdirTemp("", "shardqwm")
	defer os.RemoveAll(dir)
	drv, err := sqlitedriver.Open(filepath.Join(dir, "shardq.db"), nil)
	if err != nil {
		log.Fatal(err)
	}
	client, err := shardq.NewClient(drv, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	if err := client.Migrate(context.Background()); err != nil {
		log.Fatal(err)
	}

	pub, err := shardqwm.NewPublisher(client, shardqwm.PublisherConfig{Tenant: "acme"}, nil)
	if err != nil {
		log.Fatal(err)
	}
	sub, err := shardqwm.NewSubscriber(client, shardqwm.SubscriberConfig{Tenant: "acme", ConsumerGroup: "billing"}, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer sub.Close()

	msg := message.NewMessage("order-42-paid", []byte(`{"status":"paid"}`))
	msg.Metadata.Set(shardqwm.KeyMetadata, "order-42") // ordered per order
	if err := pub.Publish("orders", msg); err != nil {
		log.Fatal(err)
	}
	messages, err := sub.Subscribe(context.Background(), "orders")
	if err != nil {
		log.Fatal(err)
	}
	m := <-messages
	fmt.Println(m.UUID, string(m.Payload))
	m.Ack()
	// Output: order-42-paid {"status":"paid"}
}
