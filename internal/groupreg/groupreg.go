// SPDX-License-Identifier: Apache-2.0

// Package groupreg registers consumer groups in topics (the registry rows
// that fix a group's start position) at most once per client: subscribers,
// receivers and receipt receives all register before they read, and a
// loop of accepts must not read the registry every time.
package groupreg

import (
	"context"
	"sync"
	"time"

	"github.com/shardq/shardq/driver"
)

// Key is a registration's key in a client's cache: tenant, topic, group.
// Deleting a group deletes its key, so that the group registers anew.
type Key = [3]string

// Register registers group in the tenants' topic (driver.RegisterGroup)
// where seen, the client's cache of Keys, has no record of it yet, and
// records it once the registry row is written or found.
func Register(ctx context.Context, drv driver.Driver, seen *sync.Map, tenants []string, topic, group string, latest bool, now time.Time) error {
	var todo []string
	for _, t := range tenants {
		if _, ok := seen.Load(Key{t, topic, group}); !ok {
			todo = append(todo, t)
		}
	}
	if len(todo) == 0 {
		return nil
	}
	if err := drv.RegisterGroup(ctx, driver.GroupScope{Tenants: todo, Topic: topic, ConsumerGroup: group}, latest, now); err != nil {
		return err
	}
	for _, t := range todo {
		seen.Store(Key{t, topic, group}, true)
	}
	return nil
}
