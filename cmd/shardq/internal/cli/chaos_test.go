// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"io"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/shardq/shardq/internal/testdb"
)

// TestChaosClientWaitsForItsDatabase: a chaos client started again after
// a kill may meet its database restarting (nothing listens for a
// moment); it waits for it instead of exiting, which the runner would
// count as the run failing.
func TestChaosClientWaitsForItsDatabase(t *testing.T) {
	dsn := testdb.MySQLDatabase(t)
	if r := runCLI(t, nil, "", "--dsn", testdb.MySQLURL(t, dsn), "migrate"); r.code != 0 {
		t.Fatalf("migrate: %+v", r)
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	server := cfg.Addr
	// A port nothing listens on yet, forwarded to the server a moment
	// after the client starts.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Addr = ln.Addr().String()
	ln.Close()
	var wg sync.WaitGroup
	defer wg.Wait()
	done := make(chan struct{})
	defer close(done)
	wg.Go(func() {
		time.Sleep(700 * time.Millisecond)
		ln, err := net.Listen("tcp", cfg.Addr)
		if err != nil {
			t.Error(err)
			return
		}
		go func() { <-done; ln.Close() }()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", server)
			if err != nil {
				c.Close()
				continue
			}
			wg.Go(func() { io.Copy(s, c); s.Close() })
			wg.Go(func() { io.Copy(c, s); c.Close() })
		}
	})
	url := testdb.MySQLURL(t, cfg.FormatDSN())
	r := runCLI(t, nil, "", "--dsn", url, "chaos", "client", "--role", "publish", "--name", "pub-0.2",
		"--history", filepath.Join(t.TempDir(), "pub-0.2.jsonl"))
	if r.code != 0 {
		t.Fatalf("a client started before its database answered exited %d: %s", r.code, r.stderr)
	}
}
