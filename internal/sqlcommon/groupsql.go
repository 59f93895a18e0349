// SPDX-License-Identifier: Apache-2.0

package sqlcommon

import (
	"strconv"
	"strings"
)

// readyProbeSizes are the candidates one probe statement reads: a page is
// probed in statements of these sizes, the last padded, so that each
// database prepares three statements, not one per page length.
var readyProbeSizes = []int{1, 8, 32}

// groupSQL holds the statements of message groups and competing consumers
// (groups.go), whole, with named parameters (Bind). Claim rows are keyed
// (tenant, consumer_group, topic) and cursors (tenant, topic, ...,
// consumer_group): named parameters keep the two orders from being mixed.
type groupSQL struct {
	// readyCandidates is a page of one tenant's message groups with work
	// after the cursor and no live lease, by key after :after, with each
	// one's cursor; readyProbes[i] reads the next offset of
	// readyProbeSizes[i] of them (:key0, :cursor0, …), readyProbesByAge[i]
	// its created_at too.
	readyCandidates  string
	readyProbes      []string
	readyProbesByAge []string
	anyWork          string // is anything claimable (read pool, before a write transaction)
	marks            string // the group's ungrouped cursor and claim mark, locked (claimers and advances take turns on it)
	marksRead        string // the same, not locked (read pool)
	markRow          string // add the group's ungrouped cursor row at :start, for its mark
	setMark          string // move the claim mark to :mark
	again            string // claims visible again (expired, or retry due), up to the mark
	fresh            string // messages above the mark
	freshSized       string // fresh's candidates with sizes and the large ones' bodies left out (sizedColumns)
	sizesAt          string // the sizes of messages at offsets (:offsets)
	messagesAt       string // messages at offsets (:offsets)
	reclaim          string // take visible-again claims (:offsets) under a new token
	insert           string // insert claim rows (:rows), keeping any that exist
	claimed          string // this token's claims among :offsets
	retry            string // make a claim visible again at :retry_at, under its token
	extend           string // make a claim visible again at :visible_at, under its token
	release          string // make a claim visible again at :now and uncount its attempt, under its token
	settle           string // delete a claim row (its message is done), under its token
	ack              string // delete claim rows, each under its token (:claims rows of offset, token, owner)
	firstOpen        string // the lowest open claim above the cursor
	dropPassed       string // delete claim rows the cursor passed (done ones that schemas before 13 kept)
	dropAbove        string // delete claim rows above a reset cursor
}

// claimKey selects one group's claim rows (:tenant, :group, :topic).
const claimKey = "tenant = :tenant AND consumer_group = :group AND topic = :topic"

// ungroupedCursor is a scalar subquery: the group's cursor of the ungrouped
// partition or, without one, where the group starts (:start, read by
// Store.groupStart: Vitess cannot plan a second subquery here).
const ungroupedCursor = "COALESCE((SELECT committed_offset FROM queue_offsets WHERE tenant = :tenant AND topic = :topic AND partition_key = '' AND consumer_group = :group), :start)"

// ungroupedMark is a scalar subquery: the group's claim mark, the highest
// offset claimed in order (every message above the cursor and at or below
// it has a claim row or is done), or the cursor when nothing was claimed
// since (claimed_offset NULL: the row's cursor was set or reset).
const ungroupedMark = "COALESCE((SELECT COALESCE(claimed_offset, committed_offset) FROM queue_offsets WHERE tenant = :tenant AND topic = :topic " +
	"AND partition_key = '' AND consumer_group = :group), :start)"

// ungroupedOffsets selects the group's cursor row of the ungrouped
// partition, which holds its claim mark.
const ungroupedOffsets = "SELECT committed_offset, claimed_offset FROM queue_offsets WHERE tenant = :tenant AND topic = :topic AND partition_key = '' AND consumer_group = :group"

// claimFence selects a claim row while its owner and token are current.
// Token 0 is nobody's: a delayed message's placeholder row.
const claimFence = claimKey + " AND message_offset = :offset AND token = :token AND token > 0 AND owner = :owner AND done = 0"

