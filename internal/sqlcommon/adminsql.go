// SPDX-License-Identifier: Apache-2.0

package sqlcommon

import (
	"fmt"
	"math"
	"strings"

	"github.com/shardq/shardq/driver"
)

// adminSQL holds the statements of reads, listings, operators' acts,
// retention and transactional (half) messages, whole, with named
// parameters (Bind).
type adminSQL struct {
	fetch          string // a partition's messages after a cursor, in offset order
	fetchWithin    string // fetch's messages with their sizes, the large ones' bodies left out (sizedColumns)
	fetchAt        string // a partition's messages at :offsets
	countBetween   string // how many of a partition's messages lie in (:after, :up_to]
	withWork       string // partitions whose head is past a group's cursor
	withWorkMoved  string // withWork, of partitions whose head moved at or after :since
	withWorkOf     string // withWork, of named partitions (:tenants × :keys)
	sweep          string // a page of one tenant's head rows with the group's position, in key order
	sweepTenants   string // which of :tenants have a head row in :topic
	sweepAfter     string // sweep, the page after :after
	touchHead      string // mark a partition moved for discovery (a reset gave it work)
	heads          string // every partition of a topic with its head
	headsOf        string // the heads of named partitions (:tenants × :keys)
	resetOffset    string // set a cursor, back or forward (and the ungrouped claim mark to it)
	topics         scoped // head rows summarised per tenant and topic (paged)
	offsetReport   scoped // cursors with their heads (paged, :group may be '' for all)
	lag            string // a bounded count of the messages after a cursor, and the first one's time
	cursors        string // every group's cursor in one topic
	leases         scoped // lease rows (paged)
	members        scoped // heartbeat rows (paged)
	message        string // a message by identity
	lockMessage    string // a message by identity, locked
	messageStates  string // a message's bookkeeping per group
	deleteMessage  string // delete a message by identity
	deleteStates   string // delete a message's bookkeeping in every group
	topicMessages  scoped // a topic's messages (paged by tenant, offset)
	offsetBefore   string // the last offset created before a time
	deleteBatch    string // delete a bounded batch of a partition's oldest messages
	halfInsert     string // store a half message
	halfLock       string // read and lock a half message
	halfDelete     string // delete a half message
	halfDue        string // due, unclaimed half messages of a producer group
	halfClaim      string // claim a half message under the token read
	halfReschedule string // count an unknown answer and free the claim
	halfDead       string // copy a half message to the dead table
	halves         scoped // pending half messages (paged)
}

// scoped is a listing in two forms: over named tenants (:tenants) and
// over every tenant.
type scoped struct{ tenants, all string }

// scopedOn writes stmt twice, its {scope} becoming a condition on the
// tenant column col or none.
func scopedOn(col, stmt string) scoped {
	return scoped{tenants: strings.ReplaceAll(stmt, "{scope}", col+" IN (:tenants)"), all: strings.ReplaceAll(stmt, "{scope}", "1 = 1")}
}

// pick returns the form for s and its :tenants. The caller has checked
// that s names tenants or all of them.
func (q scoped) pick(s driver.Scope) (string, Args) {
	if s.AllTenants {
		return q.all, Args{}
	}
	return q.tenants, Args{"tenants": textList(s.Tenants)}
}

// paged is the page condition and limit of a listing sorted by cols:
// "(cols) > (:after) ... LIMIT :limit".
func paged(cols string) string {
	return " AND (" + cols + ") > (:after) ORDER BY " + cols + " LIMIT :limit"
}

// pageArgs names s's page over a sort key of n text columns. Without
// After, the first page starts after the empty key (every stored key has
// a non-empty tenant); without Limit, it has no end.
func pageArgs(s driver.Scope, n int) (Args, error) {
	after := s.After
	if len(after) == 0 {
		after = make([]string, n)
	} else if len(after) != n {
		return nil, fmt.Errorf("page after: %d values, this listing's sort key has %d", len(after), n)
	}
	return Args{"after": textList(after), "limit": limitOf(s)}, nil
}

func limitOf(s driver.Scope) int64 {
	if s.Limit > 0 {
		return int64(s.Limit)
	}
	return math.MaxInt64
}

const (
	messageColumns = "tenant, topic, partition_key, id, headers, payload, created_at, not_before"
	messageKey     = "tenant = :tenant AND topic = :topic AND partition_key = :key AND id = :id"
	halfColumns    = "tenant, topic, partition_key, id, producer_group, headers, payload, created_at, check_count, next_check_at, claim_owner, claim_token, not_before"
)

// groupJoin joins head row p with the registry row g of :group, and
// cursorOrStart is the group's cursor o of p or, without one, where the
// group starts (docs/consumers.md, "Start position").
const (
	groupJoin     = "LEFT JOIN queue_consumer_groups g ON g.tenant = p.tenant AND g.topic = p.topic AND g.consumer_group = :group "
	cursorOrStart = "COALESCE(o.committed_offset, g.start_offset, 0)"
)

