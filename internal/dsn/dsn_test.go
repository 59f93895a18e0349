// SPDX-License-Identifier: Apache-2.0

package dsn

import (
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

func TestParse(t *testing.T) {
	sp, err := Parse("sqlite://shardq.db")
	if err != nil || sp.Driver != "sqlite" || sp.Path != "shardq.db" {
		t.Fatalf("relative: %+v %v", sp, err)
	}
	sp, err = Parse("sqlite:///var/lib/shardq/q.db?synchronous=normal&busy_timeout=2s")
	if err != nil || sp.Path != "/var/lib/shardq/q.db" || sp.SQLite.Synchronous != "NORMAL" || sp.SQLite.BusyTimeout != 2*time.Second {
		t.Fatalf("absolute: %+v %v", sp, err)
	}
	sp, err = Parse("mysql://app:p%40ss:w@db.internal:3307/queue?timeout=5s&tls=false")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := mysql.ParseDSN(sp.MySQL)
	if err != nil || cfg.User != "app" || cfg.Passwd != "p@ss:w" || cfg.Addr != "db.internal:3307" ||
		cfg.DBName != "queue" || cfg.Timeout != 5*time.Second || cfg.Net != "tcp" {
		t.Fatalf("mysql: %+v %v", cfg, err)
	}
	if sp, _ := Parse("mysql://root@127.0.0.1/q"); !strings.Contains(sp.MySQL, "127.0.0.1:3306") {
		t.Fatalf("default port missing: %s", sp.MySQL)
	}
	// The go-sql-driver form the Go quick start uses works here too.
	sp, err = Parse("app:s3cret@tcp(db.internal:3307)/queue?timeout=5s")
	if err != nil || sp.Driver != "mysql" || sp.MySQL != "app:s3cret@tcp(db.internal:3307)/queue?timeout=5s" {
		t.Fatalf("go-sql-driver DSN: %+v %v", sp, err)
	}
	for in, want := range map[string]string{
		"u:secret@tcp(h:1)/db?timeout=x":    "xxxxx@tcp(h:1)",
		"u:secret@tcp(h:1/db":               "xxxxx@tcp(h:1/db",
		"postgres://x/y":                    "want sqlite://PATH, mysql://",
		"sqlite://":                         "needs a file path",
		"sqlite://a.db?journal=off":         `unknown sqlite parameter "journal"`,
		"sqlite://a.db?synchronous=maybe":   "synchronous",
		"mysql:///db":                       "needs a host",
		"mysql://h:1/":                      "needs one database name",
		"mysql://u:secret@h:1/db?timeout=x": "xxxxx",
	} {
		_, err := Parse(in)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%q) = %v, want an error containing %q", in, err, want)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("Parse(%q) leaks the password: %v", in, err)
		}
	}
}

// FuzzParse: any input either fails cleanly or yields a spec a driver can
// take (a go-sql-driver DSN that parses, or a non-empty path).
func FuzzParse(f *testing.F) {
	for _, s := range []string{"sqlite://shardq.db", "sqlite:///a/b.db?synchronous=FULL", "mysql://root@127.0.0.1:3306/q?timeout=1s",
		"mysql://u:p@h/d", "mysql://[::1]:3306/q", "sqlite://?", "mysql://%zz", "u:p@tcp(h:3306)/d", "u@unix(/tmp/s)/d"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		sp, err := Parse(s)
		if err != nil {
			return
		}
		switch sp.Driver {
		case "sqlite":
			if sp.Path == "" {
				t.Fatalf("Parse(%q) accepted an empty path", s)
			}
		case "mysql":
			if _, err := mysql.ParseDSN(sp.MySQL); err != nil {
				t.Fatalf("Parse(%q) produced %q, which go-sql-driver rejects: %v", s, sp.MySQL, err)
			}
		default:
			t.Fatalf("Parse(%q) gave driver %q", s, sp.Driver)
		}
	})
}
