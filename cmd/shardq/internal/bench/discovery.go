// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"errors"
	"fmt"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/consumer"
)

// The discovery scenario: a topic holding --history drained partitions
// (their messages old, every one passed by the bench group, each with a
// cursor and a free lease row, as a year of per-build keys leaves them)
// and --active partitions with --messages between them. It reports the
// cost of one discovery tick (the first; the median of those reading a
// page of the first sweep; median and p99 of the ticks after it), the rate at which the subscribers consume the active
// partitions (against the same consumption in a namespace without the
// history: the ratio), and the metadata rows before and after a retention
// pass, with each pass's time.
//
// The history is built through the schema directly: its messages through
// the driver's InsertMessages (2,000 a transaction), its cursors and lease
// rows with one INSERT ... SELECT each, and its heads aged two hours with
// one UPDATE. A million Publish calls and consumed messages would take
// hours and measure nothing this scenario is about.

// historyBatch is the messages of the history inserted per transaction.
const historyBatch = 2000

// discoveryTicks is the incremental ticks timed per repetition.
const discoveryTicks = 200

// discoveryIdle is the partition idle age of the scenario's retention
// pass: older than the fresh active partitions, younger than the aged
// history.
const discoveryIdle = time.Hour

// metadataTables hold the per-partition rows that are not messages.
var metadataTables = []string{"queue_partitions", "queue_offsets", "queue_partition_leases", "queue_delivery_state",
	"queue_group_state", "queue_message_claims"}

func (e *env) discoveryCases() (base, c scenCase) {
	return scenCase{"consume-without-history", e.discoveryConsume(false)}, scenCase{"discovery", e.discoveryConsume(true)}
}

// discoveryConsume builds the history when withHistory is set, times the
// ticks, consumes the active partitions, and runs the retention passes.
func (e *env) discoveryConsume(withHistory bool) func(ctx context.Context, ns namespace) (rep, error) {
	return func(ctx context.Context, ns namespace) (rep, error) {
		c, err := e.client()
		if err != nil {
			return rep{}, err
		}
		defer c.Close()
		extra := map[string]any{}
		if withHistory {
			start := time.Now()
			if err := e.buildHistory(ctx, ns); err != nil {
				return rep{}, err
			}
			extra["history_build_seconds"] = time.Since(start).Seconds()
			start = time.Now()
			if err := e.settle(ctx); err != nil {
				return rep{}, err
			}
			extra["history_settle_seconds"] = time.Since(start).Seconds()
		}
		if err := e.fill(ctx, c, ns); err != nil {
			return rep{}, err
		}
		if withHistory {
			tc, err := consumer.TickCost(ctx, e.d, consumer.Config{ConsumerGroup: group, Topic: ns.topic, Tenants: ns.tenants,
				DiscoveryWindow: shardq.DefaultDiscoveryWindow}, discoveryTicks)
			if err != nil {
				return rep{}, err
			}
			if tc.Work != e.p.Partitions {
				return rep{}, fmt.Errorf("discovery: a tick saw %d partitions with work, want the %d active ones", tc.Work, e.p.Partitions)
			}
			extra["tick_first_ms"] = float64(tc.First) / float64(time.Millisecond)
			extra["tick_sweeping_count"] = len(tc.Sweeping)
			extra["tick_sweeping_p50_ms"] = percentile(tc.Sweeping, 0.50)
			extra["tick_p50_ms"] = percentile(tc.Steady, 0.50)
			extra["tick_p99_ms"] = percentile(tc.Steady, 0.99)
		}
		// Labelled for --cpuprofile: `go tool pprof -tagfocus
		// consume=with-history` (or without-history) shows where each
		// consumption spends its time.
		var r rep
		label := "without-history"
		if withHistory {
			label = "with-history"
		}
		pprof.Do(ctx, pprof.Labels("consume", label), func(ctx context.Context) {
			r, err = e.consumeAll(ctx, c, ns, newRecorder(e.p.Messages, e.p.Partitions), false)
		})
		if err != nil {
			return r, err
		}
		if e.d.Name() == "mysql" {
			if extra["idle_rows_read_per_sec"], extra["idle_statements_per_sec"], err = e.idleCost(ctx, c, ns); err != nil {
				return r, err
			}
		}
		r.extraParams = extra
		if !withHistory {
			return r, nil
		}
		if extra["metadata_rows_before"], err = e.metadataRows(ctx, ns, ""); err != nil {
			return r, err
		}
		cfg := shardq.RetentionConfig{Default: shardq.RetentionPolicy{MinRetention: time.Millisecond}, PartitionIdle: discoveryIdle, DedupWindow: -1}
		for _, pass := range []string{"retention", "idle_retention"} {
			start := time.Now()
			res, err := c.Admin().RunRetention(ctx, shardq.Scope{Tenants: ns.tenants}, cfg)
			if err != nil {
				return r, err
			}
			extra[pass+"_seconds"] = time.Since(start).Seconds()
			extra[pass+"_deleted"], extra[pass+"_removed"] = res.Deleted, res.Removed
		}
		if extra["metadata_rows_after"], err = e.metadataRows(ctx, ns, ""); err != nil {
			return r, err
		}
		if extra["history_rows_after"], err = e.metadataRows(ctx, ns, "h"); err != nil {
			return r, err
		}
		return r, nil
	}
}

