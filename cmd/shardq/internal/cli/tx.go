// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/spf13/cobra"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/internal/ident"
)

func (a *app) txCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "tx", Short: "Inspect and resolve pending transactional (half) messages"}
	cmd.AddCommand(a.txListCmd(), a.txResolveCmd())
	return cmd
}

type halfLine struct {
	Tenant        string    `json:"tenant"`
	Topic         string    `json:"topic"`
	PartitionKey  string    `json:"partition_key"`
	ID            string    `json:"id"`
	ProducerGroup string    `json:"producer_group"`
	State         string    `json:"state"`
	AgeSeconds    float64   `json:"age_seconds"`
	Checks        int       `json:"checks"`
	NextCheckAt   time.Time `json:"next_check_at"`
	Overdue       bool      `json:"overdue"`
}

func (a *app) txListCmd() *cobra.Command {
	return a.listing("list", "List pending half messages with age, state and check count", nil,
		func(cmd *cobra.Command, s shardq.Scope, admin *shardq.Admin, asJSON bool) error {
			hs, err := admin.PendingHalves(cmd.Context(), s)
			if err != nil {
				return err
			}
			if n := len(hs); n > 0 {
				h := hs[n-1]
				a.nextPage(s, n, h.Tenant, h.Topic, h.PartitionKey, h.ID)
			}
			now := time.Now()
			var rows [][]string
			var objs []any
			var idle []string // producer groups with an overdue half message
			for _, h := range hs {
				l := halfLineOf(h, now)
				rows = append(rows, []string{l.Tenant, l.Topic, fmt.Sprintf("%q", l.PartitionKey), l.ID, l.ProducerGroup, l.State,
					time.Duration(l.AgeSeconds * float64(time.Second)).Round(time.Second).String(), fmt.Sprint(l.Checks), ts(l.NextCheckAt)})
				objs = append(objs, l)
				if l.Overdue && !slices.Contains(idle, l.ProducerGroup) {
					idle = append(idle, l.ProducerGroup)
				}
			}
			if err := a.table(asJSON, []string{"TENANT", "TOPIC", "KEY", "ID", "GROUP", "STATE", "AGE", "CHECKS", "NEXT CHECK"}, rows, objs); err != nil || asJSON {
				return err
			}
			for _, g := range idle {
				fmt.Fprintf(a.env.Stdout, "producer group %s: check-backs more than %s overdue; no producer of this group seems to be running\n",
					display(g), shardq.HalfOverdueAfter)
			}
			return nil
		})
}

func halfLineOf(h shardq.PendingHalf, now time.Time) halfLine {
	state := "unknown"
	switch {
	case h.ClaimOwner != "":
		state = "checking by " + h.ClaimOwner
	case h.Overdue:
		state = "check overdue"
	}
	return halfLine{Tenant: h.Tenant, Topic: h.Topic, PartitionKey: h.PartitionKey, ID: h.ID, ProducerGroup: h.ProducerGroup,
		State: state, AgeSeconds: now.Sub(h.CreatedAt).Seconds(), Checks: h.Checks, NextCheckAt: h.NextCheckAt, Overdue: h.Overdue}
}

func (a *app) txResolveCmd() *cobra.Command {
	var ref shardq.MessageRef
	cmd := &cobra.Command{
		Use:   "resolve --tenant T --topic X --key K --id ID (commit|rollback)",
		Short: "Commit or roll back one pending half message by hand",
		Args:  oneOf("decision", "commit", "rollback"),
		RunE: run(func(cmd *cobra.Command, args []string) error {
			for _, check := range []error{ident.Tenant(ref.Tenant), ident.Topic(ref.Topic), ident.PartitionKey(ref.PartitionKey), ident.MessageID(ref.ID)} {
				if check != nil {
					return check
				}
			}
			c, done, err := a.client()
			if err != nil {
				return err
			}
			defer done()
			if args[0] == "rollback" {
				err = c.Admin().RollbackHalf(cmd.Context(), ref)
				if err == nil {
					fmt.Fprintf(a.env.Stdout, "rolled back tenant=%s topic=%s key=%q id=%s\n", display(ref.Tenant), display(ref.Topic), ref.PartitionKey, display(ref.ID))
				}
			} else {
				var m *shardq.PublishResult
				m, err = c.Admin().CommitHalf(cmd.Context(), ref)
				if err == nil {
					fmt.Fprintf(a.env.Stdout, "committed offset=%d tenant=%s topic=%s key=%q id=%s\n", m.Offset, display(ref.Tenant), display(ref.Topic), ref.PartitionKey, display(ref.ID))
				}
			}
			if errors.Is(err, shardq.ErrTxResolved) {
				return fmt.Errorf("no pending half message tenant %q topic %q key %q id %q: %w", ref.Tenant, ref.Topic, ref.PartitionKey, ref.ID, err)
			}
			return err
		}),
	}
	fl := cmd.Flags()
	fl.StringVar(&ref.Tenant, "tenant", "", "tenant (required)")
	fl.StringVar(&ref.Topic, "topic", "", "topic (required)")
	fl.StringVar(&ref.PartitionKey, "key", "", "partition key (required; may be empty for ungrouped)")
	fl.StringVar(&ref.ID, "id", "", "message id (required)")
	for _, f := range []string{"tenant", "topic", "key", "id"} {
		cmd.MarkFlagRequired(f)
	}
	return cmd
}
