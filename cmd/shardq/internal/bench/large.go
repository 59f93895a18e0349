// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"runtime"
	"runtime/metrics"
	"time"

	"github.com/shardq/shardq"
)

// The large scenario: one message of --large-bytes written and read back
// whole, through the library and through the HTTP API, against the
// database alone doing the same work (one INSERT per 256 KiB BLOB chunk in
// transactions of 16, then a read in order, one row at a time). Its rate is
// MiB a second of the round trip (each MiB written once and read once);
// the params carry each direction's rate and the peak heap.

const (
	largeChunk   = shardq.DefaultLargeChunkSize
	largeChunkTx = 16 // the baseline's transactions, as the issue states them
)

// largeBody is --large-bytes of deterministic pseudo-random bytes, made
// as they are read.
func (e *env) largeBody() io.Reader {
	return io.LimitReader(rand.NewChaCha8([32]byte{'l'}), e.p.LargeBytes)
}

// largeWant is largeBody's SHA-256.
func (e *env) largeWant() (string, error) {
	h := sha256.New()
	if _, err := io.Copy(h, e.largeBody()); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// largeHeap starts measuring the heap a large case adds; stop gives its
// peak above the start. The peak counts garbage the collector has not
// reached yet: run with GOGC=10 to see what is held.
func largeHeap() (stop func() uint64) {
	runtime.GC()
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	start := s[0].Value.Uint64()
	peak := newHeapPeak()
	return func() uint64 {
		p := peak.stop()
		return p - min(p, start)
	}
}

// largeRep is one round trip's measurement.
func (e *env) largeRep(up, down time.Duration, peak uint64) rep {
	mib := float64(e.p.LargeBytes) / (1 << 20)
	round := func(v float64) float64 { return math.Round(v*10) / 10 }
	return rep{msgs: int64(math.Ceil(mib)), elapsed: up + down, extraParams: map[string]any{"unit": "MiB", "large_bytes": e.p.LargeBytes,
		"upload_mib_per_sec": round(mib / up.Seconds()), "download_mib_per_sec": round(mib / down.Seconds()),
		"peak_heap_above_start_mib": round(float64(peak) / (1 << 20)), "peak_heap_chunks": round(float64(peak) / largeChunk), "chunk_kib": largeChunk >> 10}}
}

// rawLarge is the baseline: the database alone.
func (e *env) rawLarge(ctx context.Context, ns namespace) (rep, error) {
	if err := ns.createRaw(ctx); err != nil {
		return rep{}, err
	}
	db := e.d.DB()
	heap := largeHeap()
	body, buf := e.largeBody(), make([]byte, largeChunk)
	ins := "INSERT INTO " + ns.rawMessages() + " (tenant, topic, partition_key, id, headers, payload, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)"
	start := time.Now()
	for n, done := 0, false; !done; {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return rep{}, err
		}
		for range largeChunkTx {
			k, err := io.ReadFull(body, buf)
			if k > 0 {
				if _, err := tx.ExecContext(ctx, ins, ns.tenants[0], ns.topic, "large", fmt.Sprintf("big#%d", n), "{}", buf[:k], e.timeArg(time.Now())); err != nil {
					tx.Rollback()
					return rep{}, err
				}
				n++
			}
			if err != nil {
				done = true
				break
			}
		}
		if err := tx.Commit(); err != nil {
			return rep{}, err
		}
	}
	up := time.Since(start)
	start = time.Now()
	sel := "SELECT " + e.offsetCol() + ", payload FROM " + ns.rawMessages() + " WHERE tenant = ? AND topic = ? AND partition_key = ? AND " +
		e.offsetCol() + " > ? ORDER BY " + e.offsetCol() + " LIMIT 1"
	h := sha256.New()
	for after := int64(0); ; {
		var payload []byte
		err := db.QueryRowContext(ctx, sel, ns.tenants[0], ns.topic, "large", after).Scan(&after, &payload)
		if err != nil {
			break // sql.ErrNoRows: the end
		}
		h.Write(payload)
	}
	down := time.Since(start)
	want, err := e.largeWant()
	if err != nil {
		return rep{}, err
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != want {
		return rep{}, fmt.Errorf("raw large: read back SHA-256 %s, wrote %s", got, want)
	}
	return e.largeRep(up, down, heap()), nil
}

// libraryLarge: PublishLarge, then a group receiver's Receive and Body.
func (e *env) libraryLarge(ctx context.Context, ns namespace) (rep, error) {
	c, err := e.client()
	if err != nil {
		return rep{}, err
	}
	defer c.Close()
	heap := largeHeap()
	start := time.Now()
	res, err := c.PublishLarge(ctx, shardq.Message{Tenant: ns.tenants[0], Topic: ns.topic, ID: "big"}, e.largeBody(), nil)
	if err != nil {
		return rep{}, err
	}
	up := time.Since(start)
	start = time.Now()
	r, err := c.AcceptGroup(ctx, shardq.GroupRef{Tenant: ns.tenants[0], Topic: ns.topic, ConsumerGroup: "bench"}, res.PartitionKey, nil)
	if err != nil {
		return rep{}, err
	}
	defer r.Stop(context.WithoutCancel(ctx))
	d, err := r.Receive(ctx)
	if err != nil {
		return rep{}, err
	}
	h := sha256.New()
	if _, err := io.Copy(h, d.Body()); err != nil {
		return rep{}, err
	}
	if err := r.Ack(ctx, d); err != nil {
		return rep{}, err
	}
	down := time.Since(start)
	if got := hex.EncodeToString(h.Sum(nil)); got != res.SHA256 {
		return rep{}, fmt.Errorf("large: read back SHA-256 %s, wrote %s", got, res.SHA256)
	}
	return e.largeRep(up, down, heap()), nil
}

// httpLarge: POST …/large, then receive and GET its body_url.
func (e *env) httpLarge(ctx context.Context, ns namespace) (rep, error) {
	c, err := e.client()
	if err != nil {
		return rep{}, err
	}
	defer c.Close()
	a, err := e.startAPI(ctx, c, ns)
	if err != nil {
		return rep{}, err
	}
	defer a.stop()
	heap := largeHeap()
	start := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.base+topicPath(ns.tenants[0], ns.topic)+"/large?id=big", e.largeBody())
	if err != nil {
		return rep{}, err
	}
	req.Header.Set("Authorization", "Bearer "+a.token)
	req.Header.Set("Content-Type", "application/octet-stream")
	var stored struct {
		Key    string `json:"key"`
		SHA256 string `json:"sha256"`
	}
	if err := a.do(req, &stored); err != nil {
		return rep{}, err
	}
	up := time.Since(start)
	start = time.Now()
	var got struct {
		Messages []struct {
			Receipt string `json:"receipt"`
			BodyURL string `json:"body_url"`
		} `json:"messages"`
	}
	if err := a.post(ctx, topicPath(ns.tenants[0], ns.topic)+"/groups/bench/receive", map[string]any{"key": stored.Key, "max": 1}, &got); err != nil {
		return rep{}, err
	}
	if len(got.Messages) != 1 || got.Messages[0].BodyURL == "" {
		return rep{}, fmt.Errorf("large receive: %+v", got)
	}
	req, err = http.NewRequestWithContext(ctx, http.MethodGet, a.base+got.Messages[0].BodyURL, nil)
	if err != nil {
		return rep{}, err
	}
	req.Header.Set("Authorization", "Bearer "+a.token)
	resp, err := a.http.Do(req)
	if err != nil {
		return rep{}, err
	}
	h := sha256.New()
	n, err := io.Copy(h, resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || n != e.p.LargeBytes {
		return rep{}, fmt.Errorf("GET body: %d, %d of %d bytes, %v", resp.StatusCode, n, e.p.LargeBytes, err)
	}
	var ack struct{}
	if err := a.post(ctx, topicPath(ns.tenants[0], ns.topic)+"/groups/bench/ack", map[string]any{"receipts": []string{got.Messages[0].Receipt}}, &ack); err != nil {
		return rep{}, err
	}
	down := time.Since(start)
	if sum := hex.EncodeToString(h.Sum(nil)); sum != stored.SHA256 {
		return rep{}, fmt.Errorf("large over HTTP: read back SHA-256 %s, wrote %s", sum, stored.SHA256)
	}
	return e.largeRep(up, down, heap()), nil
}

// do sends req and decodes a 200 answer into out.
func (a *apiServer) do(req *http.Request, out any) error {
	resp, err := a.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s %s: %d %s", req.Method, req.URL.Path, resp.StatusCode, bytes.TrimSpace(b))
	}
	return json.Unmarshal(b, out)
}
