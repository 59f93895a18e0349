// SPDX-License-Identifier: Apache-2.0

package driver

import (
	"context"
	"database/sql"
)

// PreparedTx runs every statement on tx as a server-side prepared
// statement, whatever tx's pool is configured to do: values travel as
// bound parameters, never as SQL text (a caller's go-sql-driver pool may
// set interpolateParams, which would otherwise splice them into the text).
// shardq wraps a caller's transaction in it (PublishTx).
//
// Statements are closed when tx ends, as database/sql closes the
// statements a transaction prepared; closing one earlier would cut the
// rows a query still streams.
func PreparedTx(tx *sql.Tx) DBTX { return preparedTx{tx} }

type preparedTx struct{ tx *sql.Tx }

func (p preparedTx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	s, err := p.tx.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	return s.ExecContext(ctx, args...)
}

func (p preparedTx) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	s, err := p.tx.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	return s.QueryContext(ctx, args...)
}
