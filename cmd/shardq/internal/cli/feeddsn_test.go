// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/shardq/shardq/internal/testdb"
)

// --feed-dsn (or SHARDQ_FEED_DSN) is the connection the MySQL change feed
// reads the binary log with; it is refused for SQLite and when it does
// not parse, without showing its password. --vtgate-grpc (the Vitess
// feed's address) is refused for SQLite, beside --feed-dsn, and when it
// is not HOST:PORT.
func TestFeedDSN(t *testing.T) {
	sqlite := "sqlite://" + t.TempDir() + "/q.db"
	migrateDSN(t, sqlite)
	for _, tc := range []struct {
		env  map[string]string
		args []string
		want string
	}{
		{nil, []string{"--dsn", sqlite, "--feed-dsn", "feed:pw@tcp(db:3306)/", "admin", "topics", "--tenant", "acme"}, "--feed-dsn: a feed connection applies to a MySQL database only"},
		{map[string]string{"SHARDQ_FEED_DSN": "feed:pw@tcp(db:3306)/"}, []string{"--dsn", sqlite, "admin", "topics", "--tenant", "acme"}, "SHARDQ_FEED_DSN: a feed connection applies"},
		{nil, []string{"--dsn", "mysql://u:p@127.0.0.1:1/db", "--feed-dsn", "mysql://feed:s3cret@db:3306/a/b", "admin", "topics", "--tenant", "acme"}, "--feed-dsn: want mysql://"},
		{nil, []string{"--dsn", "mysql://u:p@127.0.0.1:1/db", "--feed-dsn", "feed:s3cret@db:3306", "admin", "topics", "--tenant", "acme"}, "--feed-dsn: want mysql://"},
		{nil, []string{"--dsn", "mysql://u:s3cret@127.0.0.1:1/db", "--feed-max-event", "0", "admin", "topics", "--tenant", "acme"}, "--feed-max-event: want 1 to"},
		{nil, []string{"--dsn", sqlite, "--vtgate-grpc", "vtgate:15991", "admin", "topics", "--tenant", "acme"}, "--vtgate-grpc: vtgate's address applies to a MySQL DSN on vtgate only"},
		{map[string]string{"SHARDQ_VTGATE_GRPC": "vtgate:15991"}, []string{"--dsn", sqlite, "admin", "topics", "--tenant", "acme"}, "--vtgate-grpc: vtgate's address applies"},
		{nil, []string{"--dsn", "mysql://u:s3cret@127.0.0.1:1/db", "--vtgate-grpc", "vtgate", "admin", "topics", "--tenant", "acme"}, `--vtgate-grpc "vtgate": want HOST:PORT`},
		{nil, []string{"--dsn", "mysql://u:s3cret@127.0.0.1:1/db", "--vtgate-grpc", "vtgate:15991", "--feed-dsn", "feed:s3cret@tcp(db:3306)/", "admin", "topics", "--tenant", "acme"},
			"--feed-dsn and --vtgate-grpc: give one feed"},
	} {
		r := runCLI(t, tc.env, "", tc.args...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) || strings.Contains(r.stderr, "s3cret") {
			t.Errorf("%v: exit %d, %q; want 2 and %q, no password", tc.args, r.code, r.stderr, tc.want)
		}
	}

	// On MySQL: the feed connects as the feed DSN's user. A wrong
	// password makes the feed unavailable (one line; consume polls);
	// the right one does not.
	dsn := mysqlURL(t)
	migrateDSN(t, dsn)
	env := map[string]string{"SHARDQ_DSN": dsn}
	if r := runCLI(t, env, "", "publish", "--tenant", "acme", "--topic", "orders", "--key", "k", "x"); r.code != 0 {
		t.Fatal(r)
	}
	cfg, err := mysql.ParseDSN(testdb.MySQLServerDSN())
	if err != nil {
		t.Fatal(err)
	}
	right := cfg.FormatDSN()
	cfg.Passwd = "wrong-s3cret"
	for _, tc := range []struct {
		group, feed string
		unavailable bool
	}{{"wrong", cfg.FormatDSN(), true}, {"right", right, false}} {
		r := runCLI(t, env, "", "--feed-dsn", tc.feed, "consume", "--tenant", "acme", "--topic", "orders", "--group", tc.group,
			"--key", "k", "--idle-exit", "2s")
		if got := consumedPayloads(t, r); len(got) != 1 || got[0] != "x" {
			t.Fatalf("--feed-dsn %v: consumed %v", tc.unavailable, got)
		}
		if unavailable := strings.Contains(r.stderr, "change feed unavailable") && strings.Contains(r.stderr, "Access denied"); unavailable != tc.unavailable {
			t.Errorf("feed DSN with wrong password %v: stderr %q", tc.unavailable, r.stderr)
		}
		if strings.Contains(r.stderr, "wrong-s3cret") {
			t.Errorf("the feed DSN's password was printed: %q", r.stderr)
		}
	}
}
