// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"runtime/metrics"
	"strings"
	"sync"
	"time"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/cmd/shardq/internal/server"
)

// apiServer is `shardq serve` in this process on a loopback port, with an
// admin token of a namespace: what the api scenarios measure through.
type apiServer struct {
	base, token string
	http        *http.Client
	stop        func()
}

func (e *env) startAPI(ctx context.Context, c *shardq.Client, ns namespace) (*apiServer, error) {
	rc, err := c.Receipts(&shardq.ReceiptOptions{MessageBytes: server.MessageBytes, Name: "bench-api"})
	if err != nil {
		return nil, err
	}
	// No rate limit worth the name: the bench measures the server.
	srv, err := server.New(server.Config{Client: c, Driver: e.d, Receipts: rc, Rate: 1e9, Burst: 1 << 30, Logger: e.Logger})
	if err != nil {
		return nil, err
	}
	tok, _, err := server.NewToken(ctx, e.d, ns.tenants, []string{server.RoleAdmin}, 0, time.Now())
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: time.Minute, WriteTimeout: 2 * time.Minute}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	conns := e.p.Publishers + e.p.Subscribers
	tr := &http.Transport{MaxIdleConns: conns, MaxIdleConnsPerHost: conns}
	return &apiServer{base: "http://" + ln.Addr().String(), token: tok, http: &http.Client{Transport: tr},
		stop: func() {
			srv.Drain()
			_ = hs.Shutdown(context.WithoutCancel(ctx))
			<-served
			tr.CloseIdleConnections()
		}}, nil
}

// post sends body as JSON and decodes a 200 answer into out.
func (a *apiServer) post(ctx context.Context, path string, body, out any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.base+path, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+a.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := a.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var p map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&p)
		return fmt.Errorf("POST %s: %d %v", path, resp.StatusCode, p)
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

func topicPath(tenant, topic string) string {
	return "/v1/tenants/" + url.PathEscape(tenant) + "/topics/" + url.PathEscape(topic)
}

// apiMessage is a message of the API (the bench's payloads are binary).
type apiMessage struct {
	Key           string `json:"key"`
	ID            string `json:"id,omitempty"`
	PayloadBase64 string `json:"payload_base64"`
	Receipt       string `json:"receipt,omitempty"`
	Payload       string `json:"payload,omitempty"`
}

// apiPublish is publish through the HTTP API: the same calls, each a POST
// of --batch messages.
func (e *env) apiPublish(ctx context.Context, ns namespace) (rep, error) {
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
	// One request per call: the batch's messages share a partition.
	return e.publishWith(ctx, ns, func(msgs []shardq.Message) error {
		in := make([]apiMessage, len(msgs))
		for i, m := range msgs {
			in[i] = apiMessage{Key: m.PartitionKey, PayloadBase64: base64.StdEncoding.EncodeToString(m.Payload)}
		}
		var out struct{}
		return a.post(ctx, topicPath(msgs[0].Tenant, ns.topic)+"/messages", map[string]any{"messages": in}, &out)
	})
}

// apiConsume is consume through the HTTP API: --messages published
// beforehand, then --subscribers loops of { receive the next free message
// group (up to MaxReceiveMessages); ack them }.
func (e *env) apiConsume(ctx context.Context, ns namespace) (rep, error) {
	c, err := e.client()
	if err != nil {
		return rep{}, err
	}
	defer c.Close()
	if err := e.fill(ctx, c, ns); err != nil {
		return rep{}, err
	}
	a, err := e.startAPI(ctx, c, ns)
	if err != nil {
		return rep{}, err
	}
	defer a.stop()
	rec := newRecorder(e.p.Messages, e.p.Partitions)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, e.p.Subscribers)
	start := time.Now()
	var wg sync.WaitGroup
	for i := range e.p.Subscribers {
		wg.Go(func() {
			// Each receive acks the previous one's receipts when it asks
			// the same tenant (one request a turn); otherwise they are
			// acked on their own first.
			var pending []string
			var pendingGroup string
			for n := i; ctx.Err() == nil; n++ { // each receive asks the next tenant
				tenant := ns.tenants[n%len(ns.tenants)]
				group := topicPath(tenant, ns.topic) + "/groups/bench"
				if len(pending) > 0 && pendingGroup != group {
					var out struct{}
					if err := a.post(ctx, pendingGroup+"/ack", map[string]any{"receipts": pending}, &out); err != nil && ctx.Err() == nil {
						errc <- err
						return
					}
					pending = nil
				}
				body := map[string]any{"next_group": true, "max": shardq.MaxReceiveMessages, "wait": 1}
				if len(pending) > 0 {
					body["ack"] = pending
				}
				var got struct{ Messages []apiMessage }
				if err := a.post(ctx, group+"/receive", body, &got); err != nil {
					if ctx.Err() == nil {
						errc <- err
					}
					return
				}
				receipts := make([]string, len(got.Messages))
				for j, m := range got.Messages {
					b := []byte(m.Payload)
					if m.PayloadBase64 != "" {
						var derr error
						if b, derr = base64.StdEncoding.DecodeString(m.PayloadBase64); derr != nil {
							errc <- derr
							return
						}
					}
					seq, _, _, err := parsePayload(b)
					if err != nil {
						errc <- fmt.Errorf("tenant %s partition %s: %w", tenant, m.Key, err)
						return
					}
					rec.record(event{tenant: tenant, key: m.Key, seq: seq, at: time.Now()})
					receipts[j] = m.Receipt
				}
				pending, pendingGroup = receipts, group
			}
		})
	}
	waitErr := rec.wait(ctx)
	elapsed := time.Since(start)
	cancel()
	wg.Wait()
	close(errc)
	if err := errors.Join(waitErr, <-errc); err != nil {
		return rep{}, err
	}
	return rec.rep(elapsed), nil
}

