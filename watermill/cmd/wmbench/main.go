// SPDX-License-Identifier: Apache-2.0

// Command wmbench compares the shardq watermill Pub/Sub with watermill-sql
// on one MariaDB/MySQL server, in one run: publish rates with 1 and 16
// publishers, the consume rate, end-to-end latency at a steady rate, and a
// loss probe (16 publishers at once while a subscriber reads). Each
// backend gets its own fresh database; watermill-sql is the baseline of
// the ratios.
//
//	go run ./cmd/wmbench -dsn 'root@tcp(127.0.0.1:3316)/'
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/go-sql-driver/mysql"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver/mysqldriver"
	shardqwm "github.com/shardq/shardq/watermill"
)

func main() {
	dsn := flag.String("dsn", "root@tcp(127.0.0.1:3316)/", "go-sql-driver DSN of the server, without a database")
	n := flag.Int("messages", 5000, "messages per publish and consume run")
	lossN := flag.Int("loss-messages", 20000, "messages of the loss probe")
	latencyN := flag.Int("latency-messages", 500, "messages of the latency run")
	rate := flag.Int("rate", 100, "messages a second in the latency run")
	flag.Parse()
	backends := []backend{
		{name: "watermill-sql", open: openWatermillSQL},
		{name: "shardq (one key per topic)", open: openShardq(nil)},
		{name: "shardq (ungrouped)", open: openShardq(shardqwm.Ungrouped)},
	}
	results := make([]result, len(backends))
	for i, b := range backends {
		r, err := run(*dsn, b, *n, *lossN, *latencyN, *rate)
		if err != nil {
			log.Fatalf("%s: %v", b.name, err)
		}
		results[i] = r
		fmt.Fprintf(os.Stderr, "%s: %+v\n", b.name, r)
	}
	base := results[0]
	fmt.Printf("| backend | publish, 1 publisher | publish, 16 publishers | consume | latency p50 | latency p99 | lost of %d (16 publishers) |\n", *lossN)
	fmt.Println("|---|---|---|---|---|---|---|")
	for i, r := range results {
		fmt.Printf("| %s | %.0f/s (%.2f×) | %.0f/s (%.2f×) | %.0f/s (%.2f×) | %s | %s | %d (%.2f%%) |\n", backends[i].name,
			r.pub1, r.pub1/base.pub1, r.pub16, r.pub16/base.pub16, r.consume, r.consume/base.consume,
			r.p50.Round(100*time.Microsecond), r.p99.Round(100*time.Microsecond), r.lost, 100*float64(r.lost)/float64(*lossN))
	}
}

// backend opens a publisher and a subscriber factory on a database.
type backend struct {
	name string
	open func(dsn string) (message.Publisher, func() (message.Subscriber, error), func(), error)
}

type result struct {
	pub1, pub16, consume float64 // messages a second
	p50, p99             time.Duration
	lost                 int
}

func openWatermillSQL(dsn string) (message.Publisher, func() (message.Subscriber, error), func(), error) {
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return nil, nil, nil, err
	}
	logger := watermill.NopLogger{}
	pub, err := wmsql.NewPublisher(wmsql.BeginnerFromStdSQL(db), wmsql.PublisherConfig{
		SchemaAdapter: wmsql.DefaultMySQLSchema{}, AutoInitializeSchema: true}, logger)
	if err != nil {
		return nil, nil, nil, err
	}
	newSub := func() (message.Subscriber, error) {
		return wmsql.NewSubscriber(wmsql.BeginnerFromStdSQL(db), wmsql.SubscriberConfig{
			SchemaAdapter: wmsql.DefaultMySQLSchema{}, OffsetsAdapter: wmsql.DefaultMySQLOffsetsAdapter{}, InitializeSchema: true}, logger)
	}
	return pub, newSub, func() { db.Close() }, nil
}

func openShardq(key shardqwm.PartitionKeyFunc) func(dsn string) (message.Publisher, func() (message.Subscriber, error), func(), error) {
	return func(dsn string) (message.Publisher, func() (message.Subscriber, error), func(), error) {
		drv, err := mysqldriver.Open(dsn)
		if err != nil {
			return nil, nil, nil, err
		}
		client, err := shardq.NewClient(drv, nil)
		if err != nil {
			return nil, nil, nil, err
		}
		if err := client.Migrate(context.Background()); err != nil {
			return nil, nil, nil, err
		}
		pub, err := shardqwm.NewPublisher(client, shardqwm.PublisherConfig{Tenant: "bench", PartitionKey: key}, nil)
		if err != nil {
			return nil, nil, nil, err
		}
		newSub := func() (message.Subscriber, error) {
			return shardqwm.NewSubscriber(client, shardqwm.SubscriberConfig{Tenant: "bench"}, nil)
		}
		return pub, newSub, func() { client.Close(); drv.Close() }, nil
	}
}

// run measures one backend on a database of its own.
func run(serverDSN string, b backend, n, lossN, latencyN, rate int) (result, error) {
	dsn, drop, err := freshDatabase(serverDSN)
	if err != nil {
		return result{}, err
	}
	defer drop()
	pub, newSub, closeAll, err := b.open(dsn)
	if err != nil {
		return result{}, err
	}
	defer closeAll()
	defer pub.Close()
	var r result
	if r.pub1, err = publishRate(pub, "pub1", n, 1); err != nil {
		return r, err
	}
	if r.pub16, err = publishRate(pub, "pub16", n, 16); err != nil {
		return r, err
	}
	if r.consume, err = consumeRate(newSub, "pub1", n); err != nil {
		return r, err
	}
	if r.p50, r.p99, err = latency(pub, newSub, "latency", latencyN, rate); err != nil {
		return r, err
	}
	r.lost, err = lossProbe(pub, newSub, "loss", lossN)
	return r, err
}

