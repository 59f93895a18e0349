// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"errors"
	"math"
	"net"
	"net/url"
	"strings"

	"github.com/go-sql-driver/mysql"

	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/driver/mysqldriver"
	"github.com/shardq/shardq/internal/dsn"
	"github.com/shardq/shardq/vitessfeed"
)

// feedDSNHelp is --feed-dsn's usage.
const feedDSNHelp = "the MySQL change feed's own connection: a user with only REPLICATION SLAVE and REPLICATION CLIENT on *.*, " +
	"as mysql://USER:PASS@HOST:PORT or USER:PASS@tcp(HOST:PORT)/ (default $SHARDQ_FEED_DSN, else --dsn's user; docs/feed.md)"

// feedDSN is --feed-dsn, else SHARDQ_FEED_DSN, and which of them it is.
// Like --dsn, the environment is not the flag's default: help would
// print its password.
func (a *app) feedDSN() (value, from string) {
	if a.feedDSNFlag != "" {
		return a.feedDSNFlag, "--feed-dsn"
	}
	return a.env.Getenv("SHARDQ_FEED_DSN"), "SHARDQ_FEED_DSN"
}

// openDriver opens the database spec names, a MySQL one with the feed
// DSN when one is given, and on Vitess with the VStream feed when vtgate's
// gRPC address is.
func (a *app) openDriver(spec dsn.Spec) (driver.Driver, error) {
	feed, from := a.feedDSN()
	vtgate, vtgateFrom := a.vtgateGRPC, "--vtgate-grpc"
	if a.feedMaxEvent <= 0 || a.feedMaxEvent > math.MaxUint32 {
		return nil, usagef("--feed-max-event: want 1 to %d bytes", uint32(math.MaxUint32))
	}
	switch {
	case spec.Driver != "mysql" && feed != "":
		return nil, usagef("%s: a feed connection applies to a MySQL database only; --dsn is %s", from, spec.Driver)
	case spec.Driver != "mysql" && vtgate != "":
		return nil, usagef("%s: vtgate's address applies to a MySQL DSN on vtgate only; --dsn is %s", vtgateFrom, spec.Driver)
	case spec.Driver != "mysql":
		return dsn.Open(spec)
	case feed != "" && vtgate != "":
		return nil, usagef("%s and %s: give one feed: the binary log's connection (MySQL, MariaDB) or vtgate's address (Vitess)", from, vtgateFrom)
	}
	opts := []mysqldriver.Option{mysqldriver.FeedMaxEventBytes(a.feedMaxEvent)}
	if feed != "" {
		f, err := parseFeedDSN(feed)
		if err != nil {
			return nil, usagef("%s: %v", from, err)
		}
		opts = append(opts, mysqldriver.FeedDSN(f))
	}
	if vtgate != "" {
		cfg, err := mysql.ParseDSN(spec.MySQL)
		if err != nil {
			return nil, usagef("--dsn: %v", err)
		}
		if _, _, err := net.SplitHostPort(vtgate); err != nil {
			return nil, usagef("%s %q: want HOST:PORT: %v", vtgateFrom, vtgate, err)
		}
		// vtgate's database name may carry a target: keyspace@type or
		// keyspace:shard; the feed streams the whole keyspace.
		keyspace, _, _ := strings.Cut(cfg.DBName, "@")
		keyspace, _, _ = strings.Cut(keyspace, ":")
		f, err := vitessfeed.New(vitessfeed.Config{Addr: vtgate, Keyspace: keyspace})
		if err != nil {
			return nil, usagef("%s: %v", vtgateFrom, err)
		}
		opts = append(opts, mysqldriver.HeadFeed(f))
	}
	return mysqldriver.Open(spec.MySQL, opts...)
}

// parseFeedDSN reads a feed DSN as go-sql-driver's: a mysql:// URL (the
// database optional: the feed's user needs none) or a go-sql-driver DSN.
// Its errors never quote it (it holds a password).
func parseFeedDSN(s string) (string, error) {
	want := errors.New("want mysql://USER:PASS@HOST[:PORT] or USER:PASS@tcp(HOST:PORT)/")
	if !strings.HasPrefix(s, "mysql://") {
		if _, err := mysql.ParseDSN(s); err != nil {
			return "", want
		}
		return s, nil
	}
	u, err := url.Parse(s)
	if err != nil || u.Host == "" || strings.Contains(strings.TrimPrefix(u.Path, "/"), "/") {
		return "", want
	}
	host := u.Host
	if u.Port() == "" {
		host += ":3306"
	}
	cfg, err := mysql.ParseDSN("tcp(" + host + ")/" + strings.TrimPrefix(u.Path, "/") + "?" + u.RawQuery)
	if err != nil {
		return "", want
	}
	if u.User != nil {
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
	}
	return cfg.FormatDSN(), nil
}
