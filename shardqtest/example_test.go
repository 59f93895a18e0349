// SPDX-License-Identifier: Apache-2.0

package shardqtest_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/shardqtest"
)

// exampleTB stands in for the *testing.T a test has: examples get none.
type exampleTB struct {
	testing.TB
	cleanups []func()
}

func (e *exampleTB) Helper() {}
func (e *exampleTB) Fatalf(format string, args ...any) {
	panic(fmt.Sprintf(format, args...))
}
func (e *exampleTB) Cleanup(f func()) { e.cleanups = append(e.cleanups, f) }
func (e *exampleTB) TempDir() string {
	dir, err := os.MkdirTemp("", "shardqtest")
	if err != nil {
		panic(err)
	}
	e.cleanups = append(e.cleanups, func() { os.RemoveAll(dir) })
	return dir
}
func (e *exampleTB) done() {
	for i := len(e.cleanups) - 1; i >= 0; i-- {
		e.cleanups[i]()
	}
}

// A test of code that publishes: a throwaway client, then what it
// stored. In a test, pass the test's t.
func ExampleRequirePublished() {
	t := &exampleTB{}
	defer t.done()
	c := shardqtest.NewClient(t, nil)

	// The code under test.
	placeOrder := func(ctx context.Context, id string) error {
		_, err := c.Publish(ctx, shardq.Message{Tenant: "shop", Topic: "orders", PartitionKey: id, ID: id + "-created", Payload: []byte("created")})
		return err
	}
	if err := placeOrder(context.Background(), "o-17"); err != nil {
		panic(err)
	}

	got := shardqtest.RequirePublished(t, c, shardqtest.Want{Tenant: "shop", Topic: "orders", PartitionKey: "o-17", Payload: []byte("created")})
	fmt.Println(got[0].ID)
	// Output: o-17-created
}

// A handler's unit test: what a subscriber would do with its result.
func ExampleHandle() {
	handler := func(ctx context.Context, d *shardq.Delivery) error {
		if string(d.Payload) == "" {
			return shardq.DeadLetter(fmt.Errorf("order %s: empty", d.PartitionKey))
		}
		if d.Headers["hold"] == "true" {
			return d.Defer(ctx) // set aside until asked for by its offset
		}
		return nil
	}
	ctx := context.Background()
	ok := shardqtest.Handle(ctx, handler, &shardq.Delivery{Tenant: "shop", Topic: "orders", PartitionKey: "o-17", Payload: []byte("created")}, nil)
	empty := shardqtest.Handle(ctx, handler, &shardq.Delivery{Tenant: "shop", Topic: "orders", PartitionKey: "o-18"}, nil)
	held := shardqtest.Handle(ctx, handler, &shardq.Delivery{Tenant: "shop", Topic: "orders", PartitionKey: "o-19", Payload: []byte("x"),
		Headers: map[string]string{"hold": "true"}}, nil)
	fmt.Println(ok.Ack, empty.DeadLetter, held.Deferred)
	// Output: true true true
}
