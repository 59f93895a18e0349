// SPDX-License-Identifier: Apache-2.0

package sqlcommon

// lifecycleSQL holds the statements of partition and consumer-group
// lifecycle (lifecycle.go), whole, with named parameters (Bind): what
// retention reads to decide, the removal of drained partitions, and the
// group registry.
type lifecycleSQL struct {
	heads      string   // first page of a topic's heads, each with its oldest remaining message
	headsAfter string   // heads, the page after :after
	groups     []string // groups that read a topic: registered, or with a cursor, lease or member there
	registered string   // which of :tenants have the group registered
	hasCursor  string   // has the group a cursor in the topic
	topicHead  string   // the topic's highest head
	register   string   // add group rows (:rows), keeping any that exist
	pause      string   // add group rows (:rows) or set paused_at of those that exist
	paused     string   // which of :tenants have the group paused
	staleKeys  string   // keys of lease rows of :groups free or expired before :before
	lockHeads  string   // head rows of :keys, locked
	liveLeases string   // which of :keys a group of :groups holds unexpired; locks every row read
	heldLeases string   // liveLeases, locking nothing
	dropHeads  string   // delete the head rows of :keys
	dropCurs   string   // delete every group's cursor of :keys
	dropLeases string   // delete the lease rows of :keys of :groups
	dropStates string   // delete the retry bookkeeping of :keys of :groups
	dropGroupS string   // delete the message-group state of :keys of :groups
	dropClaims string   // delete the ungrouped claims of :groups in the topic
	unread     string   // a group's partitions with no cursor, with the group's start offset
	deleteReg  string   // delete a group's registry row
	groupCurs  string   // delete a group's cursors in a topic
	groupLeas  string   // delete a group's lease rows in a topic
	groupStat  string   // delete a group's retry bookkeeping in a topic
	groupGS    string   // delete a group's message-group state in a topic
	groupClm   string   // delete a group's ungrouped claims in a topic
	groupDef   string   // delete a group's deferred messages in a topic
	groupBeats string   // delete a group's heartbeat rows in a topic
	fenceGroup string   // lock a group's lease rows in a topic (a delete fences every holder)
}

// topicScope selects one tenant's topic.
const topicScope = "tenant = :tenant AND topic = :topic"

