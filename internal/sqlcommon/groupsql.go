// SPDX-License-Identifier: Apache-2.0

package sqlcommon

// groupSQL holds the statements of message groups and competing consumers
// (groups.go), whole, with named parameters (Bind). Claim rows are keyed
// (tenant, consumer_group, topic) and cursors (tenant, topic, ...,
// consumer_group): named parameters keep the two orders from being mixed.
type groupSQL struct {
	ready      string // message groups with work and no live lease, lowest next offset first
	readyByAge string // the same, oldest next message first (tenants on shards of their own)
	anyWork    string // is anything claimable (read pool, before a write transaction)
	marks      string // the group's ungrouped cursor and claim mark, locked (claimers and advances take turns on it)
	marksRead  string // the same, not locked (read pool)
	markRow    string // add the group's ungrouped cursor row at :start, for its mark
	setMark    string // move the claim mark to :mark
	again      string // claims visible again (expired, or retry due), up to the mark
	fresh      string // messages above the mark
	freshSized string // fresh's candidates with sizes and the large ones' bodies left out (sizedColumns)
	sizesAt    string // the sizes of messages at offsets (:offsets)
	messagesAt string // messages at offsets (:offsets)
	reclaim    string // take visible-again claims (:offsets) under a new token
	insert     string // insert claim rows (:rows), keeping any that exist
	claimed    string // this token's claims among :offsets
	retry      string // make a claim visible again at :retry_at, under its token
	extend     string // make a claim visible again at :visible_at, under its token
	release    string // make a claim visible again at :now and uncount its attempt, under its token
	settle     string // delete a claim row (its message is done), under its token
	ack        string // delete claim rows, each under its token (:claims rows of offset, token, owner)
	firstOpen  string // the lowest open claim above the cursor
	dropPassed string // delete claim rows the cursor passed (done ones that schemas before 13 kept)
	dropAbove  string // delete claim rows above a reset cursor
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
	// readyGroups is each free partition with work after the cursor and
	// its next offset: a correlated MIN over the partition's primary key,
	// one index probe per candidate.
	readyGroups := "SELECT p.tenant, p.partition_key, (SELECT MIN(m." + o + ") FROM queue_messages m" + s.partitionOrder() + " WHERE m.tenant = p.tenant AND m.topic = p.topic " +
		"AND m.partition_key = p.partition_key AND m." + o + " > " + cursorOrStart + ") AS next_offset " +
		"FROM queue_partitions p " +
		"LEFT JOIN queue_offsets o ON o.tenant = p.tenant AND o.topic = p.topic AND o.partition_key = p.partition_key AND o.consumer_group = :group " +
		groupJoin +
		"LEFT JOIN queue_partition_leases l ON l.tenant = p.tenant AND l.consumer_group = :group AND l.topic = p.topic AND l.partition_key = p.partition_key " +
		"WHERE p.tenant IN (:tenants) AND p.topic = :topic AND p.partition_key <> '' " +
		"AND p.head_offset > " + cursorOrStart + " AND (l.owner IS NULL OR l.owner = '' OR l.expires_at <= :now)"
	return groupSQL{
		ready: "SELECT tenant, partition_key, next_offset FROM (" + readyGroups + ") ready " +
			"WHERE next_offset IS NOT NULL ORDER BY next_offset LIMIT :limit",
		readyByAge: "SELECT ready.tenant, ready.partition_key, ready.next_offset FROM (" + readyGroups + ") ready " +
			"JOIN queue_messages n" + s.partitionOrder() + " ON n.tenant = ready.tenant AND n.topic = :topic " +
			"AND n.partition_key = ready.partition_key AND n." + o + " = ready.next_offset " +
			"ORDER BY n.created_at, ready.next_offset, ready.tenant, ready.partition_key LIMIT :limit",
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
