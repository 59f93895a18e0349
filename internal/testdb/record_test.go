// SPDX-License-Identifier: Apache-2.0

package testdb

import (
	"net"
	"slices"
	"testing"
)

// The reader finds the statements of COM_QUERY and COM_STMT_PREPARE in a
// connection's writes however the writes cut the packets, and passes over
// the handshake's packets and other commands.
func TestCommandReader(t *testing.T) {
	packet := func(seq byte, payload string) []byte {
		n := len(payload)
		return append([]byte{byte(n), byte(n >> 8), byte(n >> 16), seq}, payload...)
	}
	stream := slices.Concat(
		packet(1, "\x03handshake response, not a command"),
		packet(0, "\x03SELECT 1"),
		packet(0, "\x17execute"),
		packet(0, ""),
		packet(0, "\x16INSERT INTO queue_messages (tenant) VALUES (?)"),
		packet(0, "\x03SELECT @@version"),
	)
	want := []string{"SELECT 1", "INSERT INTO queue_messages (tenant) VALUES (?)", "SELECT @@version"}
	for _, cut := range []int{1, 2, 3, 5, 7, len(stream)} {
		var got []string
		server, client := net.Pipe()
		go func() {
			buf := make([]byte, 1024)
			for {
				if _, err := server.Read(buf); err != nil {
					return
				}
			}
		}()
		c := &commandReader{Conn: client, record: func(q string) { got = append(got, q) }}
		for p := stream; len(p) > 0; p = p[min(cut, len(p)):] {
			if _, err := c.Write(p[:min(cut, len(p))]); err != nil {
				t.Fatal(err)
			}
		}
		client.Close()
		if !slices.Equal(got, want) {
			t.Errorf("writes of %d bytes: recorded %q, want %q", cut, got, want)
		}
	}
}
