// SPDX-License-Identifier: Apache-2.0

// Package dsn reads shardq's database URLs and opens the matching driver:
//
//	sqlite://relative/path.db
//	sqlite:///absolute/path.db[?synchronous=NORMAL&busy_timeout=5s]
//	mysql://user:pass@host:port/db[?param=value]   (go-sql-driver parameters)
//	user:pass@tcp(host:port)/db[?param=value]       (a go-sql-driver DSN, as mysqldriver.Open takes)
package dsn

import (
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/driver/mysqldriver"
	"github.com/shardq/shardq/driver/sqlitedriver"
)

// Spec is a parsed URL.
type Spec struct {
	Driver string // "sqlite" or "mysql"
	// SQLite
	Path   string
	SQLite sqlitedriver.Options
	// MySQL: a go-sql-driver DSN.
	MySQL string
}

// Parse reads a URL without touching any database.
func Parse(s string) (Spec, error) {
	switch {
	case strings.HasPrefix(s, "sqlite://"):
		return parseSQLite(strings.TrimPrefix(s, "sqlite://"))
	case strings.HasPrefix(s, "mysql://"):
		return parseMySQL(s)
	case !strings.Contains(s, "://") && strings.Contains(s, "/"):
		// The Go quick start's form: what mysqldriver.Open takes.
		if _, err := mysql.ParseDSN(s); err == nil {
			return Spec{Driver: "mysql", MySQL: s}, nil
		}
	}
	return Spec{}, fmt.Errorf("dsn %q: want sqlite://PATH, mysql://USER:PASS@HOST:PORT/DB or a go-sql-driver DSN (USER:PASS@tcp(HOST:PORT)/DB)", redact(s))
}

func parseSQLite(rest string) (Spec, error) {
	path, query, _ := strings.Cut(rest, "?")
	if path == "" {
		return Spec{}, fmt.Errorf("dsn: sqlite:// needs a file path (sqlite://shardq.db or sqlite:///abs/shardq.db)")
	}
	sp := Spec{Driver: "sqlite", Path: path}
	q, err := url.ParseQuery(query)
	if err != nil {
		return Spec{}, fmt.Errorf("dsn: sqlite parameters: %w", err)
	}
	for k, vs := range q {
		v := vs[len(vs)-1]
		switch k {
		case "synchronous":
			switch strings.ToUpper(v) {
			case "OFF", "NORMAL", "FULL", "EXTRA":
				sp.SQLite.Synchronous = strings.ToUpper(v)
			default:
				return Spec{}, fmt.Errorf("dsn: sqlite synchronous=%q: want OFF, NORMAL, FULL or EXTRA", v)
			}
		case "busy_timeout":
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				return Spec{}, fmt.Errorf("dsn: sqlite busy_timeout=%q: want a positive duration such as 5s", v)
			}
			sp.SQLite.BusyTimeout = d
		default:
			return Spec{}, fmt.Errorf("dsn: unknown sqlite parameter %q (known: synchronous, busy_timeout)", k)
		}
	}
	return sp, nil
}

func parseMySQL(s string) (Spec, error) {
	u, err := url.Parse(s)
	if err != nil {
		return Spec{}, fmt.Errorf("dsn: %w", redactErr(err, s))
	}
	if u.Host == "" {
		return Spec{}, fmt.Errorf("dsn %q: mysql:// needs a host", redact(s))
	}
	db := strings.TrimPrefix(u.Path, "/")
	if db == "" || strings.Contains(db, "/") {
		return Spec{}, fmt.Errorf("dsn %q: mysql:// needs one database name after the host", redact(s))
	}
	host := u.Host
	if u.Port() == "" {
		host += ":3306"
	}
	cfg, err := mysql.ParseDSN("tcp(" + host + ")/" + db + "?" + u.RawQuery)
	if err != nil {
		return Spec{}, fmt.Errorf("dsn %q: %w", redact(s), err)
	}
	if u.User != nil {
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
	}
	return Spec{Driver: "mysql", MySQL: cfg.FormatDSN()}, nil
}

// Open opens the driver sp names.
func Open(sp Spec) (driver.Driver, error) {
	if sp.Driver == "sqlite" {
		return sqlitedriver.Open(sp.Path, &sp.SQLite)
	}
	return mysqldriver.Open(sp.MySQL)
}

// redact hides a password in a URL for error messages.
func redact(s string) string {
	u, err := url.Parse(s)
	if err != nil || !strings.Contains(s, "://") {
		// Not a URL (a go-sql-driver DSN, or garbage): hide whatever sits
		// between the first ':' and the last '@' before the address.
		if at := strings.LastIndex(s, "@"); at > 0 {
			if colon := strings.Index(s[:at], ":"); colon >= 0 {
				return s[:colon+1] + "xxxxx" + s[at:]
			}
		}
		return s
	}
	if u.User == nil {
		return s
	}
	if _, ok := u.User.Password(); ok {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	return u.String()
}

func redactErr(err error, s string) error {
	if ue, ok := err.(*url.Error); ok {
		ue.URL = "(dsn)"
		return ue
	}
	return err
}
