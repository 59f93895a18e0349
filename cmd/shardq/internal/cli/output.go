// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/shardq/shardq"
)

// errLargeToStdout refuses to print a large message as a JSON line: it
// would be held whole in memory and mixed with the lines around it.
var errLargeToStdout = errors.New("a large message is not printed as a JSON line: give --output-dir DIR (one file per message), or --assemble with --key or --next-group")

// largeToStdout is the error for large message d without --output-dir.
func largeToStdout(d *shardq.Delivery) error {
	return fmt.Errorf("message %q of tenant %q topic %q partition %q offset %d (%d bytes): %w",
		d.ID, d.Tenant, d.Topic, d.PartitionKey, d.Offset, d.Size, errLargeToStdout)
}

// fileLine is consume's JSON line for a message written to a file.
type fileLine struct {
	Tenant       string            `json:"tenant"`
	Topic        string            `json:"topic"`
	PartitionKey string            `json:"partition_key"`
	Offset       int64             `json:"offset"`
	ID           string            `json:"id"`
	Attempt      int               `json:"attempt"`
	Headers      map[string]string `json:"headers"`
	File         string            `json:"file"`
	Bytes        int64             `json:"bytes"`
	Chunks       int               `json:"chunks,omitempty"`
	SHA256       string            `json:"sha256"`
}

// writeFile writes d's payload to dir/TENANT/KEY/ID (each part escaped,
// or hashed when long, by fileName) through a temporary file in the same directory, renamed
// only once the whole body is read and, for a large message, its size
// and SHA-256 checked: a file under its final name is always whole. A
// redelivery writes the same file again. The error of a failed read
// (ErrLargeCorrupt among them) names the message.
func writeFile(dir string, d *shardq.Delivery) (fileLine, error) {
	line := fileLine{Tenant: d.Tenant, Topic: d.Topic, PartitionKey: d.PartitionKey, Offset: d.Offset, ID: d.ID,
		Attempt: d.Attempt, Headers: d.Headers, Chunks: d.Chunks}
	sub := dir
	for _, part := range []string{d.Tenant, d.PartitionKey} {
		if err := os.MkdirAll(sub, 0o755); err != nil {
			return line, fmt.Errorf("--output-dir: %w", err)
		}
		var err error
		if sub, err = nameIn(sub, part); err != nil {
			return line, fmt.Errorf("--output-dir: %w", err)
		}
	}
	if err := os.MkdirAll(sub, 0o755); err != nil {
		return line, fmt.Errorf("--output-dir: %w", err)
	}
	tmp, err := os.CreateTemp(sub, ".shardq-*.part")
	if err != nil {
		return line, fmt.Errorf("--output-dir: %w", err)
	}
	defer os.Remove(tmp.Name()) // after the rename: nothing
	sum := sha256.New()
	body := &readErr{r: d.Body()}
	n, err := io.Copy(io.MultiWriter(tmp, sum), body)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	switch {
	case body.err != nil:
		return line, fmt.Errorf("message %q of tenant %q topic %q partition %q offset %d: %w", d.ID, d.Tenant, d.Topic, d.PartitionKey, d.Offset, body.err)
	case err != nil:
		return line, fmt.Errorf("--output-dir: %w", err)
	}
	line.Bytes, line.SHA256 = n, hex.EncodeToString(sum.Sum(nil))
	if line.File, err = nameIn(sub, d.ID); err != nil {
		return line, fmt.Errorf("--output-dir: %w", err)
	}
	if err := os.Rename(tmp.Name(), line.File); err != nil {
		return line, fmt.Errorf("--output-dir: %w", err)
	}
	return line, nil
}

// maxFileName bounds an escaped name: file systems take 255 bytes, and
// the temporary file beside it needs none of them.
const maxFileName = 200

// fileName makes s one safe path element, the same for the same s and
// different for different ones: every byte but ASCII letters, digits,
// '-', '_' and a '.' that does not start it is written %XX, and "" is
// "%" (which no escaped name is alone). So no id names "..", a hidden
// file, or another directory. A name whose escaped form passes
// maxFileName is "%%" and its SHA-256 in hex instead (no escaped name
// starts "%%"); long reports it, and nameFile keeps s beside it.
func fileName(s string) (name string, long bool) {
	if s == "" {
		return "%", false
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '-', c == '_', c == '.' && i > 0:
			b.WriteByte(c)
		default:
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	if b.Len() > maxFileName {
		sum := sha256.Sum256([]byte(s))
		return "%%" + hex.EncodeToString(sum[:]), true
	}
	return b.String(), false
}

// nameIn is fileName(s) in dir; a hashed name's s is written beside it,
// to "NAME.name", so that a listing can be read back.
func nameIn(dir, s string) (string, error) {
	name, long := fileName(s)
	if long {
		if err := os.WriteFile(filepath.Join(dir, name+".name"), []byte(s), 0o644); err != nil {
			return "", err
		}
	}
	return filepath.Join(dir, name), nil
}
