// SPDX-License-Identifier: Apache-2.0

package shardq_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
)

// A delayed message holds up the later messages of its partition (they
// wait behind it, in order) and is delivered no earlier than its time;
// a delayed ungrouped message does not hold up the ungrouped messages
// after it.
func TestDelayedMessages(t *testing.T) {
	eachDatabase(t, func(t *testing.T, _ string, _ driver.Driver, c *shardq.Client) {
		ctx := context.Background()
		type got struct {
			id string
			at time.Time
		}
		var mu sync.Mutex
		var grouped, ungrouped []got
		all := make(chan struct{})
		sub, err := c.Subscribe(ctx, faultSubscriberConfig(func(_ context.Context, d *shardq.Delivery) error {
			mu.Lock()
			defer mu.Unlock()
			g := got{d.ID, time.Now()}
			if d.PartitionKey == "" {
				ungrouped = append(ungrouped, g)
			} else {
				grouped = append(grouped, g)
			}
			if len(grouped)+len(ungrouped) == 5 {
				close(all)
			}
			return nil
		}))
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Stop(ctx)
		const delay = 400 * time.Millisecond
		publish := func(m shardq.Message) shardq.PublishResult {
			t.Helper()
			m.Tenant, m.Topic = "t", "x"
			res, err := c.Publish(ctx, m)
			if err != nil {
				t.Fatal(err)
			}
			return res[0]
		}
		publish(shardq.Message{PartitionKey: "k", ID: "first"})
		delayed := publish(shardq.Message{PartitionKey: "k", ID: "delayed", Delay: delay})
		publish(shardq.Message{PartitionKey: "k", ID: "behind"})
		publish(shardq.Message{ID: "u-delayed", Delay: delay})
		publish(shardq.Message{ID: "u-now"})

		stored, _, err := c.Admin().Inspect(ctx, shardq.MessageRef{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "delayed"})
		if err != nil {
			t.Fatal(err)
		}
		notBefore := stored.NotBefore
		if notBefore.IsZero() || stored.Offset != delayed.Offset {
			t.Fatalf("stored %+v; want it scheduled", stored)
		}
		select {
		case <-all:
		case <-time.After(30 * time.Second):
			t.Fatalf("after 30 s: grouped %v, ungrouped %v", grouped, ungrouped)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(grouped) != 3 || grouped[0].id != "first" || grouped[1].id != "delayed" || grouped[2].id != "behind" {
			t.Fatalf("partition k delivered %v; want first, delayed, behind", grouped)
		}
		if grouped[1].at.Before(notBefore) || grouped[2].at.Before(grouped[1].at) {
			t.Fatalf("delayed delivered at %s, before its time %s (or behind overtook it at %s)", grouped[1].at, notBefore, grouped[2].at)
		}
		if len(ungrouped) != 2 || ungrouped[0].id != "u-now" || ungrouped[1].id != "u-delayed" {
			t.Fatalf("ungrouped delivered %v; want u-now before u-delayed", ungrouped)
		}
		uStored, _, err := c.Admin().Inspect(ctx, shardq.MessageRef{Tenant: "t", Topic: "x", ID: "u-delayed"})
		if err != nil {
			t.Fatal(err)
		}
		if ungrouped[1].at.Before(uStored.NotBefore) {
			t.Fatalf("u-delayed delivered at %s, before its time %s", ungrouped[1].at, uStored.NotBefore)
		}
	})
}

// A delay rides along PublishTx and transactional sends; bad delays are
// refused before any SQL, naming the field, with nothing stored.
func TestDelayThroughEveryPublishPath(t *testing.T) {
	eachDatabase(t, func(t *testing.T, _ string, drv driver.Driver, c *shardq.Client) {
		ctx := context.Background()
		at := time.Now().Add(time.Hour).UTC().Truncate(time.Microsecond)
		tx, err := drv.DB().BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.PublishTx(ctx, tx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "in-tx", NotBefore: at}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		p, err := c.StartTransactionProducer(ctx, shardq.TransactionProducerConfig{ProducerGroup: "pg", Tenants: []string{"t"},
			Checker: func(context.Context, *shardq.HalfMessage) (shardq.TxState, error) { return shardq.TxCommit, nil }})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Stop(ctx)
		if _, err := p.SendInTransaction(ctx, shardq.Message{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "half", NotBefore: at}, nil, nil,
			func(context.Context, *shardq.HalfMessage) (shardq.TxState, error) { return shardq.TxCommit, nil }); err != nil {
			t.Fatal(err)
		}
		for _, id := range []string{"in-tx", "half"} {
			m, _, err := c.Admin().Inspect(ctx, shardq.MessageRef{Tenant: "t", Topic: "x", PartitionKey: "k", ID: id})
			if err != nil || !m.NotBefore.Equal(at) {
				t.Fatalf("%s stored with NotBefore %v (%v); want %v", id, m.NotBefore, err, at)
			}
		}

		for _, bad := range []struct {
			m     shardq.Message
			field string
		}{
			{shardq.Message{Delay: -time.Second}, "delay"},
			{shardq.Message{Delay: time.Second, NotBefore: at}, "delay"},
			{shardq.Message{Delay: 25 * time.Hour}, "delay"},
			{shardq.Message{NotBefore: time.Now().Add(48 * time.Hour)}, "not before"},
		} {
			bad.m.Tenant, bad.m.Topic, bad.m.PartitionKey, bad.m.ID = "t", "x", "k", "bad"
			_, err := c.Publish(ctx, bad.m)
			var ve *shardq.ValidationError
			if !errors.As(err, &ve) || ve.Field != bad.field {
				t.Fatalf("Publish(delay %s, not before %v) = %v; want a validation error naming %q", bad.m.Delay, bad.m.NotBefore, err, bad.field)
			}
		}
		if _, _, err := c.Admin().Inspect(ctx, shardq.MessageRef{Tenant: "t", Topic: "x", PartitionKey: "k", ID: "bad"}); err == nil {
			t.Fatal("a refused message was stored")
		}
	})
}
