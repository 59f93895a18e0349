// SPDX-License-Identifier: Apache-2.0

// Package vitesstest runs the conformance suite (internal/conformance)
// through vtgate, with the routing proof of every statement it sent, and
// the client across shards.
package vitesstest
