// SPDX-License-Identifier: Apache-2.0

package shardqwm_test

import (
	"log/slog"
	"os"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
	"go.uber.org/goleak"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/testdb"
	shardqwm "github.com/shardq/shardq/watermill"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// Parked database/sql and SQLite connection openers of drivers
		// that the suites' clients closed.
		goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"),
	)
}

// databases are the backends the suite runs on: the embedded SQLite
// default and the MariaDB the test script starts.
var databases = []struct {
	name string
	open func(t *testing.T) driver.Driver
}{
	{"sqlite", func(t *testing.T) driver.Driver { return testdb.Migrated(t, testdb.SQLite(t)) }},
	{"mariadb", func(t *testing.T) driver.Driver { return testdb.Migrated(t, testdb.MySQL(t)) }},
}

// modes are the two ways a watermill topic can map to shardq: one
// ordered partition per topic (the default), or ungrouped messages for
// competing consumers.
var modes = []struct {
	name     string
	key      shardqwm.PartitionKeyFunc
	features tests.Features
}{
	{"one-key-per-topic", nil, tests.Features{
		ConsumerGroups: true,
		// At least once: a subscriber stopped between a handler's ack
		// and the commit of its cursor (CommitInterval) redelivers.
		ExactlyOnceDelivery: false,
		// One partition per topic, leased by one member of the group at
		// a time, however many subscribe.
		GuaranteedOrder: true,
		Persistent:      true,
		// A new subscriber of the constructor's (shared) consumer group
		// continues from the group's cursor, as a Kafka consumer group
		// does: it reads old messages only in a new group.
		NewSubscriberReceivesOldMessages: false,
	}},
	{"ungrouped", shardqwm.Ungrouped, tests.Features{
		ConsumerGroups:      true,
		ExactlyOnceDelivery: false,
		// Competing consumers handle messages in parallel: no order.
		GuaranteedOrder:                  false,
		Persistent:                       true,
		NewSubscriberReceivesOldMessages: false,
	}},
}

// constructors returns the suite's constructors on one client: the
// default consumer group, and a named one.
func constructors(client *shardq.Client, key shardqwm.PartitionKeyFunc) (tests.PubSubConstructor, tests.ConsumerGroupPubSubConstructor) {
	logger := watermill.NewSlogLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	withGroup := func(t *testing.T, group string) (message.Publisher, message.Subscriber) {
		pub, err := shardqwm.NewPublisher(client, shardqwm.PublisherConfig{Tenant: "acme", PartitionKey: key}, logger)
		if err != nil {
			t.Fatal(err)
		}
		sub, err := shardqwm.NewSubscriber(client, shardqwm.SubscriberConfig{Tenant: "acme", ConsumerGroup: group}, logger)
		if err != nil {
			t.Fatal(err)
		}
		return pub, sub
	}
	return func(t *testing.T) (message.Publisher, message.Subscriber) { return withGroup(t, "") }, withGroup
}

// eachBackend runs fn for every database and mode, with a client shared by
// every publisher and subscriber of the run (one process, one client).
func eachBackend(t *testing.T, fn func(t *testing.T, f tests.Features, c tests.PubSubConstructor, cg tests.ConsumerGroupPubSubConstructor)) {
	for _, db := range databases {
		for _, mode := range modes {
			t.Run(db.name+"/"+mode.name, func(t *testing.T) {
				client, err := shardq.NewClient(db.open(t), nil)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() {
					if err := client.Close(); err != nil {
						t.Error(err)
					}
				})
				c, cg := constructors(client, mode.key)
				fn(t, mode.features, c, cg)
			})
		}
	}
}

// TestPubSub is watermill's universal suite.
func TestPubSub(t *testing.T) {
	eachBackend(t, tests.TestPubSub)
}

// TestPubSubStressTest runs the suite ten times at once
// (STRESS_TEST_COUNT changes how many).
func TestPubSubStressTest(t *testing.T) {
	eachBackend(t, tests.TestPubSubStressTest)
}
