package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/shardq/shardq/driver"
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
}

func (a *app) txListCmd() *cobra.Command {
	var tenants []string
	var all, asJSON bool
	cmd := &cobra.Command{
		Use:   "list (--tenant T ... | --all-tenants)",
		Short: "List pending half messages with age, state and check count",
		Args:  cobra.NoArgs,
		RunE: run(func(cmd *cobra.Command, _ []string) error {
			if (len(tenants) > 0) == all {
				return usagef("give exactly one of --tenant (repeatable) or --all-tenants")
			}
			for _, t := range tenants {
				if err := ident.Tenant(t); err != nil {
					return err
				}
			}
			c, done, err := a.client()
			if err != nil {
				return err
			}
			defer done()
			hs, err := c.Driver().ListHalves(cmd.Context(), tenants, all)
			if err != nil {
				return err
			}
			now := time.Now()
			if asJSON {
				enc := json.NewEncoder(a.env.Stdout)
				for _, h := range hs {
					if err := enc.Encode(halfLineOf(h, now)); err != nil {
						return err
					}
				}
				return nil
			}
			w := tabwriter.NewWriter(a.env.Stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintln(w, "TENANT\tTOPIC\tKEY\tID\tGROUP\tSTATE\tAGE\tCHECKS\tNEXT CHECK")
			for _, h := range hs {
				l := halfLineOf(h, now)
				fmt.Fprintf(w, "%s\t%s\t%q\t%s\t%s\t%s\t%s\t%d\t%s\n", l.Tenant, l.Topic, l.PartitionKey, l.ID, l.ProducerGroup, l.State,
					time.Duration(l.AgeSeconds*float64(time.Second)).Round(time.Second), l.Checks, l.NextCheckAt.Format(time.RFC3339))
			}
			return w.Flush()
		}),
	}
	cmd.Flags().StringArrayVar(&tenants, "tenant", nil, "tenant (repeatable)")
	cmd.Flags().BoolVar(&all, "all-tenants", false, "list every tenant (an explicit fleet-wide read)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "one JSON object per line")
	return cmd
}

func halfLineOf(h driver.HalfMessage, now time.Time) halfLine {
	state := "unknown"
	if h.ClaimOwner != "" {
		state = "checking by " + h.ClaimOwner
	}
	return halfLine{Tenant: h.Tenant, Topic: h.Topic, PartitionKey: h.PartitionKey, ID: h.ID, ProducerGroup: h.ProducerGroup,
		State: state, AgeSeconds: now.Sub(h.CreatedAt).Seconds(), Checks: h.Checks, NextCheckAt: h.NextCheckAt}
}

func (a *app) txResolveCmd() *cobra.Command {
	var ref driver.MessageRef
	cmd := &cobra.Command{
		Use:   "resolve --tenant T --topic X --key K --id ID (commit|rollback)",
		Short: "Commit or roll back one pending half message by hand",
		Args:  cobra.ExactArgs(1),
		RunE: run(func(cmd *cobra.Command, args []string) error {
			if args[0] != "commit" && args[0] != "rollback" {
				return usagef("want commit or rollback, got %q", args[0])
			}
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
				err = c.Driver().RollbackHalf(cmd.Context(), ref, 0)
				if err == nil {
					fmt.Fprintf(a.env.Stdout, "rolled back tenant=%s topic=%s key=%q id=%s\n", ref.Tenant, ref.Topic, ref.PartitionKey, ref.ID)
				}
			} else {
				var m *driver.InsertMessage
				m, err = c.Driver().CommitHalf(cmd.Context(), ref, 0)
				if err == nil {
					fmt.Fprintf(a.env.Stdout, "committed offset=%d tenant=%s topic=%s key=%q id=%s\n", m.Offset, ref.Tenant, ref.Topic, ref.PartitionKey, ref.ID)
				}
			}
			if errors.Is(err, driver.ErrHalfResolved) {
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
