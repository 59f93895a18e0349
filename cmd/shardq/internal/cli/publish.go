// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/internal/ident"
)

type publishFlags struct {
	tenant, topic, key, id string
	headers                []string
	json, lines            bool
	batch                  int
	delay                  time.Duration
	ttl                    time.Duration
	notBefore              string // RFC 3339
	file                   string // --file: a large message from this file ("-": stdin)
	chunk                  int    // --chunk: bytes per chunk of --file
}

func (a *app) publishCmd() *cobra.Command {
	var f publishFlags
	cmd := &cobra.Command{
		Use:   "publish --tenant T --topic X [--key K] [--id ID] [--header k=v ...] (PAYLOAD | --lines)",
		Short: "Publish a message, or every line of stdin with --lines",
		Long: "Publish one message whose payload is PAYLOAD, or with --lines one message per line of stdin\n" +
			"(in transactions of --batch messages). Prints each message's offset and whether it was a\n" +
			"duplicate (its id was already stored); --json prints one JSON object per message.",
		RunE: run(func(cmd *cobra.Command, args []string) error { return a.publish(cmd, args, f) }),
	}
	fl := cmd.Flags()
	fl.StringVar(&f.tenant, "tenant", "", "tenant (required)")
	fl.StringVar(&f.topic, "topic", "", "topic (required)")
	fl.StringVar(&f.key, "key", "", "partition key (the ordering unit); empty means ungrouped")
	fl.StringVar(&f.id, "id", "", "message id (idempotency key); generated when empty")
	fl.StringArrayVar(&f.headers, "header", nil, "header k=v (repeatable)")
	fl.BoolVar(&f.json, "json", false, "print one JSON object per message")
	fl.BoolVar(&f.lines, "lines", false, "publish every line of stdin as one message")
	countFlag(fl, &f.batch, "batch", 100, "with --lines, messages per transaction")
	durationFlag(fl, &f.delay, "delay", 0, "deliver no earlier than this long from now (at most the client's MaxDelay, 24h)")
	durationFlag(fl, &f.ttl, "ttl", 0, "expire this long from now: never handed out after (dead-lettered when the consumer asks for it)")
	fl.StringVar(&f.notBefore, "not-before", "", "deliver no earlier than this RFC 3339 time (like 2026-12-01T18:00:00Z)")
	fl.StringVar(&f.file, "file", "", "publish this file (\"-\": stdin) as one large message: chunks in one message group, read back whole by consume --assemble")
	countFlag(fl, &f.chunk, "chunk", shardq.DefaultLargeChunkSize, "with --file: bytes per chunk (at most the payload limit, 1 MiB)")
	cmd.MarkFlagRequired("tenant")
	cmd.MarkFlagRequired("topic")
	return cmd
}

