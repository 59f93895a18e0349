// SPDX-License-Identifier: Apache-2.0

package lifecycle

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
)

// Close stops the handles kind by kind, lowest order first, each waiting
// for the one before; it joins their errors and refuses new handles.
func TestHandlesCloseInOrder(t *testing.T) {
	var hs Handles
	var mu sync.Mutex
	var stopped []int
	boom := errors.New("boom")
	for i, order := range []int{2, 0, 1, 0, 2} {
		key := new(int)
		if err := hs.Add(key, order, func(context.Context) error {
			mu.Lock()
			stopped = append(stopped, order)
			mu.Unlock()
			hs.Remove(key)
			if i == 0 {
				return boom
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	removed := new(int)
	if err := hs.Add(removed, 0, func(context.Context) error { t.Error("a removed handle was stopped"); return nil }); err != nil {
		t.Fatal(err)
	}
	hs.Remove(removed)
	if err := hs.Close(context.Background()); !errors.Is(err, boom) {
		t.Fatalf("Close = %v, want %v joined", err, boom)
	}
	if !slices.Equal(stopped, []int{0, 0, 1, 2, 2}) {
		t.Fatalf("stopped in order %v", stopped)
	}
	if err := hs.Add(new(int), 0, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Add after Close = %v, want ErrClosed", err)
	}
}
