// SPDX-License-Identifier: Apache-2.0

package chaos

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"
)

// Proxy forwards TCP connections from a loopback port to the database
// and, on demand, cuts them, holds their bytes (a black hole) or delays
// them.
type Proxy struct {
	target string
	ln     net.Listener

	mu        sync.Mutex
	conns     map[net.Conn]struct{}
	holdUntil time.Time
	delay     time.Duration
	delayEnd  time.Time
	closed    bool
	wg        sync.WaitGroup
}

// StartProxy listens on 127.0.0.1 and forwards to target.
func StartProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{target: target, ln: ln, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's address.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}

func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	if !p.track(client) {
		client.Close()
		return
	}
	defer p.untrack(client)
	p.gate()
	server, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		return
	}
	if !p.track(server) {
		server.Close()
		return
	}
	defer p.untrack(server)
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				p.gate()
				if _, werr := dst.Write(buf[:n]); werr != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		// Either side ending ends both.
		dst.Close()
		src.Close()
		done <- struct{}{}
	}
	go pipe(server, client)
	go pipe(client, server)
	<-done
	<-done
}

// gate holds bytes while a black hole lasts and adds the delay while one
// is set.
func (p *Proxy) gate() {
	for {
		p.mu.Lock()
		hold, delay, closed := time.Until(p.holdUntil), time.Duration(0), p.closed
		if time.Now().Before(p.delayEnd) {
			delay = p.delay
		}
		p.mu.Unlock()
		if closed {
			return
		}
		if hold > 0 {
			time.Sleep(min(hold, 50*time.Millisecond))
			continue
		}
		if delay > 0 {
			time.Sleep(delay)
		}
		return
	}
}

// Cut closes every connection now.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
}

// Blackhole holds every byte (connections stay open) for d.
func (p *Proxy) Blackhole(d time.Duration) {
	p.mu.Lock()
	p.holdUntil = time.Now().Add(d)
	p.mu.Unlock()
}

// Delay delays every chunk by delay, for d.
func (p *Proxy) Delay(delay, d time.Duration) {
	p.mu.Lock()
	p.delay, p.delayEnd = delay, time.Now().Add(d)
	p.mu.Unlock()
}

// Close stops the proxy and closes its connections.
func (p *Proxy) Close(ctx context.Context) error {
	p.mu.Lock()
	p.closed = true
	p.holdUntil = time.Time{}
	p.mu.Unlock()
	err := p.ln.Close()
	p.Cut()
	done := make(chan struct{})
	go func() { p.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		return errors.Join(err, ctx.Err())
	}
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}
