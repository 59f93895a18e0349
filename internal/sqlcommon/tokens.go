// SPDX-License-Identifier: Apache-2.0

package sqlcommon

import (
	"bytes"
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/shardq/shardq/driver"
)

// tokenSQL holds the statements of the server's bearer tokens
// (driver.Tokens), whole, with named parameters (Bind).
type tokenSQL struct {
	insert  string // a row per tenant (:rows)
	get     string // one token's row in one tenant
	holders string // the rows of one token id in every tenant (a scatter read on Vitess; token creation only)
	list    scoped // the rows of some tenants or all, by token then tenant
	revoke  string // mark a token's rows in :tenants revoked

	keys      string // every receipt key
	addKey    string // a receipt key, unless its id exists
	deleteKey string // one receipt key
}

func newTokenSQL(s Syntax) tokenSQL {
	return tokenSQL{
		insert:  "INSERT INTO queue_api_tokens (tenant, token_id, secret_hash, role, created_at, expires_at, revoked_at) VALUES :rows",
		get:     "SELECT secret_hash, role, created_at, expires_at, revoked_at FROM queue_api_tokens WHERE tenant = :tenant AND token_id = :id",
		holders: "SELECT tenant, secret_hash FROM queue_api_tokens WHERE token_id = :id",
		list:    scopedOn("tenant", "SELECT token_id, tenant, secret_hash, role, created_at, expires_at, revoked_at FROM queue_api_tokens WHERE {scope} ORDER BY token_id, tenant"),
		revoke:  "UPDATE queue_api_tokens SET revoked_at = :now WHERE tenant IN (:tenants) AND token_id = :id AND revoked_at IS NULL",

		keys: "SELECT key_id, secret, created_at FROM shardq_receipt_keys ORDER BY key_id",
		// created_at, not key_id: Vitess refuses an update of the vindex
		// column, even to itself.
		addKey:    "INSERT INTO shardq_receipt_keys (key_id, secret, created_at) VALUES (:id, :secret, :created_at)" + s.upsert("key_id", "created_at = created_at"),
		deleteKey: "DELETE FROM shardq_receipt_keys WHERE key_id = :id",
	}
}

// CreateToken refuses an id that a row of another token holds in any
// tenant, then stores t's rows in one transaction.
//
// The read is not in the insert's transaction, and no key can refuse a
// second token of an id: the table is sharded by tenant, so a key spans
// one shard, and locking every shard would serialise every token write.
// Two tokens of one id created at the same instant could both pass. That
// is accepted: ids are 64 random bits unless the token is given (token
// create --from-env), and anyone choosing another's id learned it from a
// row already stored, which the read finds. Whatever ids the table
// holds, a token opens only the tenants whose row holds its hash (serve
// checks the hash at every request and binds it into its sessions).
func (d *Store) CreateToken(ctx context.Context, t driver.APIToken) error {
	op := fmt.Sprintf("create token %q", t.ID)
	if err := d.tokenIDFree(ctx, op, t); err != nil {
		return err
	}
	rows := make(Rows, len(t.Tenants))
	for i, tenant := range t.Tenants {
		rows[i] = []any{tenant, t.ID, t.SecretHash, t.Role, d.EncodeTime(t.CreatedAt), d.encodeNotBefore(t.ExpiresAt), nil}
	}
	_, err := inTx(ctx, d.Begin, func(tx *sql.Tx) (struct{}, error) {
		if _, err := d.exec(ctx, tx, d.sql().token.insert, Args{"rows": rows}); err != nil {
			return struct{}{}, d.Wrap(op, err)
		}
		return struct{}{}, nil
	})
	return err
}

// tokenIDFree fails with driver.ErrTokenIDTaken when a row of t.ID in
// any tenant holds another secret hash.
func (d *Store) tokenIDFree(ctx context.Context, op string, t driver.APIToken) error {
	rows, err := d.query(ctx, d.Read, d.sql().token.holders, Args{"id": t.ID})
	if err != nil {
		return d.Wrap(op, err)
	}
	defer rows.Close()
	for rows.Next() {
		var tenant string
		var hash []byte
		if err := rows.Scan(&tenant, &hash); err != nil {
			return fmt.Errorf("%s: %w", op, err)
		}
		if !bytes.Equal(hash, t.SecretHash) {
			return fmt.Errorf("%s: %w", op, driver.ErrTokenIDTaken)
		}
	}
	if err := rows.Err(); err != nil {
		return d.Wrap(op, err)
	}
	return nil
}

