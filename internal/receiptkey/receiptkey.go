// SPDX-License-Identifier: Apache-2.0

// Package receiptkey signs and verifies receipts with HMAC-SHA256 under
// keys kept in the database (shardq_receipt_keys), so that every server of
// one database accepts the receipts of every other, and a client cannot
// make or edit one.
//
// Keys are numbered. The newest signs. A key stays valid for Grace after
// the next one was created (one visibility timeout: no receipt it signed
// can still be live after that), then Rotate deletes it. A server reads
// the keys every Refresh, and at once (at most once a second) when a
// receipt names a key it does not know: one rotated in by another server.
package receiptkey

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/shardq/shardq/driver"
)

// Errors of Verify.
var (
	ErrUnknownKey = errors.New("signed with an unknown or retired key")
	ErrSignature  = errors.New("signature does not match")
)

// Refresh is how often a Ring reads the keys again.
const Refresh = time.Minute

// secretBytes is a key's size: HMAC-SHA256's block-size-bounded ideal.
const secretBytes = 32

// Ring signs with the newest key and verifies with any valid one.
type Ring struct {
	store driver.Tokens
	grace time.Duration
	clock func() time.Time

	mu       sync.Mutex
	keys     []driver.ReceiptKey // by ID
	loadedAt time.Time
	missAt   time.Time // the last reload for an unknown key
}

// New returns a Ring on store; a key is valid for grace after its
// successor's creation.
func New(store driver.Tokens, grace time.Duration, clock func() time.Time) *Ring {
	return &Ring{store: store, grace: grace, clock: clock}
}

// Sign builds a message for the newest key's id and returns it with its
// MAC under that key. With no key stored yet it creates the first.
func (r *Ring) Sign(ctx context.Context, build func(keyID int64) []byte) (msg, sum []byte, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.loadLocked(ctx, false); err != nil {
		return nil, nil, err
	}
	k := r.keys[len(r.keys)-1]
	msg = build(k.ID)
	return msg, mac(k.Secret, msg), nil
}

// Verify checks sum, the MAC of msg under key id, in constant time.
func (r *Ring) Verify(ctx context.Context, id int64, msg, sum []byte) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.loadLocked(ctx, false); err != nil {
		return err
	}
	now := r.clock()
	k, ok := r.validLocked(id, now)
	if !ok && now.Sub(r.missAt) >= time.Second {
		r.missAt = now
		if err := r.loadLocked(ctx, true); err != nil {
			return err
		}
		k, ok = r.validLocked(id, now)
	}
	if !ok {
		return fmt.Errorf("receipt key %d: %w", id, ErrUnknownKey)
	}
	if !hmac.Equal(mac(k.Secret, msg), sum) {
		return ErrSignature
	}
	return nil
}

// validLocked finds key id if it may still verify at now.
func (r *Ring) validLocked(id int64, now time.Time) (driver.ReceiptKey, bool) {
	for i, k := range r.keys {
		if k.ID != id {
			continue
		}
		if i+1 < len(r.keys) && !now.Before(r.keys[i+1].CreatedAt.Add(r.grace)) {
			return k, false // retired more than grace ago
		}
		return k, true
	}
	return driver.ReceiptKey{}, false
}

// loadLocked reads the keys when they are older than Refresh (or always,
// with force), creating the first key if there is none.
func (r *Ring) loadLocked(ctx context.Context, force bool) error {
	now := r.clock()
	if !force && len(r.keys) > 0 && now.Sub(r.loadedAt) < Refresh {
		return nil
	}
	keys, err := Ensure(ctx, r.store, now)
	if err != nil {
		return err
	}
	r.keys, r.loadedAt = keys, now
	return nil
}

// Ensure returns the stored keys, creating the first when there is none
// (migrate calls it; so does a server that finds none).
func Ensure(ctx context.Context, store driver.Tokens, now time.Time) ([]driver.ReceiptKey, error) {
	keys, err := store.ReceiptKeys(ctx)
	if err != nil || len(keys) > 0 {
		return keys, err
	}
	// Two creators race on ID 1: one wins and both read it back.
	if _, err := store.AddReceiptKey(ctx, driver.ReceiptKey{ID: 1, Secret: newSecret(), CreatedAt: now.UTC()}); err != nil {
		return nil, err
	}
	keys, err = store.ReceiptKeys(ctx)
	if err == nil && len(keys) == 0 {
		err = errors.New("read receipt keys: none after creating the first")
	}
	return keys, err
}

// Rotate adds a key that signs from now on and deletes the keys retired
// for longer than grace; with dropPrevious it deletes every older key at
// once (a leaked key: receipts signed by it are refused from now on, and
// their messages are delivered again after their visibility timeout).
func Rotate(ctx context.Context, store driver.Tokens, grace time.Duration, dropPrevious bool, now time.Time) (driver.ReceiptKey, []int64, error) {
	keys, err := Ensure(ctx, store, now)
	if err != nil {
		return driver.ReceiptKey{}, nil, err
	}
	k := driver.ReceiptKey{ID: keys[len(keys)-1].ID + 1, Secret: newSecret(), CreatedAt: now.UTC()}
	added, err := store.AddReceiptKey(ctx, k)
	if err != nil {
		return driver.ReceiptKey{}, nil, err
	}
	if !added {
		return driver.ReceiptKey{}, nil, fmt.Errorf("add receipt key %d: another rotation added it first; run it again", k.ID)
	}
	keys = append(keys, k)
	var dropped []int64
	for i, old := range keys[:len(keys)-1] {
		if dropPrevious || !now.Before(keys[i+1].CreatedAt.Add(grace)) {
			if err := store.DeleteReceiptKey(ctx, old.ID); err != nil {
				return k, dropped, err
			}
			dropped = append(dropped, old.ID)
		}
	}
	return k, dropped, nil
}

func mac(secret, msg []byte) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write(msg)
	return h.Sum(nil)
}

func newSecret() []byte {
	b := make([]byte, secretBytes)
	rand.Read(b) // never fails (crypto/rand)
	return b
}
