// SPDX-License-Identifier: Apache-2.0

package testdb

import (
	"io"
	"net"
	"sync"
	"testing"
)

// CutProxy forwards TCP connections on loopback to a server and can sever
// all of them at once, as a failing network or a database failover would.
type CutProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  []net.Conn
	wg     sync.WaitGroup
}

// NewCutProxy listens on a free loopback port and forwards to target
// until t ends.
func NewCutProxy(t testing.TB, target string) *CutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &CutProxy{ln: ln, target: target}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// Addr is the proxy's address.
func (p *CutProxy) Addr() string { return p.ln.Addr().String() }

func (p *CutProxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			client.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, client, server)
		p.mu.Unlock()
		p.wg.Add(2)
		go func() { defer p.wg.Done(); io.Copy(server, client); server.Close() }()
		go func() { defer p.wg.Done(); io.Copy(client, server); client.Close() }()
	}
}

// Cut closes every open connection and returns how many there were; new
// ones are accepted as before.
func (p *CutProxy) Cut() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.conns) / 2
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
	return n
}

func (p *CutProxy) close() {
	p.ln.Close()
	p.Cut()
	p.wg.Wait()
}
