// SPDX-License-Identifier: Apache-2.0

package sqlcommon

import (
	"strconv"
	"strings"

	"github.com/shardq/shardq/driver"
)

// TenantTables are the tables that hold a tenant's rows, in the order a
// tenant's deletion empties them: first what fences members (leases,
// heartbeats), then the groups' bookkeeping, tokens and half messages,
// the messages, their head rows, and the tenant's settings last (a
// suspended tenant stays suspended until nothing of it is left).
var TenantTables = []string{
	"queue_partition_leases", "queue_subscriber_heartbeats", "queue_message_claims", "queue_deferred",
	"queue_group_state", "queue_delivery_state", "queue_offsets", "queue_consumer_groups", "queue_half_messages",
	"queue_half_messages_dead", "queue_api_tokens", "queue_messages", "queue_partitions", "queue_tenants",
}

// tenantSQL holds the statements of a tenant's whole life (tenant.go).
type tenantSQL struct {
	count       []string // the tenant's rows in each of TenantTables
	drop        []string // delete up to :limit of the tenant's rows of each of TenantTables
	liveMembers string   // members of the tenant with a heartbeat since :since
	liveLeases  string   // the tenant's unexpired leases
	settings    string   // the settings rows of :tenants
	settings10  string   // the same on schema 10, before the limits
	suspend     string   // add the tenant's settings row (:rows) or set suspended_at of the one there
	setLimits   string   // add the tenant's settings row (:rows) or set the limits of the one there
	resume      string   // clear the suspension of the tenant's settings row, if it has one
	list        string   // up to :limit tenants after :after with a head row (a scatter read on Vitess)
	listSet     string   // up to :limit tenants after :after with a settings row (a scatter read on Vitess)
	usage       string   // the tenant's messages and their bytes (driver.MessageBytes) per topic
	stateUsage  string   // the bytes of the tenant's message-group states (driver.GroupStateBytes) per topic
	deferUsage  string   // the bytes of the tenant's deferred rows (driver.DeferredBytes) per topic
	groupUsage  []string // the bytes of the tenant's leases, cursors and registry rows (driver.BookkeepingBytes) per topic
	heads       string   // the tenant's head rows
	exportMsgs  string   // up to :limit of the tenant's messages after (:a0, :a1, :a2) = (topic, key, offset)
	exportGroup string   // up to :limit of the tenant's group registry rows after (topic, group)
	exportCurs  string   // up to :limit of the tenant's cursors after (topic, key, group)
	exportState string   // up to :limit of the tenant's message-group states after (group, topic, key)
}

// limitColumns are queue_tenants' limits, in driver.TenantLimits' order.
var limitColumns = []string{"publish_rate", "publish_byte_rate", "max_messages", "max_bytes", "max_partitions", "min_retention_ms", "max_retention_ms"}

// setExcluded is an upsert's "col = <the row offered>, ..." for cols.
func setExcluded(s Syntax, cols []string) string {
	set := make([]string, len(cols))
	for i, c := range cols {
		set[i] = c + " = " + s.excluded(c)
	}
	return strings.Join(set, ", ")
}

// keysetPage ends a read of one tenant's rows: those after (:a0, :a1, ...)
// in the order of cols (the primary key after tenant), at most :limit.
// SQLite seeks the index by a row value; MariaDB does not turn one into
// an index range, so there the comparison is spelled out (its range
// optimiser takes that).
func keysetPage(s Syntax, cols ...string) string {
	order := " ORDER BY " + strings.Join(cols, ", ") + " LIMIT :limit"
	if s == SQLite {
		params := make([]string, len(cols))
		for i := range cols {
			params[i] = ":a" + strconv.Itoa(i)
		}
		return " WHERE tenant = :tenant AND (" + strings.Join(cols, ", ") + ") > (" + strings.Join(params, ", ") + ")" + order
	}
	after := cols[len(cols)-1] + " > :a" + strconv.Itoa(len(cols)-1)
	for i := len(cols) - 2; i >= 0; i-- {
		a := ":a" + strconv.Itoa(i)
		after = cols[i] + " > " + a + " OR " + cols[i] + " = " + a + " AND (" + after + ")"
	}
	return " WHERE tenant = :tenant AND (" + after + ")" + order
}

// primaryKeys are the SQLite primary keys of TenantTables: its DELETE has
// no LIMIT, so a batch is the rows a keyed sub-select chose.
var primaryKeys = map[string]string{
	"queue_partition_leases":      "tenant, consumer_group, topic, partition_key",
	"queue_subscriber_heartbeats": "tenant, consumer_group, topic, subscriber_name",
	"queue_message_claims":        "tenant, consumer_group, topic, message_offset",
	"queue_deferred":              "tenant, consumer_group, topic, message_offset",
	"queue_group_state":           "tenant, consumer_group, topic, partition_key",
	"queue_delivery_state":        "tenant, consumer_group, topic, partition_key, message_offset",
	"queue_offsets":               "tenant, topic, partition_key, consumer_group",
	"queue_consumer_groups":       "tenant, topic, consumer_group",
	"queue_half_messages":         "tenant, topic, partition_key, id",
	"queue_half_messages_dead":    "tenant, topic, partition_key, id",
	"queue_api_tokens":            "tenant, token_id",
	"queue_partitions":            "tenant, topic, partition_key",
	"queue_tenants":               "tenant",
}

