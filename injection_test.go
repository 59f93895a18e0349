// SPDX-License-Identifier: Apache-2.0

package shardq_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/driver/mysqldriver"
	"github.com/shardq/shardq/driver/sqlitedriver"
	"github.com/shardq/shardq/internal/sqlrecord"
	"github.com/shardq/shardq/internal/testdb"
)

// victimSecret is the victim tenant's payload; no attacker's row may ever
// hold it, and the victim's rows must survive every attack unchanged.
const victimSecret = "victim-secret-payload"

var attackRun atomic.Int64

// injections are values an attacker controls (partition key, message id,
// header keys and values, payload, a handler's error text). Each starts
// with U+0FFF (UTF-8 E0 BF BF): under gbk, big5, sjis or cp932 the 0xBF
// before the backslash that escaping adds forms one character with it, and
// the quote that follows ends the string.
var injections = []string{
	"\u0fff', 0x7b7d, (SELECT payload FROM queue_messages v WHERE v.tenant = 0x76696374696d LIMIT 1), UTC_TIMESTAMP(6)) -- x",
	"\u0fff' OR 1=1 -- x",
	"\u0fff' OR tenant = 0x76696374696d -- x",
	"\u0fff\\' OR 1=1 -- x",
	"'; DELETE FROM queue_messages; -- x",
}

