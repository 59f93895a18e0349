// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/internal/ident"
	"github.com/shardq/shardq/internal/settings"
)

type consumeFlags struct {
	topic, group, name string
	instanceID         string
	staleAfter         time.Duration
	tenants            []string
	max                int
	idleExit           time.Duration
	key                string        // --key: accept this message group
	wait               time.Duration // --wait: for --key and --next-group
	nextGroup          bool          // --next-group: accept the next free group with a ready message
	requireReady       bool          // --require-ready: with --key, accept only while a message is ready
	deadLetterExpired  bool          // --dead-letter-expired
	groupIdle          time.Duration // --group-idle: with --next-group, move on after this long without a message
	assemble           bool          // --assemble: large messages whole, payloads raw on stdout
	outputDir          string        // --output-dir: each payload to a file, its JSON line to stdout
	ungrouped          bool          // --ungrouped: only messages without a partition key
	start              startFlag     // --start: where a new group begins
}

func (a *app) consumeCmd() *cobra.Command {
	var f consumeFlags
	cmd := &cobra.Command{
		Use:   "consume --topic X --group G [--tenant T ...] [--key K [--wait D] [--require-ready] | --next-group [--wait D] | --ungrouped] [--start earliest|latest] [--max N] [--idle-exit D] [--name S]",
		Short: "Consume a topic as a member of a consumer group, printing one JSON line per message",
		Long: "Joins consumer group G on topic X for the tenants given by --tenant (repeatable) or SHARDQ_TENANTS\n" +
			"(comma-separated). Each message is printed as one JSON line and flushed before it is acked:\n" +
			`{"tenant","topic","partition_key","offset","id","attempt","headers","payload"}` + "\n" +
			"(payload as text when it is valid UTF-8, otherwise base64 in \"payload_base64\").\n" +
			"Exits 0 after --max messages or after --idle-exit without one; SIGINT/SIGTERM stop it gracefully.\n" +
			"By default it takes a fair share of every partition (and ungrouped messages). --key K attaches to the one\n" +
			"message group K of the single --tenant (waiting up to --wait while another consumer holds it);\n" +
			"--next-group takes the free group whose next message is oldest (waiting up to --wait for the first), serves it\n" +
			"until it has been quiet for --group-idle, releases it and takes the next, until --idle-exit, --max or a signal;\n" +
			"--ungrouped takes only messages without a partition key, competing with the group's other members.\n" +
			"--start decides where a group new to the topic begins in partitions it has no cursor for: every stored\n" +
			"message (earliest) or only those published from now on (latest); a group that exists keeps its own.\n" +
			"A large message (publish --file) is never printed as a JSON line: --output-dir DIR writes every payload to a\n" +
			"file (renamed into place once whole and checked) and prints a line naming it; --assemble writes payloads raw.",
		Args: cobra.NoArgs,
		RunE: run(func(cmd *cobra.Command, _ []string) error { return a.consume(cmd, f) }),
	}
	fl := cmd.Flags()
	fl.StringVar(&f.topic, "topic", "", "topic (required)")
	fl.StringVar(&f.group, "group", "", "consumer group (required)")
	fl.StringArrayVar(&f.tenants, "tenant", nil, "tenant to serve (repeatable; default $SHARDQ_TENANTS)")
	countFlag(fl, &f.max, "max", 0, "exit after this many messages (0: no limit)")
	durationFlag(fl, &f.idleExit, "idle-exit", 0, "exit after this long without a message (0: never)")
	fl.StringVar(&f.name, "name", "", "member name, for people (default host-pid); the identity its leases show is NAME#random, new per run")
	fl.StringVar(&f.instanceID, "instance-id", "", "static member id (Kafka's group.instance.id): a run stopped or killed keeps its place for --stale-after, and the next run with the id takes its partitions over without a rebalance (and stops one that still runs)")
	durationFlag(fl, &f.staleAfter, "stale-after", 0, "a member silent this long counts as gone and its partitions move (default three heartbeats, 9s); with static members, every member sets it to cover a restart")
	fl.StringVar(&f.key, "key", "", "accept this message group (partition key) exclusively")
	fl.BoolVar(&f.deadLetterExpired, "dead-letter-expired", false, "dead-letter a message found expired (publish --ttl) instead of passing over it")
	fl.BoolVar(&f.requireReady, "require-ready", false, "with --key: accept the group only when a message of it is ready (waiting up to --wait), as --next-group does")
	durationFlag(fl, &f.wait, "wait", 0, "with --key or --next-group: how long to wait for the group (0: fail at once)")
	fl.BoolVar(&f.nextGroup, "next-group", false, "serve free message groups one after another, each while it has messages (until --idle-exit, --max or a signal)")
	positiveDurationFlag(fl, &f.groupIdle, "group-idle", time.Second, "with --next-group: release a group after this long without a message and take the next")
	fl.BoolVar(&f.assemble, "assemble", false, "with --key or --next-group: put large messages (publish --file) back together and write each payload raw "+
		"to stdout (one JSON line about it on stderr); use --max 1 for one file")
	fl.StringVar(&f.outputDir, "output-dir", "", "write each message's payload to DIR/TENANT/KEY/ID (escaped; hashed when long) instead of the JSON line, which names the file, "+
		"its size and SHA-256; the file appears under its name only once whole and checked. Needed for large messages outside --assemble")
	fl.BoolVar(&f.ungrouped, "ungrouped", false, "take only ungrouped messages (empty partition key), competing with other members")
	fl.Var(&f.start, "start", "where a group new to the topic starts: earliest or latest")
	cmd.MarkFlagRequired("topic")
	cmd.MarkFlagRequired("group")
	return cmd
}

