// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/internal/ident"
	"github.com/spf13/cobra"
)

// adminDeferred lists a group's deferred messages and receives them by
// offset (docs/consumers.md, "Deferral").
func (a *app) adminDeferred() *cobra.Command {
	cmd := &cobra.Command{Use: "deferred", Short: "A consumer group's deferred messages (Delivery.Defer): list them, receive them by offset"}
	var g shardq.GroupRef
	groupFlags := func(c *cobra.Command) {
		fl := c.Flags()
		fl.StringVar(&g.Tenant, "tenant", "", "tenant (required)")
		fl.StringVar(&g.Topic, "topic", "", "topic (required)")
		fl.StringVar(&g.ConsumerGroup, "group", "", "consumer group (required)")
		for _, f := range []string{"tenant", "topic", "group"} {
			c.MarkFlagRequired(f)
		}
	}
	checkGroup := func() error {
		return firstErr(ident.Tenant(g.Tenant), ident.Topic(g.Topic), ident.ConsumerGroup(g.ConsumerGroup))
	}

	var after int64
	var limit int
	var asJSON bool
	list := &cobra.Command{Use: "list --tenant T --topic X --group G [--after OFFSET] [--limit N] [--json]",
		Short: "List the group's deferred messages in offset order",
		Args:  cobra.NoArgs, RunE: run(func(cmd *cobra.Command, _ []string) error {
			if err := checkGroup(); err != nil {
				return err
			}
			c, done, err := a.client()
			if err != nil {
				return err
			}
			defer done()
			ds, err := c.Admin().Deferred(cmd.Context(), g, after, limit)
			if err != nil {
				return err
			}
			var rows [][]string
			var objs []any
			for _, d := range ds {
				rows = append(rows, []string{fmt.Sprint(d.Offset), fmt.Sprintf("%q", d.PartitionKey), d.ID, ts(d.DeferredAt), fmt.Sprint(d.Attempts), cmp.Or(d.HeldBy, "-")})
				objs = append(objs, map[string]any{"tenant": g.Tenant, "topic": g.Topic, "group": g.ConsumerGroup, "offset": d.Offset, "partition_key": d.PartitionKey,
					"id": d.ID, "created_at": d.CreatedAt, "deferred_at": d.DeferredAt, "attempts": d.Attempts, "held_by": d.HeldBy})
			}
			if n := len(ds); n == limit {
				fmt.Fprintf(a.env.Stderr, "more may follow: --after %d\n", ds[n-1].Offset)
			}
			return a.table(asJSON, []string{"OFFSET", "KEY", "ID", "DEFERRED", "ATTEMPTS", "HELD BY"}, rows, objs)
		})}
	groupFlags(list)
	list.Flags().Int64Var(&after, "after", 0, "list offsets above this one")
	list.Flags().IntVar(&limit, "limit", 100, fmt.Sprintf("at most this many (1 to %d)", shardq.MaxPageLimit))
	list.Flags().BoolVar(&asJSON, "json", false, "JSON lines")

	var offsets []int64
	var ack bool
	var deadLetter string
	var rq shardq.DeferredRequest
	receive := &cobra.Command{Use: "receive --tenant T --topic X --group G --offset N[,N...] [--ack | --dead-letter REASON]",
		Short: "Receive deferred messages by offset and print them (JSON lines); --ack settles them, --dead-letter moves them to the dead-letter topic, otherwise they are given back, deferred still",
		Args:  cobra.NoArgs, RunE: run(func(cmd *cobra.Command, _ []string) error {
			if ack && cmd.Flags().Changed("dead-letter") {
				return usagef("give --ack or --dead-letter, not both")
			}
			rq.Tenant, rq.Topic, rq.ConsumerGroup, rq.Offsets = g.Tenant, g.Topic, g.ConsumerGroup, offsets
			c, done, err := a.client()
			if err != nil {
				return err
			}
			defer done()
			ds, err := c.ReceiveDeferred(cmd.Context(), rq)
			if err != nil {
				return err
			}
			enc := json.NewEncoder(a.env.Stdout)
			for _, d := range ds {
				out := map[string]any{"tenant": d.Tenant, "topic": d.Topic, "partition_key": d.PartitionKey, "id": d.ID, "offset": d.Offset,
					"attempt": d.Attempt, "headers": d.Headers, "created_at": d.CreatedAt}
				if utf8.Valid(d.Payload) {
					out["payload"] = string(d.Payload)
				} else {
					out["payload_base64"] = d.Payload
				}
				if err := enc.Encode(out); err != nil {
					return err
				}
			}
			var errs []error
			switch {
			case ack:
				errs = append(errs, c.AckDeferred(cmd.Context(), ds...))
			case cmd.Flags().Changed("dead-letter"):
				for _, d := range ds {
					errs = append(errs, c.DeadLetterDeferred(cmd.Context(), d, errors.New(deadLetter)))
				}
			default:
				for _, d := range ds {
					errs = append(errs, c.NackDeferred(cmd.Context(), d, shardq.NackOptions{}))
				}
			}
			if len(ds) < len(offsets) {
				fmt.Fprintf(a.env.Stderr, "received %d of %d offsets (the others are not deferred, gone, or held elsewhere)\n", len(ds), len(offsets))
			}
			return errors.Join(errs...)
		})}
	groupFlags(receive)
	fl := receive.Flags()
	fl.Int64SliceVar(&offsets, "offset", nil, "offsets of deferred messages (required; repeat or comma-separate)")
	fl.BoolVar(&ack, "ack", false, "settle them: they are no longer deferred")
	fl.StringVar(&deadLetter, "dead-letter", "", "move them to the dead-letter topic with this reason")
	fl.DurationVar(&rq.Visibility, "visibility", shardq.DefaultVisibilityTimeout, "how long they are held while printed")
	fl.StringVar(&rq.DLQSuffix, "suffix", shardq.DefaultDLQSuffix, "dead-letter topic suffix")
	cmdLineOnly(fl, "ack", "dead-letter") // without them the messages are given back, deferred still
	receive.MarkFlagRequired("offset")
	cmd.AddCommand(list, receive)
	return cmd
}
