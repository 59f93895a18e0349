// SPDX-License-Identifier: Apache-2.0

package sqlcommon

import (
	"strings"

	"github.com/shardq/shardq/driver"
)

// leaseSQL holds the statements of the lease protocol, membership and
// message-group state, whole, with named parameters (Bind).
type leaseSQL struct {
	ensure             string // make sure a lease row exists (a no-op upsert that locks it); a new row's token is the time in µs
	lock               string // read and lock a lease row
	peek               string // read a lease row, locking nothing
	committed          string // the group's cursor of the partition
	start              string // where the group starts in a partition it has no cursor for
	take               string // give the row to an owner with a new token
	fence              string // lock the row only while the token and owner are current
	fenceHead          string // fence, returning the partition's head (a scalar subquery: a plain read, it locks nothing)
	renew              string // extend a lease under its token
	renewMany          string // extend an owner's leases, each under its token (:leases rows of tenant, key, token)
	ownedTokens        string // an owner's rows and their tokens
	expire             string // end an owner's leases now, in its name
	release            string // free a lease under its token
	commit             string // move a cursor forward, never back
	dropStates         string // drop the retry bookkeeping the cursor passed
	record             string // upsert a message's retry bookkeeping
	states             string // read the retry bookkeeping of a range of offsets
	list               string // a group's lease rows in a topic
	held               string // list, of the rows an owner holds (idx_leases_owner)
	sweep              string // free the leases of those of :owners without a heartbeat since :stale_before, with the next token
	takenLeases        string // the leases of :owners, locked, with their expiry
	takeOver           string // give the leases of :owners (earlier incarnations) at :keys to :member with the next token, never shortened
	removeMembers      string // delete the heartbeat rows of :owners
	refreshBeats       string // refresh a member's heartbeat rows, adding none
	heartbeat          string // upsert a member's heartbeat rows (:rows)
	removeBeats        string // delete a member's heartbeat rows
	refreshBeatsShards string // refreshBeats, each shard's part committed on its own
	heartbeatShards    string // heartbeat, each shard's part committed on its own
	removeBeatsShards  string // removeBeats, each shard's part committed on its own
	members            string // a group's heartbeat rows in a topic
	revoke             string // free a lease with the next token (an operator's reset fences its holder)
	readState          string // a message group's state
	writeState         string // upsert a message group's state
}

// leaseKeyNamed selects one lease row (:tenant, :group, :topic, :key).
const leaseKeyNamed = "tenant = :tenant AND consumer_group = :group AND topic = :topic AND partition_key = :key"

// memberScope selects a group's rows in a topic of some tenants.
const memberScope = "tenant IN (:tenants) AND consumer_group = :group AND topic = :topic"