// TokenIn reads one token's row in tenant.
func (d *Store) TokenIn(ctx context.Context, tenant, id string) (driver.APIToken, error) {
	op := fmt.Sprintf("read token %q in tenant %q", id, tenant)
	rows, err := d.query(ctx, d.Read, d.sql().token.get, Args{"tenant": tenant, "id": id})
	if err != nil {
		return driver.APIToken{}, d.Wrap(op, err)
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return driver.APIToken{}, d.Wrap(op, err)
		}
		return driver.APIToken{}, fmt.Errorf("%s: %w", op, driver.ErrNoToken)
	}
	t := driver.APIToken{ID: id, Tenants: []string{tenant}}
	var created, expires, revoked any
	if err := rows.Scan(&t.SecretHash, &t.Role, &created, &expires, &revoked); err != nil {
		return driver.APIToken{}, fmt.Errorf("%s: %w", op, err)
	}
	if err := d.decodeTokenTimes(&t, created, expires, revoked); err != nil {
		return driver.APIToken{}, fmt.Errorf("%s: %w", op, err)
	}
	return t, rows.Err()
}

// ListTokens reads the rows in scope and merges each token's tenants: the
// rows of one id and secret hash.
func (d *Store) ListTokens(ctx context.Context, s driver.Scope) ([]driver.APIToken, error) {
	const op = "list tokens"
	q, args := d.sql().token.list.pick(s)
	rows, err := d.query(ctx, d.Read, q, args)
	if err != nil {
		return nil, d.Wrap(op, err)
	}
	defer rows.Close()
	var out []driver.APIToken
	at := map[[2]string]int{} // id and hash -> index in out
	for rows.Next() {
		var t driver.APIToken
		var tenant string
		var created, expires, revoked any
		if err := rows.Scan(&t.ID, &tenant, &t.SecretHash, &t.Role, &created, &expires, &revoked); err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		if err := d.decodeTokenTimes(&t, created, expires, revoked); err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		k := [2]string{t.ID, string(t.SecretHash)}
		if i, ok := at[k]; ok {
			out[i].Tenants = append(out[i].Tenants, tenant)
			continue
		}
		t.Tenants = []string{tenant}
		at[k] = len(out)
		out = append(out, t)
	}
	return out, rows.Err()
}

func (d *Store) decodeTokenTimes(t *driver.APIToken, created, expires, revoked any) error {
	var err1, err2, err3 error
	t.CreatedAt, err1 = d.DecodeTime(created)
	t.ExpiresAt, err2 = d.decodeNotBefore(expires)
	t.RevokedAt, err3 = d.decodeNotBefore(revoked)
	return errors.Join(err1, err2, err3)
}

// RevokeToken marks the rows of token id in tenants revoked.
func (d *Store) RevokeToken(ctx context.Context, tenants []string, id string, now time.Time) (int64, error) {
	op := fmt.Sprintf("revoke token %q in tenants %q", id, tenants)
	if len(tenants) == 0 {
		return 0, nil
	}
	res, err := d.exec(ctx, d.Write, d.sql().token.revoke, Args{"tenants": textList(tenants), "id": id, "now": d.EncodeTime(now)})
	if err != nil {
		return 0, d.Wrap(op, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("%s: %w", op, err)
	}
	return n, nil
}

// ReceiptKeys reads every receipt key, by id.
func (d *Store) ReceiptKeys(ctx context.Context) ([]driver.ReceiptKey, error) {
	const op = "read receipt keys"
	rows, err := d.query(ctx, d.Read, d.sql().token.keys, Args{})
	if err != nil {
		return nil, d.Wrap(op, err)
	}
	defer rows.Close()
	var out []driver.ReceiptKey
	for rows.Next() {
		var k driver.ReceiptKey
		var created any
		if err := rows.Scan(&k.ID, &k.Secret, &created); err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		if k.CreatedAt, err = d.DecodeTime(created); err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		out = append(out, k)
	}
	if err := rows.Err(); err != nil {
		return nil, d.Wrap(op, err)
	}
	// On Vitess a scatter read merges shards unordered.
	slices.SortFunc(out, func(a, b driver.ReceiptKey) int { return cmp.Compare(a.ID, b.ID) })
	return out, nil
}

// AddReceiptKey inserts k unless its id exists.
func (d *Store) AddReceiptKey(ctx context.Context, k driver.ReceiptKey) (bool, error) {
	op := fmt.Sprintf("add receipt key %d", k.ID)
	res, err := d.exec(ctx, d.Write, d.sql().token.addKey, Args{"id": k.ID, "secret": k.Secret, "created_at": d.EncodeTime(k.CreatedAt)})
	if err != nil {
		return false, d.Wrap(op, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("%s: %w", op, err)
	}
	return n == 1, nil
}

// DeleteReceiptKey deletes key id.
func (d *Store) DeleteReceiptKey(ctx context.Context, id int64) error {
	_, err := d.exec(ctx, d.Write, d.sql().token.deleteKey, Args{"id": id})
	return d.wrapNil(fmt.Sprintf("delete receipt key %d", id), err)
}
