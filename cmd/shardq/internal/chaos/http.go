// SPDX-License-Identifier: Apache-2.0

package chaos

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"
)

// HTTP clients publish to TopicHTTP and receive it as GroupHTTP through
// the run's `shardq serve` processes, taking them in turn: a receipt is
// settled through another server than the one that handed it out.
const (
	TopicHTTP = "http"
	GroupHTTP = "http"
	// httpDLQSuffix is serve's (shardq.DefaultDLQSuffix): it has no
	// per-group suffix.
	httpDLQSuffix = ".dlq"
	httpKeys      = 8
	// httpVisibility is a receive's visibility timeout: a lease's TTL.
	httpVisibility = leaseTTL
	// httpMargin: a receive whose answer comes later than the visibility
	// timeout less this, after the request was sent, is dropped: another
	// client may hold its group by the time its messages are handled.
	httpMargin = time.Second
	// httpTimeout bounds one request; a receive's wait is on top.
	httpTimeout = 10 * time.Second
	httpWait    = time.Second
	// Every httpLargeEvery-th publish call uploads a large message of 64
	// KiB to 512 KiB (POST …/large) instead, to a key of its own (serve
	// gives a stalled large write up after its LargeWriteTimeout, 5
	// minutes: on a shared key one would hold up those after it past the
	// run); receivers read its body by receipt.
	httpLargeEvery = 10
)

// TokenEnv carries the serve token to the HTTP clients (never the
// command line).
const TokenEnv = "SHARDQ_CHAOS_TOKEN"

type httpClient struct {
	*client
	http    *http.Client
	token   string
	servers []string
	next    int
}

// base is the next server's URL of tenant's TopicHTTP, in turn.
func (h *httpClient) base(tenant string) string {
	s := h.servers[h.next%len(h.servers)]
	h.next++
	return s + "/v1/tenants/" + tenant + "/topics/" + TopicHTTP
}

// call posts in as JSON to url and decodes a 2xx answer into out.
func (h *httpClient) call(ctx context.Context, url string, in, out any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	_, b, err := h.do(req, 8<<20)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, out)
}

// uploadLarge publishes a large message of random bytes over HTTP to a
// key of its own, recording its send and, when stored, its publish.
func (cl *client) uploadLarge(ctx context.Context, h *httpClient, tenant, id string) {
	body := make([]byte, 64<<10+cl.rng.IntN(448<<10))
	for i := range body {
		body[i] = byte(cl.rng.Uint32())
	}
	sum := sha256.Sum256(body)
	key := "hL-" + id
	cl.record(Event{Op: "send", Tenant: tenant, Topic: TopicHTTP, Key: key, ID: id, Size: int64(len(body)), SHA256: hex.EncodeToString(sum[:])})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.base(tenant)+"/large?key="+url.QueryEscape(key)+"&id="+url.QueryEscape(id), bytes.NewReader(body))
	if err != nil {
		cl.log.Warn("chaos: large upload over HTTP", "err", err)
		return
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set("Repr-Digest", "sha-256=:"+base64.StdEncoding.EncodeToString(sum[:])+":")
	start := now()
	_, b, err := h.do(req, 1<<20)
	end := now()
	var out struct {
		EndOffset int64 `json:"end_offset"`
	}
	if err == nil {
		err = json.Unmarshal(b, &out)
	}
	if err != nil {
		cl.log.Warn("chaos: large upload over HTTP failed (outcome unknown)", "err", err)
		return
	}
	cl.record(Event{Op: "publish", Tenant: tenant, Topic: TopicHTTP, Key: key, ID: id, Offset: out.EndOffset, Start: start, End: end,
		Size: int64(len(body)), SHA256: hex.EncodeToString(sum[:])})
}

// readBody reads a received large message's body by its receipt, through
// the next server, and returns its size and SHA-256 (hex).
func (h *httpClient) readBody(ctx context.Context, bodyURL string) (int64, string, error) {
	s := h.servers[h.next%len(h.servers)]
	h.next++
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s+bodyURL, nil)
	if err != nil {
		return 0, "", err
	}
	_, b, err := h.do(req, 1<<20) // a body cut short fails the read (io.ErrUnexpectedEOF)
	if err != nil {
		return 0, "", err
	}
	sum := sha256.Sum256(b)
	return int64(len(b)), hex.EncodeToString(sum[:]), nil
}

