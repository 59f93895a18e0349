// SPDX-License-Identifier: Apache-2.0

// Package large holds the layout of large messages (docs/large.md): a
// message group of chunks followed by an end marker. Write stores them
// (shardq.Client.PublishLarge); internal/receiver reads them.
package large

import "strconv"

// Headers of chunks and end markers.
const (
	HeaderID      = "shardq-large-id"      // on a chunk: the large message's id
	HeaderChunk   = "shardq-large-chunk"   // on a chunk: its number, from 0
	HeaderChunks  = "shardq-large-chunks"  // on the end marker: how many chunks
	HeaderBytes   = "shardq-large-bytes"   // on the end marker: the payload's size
	HeaderSHA256  = "shardq-large-sha256"  // on the end marker: the payload's SHA-256, hex
	HeaderAborted = "shardq-large-aborted" // on the end marker of a write that failed: "true"
	// HeaderAbandoned, on an aborted end marker a reader stored, says why
	// it gave the write up.
	HeaderAbandoned = "shardq-large-abandoned"

	// HeaderPrefix starts every header above: shardq's, not the caller's.
	HeaderPrefix = "shardq-large-"
)

// ChunkID is the id of chunk i of large message id.
func ChunkID(id string, i int) string { return id + "#" + strconv.Itoa(i) }
