// SPDX-License-Identifier: Apache-2.0

package testdb

import (
	"context"
	"database/sql"
	"encoding/json"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/go-sql-driver/mysql"
)

// StatementLog collects the distinct statement texts sent through vtgate,
// for RoutingProof; its zero value is ready.
type StatementLog struct {
	mu   sync.Mutex
	seen map[string]bool
}

// Record adds q, its whitespace collapsed.
func (l *StatementLog) Record(q string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seen == nil {
		l.seen = map[string]bool{}
	}
	l.seen[strings.Join(strings.Fields(q), " ")] = true
}

// All returns the statements recorded, sorted.
func (l *StatementLog) All() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]string, 0, len(l.seen))
	for q := range l.seen {
		out = append(out, q)
	}
	slices.Sort(out)
	return out
}

var (
	queueTable = regexp.MustCompile(`\bqueue_[a-z_]+\b`)
	ddl        = regexp.MustCompile(`(?i)^(CREATE|DROP|ALTER) `)
	limitParam = regexp.MustCompile(`(?i)\bLIMIT \?`)
	// The migrations table is sharded by version: Migrate's statements on
	// it are operator-run DDL bookkeeping, not the hot path.
	migrationsTable = regexp.MustCompile(`\bshardq_schema_migrations\b`)
)

var (
	paramList = regexp.MustCompile(`\?(\s*,\s*\?)+`)
	tupleList = regexp.MustCompile(`\(\?…?\)(\s*,\s*\(\?…?\))+`)
	literal   = regexp.MustCompile(`'[^']*'|\b\d+\b`)
)

// StatementShape is q with its lists of parameters and tuples, and its
// literals, collapsed: the statements that differ only in how many
// offsets or rows they name share a shape. ok is false for a statement
// RoutingProof leaves out (no queue table, DDL, migrations).
func StatementShape(q string) (shape string, ok bool) {
	q = strings.Join(strings.Fields(q), " ")
	if !queueTable.MatchString(q) || ddl.MatchString(q) || migrationsTable.MatchString(q) {
		return "", false
	}
	q = paramList.ReplaceAllString(q, "?…")
	q = tupleList.ReplaceAllString(q, "(…)…")
	return literal.ReplaceAllString(q, "L"), true
}

// allTenantReads are the only statements that may scatter: admin reads an
// operator asked for with --all-tenants (driver.Scope.AllTenants renders
// "1 = 1" for the tenant condition), each named by its driver method.
var allTenantReads = map[string]string{
	"Topics":         "SELECT tenant, topic, COUNT(*), MAX(head_offset) FROM queue_partitions WHERE 1 = 1",
	"OffsetReport":   "SELECT o.tenant, o.topic, o.partition_key, o.consumer_group,",
	"AllLeases":      "FROM queue_partition_leases WHERE 1 = 1",
	"AllSubscribers": "FROM queue_subscriber_heartbeats WHERE 1 = 1",
	"TopicMessages":  "FROM queue_messages WHERE 1 = 1",
	"ListHalves":     "FROM queue_half_messages",
	"ListTokens":     "FROM queue_api_tokens WHERE 1 = 1",
	"ListTenants":    "SELECT DISTINCT tenant FROM queue_partitions WHERE 1 = 1",
	"ListTenantsSet": "SELECT tenant FROM queue_tenants WHERE 1 = 1",
}

// crossTenantReads may scatter as well, each named by its driver method:
// a token id names one token in every tenant, so creating a token reads
// the id's rows in all of them.
var crossTenantReads = map[string]string{
	"CreateToken": "SELECT tenant, secret_hash FROM queue_api_tokens WHERE token_id = ?",
}

func exemptAllTenantRead(q string) (string, bool) {
	for name, stmt := range crossTenantReads {
		if q == stmt {
			return name, true
		}
	}
	if !strings.Contains(q, "1 = 1") || !strings.HasPrefix(q, "SELECT") {
		return "", false
	}
	for name, fragment := range allTenantReads {
		if strings.Contains(q, fragment) {
			return name, true
		}
	}
	return "", false
}