func newLifecycleSQL(s Syntax) lifecycleSQL {
	o := s.offset()
	// The oldest remaining message of head row p: an index probe each.
	first := func(col string) string {
		return "(SELECT m." + col + " FROM queue_messages m" + s.partitionOrder() + " WHERE m.tenant = p.tenant AND m.topic = p.topic " +
			"AND m.partition_key = p.partition_key ORDER BY m." + o + " LIMIT 1)"
	}
	heads := "SELECT p.partition_key, p.head_offset, p.updated_at, " + first(o) + ", " + first("created_at") +
		" FROM queue_partitions p WHERE p.tenant = :tenant AND p.topic = :topic"
	const keys = topicScope + " AND partition_key IN (:keys)"
	const groupKeys = "tenant = :tenant AND consumer_group IN (:groups) AND topic = :topic AND partition_key IN (:keys)"
	const ofGroup = "tenant = :tenant AND consumer_group = :group AND topic = :topic"
	return lifecycleSQL{
		heads:      heads + " ORDER BY p.partition_key LIMIT :limit",
		headsAfter: heads + " AND p.partition_key > :after ORDER BY p.partition_key LIMIT :limit",
		// Four statements, not a UNION: Vitess plans a UNION as a derived
		// table with a column list, which MariaDB cannot parse.
		groups: []string{
			"SELECT consumer_group FROM queue_consumer_groups WHERE " + topicScope,
			"SELECT DISTINCT consumer_group FROM queue_offsets WHERE " + topicScope,
			"SELECT DISTINCT consumer_group FROM queue_partition_leases WHERE " + topicScope + " AND consumer_group <> :internal",
			"SELECT DISTINCT consumer_group FROM queue_subscriber_heartbeats WHERE " + topicScope,
		},
		registered: "SELECT tenant FROM queue_consumer_groups WHERE tenant IN (:tenants) AND topic = :topic AND consumer_group = :group",
		hasCursor:  "SELECT 1 FROM queue_offsets WHERE " + topicScope + " AND consumer_group = :group LIMIT 1",
		topicHead:  "SELECT COALESCE(MAX(head_offset), 0) FROM queue_partitions WHERE " + topicScope,
		register: "INSERT INTO queue_consumer_groups (tenant, topic, consumer_group, start_offset, created_at) VALUES :rows" +
			s.upsert("tenant, topic, consumer_group", ""),
		pause: "INSERT INTO queue_consumer_groups (tenant, topic, consumer_group, start_offset, created_at, paused_at) VALUES :rows" +
			s.upsert("tenant, topic, consumer_group", "paused_at = "+s.excluded("paused_at")),
		paused: "SELECT tenant FROM queue_consumer_groups WHERE tenant IN (:tenants) AND topic = :topic AND consumer_group = :group AND paused_at IS NOT NULL",
		staleKeys: "SELECT DISTINCT partition_key FROM queue_partition_leases WHERE tenant = :tenant AND consumer_group IN (:groups) " +
			"AND topic = :topic AND expires_at < :before",
		// The head rows locked, each with whether a message is left (one
		// probe). Publishers lock a head row before they insert, so while
		// it is locked none can add one; the write transaction reads
		// committed rows (READ COMMITTED; SQLite's single writer).
		lockHeads: "SELECT p.partition_key, p.updated_at, (SELECT 1 FROM queue_messages m" + s.partitionOrder() +
			" WHERE m.tenant = p.tenant AND m.topic = p.topic AND m.partition_key = p.partition_key LIMIT 1)" +
			" FROM queue_partitions p WHERE p.tenant = :tenant AND p.topic = :topic AND p.partition_key IN (:keys)" + s.forUpdate(),
		liveLeases: "SELECT partition_key, owner, expires_at FROM queue_partition_leases WHERE " + groupKeys + s.forUpdate(),
		heldLeases: "SELECT partition_key, owner, expires_at FROM queue_partition_leases WHERE " + groupKeys,
		// Idle ones only: under READ COMMITTED a head row a publisher
		// created after lockHeads read none is not locked by it, and must
		// not go.
		dropHeads:  "DELETE FROM queue_partitions WHERE " + keys + " AND updated_at < :idle_before",
		dropCurs:   "DELETE FROM queue_offsets WHERE " + keys,
		dropLeases: "DELETE FROM queue_partition_leases WHERE " + groupKeys,
		dropStates: "DELETE FROM queue_delivery_state WHERE " + groupKeys,
		dropGroupS: "DELETE FROM queue_group_state WHERE " + groupKeys,
		dropClaims: "DELETE FROM queue_message_claims WHERE tenant = :tenant AND consumer_group IN (:groups) AND topic = :topic",
		unread: "SELECT p.partition_key, p.head_offset, COALESCE(g.start_offset, 0) FROM queue_partitions p " +
			"LEFT JOIN queue_offsets o ON o.tenant = p.tenant AND o.topic = p.topic AND o.partition_key = p.partition_key AND o.consumer_group = :group " +
			"LEFT JOIN queue_consumer_groups g ON g.tenant = p.tenant AND g.topic = p.topic AND g.consumer_group = :group " +
			"WHERE p.tenant = :tenant AND p.topic = :topic AND o.committed_offset IS NULL ORDER BY p.partition_key LIMIT :limit",
		deleteReg:  "DELETE FROM queue_consumer_groups WHERE " + topicScope + " AND consumer_group = :group",
		groupCurs:  "DELETE FROM queue_offsets WHERE " + topicScope + " AND consumer_group = :group",
		groupLeas:  "DELETE FROM queue_partition_leases WHERE " + ofGroup,
		groupStat:  "DELETE FROM queue_delivery_state WHERE " + ofGroup,
		groupGS:    "DELETE FROM queue_group_state WHERE " + ofGroup,
		groupClm:   "DELETE FROM queue_message_claims WHERE " + ofGroup,
		groupDef:   "DELETE FROM queue_deferred WHERE " + ofGroup,
		groupBeats: "DELETE FROM queue_subscriber_heartbeats WHERE " + ofGroup,
		fenceGroup: "SELECT partition_key, owner, expires_at FROM queue_partition_leases WHERE " + ofGroup + s.forUpdate(),
	}
}
