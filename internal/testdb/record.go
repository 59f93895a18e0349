// SPDX-License-Identifier: Apache-2.0

package testdb

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/shardq/shardq/driver/mysqldriver"
)

var recordedNets atomic.Int64

// VitessRecorded opens the keyspace of dsn (VitessIn's or
// VitessMigrated's) again with mysqldriver.Open, as an application does,
// and hands record the text of every statement the driver sends: each
// text query and each statement it prepares, read off its connections'
// bytes (a prepared statement's executions carry no text, so a statement
// run again on a connection is recorded once). t closes the driver.
func VitessRecorded(t testing.TB, dsn string, record func(string)) *mysqldriver.Driver {
	t.Helper()
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	network, inner := fmt.Sprintf("shardq-recorded-%d", recordedNets.Add(1)), cfg.Net
	mysql.RegisterDialContext(network, func(ctx context.Context, addr string) (net.Conn, error) {
		var dialer net.Dialer
		conn, err := dialer.DialContext(ctx, inner, addr)
		if err != nil {
			return nil, err
		}
		return &commandReader{Conn: conn, record: record}, nil
	})
	t.Cleanup(func() { mysql.DeregisterDialContext(network) })
	cfg.Net = network
	d, err := mysqldriver.Open(cfg.FormatDSN())
	if err != nil {
		t.Fatalf("open vitess driver: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// MySQL protocol commands that carry a statement's text.
const (
	comQuery       = 0x03
	comStmtPrepare = 0x16
)

// commandReader passes a client connection's writes on unchanged and
// reads the packets in them: a packet of sequence number 0 starts a
// command (the handshake's packets number from 1), its first byte names
// the command, and COM_QUERY's and COM_STMT_PREPARE's rest is the
// statement. One goroutine at a time writes a connection.
type commandReader struct {
	net.Conn
	record func(string)

	header  [4]byte
	have    int  // bytes of header read
	left    int  // bytes of the packet's payload not read yet
	command bool // the packet starts a command whose byte is not read yet
	keep    bool // the payload is a statement's text
	text    []byte
}

func (c *commandReader) Write(p []byte) (int, error) {
	c.read(p)
	return c.Conn.Write(p)
}

func (c *commandReader) read(p []byte) {
	for len(p) > 0 {
		if c.have < len(c.header) {
			n := copy(c.header[c.have:], p)
			c.have, p = c.have+n, p[n:]
			if c.have < len(c.header) {
				return
			}
			c.left = int(c.header[0]) | int(c.header[1])<<8 | int(c.header[2])<<16
			c.command, c.keep, c.text = c.header[3] == 0, false, c.text[:0]
			if c.left == 0 {
				c.have = 0
			}
			continue
		}
		n := min(len(p), c.left)
		payload := p[:n]
		c.left, p = c.left-n, p[n:]
		if c.command {
			c.command = false
			c.keep = payload[0] == comQuery || payload[0] == comStmtPrepare
			payload = payload[1:]
		}
		if c.keep {
			c.text = append(c.text, payload...)
		}
		if c.left == 0 {
			if c.keep {
				c.record(string(c.text))
			}
			c.have = 0
		}
	}
}
