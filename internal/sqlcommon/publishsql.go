// SPDX-License-Identifier: Apache-2.0

package sqlcommon

// publishSQL holds the statements that append messages (publish.go),
// whole, with named parameters (Bind).
type publishSQL struct {
	lockHeads    string // create or lock head rows (:rows of tenant, topic, key, head 0, now, now)
	insert       string // insert messages (:rows of messageRow); a duplicate identity fails the statement
	insertFresh  string // SQLite: insert, skip stored identities, return what went in
	insertLocked string // MySQL: insert one message while locking its partition's head row; no row when the head row is missing
	stored       string // stored offsets of identities (:ids rows of key, id), read current
	advanceHeads string // raise head rows (:rows of tenant, topic, key, head, now, now)
}

const messageInsert = "INSERT INTO queue_messages (tenant, topic, partition_key, id, headers, payload, created_at, not_before) VALUES :rows"

func newPublishSQL(s Syntax) publishSQL {
	const heads = "INSERT INTO queue_partitions (tenant, topic, partition_key, head_offset, created_at, updated_at) VALUES :rows"
	p := publishSQL{
		lockHeads: heads + s.upsert("tenant, topic, partition_key", ""),
		insert:    messageInsert,
		stored: "SELECT partition_key, id, " + s.offset() + " FROM queue_messages WHERE tenant = :tenant AND topic = :topic AND " +
			s.inRows("partition_key, id", "ids") + s.forShare(),
		advanceHeads: heads + s.upsert("tenant, topic, partition_key",
			"head_offset = "+s.greatest()+"(head_offset, "+s.excluded("head_offset")+"), updated_at = "+s.excluded("updated_at")),
	}
	if s == MySQL {
		p.insertLocked = "INSERT INTO queue_messages (tenant, topic, partition_key, id, headers, payload, created_at, not_before) " +
			"SELECT :tenant, :topic, :key, :id, :headers, :payload, :created_at, :not_before FROM queue_partitions " +
			"WHERE tenant = :tenant AND topic = :topic AND partition_key = :key" + s.forUpdate()
	}
	if s == SQLite {
		p.insertFresh = messageInsert + s.upsert("tenant, topic, partition_key, id", "") + ` RETURNING partition_key, id, "offset"`
	}
	return p
}
