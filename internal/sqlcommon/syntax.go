// SPDX-License-Identifier: Apache-2.0

package sqlcommon

import (
	"fmt"
	"strings"
)

// Syntax is the SQL flavour a driver speaks. It only feeds the statement
// tables (leasesql.go, groupsql.go, publishsql.go, adminsql.go,
// lifecyclesql.go), which write every statement whole, once; no code
// outside them assembles SQL from pieces.
type Syntax int

const (
	// MySQL is MySQL 8, MariaDB 10.6+ and Vitess.
	MySQL Syntax = iota + 1
	// SQLite is SQLite 3.35+ (upserts with RETURNING, row values).
	SQLite
)

// offset is the offset column, quoted (it is a reserved word).
func (s Syntax) offset() string {
	if s == MySQL {
		return "`offset`"
	}
	return `"offset"`
}

// forUpdate ends a SELECT that locks the rows it reads inside a write
// transaction. SQLite's write transaction already excludes every other
// writer.
func (s Syntax) forUpdate() string {
	if s == MySQL {
		return " FOR UPDATE"
	}
	return ""
}

// forShare ends a SELECT that must read the latest committed rows, not the
// transaction's snapshot, and keep them from changing until commit.
func (s Syntax) forShare() string {
	if s == MySQL {
		return " LOCK IN SHARE MODE"
	}
	return ""
}

// octets is the length of col in bytes: MySQL's LENGTH counts bytes,
// SQLite's counts characters of TEXT (bytes only of a BLOB).
func (s Syntax) octets(col string) string {
	if s == MySQL {
		return "LENGTH(" + col + ")"
	}
	return "LENGTH(CAST(" + col + " AS BLOB))"
}

// octetSum is the sum of cols' lengths in bytes.
func (s Syntax) octetSum(cols ...string) string {
	parts := make([]string, len(cols))
	for i, c := range cols {
		parts[i] = s.octets(c)
	}
	return strings.Join(parts, " + ")
}

// greatest is the two-argument maximum function.
func (s Syntax) greatest() string {
	if s == MySQL {
		return "GREATEST"
	}
	return "max"
}

// excluded names the value an upsert tried to insert into col.
func (s Syntax) excluded(col string) string {
	if s == MySQL {
		return "VALUES(" + col + ")"
	}
	return "excluded." + col
}

// upsert ends an INSERT: on a conflict over conflictCols, apply set (an
// assignment list using excluded), or change nothing when set is "" (on
// MySQL a no-op update, which still locks the row).
func (s Syntax) upsert(conflictCols, set string) string {
	if s == MySQL {
		if set == "" {
			// The last key column, not tenant: Vitess refuses an update
			// of the vindex column, even to itself.
			cols := strings.Split(conflictCols, ",")
			col := strings.TrimSpace(cols[len(cols)-1])
			set = col + " = " + col
		}
		return " ON DUPLICATE KEY UPDATE " + set
	}
	if set == "" {
		return " ON CONFLICT (" + conflictCols + ") DO NOTHING"
	}
	return " ON CONFLICT (" + conflictCols + ") DO UPDATE SET " + set
}

// useIndex follows a table name in FROM to make the planner use the named
// index, where statistics of a table that grows and shrinks quickly would
// mislead it.
func (s Syntax) useIndex(index string) string {
	if s == MySQL {
		return " FORCE INDEX (" + index + ")"
	}
	return " INDEXED BY " + index
}

// partitionOrder is the useIndex of queue_messages' index that leads with
// (tenant, topic, partition_key, offset): reads of a partition after a
// cursor must range over it, not over the id index that a fresh table's
// statistics may prefer (seen: a read of 8 rows after offset 8480
// examined 8488).
func (s Syntax) partitionOrder() string {
	if s == MySQL {
		return s.useIndex("PRIMARY")
	}
	return s.useIndex("pk_queue_messages")
}

// inRows is "(cols) IN (<param's rows>)", param being a Rows value. SQLite
// takes a row value's IN list only as a subquery, hence VALUES there.
func (s Syntax) inRows(cols, param string) string {
	if s == MySQL {
		return "(" + cols + ") IN (:" + param + ")"
	}
	return "(" + cols + ") IN (VALUES :" + param + ")"
}

func (s Syntax) String() string {
	switch s {
	case MySQL:
		return "MySQL"
	case SQLite:
		return "SQLite"
	}
	return fmt.Sprintf("Syntax(%d)", int(s))
}

// messageBytes is the SQL expression of a queue_messages row's size: its
// payload's and headers' bytes (SQLite's LENGTH counts a text's
// characters, so headers are read as a blob).
func (s Syntax) messageBytes() string {
	if s == MySQL {
		return "(LENGTH(payload) + LENGTH(headers))"
	}
	return "(LENGTH(payload) + LENGTH(CAST(headers AS BLOB)))"
}

// sizedColumns are a message's columns for a read within a byte budget
// (scanSized): offset, id, size, then headers and payload only when the
// row's size is at most :small (else NULL, loaded later if it fits), then
// created_at and not_before. :small is the budget over the rows read, so
// the rows a read carries never pass the budget, whatever they hold.
func (s Syntax) sizedColumns() string {
	n := s.messageBytes()
	return s.offset() + ", id, " + n + ", CASE WHEN " + n + " <= :small THEN headers END, CASE WHEN " + n + " <= :small THEN payload END, created_at, not_before"
}
