// SPDX-License-Identifier: Apache-2.0

package mysqldriver

import (
	"context"
	sqldriver "database/sql/driver"

	gomysql "github.com/go-mysql-org/go-mysql/mysql"

	"github.com/shardq/shardq/driver"
)

// FeedFrom runs the change feed from the binary log position (file, pos).
func FeedFrom(ctx context.Context, d *Driver, sink driver.FeedSink, file string, pos uint32) error {
	return d.feedFrom(ctx, sink, &gomysql.Position{Name: file, Pos: pos})
}

// BinlogPosition is the server's current binary log position.
func BinlogPosition(ctx context.Context, d *Driver) (string, uint32, error) {
	p, err := d.binlogPosition(ctx)
	return p.Name, p.Pos, err
}

// VTGateConnector makes c's connections begin their transactions at their
// first execution, as Open does for connections through vtgate.
func VTGateConnector(c sqldriver.Connector) sqldriver.Connector { return vtgateConnector{c} }

type vtgateConnector struct{ sqldriver.Connector }

func (c vtgateConnector) Connect(ctx context.Context) (sqldriver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return newTxConn(conn, false)
}

// ImplicitConnector turns c's sessions' autocommit off and makes their
// transactions begin with their first statement, as Open's
// write-transaction pool does.
func ImplicitConnector(c sqldriver.Connector) sqldriver.Connector { return implicitConnector{c} }

type implicitConnector struct{ sqldriver.Connector }

func (c implicitConnector) Connect(ctx context.Context) (sqldriver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := conn.(sqldriver.ExecerContext).ExecContext(ctx, "SET SESSION autocommit = 0", nil); err != nil {
		conn.Close()
		return nil, err
	}
	return newTxConn(conn, true)
}

// ErrOutsideTx is the write-transaction pool's refusal of a statement
// outside a transaction.
var ErrOutsideTx = errOutsideTx