// RoutingProof asks vtgate for the plan of every recorded statement on a
// queue table (VEXPLAIN PLAN, placeholders replaced by literals) and
// requires every route in it to reach one shard by the tenant vindex, or
// the shards of an explicit tenant list. A new unscoped statement fails
// here. Fewer than floor statements checked fails too: the run they came
// from did not record its SQL.
func RoutingProof(t *testing.T, statements []string, floor int) {
	SkipVitess(t)
	cfg, err := mysql.ParseDSN(VitessDSN())
	if err != nil {
		t.Fatal(err)
	}
	// Held, so that no test of another process drops its tables meanwhile.
	dsn, _ := vitessKeyspaceNamed(t, cfg.DBName)
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	// The checker itself: statements without a tenant condition must be
	// caught, as reads and as writes.
	for _, q := range []string{
		"SELECT tenant, partition_key FROM queue_partitions WHERE topic = ?",
		"UPDATE queue_partition_leases SET owner = '' WHERE consumer_group = ?",
		"DELETE FROM queue_message_claims WHERE topic = ?",
		"SELECT p.tenant FROM queue_partitions p JOIN queue_offsets o ON o.topic = p.topic WHERE p.tenant = ?",
	} {
		statements = append(statements, "CHECKER "+q)
	}
	checked, exempt, caught := 0, map[string]int{}, 0
	for _, q := range statements {
		probe := strings.HasPrefix(q, "CHECKER ")
		q = strings.TrimPrefix(q, "CHECKER ")
		if !queueTable.MatchString(q) || ddl.MatchString(q) || migrationsTable.MatchString(q) {
			continue
		}
		if name, ok := exemptAllTenantRead(q); ok {
			exempt[name]++
			continue
		}
		literal := strings.ReplaceAll(limitParam.ReplaceAllString(q, "LIMIT 10"), "?", "'v'")
		var plan string
		if err := db.QueryRowContext(context.Background(), "VEXPLAIN PLAN "+literal).Scan(&plan); err != nil {
			t.Errorf("VEXPLAIN PLAN failed: %v\n%s", err, q)
			continue
		}
		var root map[string]any
		if err := json.Unmarshal([]byte(plan), &root); err != nil {
			t.Fatalf("plan is not JSON: %v\n%s", err, plan)
		}
		bad := scattered(root)
		switch {
		case probe && bad == "":
			t.Errorf("the checker let an unscoped statement pass:\n%s\nplan: %s", q, plan)
		case probe:
			caught++
		case bad != "":
			t.Errorf("statement is not routed by tenant (%s):\n%s\nplan: %s", bad, q, plan)
		default:
			checked++
		}
	}
	if checked < floor {
		t.Fatalf("only %d statements checked, want at least %d; the conformance run did not record its SQL", checked, floor)
	}
	t.Logf("the checker caught %d unscoped probes; %d statements route to one shard by tenant (or the shards of a tenant list); all-tenant admin reads exempt: %v", caught, checked, exempt)
}

// scattered walks a plan and describes the first primitive that does not
// route by the tenant vindex ("" when every one does).
func scattered(node map[string]any) string {
	op, _ := node["OperatorType"].(string)
	variant, _ := node["Variant"].(string)
	switch op {
	case "Route", "Update", "Delete":
		switch variant {
		case "EqualUnique", "Equal", "IN", "MultiEqual":
			if v, _ := node["Vindex"].(string); v != "tenant_xxhash" {
				return op + " by vindex " + v
			}
		default:
			return op + " " + variant
		}
	case "Insert", "Upsert":
		if variant != "Sharded" && variant != "" {
			return op + " " + variant
		}
	}
	for _, key := range []string{"Inputs", "Sources"} {
		children, _ := node[key].([]any)
		for _, c := range children {
			if m, ok := c.(map[string]any); ok {
				if bad := scattered(m); bad != "" {
					return bad
				}
			}
		}
	}
	return ""
}