func newLeaseSQL(s Syntax) leaseSQL {
	l := leaseSQL{
		ensure: "INSERT INTO queue_partition_leases (tenant, consumer_group, topic, partition_key, owner, token, expires_at, acquired_at) " +
			"VALUES (:tenant, :group, :topic, :key, '', :first_token, :now, :now)" + s.upsert("tenant, consumer_group, topic, partition_key", ""),
		lock:      "SELECT owner, token, expires_at FROM queue_partition_leases WHERE " + leaseKeyNamed + s.forUpdate(),
		peek:      "SELECT owner, expires_at FROM queue_partition_leases WHERE " + leaseKeyNamed,
		committed: "SELECT committed_offset FROM queue_offsets WHERE tenant = :tenant AND topic = :topic AND partition_key = :key AND consumer_group = :group",
		start:     "SELECT start_offset FROM queue_consumer_groups WHERE tenant = :tenant AND topic = :topic AND consumer_group = :group",
		take: "UPDATE queue_partition_leases SET owner = :owner, token = :token, expires_at = :expires_at, acquired_at = :now " +
			"WHERE " + leaseKeyNamed,
		fence: "SELECT 1 FROM queue_partition_leases WHERE " + leaseKeyNamed + " AND token = :token AND owner = :owner" + s.forUpdate(),
		fenceHead: "SELECT (SELECT head_offset FROM queue_partitions WHERE tenant = :tenant AND topic = :topic AND partition_key = :key) " +
			"FROM queue_partition_leases WHERE " + leaseKeyNamed + " AND token = :token AND owner = :owner" + s.forUpdate(),
		renew: "UPDATE queue_partition_leases SET expires_at = :expires_at WHERE " + leaseKeyNamed + " AND token = :token",
		renewMany: "UPDATE queue_partition_leases SET expires_at = :expires_at WHERE " + memberScope + " AND owner = :owner AND " +
			s.inRows("tenant, partition_key, token", "leases"),
		ownedTokens: "SELECT tenant, partition_key, token FROM queue_partition_leases WHERE " + memberScope + " AND owner = :owner",
		expire:      "UPDATE queue_partition_leases SET expires_at = :now WHERE " + memberScope + " AND owner = :owner AND expires_at > :now",
		release:     "UPDATE queue_partition_leases SET owner = '', expires_at = :now WHERE " + leaseKeyNamed + " AND token = :token",
		commit: "INSERT INTO queue_offsets (tenant, topic, partition_key, consumer_group, committed_offset, updated_at) " +
			"VALUES (:tenant, :topic, :key, :group, :offset, :now)" + s.upsert("tenant, topic, partition_key, consumer_group",
			"committed_offset = "+s.greatest()+"(committed_offset, "+s.excluded("committed_offset")+"), updated_at = "+s.excluded("updated_at")),
		dropStates: "DELETE FROM queue_delivery_state WHERE " + leaseKeyNamed + " AND message_offset <= :offset",
		record: "INSERT INTO queue_delivery_state (tenant, consumer_group, topic, partition_key, message_offset, " +
			"attempts, next_attempt_at, last_error, updated_at) VALUES (:tenant, :group, :topic, :key, :offset, :attempts, :next_attempt_at, :last_error, :now)" +
			s.upsert("tenant, consumer_group, topic, partition_key, message_offset",
				"attempts = "+s.excluded("attempts")+", next_attempt_at = "+s.excluded("next_attempt_at")+
					", last_error = "+s.excluded("last_error")+", updated_at = "+s.excluded("updated_at")),
		states: "SELECT message_offset, attempts, next_attempt_at, last_error FROM queue_delivery_state WHERE " + leaseKeyNamed +
			" AND message_offset > :after AND message_offset <= :up_to",
		list: "SELECT tenant, partition_key, owner, token, expires_at FROM queue_partition_leases WHERE " + memberScope +
			" ORDER BY tenant, partition_key",
		// idx_leases_owner, forced and unordered (HeldLeases sorts): with
		// an ORDER BY, or "owner <> ''" (not a range to SQLite), both
		// databases walk the primary key over every lease row of the
		// group, drained partitions' free rows included (docs/BENCHMARKS.md,
		// statement costs).
		held: "SELECT tenant, partition_key, owner, token, expires_at FROM queue_partition_leases" + s.useIndex("idx_leases_owner") +
			" WHERE " + memberScope + " AND owner > ''",
		// One statement: it cannot be left half done, its row locks
		// held, by a process frozen between two statements. A lease
		// acquired after :now (when the sweeper read the heartbeats) is
		// not a dead owner's: under READ COMMITTED the subquery reads an
		// earlier snapshot than the lease rows it meets after a lock wait.
		sweep: "UPDATE queue_partition_leases SET owner = '', token = token + 1, expires_at = :now WHERE " + memberScope +
			" AND owner IN (:owners) AND acquired_at < :now AND NOT EXISTS (SELECT 1 FROM queue_subscriber_heartbeats h WHERE h.tenant = queue_partition_leases.tenant" +
			" AND h.consumer_group = queue_partition_leases.consumer_group AND h.topic = queue_partition_leases.topic" +
			" AND h.subscriber_name = queue_partition_leases.owner AND h.heartbeat_at >= :stale_before)",
		takenLeases: "SELECT partition_key, expires_at FROM queue_partition_leases WHERE " + memberScope + " AND owner IN (:owners)" + s.forUpdate(),
		takeOver: "UPDATE queue_partition_leases SET owner = :member, token = token + 1, expires_at = " + s.greatest() + "(expires_at, :expires_at) WHERE " + memberScope +
			" AND owner IN (:owners) AND partition_key IN (:keys)",
		refreshBeats:  "UPDATE queue_subscriber_heartbeats SET heartbeat_at = :now WHERE " + memberScope + " AND subscriber_name = :member",
		removeMembers: "DELETE FROM queue_subscriber_heartbeats WHERE " + memberScope + " AND subscriber_name IN (:owners)",
		heartbeat: "INSERT INTO queue_subscriber_heartbeats (tenant, consumer_group, topic, subscriber_name, started_at, heartbeat_at) VALUES :rows" +
			s.upsert("tenant, consumer_group, topic, subscriber_name", "heartbeat_at = "+s.excluded("heartbeat_at")),
		removeBeats: "DELETE FROM queue_subscriber_heartbeats WHERE " + memberScope + " AND subscriber_name = :member",
		members: "SELECT tenant, subscriber_name, started_at, heartbeat_at FROM queue_subscriber_heartbeats WHERE " + memberScope +
			" ORDER BY tenant, subscriber_name",
		revoke:    "UPDATE queue_partition_leases SET owner = '', token = token + 1, expires_at = :now WHERE " + leaseKeyNamed,
		readState: "SELECT state FROM queue_group_state WHERE " + leaseKeyNamed,
		writeState: "INSERT INTO queue_group_state (tenant, consumer_group, topic, partition_key, state, updated_at) " +
			"VALUES (:tenant, :group, :topic, :key, :state, :now)" + s.upsert("tenant, consumer_group, topic, partition_key",
			"state = "+s.excluded("state")+", updated_at = "+s.excluded("updated_at")),
	}
	// Through vtgate, one statement over tenants of several shards that
	// each shard commits on its own: no shard's row is held while another
	// shard's part waits, so no lock cycle across shards forms with a
	// sweep, which takes them tenant by tenant.
	l.refreshBeatsShards = multiShardAutocommit(l.refreshBeats)
	l.heartbeatShards = multiShardAutocommit(l.heartbeat)
	l.removeBeatsShards = multiShardAutocommit(l.removeBeats)
	return l
}

// multiShardAutocommit marks a statement for vtgate to run as an
// autocommit statement on each shard it touches (a comment directive
// after the verb; a database other than vtgate reads a comment).
func multiShardAutocommit(stmt string) string {
	verb, rest, _ := strings.Cut(stmt, " ")
	return verb + " /*vt+ MULTI_SHARD_AUTOCOMMIT=1 */ " + rest
}

// refNamed names a partition's lease key.
func refNamed(p driver.PartitionRef) Args {
	return Args{"tenant": p.Tenant, "group": p.ConsumerGroup, "topic": p.Topic, "key": p.PartitionKey}
}

// memberNamed names a group's rows in a topic of some tenants.
func memberNamed(tenants []string, group, topic string) Args {
	return Args{"tenants": textList(tenants), "group": group, "topic": topic}
}

// textList is a List of ss.
func textList(ss []string) List {
	l := make(List, len(ss))
	for i, s := range ss {
		l[i] = s
	}
	return l
}