// withWork selects the head rows matching where whose head is past the
// group's cursor (none: 0), with the cursor, unordered.
// idx_partitions_moved serves the :since form.
func withWork(where string) string {
	return "SELECT p.tenant, p.partition_key, p.head_offset, " + cursorOrStart + " " +
		"FROM queue_partitions p LEFT JOIN queue_offsets o ON o.tenant = p.tenant AND o.topic = p.topic " +
		"AND o.partition_key = p.partition_key AND o.consumer_group = :group " + groupJoin +
		"WHERE " + where + " AND p.head_offset > " + cursorOrStart
}

// sweepPage selects one tenant's head rows with the group's position,
// drained ones included (the sweep goes on after the last row read).
const sweepPage = "SELECT p.tenant, p.partition_key, p.head_offset, " + cursorOrStart + " " +
	"FROM queue_partitions p LEFT JOIN queue_offsets o ON o.tenant = p.tenant AND o.topic = p.topic " +
	"AND o.partition_key = p.partition_key AND o.consumer_group = :group " + groupJoin +
	"WHERE p.tenant = :tenant AND p.topic = :topic"

func newAdminSQL(s Syntax) adminSQL {
	o := s.offset()
	deleteBatch := "DELETE FROM queue_messages WHERE tenant = :tenant AND topic = :topic AND partition_key = :key AND created_at < :before " +
		"AND " + o + " <= :up_to ORDER BY " + o + " LIMIT :limit"
	if s == SQLite { // no DELETE ... LIMIT: select the batch's offsets
		deleteBatch = "DELETE FROM queue_messages WHERE tenant = :tenant AND topic = :topic AND partition_key = :key AND " + o + " IN (" +
			"SELECT " + o + " FROM queue_messages WHERE tenant = :tenant AND topic = :topic AND partition_key = :key AND created_at < :before " +
			"AND " + o + " <= :up_to ORDER BY " + o + " LIMIT :limit)"
	}
	return adminSQL{
		fetch: "SELECT " + o + ", id, headers, payload, created_at, not_before FROM queue_messages" + s.partitionOrder() + " " +
			"WHERE tenant = :tenant AND topic = :topic AND partition_key = :key AND " + o + " > :after ORDER BY " + o + " LIMIT :limit",
		fetchWithin: "SELECT " + s.sizedColumns() + " FROM queue_messages" + s.partitionOrder() + " " +
			"WHERE tenant = :tenant AND topic = :topic AND partition_key = :key AND " + o + " > :after ORDER BY " + o + " LIMIT :limit",
		countBetween: "SELECT COUNT(*) FROM queue_messages" + s.partitionOrder() + " " +
			"WHERE tenant = :tenant AND topic = :topic AND partition_key = :key AND " + o + " > :after AND " + o + " <= :up_to",
		fetchAt: "SELECT " + o + ", id, headers, payload, created_at, not_before FROM queue_messages " +
			"WHERE tenant = :tenant AND topic = :topic AND partition_key = :key AND " + o + " IN (:offsets)",
		withWork: withWork("p.tenant IN (:tenants) AND p.topic = :topic") + " ORDER BY p.tenant, p.partition_key",
		// Unordered (the member sorts): ordered by key, MariaDB walks the
		// primary key over every partition of the topic instead of the
		// stamp index over those that moved (docs/BENCHMARKS.md, statement
		// costs).
		withWorkMoved: withWork("p.tenant IN (:tenants) AND p.topic = :topic AND p.updated_at >= :since"),
		withWorkOf:    withWork("p.tenant IN (:tenants) AND p.topic = :topic AND p.partition_key IN (:keys)"),
		sweep:         sweepPage + " ORDER BY p.partition_key LIMIT :limit",
		sweepTenants:  "SELECT DISTINCT tenant FROM queue_partitions WHERE tenant IN (:tenants) AND topic = :topic",
		sweepAfter:    sweepPage + " AND p.partition_key > :after ORDER BY p.partition_key LIMIT :limit",
		touchHead:     "UPDATE queue_partitions SET updated_at = :now WHERE tenant = :tenant AND topic = :topic AND partition_key = :key",
		heads: "SELECT tenant, partition_key, head_offset, 0 FROM queue_partitions " +
			"WHERE tenant IN (:tenants) AND topic = :topic ORDER BY tenant, partition_key",
		headsOf: "SELECT tenant, partition_key, head_offset FROM queue_partitions WHERE tenant IN (:tenants) AND topic = :topic AND partition_key IN (:keys)",
		resetOffset: "INSERT INTO queue_offsets (tenant, topic, partition_key, consumer_group, committed_offset, updated_at) " +
			"VALUES (:tenant, :topic, :key, :group, :offset, :now)" + s.upsert("tenant, topic, partition_key, consumer_group",
			"committed_offset = "+s.excluded("committed_offset")+", claimed_offset = NULL, updated_at = "+s.excluded("updated_at")),
		topics: scopedOn("tenant", "SELECT tenant, topic, COUNT(*), MAX(head_offset) FROM queue_partitions WHERE {scope}"+
			" AND (tenant, topic) > (:after) GROUP BY tenant, topic ORDER BY tenant, topic LIMIT :limit"),
		offsetReport: scopedOn("o.tenant", "SELECT o.tenant, o.topic, o.partition_key, o.consumer_group, COALESCE(p.head_offset, 0), o.committed_offset, o.updated_at "+
			"FROM queue_offsets o "+
			"LEFT JOIN queue_partitions p ON p.tenant = o.tenant AND p.topic = o.topic AND p.partition_key = o.partition_key "+
			"WHERE {scope} AND (:group = '' OR o.consumer_group = :group)"+paged("o.tenant, o.topic, o.consumer_group, o.partition_key")),
		lag: "SELECT COUNT(*), MIN(created_at), COALESCE(SUM(CASE WHEN not_before > :now THEN 1 ELSE 0 END), 0) FROM (SELECT created_at, not_before FROM queue_messages " +
			"WHERE tenant = :tenant AND topic = :topic AND partition_key = :key AND " + o + " > :after ORDER BY " + o + " LIMIT :limit) unconsumed",
		cursors: "SELECT consumer_group, partition_key, committed_offset FROM queue_offsets WHERE tenant = :tenant AND topic = :topic",
		leases: scopedOn("tenant", "SELECT tenant, consumer_group, topic, partition_key, owner, token, expires_at FROM queue_partition_leases "+
			"WHERE {scope}"+paged("tenant, consumer_group, topic, partition_key")),
		members: scopedOn("tenant", "SELECT tenant, consumer_group, topic, subscriber_name, started_at, heartbeat_at FROM queue_subscriber_heartbeats "+
			"WHERE {scope}"+paged("tenant, consumer_group, topic, subscriber_name")),
		message:     "SELECT " + o + ", " + messageColumns + " FROM queue_messages WHERE " + messageKey,
		lockMessage: "SELECT " + o + ", " + messageColumns + " FROM queue_messages WHERE " + messageKey + s.forUpdate(),
		messageStates: "SELECT consumer_group, attempts, next_attempt_at, last_error FROM queue_delivery_state " +
			"WHERE tenant = :tenant AND topic = :topic AND partition_key = :key AND message_offset = :offset",
		deleteMessage: "DELETE FROM queue_messages WHERE " + messageKey,
		deleteStates:  "DELETE FROM queue_delivery_state WHERE tenant = :tenant AND topic = :topic AND partition_key = :key AND message_offset = :offset",
		// The offset is a number: compared as one, not as text.
		topicMessages: scopedOn("tenant", "SELECT "+o+", "+messageColumns+" FROM queue_messages WHERE {scope} AND topic = :topic "+
			"AND (tenant > :after_tenant OR (tenant = :after_tenant AND "+o+" > :after_offset)) ORDER BY tenant, "+o+" LIMIT :limit"),
		offsetBefore: "SELECT MAX(" + o + ") FROM queue_messages WHERE tenant = :tenant AND topic = :topic AND partition_key = :key AND created_at < :before",
		deleteBatch:  deleteBatch,
		halfInsert: "INSERT INTO queue_half_messages (" + halfColumns + ", claim_expires_at) VALUES (:tenant, :topic, :key, :id, :producer_group, " +
			":headers, :payload, :created_at, 0, :next_check_at, '', 0, :not_before, :created_at)",
		halfLock:   "SELECT " + halfColumns + " FROM queue_half_messages WHERE " + messageKey + s.forUpdate(),
		halfDelete: "DELETE FROM queue_half_messages WHERE " + messageKey,
		halfDue: "SELECT " + halfColumns + " FROM queue_half_messages WHERE tenant IN (:tenants) AND producer_group = :producer_group " +
			"AND next_check_at <= :now AND (claim_owner = '' OR claim_expires_at <= :now) ORDER BY next_check_at LIMIT :limit",
		halfClaim: "UPDATE queue_half_messages SET claim_owner = :owner, claim_token = claim_token + 1, claim_expires_at = :claim_expires_at " +
			"WHERE " + messageKey + " AND claim_token = :token",
		halfReschedule: "UPDATE queue_half_messages SET check_count = check_count + 1, next_check_at = :next_check_at, claim_owner = '' " +
			"WHERE " + messageKey + " AND claim_token = :token",
		halfDead: "INSERT INTO queue_half_messages_dead (tenant, topic, partition_key, id, producer_group, headers, payload, created_at, check_count, dead_at) " +
			"VALUES (:tenant, :topic, :key, :id, :producer_group, :headers, :payload, :created_at, :check_count, :now)" +
			s.upsert("tenant, topic, partition_key, id", ""),
		halves: scopedOn("tenant", "SELECT "+halfColumns+" FROM queue_half_messages WHERE {scope}"+paged("tenant, topic, partition_key, id")),
	}
}

// messageNamed names a message's identity.
func messageNamed(r driver.MessageRef) Args {
	return Args{"tenant": r.Tenant, "topic": r.Topic, "key": r.PartitionKey, "id": r.ID}
}