// Large receives: the case of issue 29 (20 messages of a 1 MiB payload
// and 60 headers of 8,000 '<' each, received with max 20). The server
// stops each response at its byte budget; this measures the process's
// peak heap while the receives run.
const (
	largeMessages = 20
	largePayload  = 1 << 20
	largeHeaders  = 60
	largeHeader   = 8000
)

func (e *env) apiLarge(ctx context.Context, ns namespace) (rep, error) {
	c, err := e.client()
	if err != nil {
		return rep{}, err
	}
	defer c.Close()
	tenant := ns.tenants[0]
	headers := make(map[string]string, largeHeaders)
	for i := range largeHeaders {
		headers[fmt.Sprintf("h%02d", i)] = strings.Repeat("<", largeHeader)
	}
	payload := bytes.Repeat([]byte("p"), largePayload)
	for i := range largeMessages {
		if _, err := c.Publish(ctx, shardq.Message{Tenant: tenant, Topic: ns.topic, PartitionKey: "large", ID: fmt.Sprintf("large-%d", i),
			Headers: headers, Payload: payload}); err != nil {
			return rep{}, err
		}
	}
	payload, headers = nil, nil
	a, err := e.startAPI(ctx, c, ns)
	if err != nil {
		return rep{}, err
	}
	defer a.stop()
	runtime.GC()
	peak := newHeapPeak()
	start := time.Now()
	var got, receives, largestBody int
	for got < largeMessages && receives < 2*largeMessages {
		receives++
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.base+topicPath(tenant, ns.topic)+"/groups/bench/receive",
			strings.NewReader(`{"key":"large","max":20}`))
		if err != nil {
			return rep{}, err
		}
		req.Header.Set("Authorization", "Bearer "+a.token)
		resp, err := a.http.Do(req)
		if err != nil {
			return rep{}, err
		}
		// The answer streams through a decoder that keeps only receipts:
		// the client's copy of the body is not the server's heap.
		var out struct{ Messages []struct{ Receipt string } }
		cr := &countingReader{r: resp.Body}
		err = json.NewDecoder(cr).Decode(&out)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			return rep{}, fmt.Errorf("large receive: %d: %v", resp.StatusCode, err)
		}
		largestBody = max(largestBody, cr.n)
		receipts := make([]string, len(out.Messages))
		for i, m := range out.Messages {
			receipts[i] = m.Receipt
		}
		got += len(receipts)
		var ack struct{}
		if err := a.post(ctx, topicPath(tenant, ns.topic)+"/groups/bench/ack", map[string]any{"receipts": receipts}, &ack); err != nil {
			return rep{}, err
		}
	}
	elapsed := time.Since(start)
	peakBytes := peak.stop()
	if got != largeMessages {
		return rep{}, fmt.Errorf("large receive: %d of %d messages in %d receives", got, largeMessages, receives)
	}
	return rep{msgs: int64(got), elapsed: elapsed, extraParams: map[string]any{
		"peak_heap_mib": math.Round(float64(peakBytes)/(1<<20)*10) / 10, "budget_mib": server.DefaultMaxResponseBytes >> 20,
		"largest_response_mib": math.Round(float64(largestBody)/(1<<20)*10) / 10, "receives": receives}}, nil
}

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// heapPeak samples the heap every half millisecond: its objects (live,
// and dead ones the collector has not swept yet), and what the last
// collection found live.
type heapPeak struct {
	done chan struct{}
	peak chan [2]uint64
}

