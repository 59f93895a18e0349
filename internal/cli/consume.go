package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/internal/ident"
)

type consumeFlags struct {
	topic, group, name string
	tenants            []string
	max                int
	idleExit           time.Duration
}

func (a *app) consumeCmd() *cobra.Command {
	var f consumeFlags
	cmd := &cobra.Command{
		Use:   "consume --topic X --group G [--tenant T ...] [--max N] [--idle-exit D] [--name S]",
		Short: "Consume a topic as a member of a consumer group, printing one JSON line per message",
		Long: "Joins consumer group G on topic X for the tenants given by --tenant (repeatable) or MQ_TENANTS\n" +
			"(comma-separated). Each message is printed as one JSON line and flushed before it is acked:\n" +
			`{"tenant","topic","partition_key","offset","id","attempt","headers","payload"}` + "\n" +
			"(payload as text when it is valid UTF-8, otherwise base64 in \"payload_base64\").\n" +
			"Exits 0 after --max messages or after --idle-exit without one; SIGINT/SIGTERM stop it gracefully.",
		Args: cobra.NoArgs,
		RunE: run(func(cmd *cobra.Command, _ []string) error { return a.consume(cmd, f) }),
	}
	fl := cmd.Flags()
	fl.StringVar(&f.topic, "topic", "", "topic (required)")
	fl.StringVar(&f.group, "group", "", "consumer group (required)")
	fl.StringArrayVar(&f.tenants, "tenant", nil, "tenant to serve (repeatable; default MQ_TENANTS)")
	fl.IntVar(&f.max, "max", 0, "exit after this many messages (0: no limit)")
	fl.DurationVar(&f.idleExit, "idle-exit", 0, "exit after this long without a message (0: never)")
	fl.StringVar(&f.name, "name", "", "subscriber name (default host-pid-random)")
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

func (a *app) consume(cmd *cobra.Command, f consumeFlags) error {
	tenants := f.tenants
	if len(tenants) == 0 {
		ts, err := ident.TenantList("MQ_TENANTS", a.env.Getenv("MQ_TENANTS"))
		if err != nil {
			return usagef("no tenants: give --tenant or MQ_TENANTS (%v)", err)
		}
		tenants = ts
	}
	if f.max < 0 {
		return usagef("--max must not be negative")
	}
	c, done, err := a.client()
	if err != nil {
		return err
	}
	defer done()

	out := bufio.NewWriter(a.env.Stdout)
	var mu sync.Mutex
	printed := 0
	reachedMax := make(chan struct{})
	activity := make(chan struct{}, 1)
	enc := json.NewEncoder(out)
	handler := func(ctx context.Context, d *shardq.Delivery) error {
		mu.Lock()
		if f.max > 0 && printed >= f.max {
			mu.Unlock()
			<-ctx.Done() // not printed, not acked: the stop cancels it
			return ctx.Err()
		}
		line := consumeLine{Tenant: d.Tenant, Topic: d.Topic, PartitionKey: d.PartitionKey, Offset: d.Offset, ID: d.ID,
			Attempt: d.Attempt, Headers: d.Headers}
		if utf8.Valid(d.Payload) {
			p := string(d.Payload)
			line.Payload = &p
		} else {
			line.PayloadBase64 = d.Payload
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
	sub, err := c.Subscribe(cmd.Context(), shardq.SubscriberConfig{
		ConsumerGroup: f.group, Topic: f.topic, Tenants: tenants, Name: f.name, Handler: handler,
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
wait:
	for {
		select {
		case <-cmd.Context().Done(): // SIGINT/SIGTERM
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
	return sub.Stop(stopCtx)
}