type consumeLine struct {
	Tenant        string            `json:"tenant"`
	Topic         string            `json:"topic"`
	PartitionKey  string            `json:"partition_key"`
	Offset        int64             `json:"offset"`
	ID            string            `json:"id"`
	Attempt       int               `json:"attempt"`
	Headers       map[string]string `json:"headers"`
	Payload       *string           `json:"payload,omitempty"`
	PayloadBase64 []byte            `json:"payload_base64,omitempty"`
}

func newConsumeLine(d *shardq.Delivery) consumeLine {
	line := consumeLine{Tenant: d.Tenant, Topic: d.Topic, PartitionKey: d.PartitionKey, Offset: d.Offset, ID: d.ID,
		Attempt: d.Attempt, Headers: d.Headers}
	if utf8.Valid(d.Payload) {
		p := string(d.Payload)
		line.Payload = &p
	} else {
		line.PayloadBase64 = d.Payload
	}
	return line
}

func (a *app) consume(cmd *cobra.Command, f consumeFlags) error {
	tenants := f.tenants
	if len(tenants) == 0 {
		ts, err := a.servedTenants()
		if err == nil && ts == nil {
			err = fmt.Errorf("%s is not set", settings.TenantsVar)
		}
		if err != nil {
			return usagef("no tenants: give --tenant or %s (%v)", settings.TenantsVar, err)
		}
		tenants = ts
	}
	if f.max < 0 {
		return usagef("--max must not be negative")
	}
	modes := 0
	for _, on := range []bool{f.key != "", f.nextGroup, f.ungrouped} {
		if on {
			modes++
		}
	}
	switch {
	case modes > 1:
		return usagef("--key, --next-group and --ungrouped exclude each other")
	case f.wait < 0:
		return usagef("--wait must not be negative")
	case f.wait > 0 && f.key == "" && !f.nextGroup:
		return usagef("--wait applies to --key and --next-group only")
	case f.requireReady && f.key == "":
		return usagef("--require-ready applies to --key only (--next-group always requires a ready message)")
	case f.key != "" && len(tenants) != 1:
		return usagef("--key needs exactly one tenant, got %d", len(tenants))
	case f.assemble && f.key == "" && !f.nextGroup:
		return usagef("--assemble reads one message group at a time: give --key or --next-group")
	case f.assemble && f.outputDir != "":
		return usagef("--assemble writes payloads to stdout, --output-dir to files: give one")
	case f.instanceID != "" && (f.key != "" || f.nextGroup || f.ungrouped):
		return usagef("--instance-id applies to a subscriber (no --key, --next-group or --ungrouped)")
	}
	nameErr := error(nil)
	if f.name != "" {
		nameErr = ident.SubscriberName(f.name)
	}
	if f.instanceID != "" {
		nameErr = firstErr(nameErr, ident.MemberName("--instance-id", f.instanceID))
	}
	if err := firstErr(ident.Topic(f.topic), ident.ConsumerGroup(f.group), ident.Tenants("--tenant", tenants), ident.PartitionKey(f.key), nameErr); err != nil {
		return err
	}
	c, done, err := a.client()
	if err != nil {
		return err
	}
	defer done()
	if f.key != "" || f.nextGroup {
		return a.receive(cmd.Context(), c, f, tenants)
	}

	out := bufio.NewWriter(a.env.Stdout)
	var mu sync.Mutex
	printed := 0
	reachedMax := make(chan struct{})
	activity := make(chan struct{}, 1)
	refused := make(chan error, 1)
	enc := json.NewEncoder(out)
	handler := func(ctx context.Context, d *shardq.Delivery) error {
		if d.IsLarge() && f.outputDir == "" {
			err := largeToStdout(d)
			select {
			case refused <- err:
			default:
			}
			<-ctx.Done() // not acked: the command ends with err
			return err
		}
		var line any = newConsumeLine(d)
		if f.outputDir != "" {
			fl, err := writeFile(f.outputDir, d)
			if err != nil {
				return err // a failed delivery: retried, dead-lettered after the last attempt
			}
			line = fl
		}
		mu.Lock()
		if f.max > 0 && printed >= f.max {
			mu.Unlock()
			<-ctx.Done() // not printed, not acked: the stop cancels it
			return ctx.Err()
		}
		err := enc.Encode(line)
		if err == nil {
			err = out.Flush()
		}
		if err == nil {
			printed++
			if printed == f.max {
				close(reachedMax)
			}
		}
		mu.Unlock()
		select {
		case activity <- struct{}{}:
		default:
		}
		if err != nil {
			return fmt.Errorf("write stdout: %w", err) // not acked: retried
		}
		return nil
	}
	take := shardq.TakeAll
	if f.ungrouped {
		take = shardq.TakeUngrouped
	}
	sub, err := c.Subscribe(cmd.Context(), shardq.SubscriberConfig{
		ConsumerGroup: f.group, Topic: f.topic, Tenants: tenants, Name: f.name, InstanceID: f.instanceID, StaleAfter: f.staleAfter, Handler: handler, Take: take,
		StartPosition: shardq.StartPosition(f.start), DeadLetterExpired: f.deadLetterExpired,
	})
	if err != nil {
		return err
	}
	var idle <-chan time.Time
	resetIdle := func() {}
	if f.idleExit > 0 {
		timer := time.NewTimer(f.idleExit)
		defer timer.Stop()
		idle = timer.C
		resetIdle = func() {
			if !timer.Stop() {
				select {
				case <-timer.C:
				default:
				}
			}
			timer.Reset(f.idleExit)
		}
	}
	graceful := true
	var failed error
wait:
	for {
		select {
		case <-cmd.Context().Done(): // SIGINT/SIGTERM
			break wait
		case failed = <-refused:
			graceful = false
			break wait
		case <-reachedMax:
			graceful = false // handlers past --max are blocked: cancel them now
			break wait
		case <-idle:
			break wait
		case <-activity:
			resetIdle()
		}
	}
	stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	if !graceful {
		cancel()
	} else {
		defer cancel()
	}
	return errors.Join(failed, sub.Stop(stopCtx))
}