// freshDatabase creates a database for one backend and returns its DSN
// and a function that drops it.
func freshDatabase(serverDSN string) (string, func(), error) {
	cfg, err := mysql.ParseDSN(serverDSN)
	if err != nil {
		return "", nil, err
	}
	admin, err := sql.Open("mysql", serverDSN)
	if err != nil {
		return "", nil, err
	}
	name := fmt.Sprintf("wmbench_%d", time.Now().UnixNano())
	if _, err := admin.Exec("CREATE DATABASE " + name + " CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"); err != nil {
		admin.Close()
		return "", nil, err
	}
	cfg.DBName = name
	return cfg.FormatDSN(), func() {
		if _, err := admin.Exec("DROP DATABASE " + name); err != nil {
			log.Printf("drop database %s: %v", name, err)
		}
		admin.Close()
	}, nil
}

// publishRate publishes n messages, one per Publish call, from
// publishers goroutines, and returns messages a second.
func publishRate(pub message.Publisher, topic string, n, publishers int) (float64, error) {
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, publishers)
	for p := range publishers {
		wg.Go(func() {
			for i := p; i < n; i += publishers {
				if err := pub.Publish(topic, message.NewMessage(watermill.NewUUID(), []byte(strconv.Itoa(i)))); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return 0, err
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

// consumeRate reads and acks n stored messages with a new subscriber.
func consumeRate(newSub func() (message.Subscriber, error), topic string, n int) (float64, error) {
	sub, err := newSub()
	if err != nil {
		return 0, err
	}
	defer sub.Close()
	start := time.Now()
	ch, err := sub.Subscribe(context.Background(), topic)
	if err != nil {
		return 0, err
	}
	seen := map[string]bool{}
	for len(seen) < n {
		select {
		case m := <-ch:
			seen[m.UUID] = true
			m.Ack()
		case <-time.After(30 * time.Second):
			return 0, fmt.Errorf("consume: %d of %d in 30 s", len(seen), n)
		}
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

// latency publishes n messages at rate a second to a running subscriber
// and returns the p50 and p99 of publish-to-receive.
func latency(pub message.Publisher, newSub func() (message.Subscriber, error), topic string, n, rate int) (p50, p99 time.Duration, err error) {
	sub, err := newSub()
	if err != nil {
		return 0, 0, err
	}
	defer sub.Close()
	ch, err := sub.Subscribe(context.Background(), topic)
	if err != nil {
		return 0, 0, err
	}
	// Warm up: the subscriber holds its partition before timing starts.
	if err := pub.Publish(topic, message.NewMessage("warmup", []byte("0"))); err != nil {
		return 0, 0, err
	}
	select {
	case m := <-ch:
		m.Ack()
	case <-time.After(30 * time.Second):
		return 0, 0, errors.New("latency: warm-up message not received")
	}
	var lat []time.Duration
	done := make(chan struct{})
	go func() {
		defer close(done)
		for len(lat) < n {
			select {
			case m := <-ch:
				sent, _ := strconv.ParseInt(string(m.Payload), 10, 64)
				lat = append(lat, time.Since(time.Unix(0, sent)))
				m.Ack()
			case <-time.After(30 * time.Second):
				return
			}
		}
	}()
	tick := time.NewTicker(time.Second / time.Duration(rate))
	for range n {
		<-tick.C
		if err := pub.Publish(topic, message.NewMessage(watermill.NewUUID(), []byte(strconv.FormatInt(time.Now().UnixNano(), 10)))); err != nil {
			return 0, 0, err
		}
	}
	tick.Stop()
	<-done
	if len(lat) < n {
		return 0, 0, fmt.Errorf("latency: %d of %d received", len(lat), n)
	}
	slices.Sort(lat)
	return lat[len(lat)/2], lat[len(lat)*99/100], nil
}

// lossProbe publishes n messages from 16 publishers at once while a
// subscriber reads, and returns how many were never delivered (waiting
// until all arrived, or 15 s passed without a new one).
func lossProbe(pub message.Publisher, newSub func() (message.Subscriber, error), topic string, n int) (int, error) {
	sub, err := newSub()
	if err != nil {
		return 0, err
	}
	defer sub.Close()
	ch, err := sub.Subscribe(context.Background(), topic)
	if err != nil {
		return 0, err
	}
	var received sync.Map
	var count atomic.Int64
	var last atomic.Int64
	last.Store(time.Now().UnixNano())
	go func() {
		for m := range ch {
			if _, dup := received.LoadOrStore(m.UUID, true); !dup {
				count.Add(1)
				last.Store(time.Now().UnixNano())
			}
			m.Ack()
		}
	}()
	if _, err := publishRate(pub, topic, n, 16); err != nil {
		return 0, err
	}
	for count.Load() < int64(n) && time.Since(time.Unix(0, last.Load())) < 15*time.Second {
		time.Sleep(50 * time.Millisecond)
	}
	return n - int(count.Load()), nil
}
