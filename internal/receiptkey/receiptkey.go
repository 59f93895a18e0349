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
	"hash"
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

// Size is a MAC's size in bytes.
const Size = sha256.Size

// key is a stored key with MACs under it kept for reuse: a MAC's set-up
// (hashing the padded secret twice) costs as much as the MAC of a
// receipt, which is signed once per message handed out.
type key struct {
	driver.ReceiptKey
	macs *sync.Pool
}

func newKey(k driver.ReceiptKey) key {
	return key{k, &sync.Pool{New: func() any { return hmac.New(sha256.New, k.Secret) }}}
}

// sum appends msg's MAC under k to out.
func (k key) sum(msg, out []byte) []byte {
	h := k.macs.Get().(hash.Hash)
	h.Write(msg)
	out = h.Sum(out)
	h.Reset()
	k.macs.Put(h)
	return out
}

// Ring signs with the newest key and verifies with any valid one. Its
// lock is never held across a database read: while one caller reloads
// the keys, the others go on with the keys they have.
type Ring struct {
	store driver.Tokens
	grace time.Duration
	clock func() time.Time

	loading sync.Mutex // one reload at a time

	mu       sync.Mutex
	keys     []key // by ID; replaced whole, never changed in place
	loadedAt time.Time
	missAt   time.Time // the last read for a key newer than the newest known
}

// New returns a Ring on store; a key is valid for grace after its
// successor's creation.
func New(store driver.Tokens, grace time.Duration, clock func() time.Time) *Ring {
	return &Ring{store: store, grace: grace, clock: clock}
}

// Sign builds a message for the newest key's id and returns it with its
// MAC under that key. With no key stored yet it creates the first.
func (r *Ring) Sign(ctx context.Context, build func(keyID int64) []byte) (msg, sum []byte, err error) {
	keys, err := r.current(ctx)
	if err != nil {
		return nil, nil, err
	}
	k := keys[len(keys)-1]
	msg = build(k.ID)
	return msg, k.sum(msg, make([]byte, 0, Size)), nil
}

// Verify checks sum, the MAC of msg under key id, in constant time. An
// id above the newest it knows makes it read the keys again, at most once
// a second, or wait for a read under way: a key another server rotated
// in. (A key dropped elsewhere is refused from the next read, within
// Refresh.)
func (r *Ring) Verify(ctx context.Context, id int64, msg, sum []byte) error {
	keys, err := r.current(ctx)
	if err != nil {
		return err
	}
	now := r.clock()
	if id > keys[len(keys)-1].ID {
		if keys, err = r.newer(ctx, id, now); err != nil {
			return err
		}
	}
	k, ok := valid(keys, id, now, r.grace)
	if !ok {
		return fmt.Errorf("receipt key %d: %w", id, ErrUnknownKey)
	}
	var buf [Size]byte
	if !hmac.Equal(k.sum(msg, buf[:0]), sum) {
		return ErrSignature
	}
	return nil
}

// newer returns keys that include id if a read finds it: it waits for a
// read under way, or makes one when the last was a second ago or more.
func (r *Ring) newer(ctx context.Context, id int64, now time.Time) ([]key, error) {
	r.loading.Lock()
	defer r.loading.Unlock()
	r.mu.Lock()
	keys, due := r.keys, now.Sub(r.missAt) >= time.Second
	if due {
		r.missAt = now
	}
	r.mu.Unlock()
	if id <= keys[len(keys)-1].ID || !due {
		return keys, nil // a read under way found it, or a read was made this second
	}
	return r.loadLocked(ctx)
}

// valid finds key id among keys if it may still verify at now.
func valid(keys []key, id int64, now time.Time, grace time.Duration) (key, bool) {
	for i, k := range keys {
		if k.ID != id {
			continue
		}
		if i+1 < len(keys) && !now.Before(keys[i+1].CreatedAt.Add(grace)) {
			return k, false // retired more than grace ago
		}
		return k, true
	}
	return key{}, false
}

// current returns the keys, reading them when they are older than
// Refresh: with keys in hand, one caller reads and the others go on with
// the old keys; without, they wait for the first read.
func (r *Ring) current(ctx context.Context) ([]key, error) {
	keys, fresh := r.snapshot()
	if fresh {
		return keys, nil
	}
	if len(keys) > 0 {
		if !r.loading.TryLock() {
			return keys, nil // another caller reads
		}
	} else {
		r.loading.Lock()
	}
	defer r.loading.Unlock()
	if keys, fresh := r.snapshot(); fresh {
		return keys, nil // read meanwhile
	}
	return r.loadLocked(ctx)
}

func (r *Ring) snapshot() (keys []key, fresh bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.keys, len(r.keys) > 0 && r.clock().Sub(r.loadedAt) < Refresh
}

// loadLocked reads the keys (creating the first if there is none); the
// caller holds loading.
func (r *Ring) loadLocked(ctx context.Context) ([]key, error) {
	now := r.clock()
	stored, err := Ensure(ctx, r.store, now)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	keys := make([]key, len(stored))
	for i, k := range stored {
		keys[i] = newKey(k)
		for _, had := range r.keys {
			if had.ID == k.ID && hmac.Equal(had.Secret, k.Secret) {
				keys[i] = had // the same key: its MACs stay good
			}
		}
	}
	r.keys, r.loadedAt = keys, now
	return keys, nil
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

func newSecret() []byte {
	b := make([]byte, secretBytes)
	rand.Read(b) // never fails (crypto/rand)
	return b
}