func newGroupSQL(s Syntax) groupSQL {
	o := s.offset()
	// readyProbe is one candidate's next offset, its cursor bound as a
	// value: a correlated MIN (or ORDER BY … LIMIT 1) over an outer
	// reference reads every stored row of the partition on MariaDB, whose
	// optimizer range-scans no key on one; with a value, it is one index
	// probe. readyProbeByAge reads that message's created_at too. A union
	// of them probes a page of candidates in one round trip.
	nextAfter := "SELECT MIN(m." + o + ") FROM queue_messages m" + s.partitionOrder() +
		" WHERE m.tenant = :tenant AND m.topic = :topic AND m.partition_key = :key{i} AND m." + o + " > :cursor{i}"
	readyProbe := "SELECT :key{i}, (" + nextAfter + "), NULL"
	readyProbeByAge := "SELECT n.partition_key, n." + o + ", n.created_at FROM queue_messages n" + s.partitionOrder() +
		" WHERE n.tenant = :tenant AND n.topic = :topic AND n.partition_key = :key{i} AND n." + o + " = (" + nextAfter + ")"
	unions := func(arm string) []string {
		out := make([]string, len(readyProbeSizes))
		for i, n := range readyProbeSizes {
			arms := make([]string, n)
			for j := range arms {
				arms[j] = strings.ReplaceAll(arm, "{i}", strconv.Itoa(j))
			}
			out[i] = strings.Join(arms, " UNION ALL ")
		}
		return out
	}
	return groupSQL{
		readyCandidates: "SELECT p.partition_key, " + cursorOrStart + " FROM queue_partitions p " +
			"LEFT JOIN queue_offsets o ON o.tenant = p.tenant AND o.topic = p.topic AND o.partition_key = p.partition_key AND o.consumer_group = :group " +
			groupJoin +
			"LEFT JOIN queue_partition_leases l ON l.tenant = p.tenant AND l.consumer_group = :group AND l.topic = p.topic AND l.partition_key = p.partition_key " +
			"WHERE p.tenant = :tenant AND p.topic = :topic AND p.partition_key > :after " +
			"AND p.head_offset > " + cursorOrStart + " AND (l.owner IS NULL OR l.owner = '' OR l.expires_at <= :now) ORDER BY p.partition_key LIMIT :page",
		readyProbes:      unions(readyProbe),
		readyProbesByAge: unions(readyProbeByAge),
		anyWork: "SELECT EXISTS (SELECT 1 FROM queue_message_claims WHERE " + claimKey +
			" AND done = 0 AND visible_at <= :now AND message_offset > " + ungroupedCursor + ") OR EXISTS (SELECT 1 FROM queue_messages" + s.partitionOrder() +
			" WHERE tenant = :tenant AND topic = :topic AND partition_key = '' AND " + o + " > " + ungroupedMark + ")",
		marks:     ungroupedOffsets + s.forUpdate(),
		marksRead: ungroupedOffsets,
		markRow: "INSERT INTO queue_offsets (tenant, topic, partition_key, consumer_group, committed_offset, updated_at) VALUES (:tenant, :topic, '', :group, :start, :now)" +
			s.upsert("tenant, topic, partition_key, consumer_group", ""),
		setMark: "UPDATE queue_offsets SET claimed_offset = :mark WHERE tenant = :tenant AND topic = :topic AND partition_key = '' AND consumer_group = :group",
		again: "SELECT message_offset FROM queue_message_claims WHERE " + claimKey + " AND done = 0 AND message_offset > :cursor AND message_offset <= :mark " +
			"AND visible_at <= :now ORDER BY message_offset LIMIT :limit",
		fresh: "SELECT " + o + ", id, headers, payload, created_at, not_before FROM queue_messages" + s.partitionOrder() +
			" WHERE tenant = :tenant AND topic = :topic AND partition_key = '' AND " + o + " > :after ORDER BY " + o + " LIMIT :limit",
		freshSized: "SELECT " + s.sizedColumns() + " FROM queue_messages" + s.partitionOrder() +
			" WHERE tenant = :tenant AND topic = :topic AND partition_key = '' AND " + o + " > :after ORDER BY " + o + " LIMIT :limit",
		sizesAt: "SELECT " + o + ", " + s.messageBytes() + " FROM queue_messages WHERE tenant = :tenant AND topic = :topic " +
			"AND partition_key = '' AND " + o + " IN (:offsets)",
		messagesAt: "SELECT " + o + ", id, headers, payload, created_at, not_before FROM queue_messages WHERE tenant = :tenant AND topic = :topic " +
			"AND partition_key = '' AND " + o + " IN (:offsets)",

		reclaim: "UPDATE queue_message_claims SET owner = :owner, token = :token, attempts = attempts + 1, visible_at = :visible_at, updated_at = :now " +
			"WHERE " + claimKey + " AND message_offset IN (:offsets) AND done = 0 AND visible_at <= :now",
		insert: "INSERT INTO queue_message_claims (tenant, consumer_group, topic, message_offset, owner, token, attempts, visible_at, done, updated_at) " +
			"VALUES :rows" + s.upsert("tenant, consumer_group, topic, message_offset", ""),
		claimed: "SELECT message_offset, attempts, last_error FROM queue_message_claims WHERE " + claimKey +
			" AND message_offset IN (:offsets) AND token = :token AND message_offset > :cursor ORDER BY message_offset",
		retry:   "UPDATE queue_message_claims SET visible_at = :retry_at, last_error = :last_error, updated_at = :now WHERE " + claimFence,
		extend:  "UPDATE queue_message_claims SET visible_at = :visible_at, updated_at = :now WHERE " + claimFence,
		release: "UPDATE queue_message_claims SET visible_at = :now, attempts = attempts - 1, updated_at = :now WHERE " + claimFence,
		settle:  "DELETE FROM queue_message_claims WHERE " + claimFence,
		ack: "DELETE FROM queue_message_claims WHERE " + claimKey + " AND done = 0 AND token > 0 AND " +
			s.inRows("message_offset, token, owner", "claims"),
		firstOpen:  "SELECT MIN(message_offset) FROM queue_message_claims WHERE " + claimKey + " AND done = 0 AND message_offset > :cursor",
		dropPassed: "DELETE FROM queue_message_claims WHERE " + claimKey + " AND message_offset <= :offset",
		dropAbove:  "DELETE FROM queue_message_claims WHERE " + claimKey + " AND message_offset > :offset",
	}
}
