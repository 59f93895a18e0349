// SPDX-License-Identifier: Apache-2.0

package sqlcommon

// deferredSQL holds the statements of deferred messages (deferred.go).
// Rows are keyed (tenant, consumer_group, topic, message_offset), as
// claims are.
type deferredSQL struct {
	insert   string // add deferred rows (:rows), keeping any that exist
	claim    string // take the claimable rows at :offsets under a new token
	claimed  string // this token's rows among :offsets, with their messages (offset, id, headers, payload, created_at, not_before)
	ack      string // delete rows, each under its claim (:claims rows of offset, token, owner)
	release  string // give a claimed row back, claimable from :visible_at, under its claim
	extend   string // keep a claimed row until :visible_at, under its claim
	settle   string // delete a row under its claim
	list     string // up to :limit rows after :after with their messages' metadata
	counts   string // the group's rows per partition key, of :keys
	floors   string // the lowest deferred offset per partition of a topic, of any group
	gone     string // up to :limit rows of a topic whose message is not stored
	dropGone string // delete the rows of a topic at :offsets (checked gone) of one group
}

// deferredFence selects a deferred row while its claim (owner, token) is
// current. Token 0 is nobody's: a row never claimed.
const deferredFence = claimKey + " AND message_offset = :offset AND token = :token AND token > 0 AND owner = :owner"

func newDeferredSQL(s Syntax) deferredSQL {
	o := s.offset()
	ofMessage := " JOIN queue_messages m ON m.tenant = d.tenant AND m.topic = d.topic AND m.partition_key = d.partition_key AND m." + o + " = d.message_offset"
	return deferredSQL{
		insert: "INSERT INTO queue_deferred (tenant, consumer_group, topic, message_offset, partition_key, owner, token, attempts, visible_at, deferred_at, updated_at) " +
			"VALUES :rows" + s.upsert("tenant, consumer_group, topic, message_offset", ""),
		claim: "UPDATE queue_deferred SET owner = :owner, token = :token, attempts = attempts + 1, visible_at = :visible_at, updated_at = :now " +
			"WHERE " + claimKey + " AND message_offset IN (:offsets) AND visible_at <= :now",
		claimed: "SELECT d.attempts, d.partition_key, m." + o + ", m.id, m.headers, m.payload, m.created_at, m.not_before FROM queue_deferred d" + ofMessage +
			" WHERE d.tenant = :tenant AND d.consumer_group = :group AND d.topic = :topic AND d.message_offset IN (:offsets) AND d.token = :token" +
			" ORDER BY d.message_offset",
		ack:     "DELETE FROM queue_deferred WHERE " + claimKey + " AND token > 0 AND " + s.inRows("message_offset, token, owner", "claims"),
		release: "UPDATE queue_deferred SET owner = '', visible_at = :visible_at, updated_at = :now WHERE " + deferredFence,
		extend:  "UPDATE queue_deferred SET visible_at = :visible_at, updated_at = :now WHERE " + deferredFence,
		settle:  "DELETE FROM queue_deferred WHERE " + deferredFence,
		list: "SELECT d.message_offset, d.partition_key, d.attempts, d.owner, d.visible_at, d.deferred_at, m.id, m.created_at, m.not_before FROM queue_deferred d" + ofMessage +
			" WHERE d.tenant = :tenant AND d.consumer_group = :group AND d.topic = :topic AND d.message_offset > :after ORDER BY d.message_offset LIMIT :limit",
		counts: "SELECT partition_key, COUNT(*) FROM queue_deferred WHERE tenant = :tenant AND topic = :topic AND partition_key IN (:keys) " +
			"AND consumer_group = :group GROUP BY partition_key",
		floors: "SELECT partition_key, MIN(message_offset) FROM queue_deferred WHERE tenant = :tenant AND topic = :topic GROUP BY partition_key",
		gone: "SELECT d.consumer_group, d.message_offset FROM queue_deferred d LEFT JOIN queue_messages m ON m.tenant = d.tenant AND m.topic = d.topic " +
			"AND m.partition_key = d.partition_key AND m." + o + " = d.message_offset WHERE d.tenant = :tenant AND d.topic = :topic AND m." + o + " IS NULL " +
			"ORDER BY d.partition_key, d.consumer_group, d.message_offset LIMIT :limit",
		dropGone: "DELETE FROM queue_deferred WHERE " + claimKey + " AND message_offset IN (:offsets)",
	}
}
