// SPDX-License-Identifier: Apache-2.0

//go:build unix

package testdb

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// lockKeyspace takes keyspace ks of the vtgate at addr for this process
// with an exclusive lock on a file in the temporary directory, which the
// kernel releases when the process ends, however it ends. It returns a
// nil release when another process holds the keyspace.
func lockKeyspace(addr, ks string) (release func(), err error) {
	name := "shardq-vitess-" + strings.NewReplacer(":", "_", "/", "_").Replace(addr) + "-" + ks + ".lock"
	// Opened for reading, which flock needs no more than, and created only
	// when missing: the file may be another user's (the test Vitess is the
	// machine's), and a sticky temporary directory refuses O_CREAT on it.
	path := filepath.Join(os.TempDir(), name)
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		f, err = os.OpenFile(path, os.O_RDONLY|os.O_CREATE, 0o644)
	}
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, nil
		}
		return nil, err
	}
	return func() { f.Close() }, nil // closing the file releases its lock
}
