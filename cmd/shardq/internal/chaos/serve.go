// SPDX-License-Identifier: Apache-2.0

package chaos

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/shardq/shardq/cmd/shardq/internal/server"
)

// servers is how many `shardq serve` processes the HTTP clients share.
const servers = 2

// serverReady bounds a server's start, to its first ready answer.
const serverReady = 30 * time.Second

// startServers makes the servers' token and starts them, each on a
// loopback port of its own that its later incarnations keep.
func (r *runner) startServers(ctx context.Context) error {
	if r.cfg.Tokens == nil {
		return errors.New("chaos: RunConfig.Tokens is required (the HTTP clients' token)")
	}
	tok, _, err := server.NewToken(ctx, r.cfg.Tokens, r.cfg.Tenants, []string{"publish", "consume"}, 24*time.Hour, time.Now())
	if err != nil {
		return fmt.Errorf("chaos: the servers' token: %w", err)
	}
	r.token = tok
	for i := range servers {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		addr := ln.Addr().String()
		ln.Close()
		p := &proc{slot: fmt.Sprintf("serve-%d", i), server: true, addr: addr}
		r.procs = append(r.procs, p)
		r.servers = append(r.servers, "http://"+addr)
		if err := r.spawn(ctx, p); err != nil {
			return err
		}
	}
	return nil
}

// spawnServer starts a server's next incarnation; the first, it waits for
// until ready (a later one's clients retry meanwhile, and a fault may hold
// its database for longer).
func (r *runner) spawnServer(ctx context.Context, p *proc) error {
	logf, err := os.OpenFile(filepath.Join(r.cfg.Dir, p.name()+".log"), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	// Dead letters after maxAttempts nacks, as the other consumers'; a
	// stop waits for requests no longer than a client does.
	args := []string{"--log-level", "warn", "serve", "--addr", p.addr, "--name", p.name(),
		"--max-attempts", fmt.Sprint(maxAttempts), "--shutdown-timeout", httpTimeout.String()}
	if err := r.exec(p, logf, args); err != nil || p.incarnation > 1 {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, serverReady)
	defer cancel()
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.addr+"/readyz", nil)
		if err != nil {
			return err
		}
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-p.exited:
			return fmt.Errorf("chaos: %s exited before it was ready (log: %s)", p.name(), filepath.Join(r.cfg.Dir, p.name()+".log"))
		case <-ctx.Done():
			return fmt.Errorf("chaos: %s not ready within %v: %w", p.name(), serverReady, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