func newHeapPeak() *heapPeak {
	h := &heapPeak{done: make(chan struct{}), peak: make(chan [2]uint64, 1)}
	go func() {
		s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}, {Name: "/gc/heap/live:bytes"}}
		var peak [2]uint64
		t := time.NewTicker(500 * time.Microsecond)
		defer t.Stop()
		for {
			metrics.Read(s)
			peak[0], peak[1] = max(peak[0], s[0].Value.Uint64()), max(peak[1], s[1].Value.Uint64())
			select {
			case <-h.done:
				h.peak <- peak
				return
			case <-t.C:
			}
		}
	}()
	return h
}

// stop returns the peak of the heap's objects.
func (h *heapPeak) stop() uint64 { return h.stopBoth()[0] }

// stopBoth returns the peaks of the heap's objects and of what
// collections found live.
func (h *heapPeak) stopBoth() [2]uint64 { close(h.done); return <-h.peak }

// Hostile bodies: 8 MiB of {"messages":[{},{},…]} from a publish token,
// and of {"receipts":["",…]} from a consume token, four at once, three
// rounds each; and, for scale, four honest publishes of 1,000 messages
// that fill the body limit, at once. The server must refuse the hostile
// ones from their bounds before it decodes them, and hold no more than
// its budget of bodies and what they decode into: this reports the peak
// of the process's live heap over the heap before the attack (the
// bodies sent are built beforehand), beside that budget.
const (
	attackers     = 4
	attackRounds  = 3
	attackBody    = server.DefaultMaxBodyBytes
	honestPayload = attackBody/1000 - 64 // 1,000 messages and their JSON within the limit
)

func attackBodies() map[string]string {
	fill := func(head, item, tail string) string {
		n := (attackBody - len(head) - len(tail)) / (len(item) + 1)
		return head + strings.TrimSuffix(strings.Repeat(item+",", n), ",") + tail
	}
	honest := `{"key":"k","payload":"` + strings.Repeat("h", honestPayload) + `"}`
	return map[string]string{
		"publish_body":  fill(`{"messages":[`, `{}`, `]}`),
		"receipts_body": fill(`{"receipts":[`, `""`, `]}`),
		"honest_body":   `{"messages":[` + strings.TrimSuffix(strings.Repeat(honest+",", 1000), ",") + `]}`,
	}
}

func (e *env) apiAttack(ctx context.Context, ns namespace) (rep, error) {
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
	bodies := attackBodies()
	tenant := ns.tenants[0]
	paths := map[string]string{"publish_body": topicPath(tenant, ns.topic) + "/messages",
		"receipts_body": topicPath(tenant, ns.topic) + "/groups/bench/ack", "honest_body": topicPath(tenant, ns.topic) + "/messages"}
	want := map[string]int{"publish_body": http.StatusBadRequest, "receipts_body": http.StatusBadRequest, "honest_body": http.StatusOK}
	params := map[string]any{"inflight_budget_mib": server.DefaultMaxInflightBodyBytes >> 20, "body_mib": attackBody >> 20, "requests": attackers}
	start := time.Now()
	var requests int64
	for _, name := range []string{"publish_body", "receipts_body", "honest_body"} {
		runtime.GC()
		base := liveHeap()
		peak := newHeapPeak()
		rounds := attackRounds
		if name == "honest_body" {
			rounds = 1
		}
		statuses := make(chan int, attackers*rounds)
		for range rounds {
			var wg sync.WaitGroup
			for range attackers {
				wg.Go(func() {
					req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.base+paths[name], strings.NewReader(bodies[name]))
					if err != nil {
						statuses <- 0
						return
					}
					req.Header.Set("Authorization", "Bearer "+a.token)
					resp, err := a.http.Do(req)
					if err != nil {
						statuses <- 0
						return
					}
					io.Copy(io.Discard, resp.Body) //nolint:errcheck // only the status counts
					resp.Body.Close()
					statuses <- resp.StatusCode
				})
			}
			wg.Wait()
		}
		high := peak.stopBoth()
		close(statuses)
		counts := map[int]int{}
		for s := range statuses {
			counts[s]++
		}
		// 429s are the budget at work (honest bodies past it); any other
		// answer is a failure of the bounds.
		if counts[want[name]]+counts[http.StatusTooManyRequests] != attackers*rounds || counts[want[name]] == 0 {
			return rep{}, fmt.Errorf("%s: answers %v, want %d (or 429)", name, counts, want[name])
		}
		requests += int64(attackers * rounds)
		mib := func(n uint64) float64 { return math.Round(float64(n-min(n, base))/(1<<20)*10) / 10 }
		params[name+"_peak_mib"], params[name+"_live_mib"] = mib(high[0]), mib(high[1])
		params[name+"_429"] = counts[http.StatusTooManyRequests]
	}
	return rep{msgs: requests, elapsed: time.Since(start), extraParams: params}, nil
}

// liveHeap is the heap's objects now.
func liveHeap() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}