// receive consumes message groups through GroupReceivers: the one group
// --key names, or with --next-group one free group after another. Each
// message is printed, then acked.
func (a *app) receive(ctx context.Context, c *shardq.Client, f consumeFlags, tenants []string) error {
	opts := shardq.ReceiverOptions{Name: f.name, Wait: f.wait, StartPosition: shardq.StartPosition(f.start), RequireReady: f.requireReady,
		DeadLetterExpired: f.deadLetterExpired}
	out := bufio.NewWriter(a.env.Stdout)
	s := &groupServer{a: a, f: f, enc: json.NewEncoder(out), out: out, last: time.Now()}
	if f.key != "" {
		r, err := c.AcceptGroup(ctx, shardq.GroupRef{Tenant: tenants[0], Topic: f.topic, ConsumerGroup: f.group}, f.key, &opts)
		if err != nil {
			return err
		}
		_, err = s.serve(ctx, r, 0)
		return err
	}
	for first := true; f.max == 0 || s.printed < f.max; first = false {
		if !first {
			// Later groups: wait for one until --idle-exit (or, without
			// it, until stopped), as long as the command runs.
			opts.Wait = time.Minute
			if f.idleExit > 0 {
				if opts.Wait = f.idleExit - time.Since(s.last); opts.Wait <= 0 {
					return nil // --idle-exit
				}
			}
		}
		r, err := c.AcceptNextGroup(ctx, shardq.NextGroupRequest{Tenants: tenants, Topic: f.topic, ConsumerGroup: f.group}, &opts)
		switch {
		case err != nil && ctx.Err() != nil:
			return nil // SIGINT/SIGTERM
		case errors.Is(err, shardq.ErrNoReadyGroup) && !first:
			continue // waited: look again (the idle exit decides)
		case err != nil:
			return err
		}
		done, err := s.serve(ctx, r, f.groupIdle)
		if err != nil || done {
			return err
		}
	}
	return nil
}

// groupServer prints and acks the messages of accepted groups.
type groupServer struct {
	a       *app
	f       consumeFlags
	enc     *json.Encoder
	out     *bufio.Writer
	printed int
	last    time.Time // when the group in hand was accepted or its last message acked, for --idle-exit
}