// idleWindow is how long idleCost measures idle members.
const idleWindow = 5 * time.Second

// idleCost runs --subscribers members over the drained namespace and,
// once their first sweep is done, counts from the server's status
// counters the rows the engine reads and the statements it runs per
// second while they idle (MySQL only: the counters are the server's, so
// nothing else may run meanwhile).
func (e *env) idleCost(ctx context.Context, c *shardq.Client, ns namespace) (rowsPerSec, stmtsPerSec float64, err error) {
	stop, err := e.startSubscribers(ctx, c, ns, newRecorder(0, e.p.Partitions), false, false)
	if err != nil {
		return 0, 0, err
	}
	defer func() { err = errors.Join(err, stop()) }()
	// Joined, and the first sweep over the head rows done (10,000 rows a
	// tick at start-up): what is measured is the steady idle cost.
	// Ticks come an interval after the previous one ended: allow a
	// quarter more.
	time.Sleep(3*time.Second + time.Duration(e.p.History/10_000)*shardq.DefaultDiscoveryInterval*5/4)
	status := func() (rows, stmts float64, err error) {
		// Handler_read_*: rows the storage engines handed to the server
		// (MariaDB has no Innodb_rows_read).
		rs, err := e.d.DB().QueryContext(ctx, "SHOW GLOBAL STATUS WHERE Variable_name LIKE 'Handler\\_read\\_%' OR Variable_name = 'Questions'")
		if err != nil {
			return 0, 0, err
		}
		defer rs.Close()
		for rs.Next() {
			var name string
			var v float64
			if err := rs.Scan(&name, &v); err != nil {
				return 0, 0, err
			}
			if name == "Questions" {
				stmts = v
			} else {
				rows += v
			}
		}
		return rows, stmts, rs.Err()
	}
	r0, s0, err := status()
	if err != nil {
		return 0, 0, err
	}
	time.Sleep(idleWindow)
	r1, s1, err := status()
	if err != nil {
		return 0, 0, err
	}
	sec := idleWindow.Seconds()
	return (r1 - r0) / sec, (s1 - s0) / sec, nil
}

