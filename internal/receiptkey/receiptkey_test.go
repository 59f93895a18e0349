// SPDX-License-Identifier: Apache-2.0

package receiptkey_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/receiptkey"
	"github.com/shardq/shardq/internal/testdb"
)

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func eachDB(t *testing.T, fn func(t *testing.T, drv driver.Driver)) {
	t.Run("sqlite", func(t *testing.T) { fn(t, testdb.Migrated(t, testdb.SQLite(t))) })
	t.Run("mariadb", func(t *testing.T) { fn(t, testdb.Migrated(t, testdb.MySQL(t))) })
}

func sign(t *testing.T, r *receiptkey.Ring, text string) (int64, []byte, []byte) {
	t.Helper()
	var id int64
	msg, sum, err := r.Sign(context.Background(), func(k int64) []byte { id = k; return []byte(text) })
	if err != nil {
		t.Fatal(err)
	}
	return id, msg, sum
}

// Two servers of one database: what one signs the other verifies; an
// edited message or MAC fails; a rotation made elsewhere is picked up
// when a receipt names the new key; the replaced key verifies for the
// grace and not after; --drop-previous refuses it at once.
func TestRingAcrossServersAndRotation(t *testing.T) {
	eachDB(t, func(t *testing.T, drv driver.Driver) {
		ctx := context.Background()
		const grace = time.Hour
		clk := &clock{t: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)}
		a, b := receiptkey.New(drv, grace, clk.Now), receiptkey.New(drv, grace, clk.Now)

		id1, msg, sum := sign(t, a, "hello")
		if id1 != 1 {
			t.Fatalf("first key id %d, want 1", id1)
		}
		if err := b.Verify(ctx, id1, msg, sum); err != nil {
			t.Fatalf("another server verifies: %v", err)
		}
		if err := b.Verify(ctx, id1, []byte("hellO"), sum); !errors.Is(err, receiptkey.ErrSignature) {
			t.Fatalf("edited message: %v, want ErrSignature", err)
		}
		bad := append([]byte(nil), sum...)
		bad[0] ^= 1
		if err := b.Verify(ctx, id1, msg, bad); !errors.Is(err, receiptkey.ErrSignature) {
			t.Fatalf("edited MAC: %v, want ErrSignature", err)
		}
		if err := b.Verify(ctx, 99, msg, sum); !errors.Is(err, receiptkey.ErrUnknownKey) {
			t.Fatalf("unknown key: %v, want ErrUnknownKey", err)
		}

		clk.Add(2 * time.Second)
		k2, dropped, err := receiptkey.Rotate(ctx, drv, grace, false, clk.Now())
		if err != nil || k2.ID != 2 || len(dropped) != 0 {
			t.Fatalf("rotate = %+v, %v, %v", k2, dropped, err)
		}
		// a still signs with key 1 until it reads the keys again: both
		// verify everywhere meanwhile.
		if id, _, _ := sign(t, a, "x"); id != 1 {
			t.Fatalf("before its refresh a signs with key %d, want 1", id)
		}
		clk.Add(receiptkey.Refresh)
		id2, msg2, sum2 := sign(t, a, "after")
		if id2 != 2 {
			t.Fatalf("after its refresh a signs with key %d, want 2", id2)
		}
		if err := b.Verify(ctx, id2, msg2, sum2); err != nil {
			t.Fatalf("b meets key 2 first in a receipt: %v", err)
		}
		if err := b.Verify(ctx, id1, msg, sum); err != nil {
			t.Fatalf("key 1 within its grace: %v", err)
		}
		clk.Add(grace)
		if err := b.Verify(ctx, id1, msg, sum); !errors.Is(err, receiptkey.ErrUnknownKey) {
			t.Fatalf("key 1 past its grace: %v, want ErrUnknownKey", err)
		}
		// The next rotation deletes it; --drop-previous deletes key 3's
		// predecessors at once.
		k3, dropped, err := receiptkey.Rotate(ctx, drv, grace, false, clk.Now())
		if err != nil || k3.ID != 3 || len(dropped) != 1 || dropped[0] != 1 {
			t.Fatalf("rotate = %+v, dropped %v, %v; want key 3, key 1 dropped", k3, dropped, err)
		}
		k4, dropped, err := receiptkey.Rotate(ctx, drv, grace, true, clk.Now())
		if err != nil || k4.ID != 4 || len(dropped) != 2 {
			t.Fatalf("rotate --drop-previous = %+v, dropped %v, %v; want keys 2 and 3 dropped", k4, dropped, err)
		}
		// b read the keys before the drop: key 2 is still the newest it
		// knows, and verifies until b reads them again, within Refresh.
		if err := b.Verify(ctx, id2, msg2, sum2); err != nil {
			t.Fatalf("before b's refresh: %v", err)
		}
		clk.Add(receiptkey.Refresh)
		if err := b.Verify(ctx, id2, msg2, sum2); !errors.Is(err, receiptkey.ErrUnknownKey) {
			t.Fatalf("a dropped key after b's refresh: %v, want ErrUnknownKey", err)
		}
		keys, err := drv.ReceiptKeys(ctx)
		if err != nil || len(keys) != 1 || keys[0].ID != 4 {
			t.Fatalf("keys left: %+v, %v", keys, err)
		}
	})
}

// Servers starting at once on a database without a key agree on one.
func TestEnsureRaces(t *testing.T) {
	eachDB(t, func(t *testing.T, drv driver.Driver) {
		var wg sync.WaitGroup
		got := make([][]driver.ReceiptKey, 4)
		errs := make([]error, 4)
		for i := range got {
			wg.Go(func() { got[i], errs[i] = receiptkey.Ensure(context.Background(), drv, time.Now()) })
		}
		wg.Wait()
		for i := range got {
			if errs[i] != nil || len(got[i]) != 1 || string(got[i][0].Secret) != string(got[0][0].Secret) {
				t.Fatalf("creator %d: %+v, %v; want the one key all others got", i, got[i], errs[i])
			}
		}
	})
}