// serve delivers r's messages until --max, --idle-exit, a stop, or (when
// groupIdle > 0) groupIdle without a message in this group; it closes r.
// done says the command should end.
func (s *groupServer) serve(ctx context.Context, r *shardq.GroupReceiver, groupIdle time.Duration) (done bool, err error) {
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if cerr := r.Stop(cctx); cerr != nil {
			fmt.Fprintln(s.a.env.Stderr, "error:", cerr)
		}
	}()
	fmt.Fprintf(s.a.env.Stderr, "accepted message group %q of tenant %q\n", r.PartitionKey(), r.Tenant())
	// --idle-exit counts from holding the group: an accept may have
	// waited longer than --idle-exit (a frozen holder's lease running
	// out), and the heir must still deliver what waits.
	s.last = time.Now()
	for s.f.max == 0 || s.printed < s.f.max {
		wait := groupIdle
		if s.f.idleExit > 0 {
			left := s.f.idleExit - time.Since(s.last)
			if left <= 0 {
				return true, nil // --idle-exit
			}
			if wait == 0 || left < wait {
				wait = left
			}
		}
		rctx, cancel := ctx, context.CancelFunc(func() {})
		if wait > 0 {
			rctx, cancel = context.WithTimeout(ctx, wait)
		}
		var d *shardq.Delivery
		var ld *shardq.LargeDelivery
		if s.f.assemble {
			if ld, err = r.ReceiveLarge(rctx); err == nil {
				d = ld.Delivery
			}
		} else {
			d, err = r.Receive(rctx)
		}
		cancel()
		switch {
		case err != nil && ctx.Err() != nil:
			return true, nil // SIGINT/SIGTERM
		case errors.Is(err, context.DeadlineExceeded):
			// This group went quiet: the next one (--next-group), or the
			// end (--idle-exit).
			return s.f.idleExit > 0 && time.Since(s.last) >= s.f.idleExit, nil
		case errors.Is(err, shardq.ErrReceiverClosed) && groupIdle > 0:
			return false, nil // idle-released or lost: take the next group
		case err != nil:
			return true, err
		}
		switch {
		case ld != nil:
			err = s.writeWhole(ld)
		case s.f.outputDir != "":
			var line fileLine
			if line, err = writeFile(s.f.outputDir, d); err == nil {
				err = s.enc.Encode(line)
			}
		case d.IsLarge():
			return true, largeToStdout(d) // not acked: Stop releases it
		default:
			err = s.enc.Encode(newConsumeLine(d))
		}
		if errors.Is(err, shardq.ErrLargeCorrupt) {
			// A failed delivery: counted, retried after the backoff,
			// dead-lettered after the last attempt; never rewritten as is
			// by every later run.
			if nerr := r.Nack(ctx, d, err); nerr != nil {
				err = errors.Join(err, fmt.Errorf("nack: %w", nerr))
			}
		}
		if err != nil {
			return true, err
		}
		if err := s.out.Flush(); err != nil {
			return true, fmt.Errorf("write stdout: %w", err) // not acked: delivered again to the next owner
		}
		if err := r.Ack(ctx, d); err != nil {
			return true, err
		}
		s.printed++
		s.last = time.Now()
	}
	return true, nil // --max
}

// writeWhole writes a message's payload raw to stdout, reading a large
// one chunk by chunk, and one JSON line about it to stderr. A large
// message's size and SHA-256 are checked only once its last chunk is
// read, after the bytes before it went out: stderr says so before the
// first byte, and a mismatch fails with an error naming the message.
func (s *groupServer) writeWhole(ld *shardq.LargeDelivery) error {
	if ld.Chunks > 0 {
		fmt.Fprintf(s.a.env.Stderr, "writing large message %q of tenant %q topic %q (%d bytes, %d chunks) to stdout; its size and SHA-256 are checked at the end\n",
			ld.ID, ld.Tenant, ld.Topic, ld.Size, ld.Chunks)
	}
	sum := sha256.New()
	body := &readErr{r: ld.Body}
	n, err := io.Copy(io.MultiWriter(s.out, sum), body)
	switch {
	case body.err != nil:
		return fmt.Errorf("large message %q of tenant %q topic %q partition %q offset %d: %w", ld.ID, ld.Tenant, ld.Topic, ld.PartitionKey, ld.Offset, body.err)
	case err != nil:
		return fmt.Errorf("write stdout: %w", err) // not acked: delivered again
	}
	return json.NewEncoder(s.a.env.Stderr).Encode(map[string]any{"tenant": ld.Tenant, "topic": ld.Topic, "partition_key": ld.PartitionKey,
		"id": ld.ID, "offset": ld.Offset, "attempt": ld.Attempt, "headers": ld.Headers, "bytes": n, "chunks": ld.Chunks,
		"sha256": hex.EncodeToString(sum.Sum(nil))})
}

// readErr remembers its reader's error, to tell a failed read from a
// failed write in io.Copy.
type readErr struct {
	r   io.Reader
	err error
}

func (r *readErr) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if err != nil && err != io.EOF {
		r.err = err
	}
	return n, err
}