// do sends req with the token and returns a 2xx answer's body, read
// whole (up to limit bytes), and its head.
func (h *httpClient) do(req *http.Request, limit int64) (*http.Response, []byte, error) {
	req.Header.Set("Authorization", "Bearer "+h.token)
	resp, err := h.http.Do(req)
	if err != nil {
		return nil, nil, &noAnswerError{err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, limit))
	if err != nil {
		return nil, nil, err
	}
	if resp.StatusCode/100 != 2 {
		return nil, nil, &statusError{url: req.URL.String(), status: resp.Status, body: string(bytes.TrimSpace(b))}
	}
	return resp, b, nil
}

// statusError: the server answered, and not with success.
type statusError struct{ url, status, body string }

func (e *statusError) Error() string { return e.url + ": " + e.status + ": " + e.body }

// noAnswerError: the request got no answer (no connection, or it broke
// before the response's head).
type noAnswerError struct{ err error }

func (e *noAnswerError) Error() string { return e.err.Error() }
func (e *noAnswerError) Unwrap() error { return e.err }

func (cl *client) httpClient() *httpClient {
	return &httpClient{client: cl, http: &http.Client{Timeout: httpTimeout + httpWait}, token: cl.cfg.Token, servers: cl.cfg.Servers,
		next: cl.rng.IntN(len(cl.cfg.Servers))}
}

// httpPublish publishes one to three keyed messages a call.
func (cl *client) httpPublish(ctx context.Context, stop <-chan struct{}) error {
	h := cl.httpClient()
	type msg struct {
		Key     string `json:"key"`
		ID      string `json:"id"`
		Payload string `json:"payload"`
	}
	var out struct {
		Results []struct {
			Key    string `json:"key"`
			ID     string `json:"id"`
			Offset int64  `json:"offset"`
		} `json:"results"`
	}
	n, calls := 0, 0
	return every(ctx, stop, cl.cfg.Interval, func() {
		tenant := cl.tenant()
		if calls++; calls%httpLargeEvery == 0 {
			n++
			cl.uploadLarge(ctx, h, tenant, fmt.Sprintf("%s-%d", cl.cfg.Name, n))
			return
		}
		msgs := make([]msg, 1+cl.rng.IntN(3))
		for i := range msgs {
			n++
			msgs[i] = msg{Key: fmt.Sprintf("h%d", cl.rng.IntN(httpKeys)), ID: fmt.Sprintf("%s-%d", cl.cfg.Name, n),
				Payload: fmt.Sprintf("payload of %s-%d", cl.cfg.Name, n)}
			cl.record(Event{Op: "send", Tenant: tenant, Topic: TopicHTTP, Key: msgs[i].Key, ID: msgs[i].ID})
		}
		start := now()
		err := h.call(ctx, h.base(tenant)+"/messages", map[string]any{"messages": msgs}, &out)
		end := now()
		if err != nil {
			cl.log.Warn("chaos: publish over HTTP failed (outcome unknown)", "err", err)
			return
		}
		for _, r := range out.Results {
			cl.record(Event{Op: "publish", Tenant: tenant, Topic: TopicHTTP, Key: r.Key, ID: r.ID, Offset: r.Offset, Start: start, End: end})
		}
	})
}