// TestNoValueReachesSQLAsText tries every charset a MySQL DSN can name.
// Open must refuse each one but utf8mb4 (ErrUnsafeCharset); through every
// configuration it accepts, the injections above go through each
// statement family (publish, PublishTx, admin inspect/delete/requeue/
// reset, consume, dead-letter, group receiver) and the victim's rows stay
// untouched and unread. SQLite binds natively and runs the same attack.
func TestNoValueReachesSQLAsText(t *testing.T) {
	t.Run("sqlite", func(t *testing.T) {
		d, err := sqlitedriver.Open(filepath.Join(t.TempDir(), "q.db"), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		attackAndCheck(t, d, d)
	})
	base := testdb.MySQLDatabase(t)
	victimDrv := testdb.Migrated(t, mustOpenMySQL(t, base))
	defer victimDrv.Close()
	for _, params := range []string{
		"", "charset=utf8mb4", "charset=gbk", "charset=big5", "charset=sjis", "charset=cp932", "charset=gb2312",
		"charset=latin1", "charset=utf8mb3", "charset=gbk,utf8mb4", "collation=gbk_chinese_ci", "collation=big5_chinese_ci",
		"collation=utf8mb4_general_ci", "character_set_client=gbk", "character_set_connection=gbk",
		"sql_mode=%27NO_BACKSLASH_ESCAPES%27", "charset=gbk&interpolateParams=false", "interpolateParams=true",
	} {
		t.Run(params, func(t *testing.T) {
			dsn := base
			if params != "" {
				sep := "?"
				if strings.Contains(dsn, "?") {
					sep = "&"
				}
				dsn += sep + params
			}
			d, err := mysqldriver.Open(dsn)
			if err != nil {
				if !errors.Is(err, mysqldriver.ErrUnsafeCharset) {
					t.Fatalf("Open refused %q for another reason: %v", params, err)
				}
				if strings.Contains(params, "utf8mb4") && !strings.Contains(params, "gbk") {
					t.Fatalf("Open refused the safe %q: %v", params, err)
				}
				t.Logf("refused: %v", err)
				return
			}
			defer d.Close()
			// The pool connects lazily: a session whose character set a
			// later SET changed is refused at its first statement.
			if err := d.DB().Ping(); err != nil {
				if !errors.Is(err, mysqldriver.ErrUnsafeCharset) {
					t.Fatalf("connect with %q: %v", params, err)
				}
				t.Logf("refused at connect: %v", err)
				return
			}
			attackAndCheck(t, victimDrv, d)
		})
	}
	t.Run("New refuses a caller's gbk pool", func(t *testing.T) {
		sep := "?"
		if strings.Contains(base, "?") {
			sep = "&"
		}
		cfg, err := mysql.ParseDSN(base + sep + "charset=gbk&interpolateParams=true")
		if err != nil {
			t.Fatal(err)
		}
		conn, err := mysql.NewConnector(cfg)
		if err != nil {
			t.Fatal(err)
		}
		db := sql.OpenDB(conn)
		defer db.Close()
		if _, err := mysqldriver.New(db); !errors.Is(err, mysqldriver.ErrUnsafeCharset) {
			t.Fatalf("New on a gbk pool = %v, want ErrUnsafeCharset", err)
		}
	})
}

// TestNoValueInStatementText records the text of every statement the MySQL
// driver runs while the attacks go through every statement family, and
// fails if any holds an attacker's value: values travel only as bound
// parameters. A caller's pool that would splice them in
// (interpolateParams=true) is refused by New, and a caller's transaction
// from such a pool (PublishTx) still gets its statements prepared.
func TestNoValueInStatementText(t *testing.T) {
	base := testdb.MySQLDatabase(t)
	victimDrv := testdb.Migrated(t, mustOpenMySQL(t, base))
	defer victimDrv.Close()
	var mu sync.Mutex
	var texts []string
	record := func(q string) {
		mu.Lock()
		defer mu.Unlock()
		texts = append(texts, q)
	}
	pool := func(interpolate bool) *sql.DB {
		db := sql.OpenDB(sqlrecord.Connector(testdb.MySQLConnector(t, base, interpolate), record))
		t.Cleanup(func() { db.Close() })
		return db
	}
	// checkTexts fails on a recorded text holding a value, or on fewer
	// than least texts (the workload did not go through the pool).
	checkTexts := func(t *testing.T, least int) {
		t.Helper()
		mu.Lock()
		defer mu.Unlock()
		if len(texts) < least {
			t.Fatalf("recorded %d statements: the attack did not run through the recording pool", len(texts))
		}
		for _, q := range texts {
			for _, v := range append(injections, victimSecret) {
				if strings.Contains(q, v) || strings.Contains(q, "\u0fff") {
					t.Fatalf("a value reached SQL as text: %q", q)
				}
			}
		}
		texts = nil
	}

	t.Run("New refuses an interpolating pool", func(t *testing.T) {
		if _, err := mysqldriver.New(pool(true)); !errors.Is(err, mysqldriver.ErrInterpolatedParams) {
			t.Fatalf("New on an interpolateParams=true pool = %v, want ErrInterpolatedParams", err)
		}
	})
	t.Run("every statement family", func(t *testing.T) {
		d, err := mysqldriver.New(pool(false))
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		texts = nil
		mu.Unlock()
		attackAndCheck(t, victimDrv, d)
		checkTexts(t, 100)
	})
	t.Run("PublishTx on a caller's interpolating pool", func(t *testing.T) {
		c, err := shardq.NewClient(victimDrv, &shardq.Config{Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		callers := pool(true)
		for i, v := range injections {
			tx, err := callers.Begin()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.PublishTx(context.Background(), tx, shardq.Message{Tenant: "attacker", Topic: "tx",
				PartitionKey: v, ID: fmt.Sprint(v, i), Headers: map[string]string{v: v}, Payload: []byte(v)}); err != nil {
				t.Fatalf("PublishTx %d: %v", i, err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
		}
		checkTexts(t, 3*len(injections)) // lock heads, insert, advance heads
	})
}

func mustOpenMySQL(t *testing.T, dsn string) *mysqldriver.Driver {
	t.Helper()
	d, err := mysqldriver.Open(dsn)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// attackAndCheck stores the victim's messages through victimDrv (a safe
// configuration), runs every attack through attackDrv, then checks the
// victim's rows and that no attacker's row holds the victim's payload.
func attackAndCheck(t *testing.T, victimDrv, attackDrv driver.Driver) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	testdb.Migrated(t, victimDrv)
	quiet := &shardq.Config{Logger: slog.New(slog.DiscardHandler)}
	victim, err := shardq.NewClient(victimDrv, quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer victim.Close()
	// Fresh topics per run: several configurations share one database.
	topic := fmt.Sprintf("orders-%d", attackRun.Add(1))
	if _, err := victim.Publish(ctx, shardq.Message{Tenant: "victim", Topic: topic, PartitionKey: "k", ID: "v1", Payload: []byte(victimSecret)},
		shardq.Message{Tenant: "victim", Topic: topic + ".dlq", PartitionKey: "k", ID: "v2", Payload: []byte(victimSecret)}); err != nil {
		t.Fatal(err)
	}
	before := victimRows(t, victimDrv, topic)

	c, err := shardq.NewClient(attackDrv, quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	a := c.Admin()
	for i, v := range injections {
		msg := shardq.Message{Tenant: "attacker", Topic: topic, PartitionKey: v, ID: v, Headers: map[string]string{v: v}, Payload: []byte(v)}
		// Publish and its duplicate (the idempotency read).
		for range 2 {
			if _, err := c.Publish(ctx, msg); err != nil {
				t.Fatalf("publish injection %d: %v", i, err)
			}
		}
		tx, err := attackDrv.DB().BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		txMsg := msg
		txMsg.ID = v + "tx"
		if _, err := c.PublishTx(ctx, tx, txMsg); err != nil {
			t.Fatalf("PublishTx injection %d: %v", i, err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		ref := shardq.MessageRef{Tenant: "attacker", Topic: topic, PartitionKey: v, ID: v}
		if _, _, err := a.Inspect(ctx, ref); err != nil {
			t.Fatalf("inspect injection %d: %v", i, err)
		}
		if _, err := a.Requeue(ctx, ref, ""); !errors.Is(err, shardq.ErrNoMessage) {
			t.Fatalf("requeue injection %d = %v, want ErrNoMessage", i, err)
		}
		if _, err := a.ResetOffsets(ctx, shardq.ResetRequest{Tenant: "attacker", Topic: topic, ConsumerGroup: "g", Create: true, To: shardq.ResetToOffset, Key: v, Offset: 0}); err != nil {
			t.Fatalf("reset injection %d: %v", i, err)
		}
		ghost := ref
		ghost.ID = v + "ghost"
		if deleted, err := a.Delete(ctx, ghost); err != nil || deleted {
			t.Fatalf("delete of a missing injected id %d = %v, %v", i, deleted, err)
		}
	}
	// Consume: the handler dead-letters each message with the injection as
	// its error text (written in a header of the dead letter), and the
	// group receiver accepts the injected group by name.
	var mu sync.Mutex
	seen := map[string]bool{}
	sub, err := c.Subscribe(ctx, shardq.SubscriberConfig{ConsumerGroup: "g", Topic: topic, Tenants: []string{"attacker"}, Take: shardq.TakeGrouped,
		PollInterval: 20 * time.Millisecond, DiscoveryInterval: 50 * time.Millisecond,
		Handler: func(_ context.Context, d *shardq.Delivery) error {
			mu.Lock()
			seen[d.ID] = true
			mu.Unlock()
			return shardq.DeadLetter(errors.New(d.PartitionKey))
		}})
	if err != nil {
		t.Fatal(err)
	}
	want := 2 * len(injections)
	for deadline := time.Now().Add(60 * time.Second); ; {
		mu.Lock()
		n := len(seen)
		mu.Unlock()
		if n == want {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("consumed %d of %d injected messages", n, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := sub.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	for i, v := range injections {
		ref := shardq.MessageRef{Tenant: "attacker", Topic: topic, PartitionKey: v, ID: v}
		if _, err := a.Requeue(ctx, ref, ""); err != nil {
			t.Fatalf("requeue dead letter %d: %v", i, err)
		}
		r, err := c.AcceptGroup(ctx, shardq.GroupRef{Tenant: "attacker", Topic: topic, ConsumerGroup: "g2"}, v, nil)
		if err != nil {
			t.Fatalf("accept injected group %d: %v", i, err)
		}
		rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
		d, err := r.Receive(rctx)
		rcancel()
		if err != nil {
			t.Fatalf("receive injected group %d: %v", i, err)
		}
		if err := r.Nack(ctx, d, shardq.RetryAfter(time.Hour, errors.New(v))); err != nil {
			t.Fatalf("nack injected group %d: %v", i, err)
		}
		if err := r.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		if deleted, err := a.Delete(ctx, ref); err != nil || !deleted {
			t.Fatalf("delete injected message %d = %v, %v", i, deleted, err)
		}
	}

	if after := victimRows(t, victimDrv, topic); after != before {
		t.Fatalf("victim's rows changed:\nbefore %s\nafter  %s", before, after)
	}
	var leaked int
	if err := victimDrv.DB().QueryRowContext(ctx, "SELECT COUNT(*) FROM queue_messages WHERE tenant = ? AND (payload LIKE ? OR headers LIKE ?)",
		"attacker", "%"+victimSecret+"%", "%"+victimSecret+"%").Scan(&leaked); err != nil {
		t.Fatal(err)
	}
	if leaked > 0 {
		t.Fatalf("%d attacker rows hold the victim's payload", leaked)
	}
}

// victimRows describes every victim row of the topic and its dead-letter
// topic, payloads included.
func victimRows(t *testing.T, d driver.Driver, topic string) string {
	t.Helper()
	rows, err := d.DB().Query("SELECT topic, partition_key, id, payload FROM queue_messages WHERE tenant = ? AND topic IN (?, ?) ORDER BY topic, id",
		"victim", topic, topic+".dlq")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var sb strings.Builder
	n := 0
	for rows.Next() {
		var tp, k, id string
		var p []byte
		if err := rows.Scan(&tp, &k, &id, &p); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&sb, "[%s %s %s %q]", tp, k, id, p)
		n++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Fatalf("victim has %d rows, want 2: %s", n, sb.String())
	}
	return sb.String()
}