func (a *app) publish(cmd *cobra.Command, args []string, f publishFlags) error {
	headers := map[string]string{}
	for _, h := range f.headers {
		k, v, ok := strings.Cut(h, "=")
		if !ok {
			return usagef("--header %q: want k=v", h)
		}
		headers[k] = v
	}
	switch {
	case f.lines && len(args) > 0:
		return usagef("--lines reads payloads from stdin; do not also give PAYLOAD")
	case f.lines && f.id != "":
		return usagef("--id names one message; with --lines ids are generated")
	case f.lines && f.batch < 1:
		return usagef("--batch must be at least 1")
	case f.file != "" && (f.lines || len(args) > 0):
		return usagef("--file is the payload: do not also give PAYLOAD or --lines")
	case f.file != "" && (f.delay > 0 || f.notBefore != ""):
		return usagef("--file: a large message cannot be delayed")
	case f.file != "" && f.ttl > 0:
		return usagef("--file: a large message does not expire")
	case f.file == "" && !f.lines && len(args) != 1:
		return usagef("want exactly one PAYLOAD argument (or --lines), got %d", len(args))
	}
	idErr := error(nil)
	if f.id != "" {
		idErr = ident.MessageID(f.id)
	}
	if err := firstErr(ident.Tenant(f.tenant), ident.Topic(f.topic), ident.PartitionKey(f.key), idErr, ident.Headers(headers)); err != nil {
		return err
	}
	var notBefore time.Time
	if f.notBefore != "" {
		t, err := time.Parse(time.RFC3339Nano, f.notBefore)
		if err != nil {
			return usagef("--not-before %q: want an RFC 3339 time such as 2026-12-01T18:00:00Z", f.notBefore)
		}
		if f.delay > 0 {
			return usagef("--delay and --not-before both say when; give one")
		}
		notBefore = t
	}
	base := shardq.Message{Tenant: f.tenant, Topic: f.topic, PartitionKey: f.key, ID: f.id, Headers: headers, Delay: f.delay, NotBefore: notBefore, TTL: f.ttl}
	c, done, err := a.client()
	if err != nil {
		return err
	}
	defer done()
	if f.file != "" {
		return a.publishFile(cmd.Context(), c, f, base)
	}
	if !f.lines {
		base.Payload = []byte(args[0])
		res, err := c.Publish(cmd.Context(), base)
		if err != nil {
			return err
		}
		return a.printResults(f, res)
	}

	sc := bufio.NewScanner(a.env.Stdin)
	sc.Buffer(make([]byte, 64<<10), maxLineBytes+1)
	batch := make([]shardq.Message, 0, f.batch)
	prog := a.progress("published", f.json)
	dups := 0
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		res, err := c.Publish(cmd.Context(), batch...)
		if err != nil {
			return err
		}
		for _, r := range res {
			if r.Duplicate {
				dups++
			}
		}
		prog.add(int64(len(batch)))
		batch = batch[:0]
		return a.printResults(f, res)
	}
	defer func() { prog.done(fmt.Sprintf("published %d messages (%d duplicates)", prog.n, dups)) }()
	line := 0
	for sc.Scan() {
		line++
		m := base
		m.Payload = []byte(sc.Text())
		batch = append(batch, m)
		if len(batch) == f.batch {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if errors.Is(sc.Err(), bufio.ErrTooLong) {
		return fmt.Errorf("stdin line %d: %w", line+1,
			&shardq.ValidationError{Field: "payload", Rule: fmt.Sprintf("more than %d bytes", maxLineBytes)})
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read stdin: %w", err)
	}
	return flush()
}

// maxLineBytes is the client's default payload limit.
const maxLineBytes = 1 << 20

type publishLine struct {
	Tenant       string `json:"tenant"`
	Topic        string `json:"topic"`
	PartitionKey string `json:"partition_key"`
	ID           string `json:"id"`
	Offset       int64  `json:"offset"`
	Duplicate    bool   `json:"duplicate"`
}

func (a *app) printResults(f publishFlags, res []shardq.PublishResult) error {
	enc := json.NewEncoder(a.env.Stdout)
	for _, r := range res {
		if f.json {
			if err := enc.Encode(publishLine{r.Tenant, r.Topic, r.PartitionKey, r.ID, r.Offset, r.Duplicate}); err != nil {
				return err
			}
			continue
		}
		status := "published"
		if r.Duplicate {
			status = "duplicate"
		}
		if _, err := fmt.Fprintf(a.env.Stdout, "%s offset=%d tenant=%s topic=%s key=%q id=%s\n",
			status, r.Offset, display(r.Tenant), display(r.Topic), r.PartitionKey, display(r.ID)); err != nil {
			return err
		}
	}
	return nil
}

// publishFile publishes --file as one large message (PublishLarge).
func (a *app) publishFile(ctx context.Context, c *shardq.Client, f publishFlags, m shardq.Message) error {
	var body io.Reader = a.env.Stdin
	if f.file != "-" {
		file, err := os.Open(f.file)
		if err != nil {
			return usageError{fmt.Errorf("--file: %w", err)}
		}
		defer file.Close()
		body = file
	}
	prog := a.progress("published bytes", f.json)
	res, err := c.PublishLarge(ctx, m, io.TeeReader(body, progressWriter{prog}), &shardq.LargeOptions{ChunkSize: f.chunk})
	if err != nil {
		return err
	}
	prog.done(fmt.Sprintf("published %d bytes in %d chunks", res.Bytes, res.Chunks))
	if f.json {
		return json.NewEncoder(a.env.Stdout).Encode(map[string]any{"tenant": res.Tenant, "topic": res.Topic, "partition_key": res.PartitionKey,
			"id": res.ID, "chunks": res.Chunks, "bytes": res.Bytes, "sha256": res.SHA256, "end_offset": res.EndOffset})
	}
	fmt.Fprintf(a.env.Stdout, "large message id=%s key=%q chunks=%d bytes=%d sha256=%s end_offset=%d\n",
		display(res.ID), res.PartitionKey, res.Chunks, res.Bytes, res.SHA256, res.EndOffset)
	return nil
}

// progressWriter counts what passes through it.
type progressWriter struct{ p *progress }

func (w progressWriter) Write(b []byte) (int, error) {
	w.p.add(int64(len(b)))
	return len(b), nil
}