// httpReceive receives the next free message group, handles its
// messages (a poisoned one fails: it is nacked) and settles them through
// the next server.
func (cl *client) httpReceive(ctx context.Context, stop <-chan struct{}) error {
	ctx, cancel := untilStop(ctx, stop)
	defer cancel()
	h := cl.httpClient()
	type message struct {
		Key     string `json:"key"`
		ID      string `json:"id"`
		Offset  int64  `json:"offset"`
		Receipt string `json:"receipt"`
		BodyURL string `json:"body_url"` // a large message's
	}
	for turn := 0; ctx.Err() == nil; turn++ {
		var got struct {
			Messages []message `json:"messages"`
		}
		tenant := cl.cfg.Tenants[turn%len(cl.cfg.Tenants)]
		sent := time.Now()
		err := h.call(ctx, h.base(tenant)+"/groups/"+GroupHTTP+"/receive", map[string]any{"next_group": true, "max": 10,
			"wait": httpWait.Seconds(), "visibility": httpVisibility.Seconds()}, &got)
		if err != nil {
			if ctx.Err() == nil {
				cl.log.Warn("chaos: receive over HTTP failed", "err", err)
				sleep(ctx, 200*time.Millisecond)
			}
			continue
		}
		if late := time.Since(sent); late > httpVisibility-httpMargin && len(got.Messages) > 0 {
			cl.log.Warn("chaos: a receive answered too late to handle; its messages are left to their visibility timeout", "after", late)
			continue
		}
		// In offset order, up to the first poisoned message: the acks
		// before it (an ack is cumulative, so one after it would pass
		// it over), then its nack, which gives the group back; the rest
		// come again.
		var acks []string
		var acked []Event // the handle lines of acks
		poison := ""
		// Handled within the visibility less the margin, as the receive
		// was answered: a large body's read is bounded by it.
		hctx, hcancel := context.WithDeadline(ctx, sent.Add(httpVisibility-httpMargin))
		for _, m := range got.Messages {
			if hctx.Err() != nil {
				break // the rest come again
			}
			e := Event{Op: "handle", Tenant: tenant, Group: GroupHTTP, Topic: TopicHTTP, Key: m.Key, ID: m.ID, Offset: m.Offset, Start: now(), Result: "ok"}
			if m.BodyURL != "" {
				var berr error
				if e.Size, e.SHA256, berr = h.readBody(hctx, m.BodyURL); berr != nil {
					// Not nacked: no attempt is counted, so a body that
					// never reads whole leaves its message stuck, which
					// the checker reports, not dead-lettered.
					cl.log.Warn("chaos: reading a large body over HTTP failed; left to its visibility timeout", "id", m.ID, "err", berr)
					e.Result, e.End = "error", now()
					cl.record(e)
					break
				}
			}
			if poisoned(m.ID) {
				e.Result, poison = "error", m.Receipt
			} else {
				acks = append(acks, m.Receipt)
			}
			// Handled one after another; written before the settlement
			// (see drainGroup).
			e.End = now()
			cl.record(e)
			if e.Result == "ok" {
				acked = append(acked, e)
			}
			if poison != "" {
				break
			}
		}
		hcancel()
		// The settlement outlives a stop: its handle lines are written.
		sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), httpTimeout)
		var settled struct{}
		if len(acks) > 0 {
			if err := h.call(sctx, h.base(tenant)+"/groups/"+GroupHTTP+"/ack", map[string]any{"receipts": acks}, &settled); err != nil {
				cl.log.Warn("chaos: ack over HTTP failed", "err", err)
				// No answer (the server is down or the connection broke,
				// perhaps long after the fault that caused it): the acks'
				// outcome is unknown. An answer, even one whose body was
				// lost, stays for the checker to judge by the faults (and a
				// server's panic fails the run: panics).
				if noAnswer := (*noAnswerError)(nil); errors.As(err, &noAnswer) {
					for _, e := range acked {
						cl.record(Event{Op: "unsettled", Tenant: tenant, Group: GroupHTTP, Topic: TopicHTTP, Key: e.Key, ID: e.ID, Offset: e.Offset, Start: e.Start})
					}
				}
				scancel()
				continue
			}
		}
		if poison != "" {
			if err := h.call(sctx, h.base(tenant)+"/groups/"+GroupHTTP+"/nack", map[string]any{"receipts": []string{poison}, "retry_after": 0.1,
				"reason": "poisoned"}, &settled); err != nil {
				cl.log.Warn("chaos: nack over HTTP failed", "err", err)
			}
		}
		scancel()
	}
	return nil
}