func newTenantSQL(s Syntax) tenantSQL {
	rowBytes := strconv.Itoa(driver.BookkeepingRowBytes)
	st := tenantSQL{
		liveMembers: "SELECT DISTINCT subscriber_name FROM queue_subscriber_heartbeats WHERE tenant = :tenant AND heartbeat_at >= :since ORDER BY subscriber_name",
		liveLeases:  "SELECT COUNT(*) FROM queue_partition_leases WHERE tenant = :tenant AND owner <> '' AND expires_at > :now",
		settings: "SELECT tenant, suspended_at, updated_at, " + strings.Join(limitColumns, ", ") +
			" FROM queue_tenants WHERE tenant IN (:tenants)",
		settings10: "SELECT tenant, suspended_at, updated_at FROM queue_tenants WHERE tenant IN (:tenants)",
		suspend: "INSERT INTO queue_tenants (tenant, suspended_at, updated_at) VALUES :rows" +
			s.upsert("tenant", "suspended_at = "+s.excluded("suspended_at")+", updated_at = "+s.excluded("updated_at")),
		resume: "UPDATE queue_tenants SET suspended_at = NULL, updated_at = :now WHERE tenant = :tenant",
		setLimits: "INSERT INTO queue_tenants (tenant, updated_at, " + strings.Join(limitColumns, ", ") + ") VALUES :rows" +
			s.upsert("tenant", setExcluded(s, append([]string{"updated_at"}, limitColumns...))),
		// Every tenant, as an operator asked: "1 = 1" marks an all-tenant
		// read, as driver.Scope.AllTenants renders it.
		list:    "SELECT DISTINCT tenant FROM queue_partitions WHERE 1 = 1 AND tenant > :after ORDER BY tenant LIMIT :limit",
		listSet: "SELECT tenant FROM queue_tenants WHERE 1 = 1 AND tenant > :after ORDER BY tenant LIMIT :limit",
		heads:   "SELECT COUNT(*) FROM queue_partitions WHERE tenant = :tenant",
		usage: "SELECT topic, COUNT(*), COUNT(DISTINCT partition_key), COALESCE(SUM(" + s.octetSum("payload", "headers", "partition_key", "id") + "), 0)" +
			" FROM queue_messages WHERE tenant = :tenant GROUP BY topic ORDER BY topic",
		stateUsage: "SELECT topic, COALESCE(SUM(" + s.octetSum("state", "partition_key", "consumer_group") + "), 0)" +
			" FROM queue_group_state WHERE tenant = :tenant GROUP BY topic ORDER BY topic",
		deferUsage: "SELECT topic, COALESCE(SUM(" + s.octetSum("partition_key", "consumer_group") + "), 0)" +
			" FROM queue_deferred WHERE tenant = :tenant GROUP BY topic ORDER BY topic",
		groupUsage: []string{
			"SELECT topic, COALESCE(SUM(" + s.octetSum("partition_key", "consumer_group", "owner") + " + " + rowBytes + "), 0)" +
				" FROM queue_partition_leases WHERE tenant = :tenant GROUP BY topic ORDER BY topic",
			"SELECT topic, COALESCE(SUM(" + s.octetSum("partition_key", "consumer_group") + " + " + rowBytes + "), 0)" +
				" FROM queue_offsets WHERE tenant = :tenant GROUP BY topic ORDER BY topic",
			"SELECT topic, COALESCE(SUM(" + s.octetSum("consumer_group") + " + " + rowBytes + "), 0)" +
				" FROM queue_consumer_groups WHERE tenant = :tenant GROUP BY topic ORDER BY topic",
		},
		// Keyset pages in primary-key order, each after the last row of
		// the page before (:a0, :a1, :a2).
		exportMsgs: "SELECT " + s.offset() + ", tenant, topic, partition_key, id, headers, payload, created_at, not_before FROM queue_messages" +
			keysetPage(s, "topic", "partition_key", s.offset()),
		exportGroup: "SELECT topic, consumer_group, start_offset, created_at, paused_at FROM queue_consumer_groups" +
			keysetPage(s, "topic", "consumer_group"),
		exportCurs: "SELECT topic, partition_key, consumer_group, committed_offset FROM queue_offsets" +
			keysetPage(s, "topic", "partition_key", "consumer_group"),
		exportState: "SELECT topic, consumer_group, partition_key, state FROM queue_group_state" +
			keysetPage(s, "consumer_group", "topic", "partition_key"),
	}
	for _, t := range TenantTables {
		st.count = append(st.count, "SELECT COUNT(*) FROM "+t+" WHERE tenant = :tenant")
		if s == MySQL {
			// Routed by tenant: on Vitess, one shard's statement.
			st.drop = append(st.drop, "DELETE FROM "+t+" WHERE tenant = :tenant LIMIT :limit")
			continue
		}
		pk := primaryKeys[t]
		if t == "queue_messages" {
			pk = s.offset()
		}
		st.drop = append(st.drop, "DELETE FROM "+t+" WHERE ("+pk+") IN (SELECT "+pk+" FROM "+t+" WHERE tenant = :tenant LIMIT :limit)")
	}
	return st
}
