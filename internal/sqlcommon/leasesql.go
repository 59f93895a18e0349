// SPDX-License-Identifier: Apache-2.0

package sqlcommon

import (
	"github.com/shardq/shardq/driver"
)

// leaseSQL holds the lease protocol's statements, whole, with named
// parameters (Bind): each is written once, here, from the dialect, and the
// code that runs them names its values instead of ordering them.
type leaseSQL struct {
	ensure      string // make sure a lease row exists (a no-op upsert that locks it)
	lock        string // read and lock a lease row
	committed   string // the group's cursor of the partition
	take        string // give the row to an owner with a new token
	fence       string // lock the row only while the token and owner are current
	renew       string // extend a lease under its token
	release     string // free a lease under its token
	commit      string // move a cursor forward, never back
	dropStates  string // drop the retry bookkeeping the cursor passed
	record      string // upsert a message's retry bookkeeping
	states      string // read the retry bookkeeping of a range of offsets
	removeBeats string // delete a member's heartbeat rows
	revoke      string // free a lease with the next token (an operator's reset fences its holder)
	readState   string // a message group's state
	writeState  string // upsert a message group's state
}

// leaseKeyNamed selects one lease row (:tenant, :group, :topic, :key).
const leaseKeyNamed = "tenant = :tenant AND consumer_group = :group AND topic = :topic AND partition_key = :key"

func newLeaseSQL(d Dialect) leaseSQL {
	return leaseSQL{
		ensure: "INSERT INTO queue_partition_leases (tenant, consumer_group, topic, partition_key, owner, token, expires_at, acquired_at) " +
			"VALUES (:tenant, :group, :topic, :key, '', 0, :now, :now)" + d.Upsert("tenant, consumer_group, topic, partition_key", ""),
		lock:      "SELECT owner, token, expires_at FROM queue_partition_leases WHERE " + leaseKeyNamed + d.LockClause,
		committed: "SELECT committed_offset FROM queue_offsets WHERE tenant = :tenant AND topic = :topic AND partition_key = :key AND consumer_group = :group",
		take: "UPDATE queue_partition_leases SET owner = :owner, token = :token, expires_at = :expires_at, acquired_at = :now " +
			"WHERE " + leaseKeyNamed,
		fence:   "SELECT 1 FROM queue_partition_leases WHERE " + leaseKeyNamed + " AND token = :token AND owner = :owner" + d.LockClause,
		renew:   "UPDATE queue_partition_leases SET expires_at = :expires_at WHERE " + leaseKeyNamed + " AND token = :token",
		release: "UPDATE queue_partition_leases SET owner = '', expires_at = :now WHERE " + leaseKeyNamed + " AND token = :token",
		commit: "INSERT INTO queue_offsets (tenant, topic, partition_key, consumer_group, committed_offset, updated_at) " +
			"VALUES (:tenant, :topic, :key, :group, :offset, :now)" + d.Upsert("tenant, topic, partition_key, consumer_group",
			"committed_offset = "+d.Greatest+"(committed_offset, "+d.Excluded("committed_offset")+"), updated_at = "+d.Excluded("updated_at")),
		dropStates: "DELETE FROM queue_delivery_state WHERE " + leaseKeyNamed + " AND message_offset <= :offset",
		record: "INSERT INTO queue_delivery_state (tenant, consumer_group, topic, partition_key, message_offset, " +
			"attempts, next_attempt_at, last_error, updated_at) VALUES (:tenant, :group, :topic, :key, :offset, :attempts, :next_attempt_at, :last_error, :now)" +
			d.Upsert("tenant, consumer_group, topic, partition_key, message_offset",
				"attempts = "+d.Excluded("attempts")+", next_attempt_at = "+d.Excluded("next_attempt_at")+
					", last_error = "+d.Excluded("last_error")+", updated_at = "+d.Excluded("updated_at")),
		states: "SELECT message_offset, attempts, next_attempt_at, last_error FROM queue_delivery_state WHERE " + leaseKeyNamed +
			" AND message_offset > :after AND message_offset <= :up_to",
		removeBeats: "DELETE FROM queue_subscriber_heartbeats WHERE tenant IN (:tenants) AND consumer_group = :group AND topic = :topic " +
			"AND subscriber_name = :member",
		revoke:    "UPDATE queue_partition_leases SET owner = '', token = token + 1, expires_at = :now WHERE " + leaseKeyNamed,
		readState: "SELECT state FROM queue_group_state WHERE " + leaseKeyNamed,
		writeState: "INSERT INTO queue_group_state (tenant, consumer_group, topic, partition_key, state, updated_at) " +
			"VALUES (:tenant, :group, :topic, :key, :state, :now)" + d.Upsert("tenant, consumer_group, topic, partition_key",
			"state = "+d.Excluded("state")+", updated_at = "+d.Excluded("updated_at")),
	}
}

// refNamed names a partition's lease key.
func refNamed(p driver.PartitionRef) Args {
	return Args{"tenant": p.Tenant, "group": p.ConsumerGroup, "topic": p.Topic, "key": p.PartitionKey}
}