// buildHistory writes --history drained partitions (keys h0000000...) of
// the bench group in ns, spread over its tenants.
func (e *env) buildHistory(ctx context.Context, ns namespace) error {
	old := time.Now().Add(-2 * time.Hour)
	for i := 0; i < e.p.History; {
		var ms []*driver.InsertMessage
		for ; i < e.p.History && len(ms) < historyBatch; i++ {
			ms = append(ms, &driver.InsertMessage{Tenant: ns.tenants[i%len(ns.tenants)], Topic: ns.topic,
				PartitionKey: fmt.Sprintf("h%07d", i), ID: "m", CreatedAt: old})
		}
		tx, err := e.d.BeginWrite(ctx)
		if err != nil {
			return err
		}
		if err := e.d.InsertMessages(ctx, tx, ms); err != nil {
			return errors.Join(fmt.Errorf("history: %w", err), tx.Rollback())
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("history: %w", err)
		}
	}
	if err := e.d.RegisterGroup(ctx, driver.GroupScope{Tenants: ns.tenants, Topic: ns.topic, ConsumerGroup: group}, false, time.Now()); err != nil {
		return err
	}
	in, args := ns.tenantIn()
	// The tables' time columns are DATETIME(6) on MySQL and microseconds
	// on SQLite.
	var at any = old
	if e.d.Name() == "sqlite" {
		at = old.UnixMicro()
	}
	db := e.d.DB()
	for _, stmt := range []struct {
		q    string
		args []any
	}{
		{"INSERT INTO queue_offsets (tenant, topic, partition_key, consumer_group, committed_offset, updated_at) " +
			"SELECT tenant, topic, partition_key, ?, head_offset, updated_at FROM queue_partitions WHERE tenant IN " + in, append([]any{group}, args...)},
		{"INSERT INTO queue_partition_leases (tenant, consumer_group, topic, partition_key, owner, token, expires_at, acquired_at) " +
			"SELECT tenant, ?, topic, partition_key, '', 1, updated_at, updated_at FROM queue_partitions WHERE tenant IN " + in, append([]any{group}, args...)},
		{"UPDATE queue_partitions SET updated_at = ? WHERE tenant IN " + in, append([]any{at}, args...)},
	} {
		if _, err := db.ExecContext(ctx, stmt.q, stmt.args...); err != nil {
			return fmt.Errorf("history: %w", err)
		}
	}
	return nil
}

// settle lets the database absorb the history's bulk writes before
// anything is timed, as history that accumulated over months would be:
// SQLite checkpoints its write-ahead log into the file; InnoDB is given
// up to a minute to flush its dirty pages below a tenth of its buffer
// pool, where an idle server keeps them. Timed right after the
// build, consumption competed with writing back some 400 MB (a million
// partitions) and measured that, not the history.
func (e *env) settle(ctx context.Context) error {
	if e.d.Name() == "sqlite" {
		_, err := e.d.DB().ExecContext(ctx, "PRAGMA wal_checkpoint(TRUNCATE)")
		return err
	}
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(time.Second) {
		var name string
		var dirty, total int64
		if err := e.d.DB().QueryRowContext(ctx, "SHOW GLOBAL STATUS LIKE 'Innodb_buffer_pool_pages_dirty'").Scan(&name, &dirty); err != nil {
			return err
		}
		if err := e.d.DB().QueryRowContext(ctx, "SHOW GLOBAL STATUS LIKE 'Innodb_buffer_pool_pages_total'").Scan(&name, &total); err != nil {
			return err
		}
		if dirty*10 < total { // as an idle server keeps it
			return nil
		}
	}
	return nil
}

// tenantIn is "(?, ...)" for the namespace's tenants, and its arguments.
func (ns namespace) tenantIn() (string, []any) {
	args := make([]any, len(ns.tenants))
	for i, t := range ns.tenants {
		args[i] = t
	}
	return "(" + strings.TrimSuffix(strings.Repeat("?, ", len(ns.tenants)), ", ") + ")", args
}

// metadataRows counts the namespace's rows in metadataTables (retention's
// own claim rows aside), of partition keys starting with prefix.
func (e *env) metadataRows(ctx context.Context, ns namespace, prefix string) (int64, error) {
	in, args := ns.tenantIn()
	var total int64
	for _, t := range metadataTables {
		q := "SELECT COUNT(*) FROM " + t + " WHERE tenant IN " + in
		a := args
		switch t {
		case "queue_message_claims": // keyed by offset: ungrouped only
			if prefix != "" {
				continue
			}
		case "queue_partition_leases":
			q += " AND consumer_group <> ?"
			a = append(append([]any{}, args...), driver.RetentionGroup)
		}
		if prefix != "" {
			q += " AND partition_key LIKE ?"
			a = append(append([]any{}, a...), prefix+"%")
		}
		var n int64
		if err := e.d.DB().QueryRowContext(ctx, q, a...).Scan(&n); err != nil {
			return 0, fmt.Errorf("count %s: %w", t, err)
		}
		total += n
	}
	return total, nil
}
