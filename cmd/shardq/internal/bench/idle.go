// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/shardq/shardq"
)

// idleSettle is how long the members run before counting: their first
// rebalance, discovery sweep and heartbeat are start-up, not idle cost.
const idleSettle = 5 * time.Second

// idle: --subscribers members of one group (one client in this process,
// or one process each with --processes) serve --tenants tenants of a
// topic that receives nothing. After idleSettle, the statements the
// server counts (MySQL's Questions status) over --duration, less this
// measurement's own, are the members' idle cost: statements per member
// per second. The baseline is the same with the change feed off.
func (e *env) idle(feed shardq.FeedMode) func(ctx context.Context, ns namespace) (rep, error) {
	return func(ctx context.Context, ns namespace) (rep, error) {
		count, own := e.statements()
		if _, err := count(ctx); err != nil {
			return rep{}, fmt.Errorf("idle counts statements: %w", err)
		}
		saved := e.p.Feed
		defer func() { e.p.Feed = saved }()
		e.p.Feed = map[shardq.FeedMode]string{shardq.FeedAuto: "auto", shardq.FeedOff: "off"}[feed]
		c, err := e.client()
		if err != nil {
			return rep{}, err
		}
		defer c.Close()
		rec := newRecorder(0, 0)
		stop, err := e.startSubscribers(ctx, c, ns, rec, false, false)
		if err != nil {
			return rep{}, err
		}
		defer func() {
			if stop != nil {
				stop()
			}
		}()
		select {
		case <-time.After(idleSettle):
		case <-ctx.Done():
			return rep{}, ctx.Err()
		}
		start := time.Now()
		before, err := count(ctx)
		if err != nil {
			return rep{}, err
		}
		select {
		case <-time.After(e.p.Duration):
		case <-ctx.Done():
			return rep{}, ctx.Err()
		}
		after, err := count(ctx)
		if err != nil {
			return rep{}, err
		}
		elapsed := time.Since(start)
		extra := map[string]any{}
		if !e.p.Processes {
			extra["feed_up"] = c.FeedUp()
		}
		err = stop()
		stop = nil
		if err != nil {
			return rep{}, err
		}
		if rec.count() != 0 {
			return rep{}, errors.New("idle: a message was delivered from a topic nobody published to")
		}
		n := float64(after - before - own)
		return rep{elapsed: elapsed, perMemberSec: n / float64(e.p.Subscribers) / elapsed.Seconds(), extraParams: extra}, nil
	}
}

// statements is the idle scenario's count of statements the server was
// sent, and how many of them each reading of it adds.
func (e *env) statements() (count func(context.Context) (int64, error), own int64) {
	if e.p.VtgateVars != "" {
		return func(ctx context.Context) (int64, error) { return vtgateStatements(ctx, e.p.VtgateVars) }, 0
	}
	db := e.d.DB()
	return func(ctx context.Context) (int64, error) {
		n, err := questions(ctx, db)
		if err != nil {
			return 0, fmt.Errorf("MySQL's Questions status (%s has none; through vtgate, give --vtgate-vars): %w", e.d.Name(), err)
		}
		return n, nil
	}, 1 // the second SHOW is counted
}

// vtgateStatements is vtgate's count of the statements its clients sent
// (every API call: execute, prepare, stream), from its /debug/vars.
func vtgateStatements(ctx context.Context, url string) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, fmt.Errorf("--vtgate-vars: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, fmt.Errorf("--vtgate-vars: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("--vtgate-vars: %s answered %s", url, resp.Status)
	}
	var vars struct {
		VtgateApi *struct{ TotalCount int64 }
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&vars); err != nil {
		return 0, fmt.Errorf("--vtgate-vars: %s: %w", url, err)
	}
	if vars.VtgateApi == nil {
		return 0, fmt.Errorf("--vtgate-vars: %s has no VtgateApi (is it vtgate's /debug/vars?)", url)
	}
	return vars.VtgateApi.TotalCount, nil
}

// questions is the server's count of statements sent by clients.
func questions(ctx context.Context, db *sql.DB) (int64, error) {
	var name string
	var n int64
	err := db.QueryRowContext(ctx, "SHOW GLOBAL STATUS LIKE 'Questions'").Scan(&name, &n)
	return n, err
}
