// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"bufio"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/internal/ident"
)

// adminTenant is `admin tenant`: a tenant's whole life.
func (a *app) adminTenant() *cobra.Command {
	cmd := &cobra.Command{Use: "tenant", Short: "One tenant's whole life: suspend, resume, export, delete everything it owns"}
	cmd.AddCommand(a.adminTenantSuspend(true), a.adminTenantSuspend(false), a.adminTenantLimits(), a.adminTenantExport(), a.adminTenantDelete())
	return cmd
}

// adminTenants is `admin tenants`: the tenants with data, a page at a time.
func (a *app) adminTenants() *cobra.Command {
	var after string
	var limit int
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "tenants [--after T] [--limit N] [--json]",
		Short: "List the tenants with partitions or a suspension, with their messages and stored bytes per topic",
		Long: "Lists up to --limit tenants after --after, in order, reading every shard for the names; then counts each\n" +
			"tenant's messages and stored bytes (what --max-bytes counts) per topic on its shard (a full count: keep pages small on large databases).",
		Args: cobra.NoArgs,
		RunE: run(func(cmd *cobra.Command, _ []string) error {
			c, done, err := a.client()
			if err != nil {
				return err
			}
			defer done()
			tenants, err := c.Admin().Tenants(cmd.Context(), after, limit)
			if err != nil {
				return err
			}
			var rows [][]string
			var objs []any
			for _, t := range tenants {
				state := "active"
				if !t.SuspendedAt.IsZero() {
					state = "suspended since " + ts(t.SuspendedAt)
				}
				rows = append(rows, []string{t.Tenant, state, "*", fmt.Sprint(t.Messages), fmt.Sprint(t.Bytes)})
				topics := []any{}
				for _, u := range t.Topics {
					rows = append(rows, []string{t.Tenant, state, u.Topic, fmt.Sprint(u.Messages), fmt.Sprint(u.Bytes)})
					topics = append(topics, map[string]any{"topic": u.Topic, "messages": u.Messages, "partitions": u.Partitions, "bytes": u.Bytes})
				}
				o := map[string]any{"tenant": t.Tenant, "messages": t.Messages, "partitions": t.Partitions, "bytes": t.Bytes, "topics": topics}
				if t.Limits != (shardq.TenantLimits{}) {
					o["limits"] = limitsJSON(t.Limits)
				}
				if !t.SuspendedAt.IsZero() {
					o["suspended_at"] = t.SuspendedAt.UTC()
				}
				objs = append(objs, o)
			}
			return a.table(asJSON, []string{"TENANT", "STATE", "TOPIC", "MESSAGES", "BYTES"}, rows, objs)
		}),
	}
	fl := cmd.Flags()
	fl.StringVar(&after, "after", "", "list the tenants after this one (the last of the previous page)")
	fl.IntVar(&limit, "limit", shardq.DefaultTenantPage, "tenants per page")
	fl.BoolVar(&asJSON, "json", false, "print one JSON object per tenant")
	return cmd
}

func (a *app) adminTenantSuspend(suspend bool) *cobra.Command {
	use, short := "resume", "End a tenant's suspension: its publishers and consumers work again"
	if suspend {
		use, short = "suspend", "Suspend a tenant: its publishes and receives fail, its members release its partitions; nothing stored changes"
	}
	var tenant string
	cmd := &cobra.Command{
		Use:   use + " --tenant T",
		Short: short,
		Long: short + ".\nOther processes see it within their TenantSettingsTTL (1 s by default) and members at their next\n" +
			"rebalance tick (DiscoveryInterval).",
		Args: cobra.NoArgs,
		RunE: run(func(cmd *cobra.Command, _ []string) error {
			if err := ident.Tenant(tenant); err != nil {
				return err
			}
			c, done, err := a.client()
			if err != nil {
				return err
			}
			defer done()
			set := c.Admin().ResumeTenant
			if suspend {
				set = c.Admin().SuspendTenant
			}
			if err := set(cmd.Context(), tenant); err != nil {
				return err
			}
			fmt.Fprintf(a.env.Stdout, "%s tenant %s\n", map[bool]string{true: "suspended", false: "resumed"}[suspend], display(tenant))
			return nil
		}),
	}
	cmd.Flags().StringVar(&tenant, "tenant", "", "tenant (required)")
	cmd.MarkFlagRequired("tenant")
	return cmd
}

// limitFlags are `admin tenant limits`' flags, in TenantLimits' order.
var limitFlags = []struct{ name, usage string }{
	{"publish-rate", "messages per second, per client process (0: no limit)"},
	{"publish-byte-rate", "message bytes (payload, headers, key, id) per second, per client process (0: no limit)"},
	{"max-messages", "messages stored (0: no limit)"},
	{"max-bytes", "bytes stored: messages (payload, headers, key, id), group states, deferred rows (0: no limit)"},
	{"max-partitions", "partitions with a message (0: no limit)"},
}

func limitFields(l *shardq.TenantLimits) []*int64 {
	return []*int64{&l.PublishRate, &l.PublishByteRate, &l.MaxMessages, &l.MaxBytes, &l.MaxPartitions}
}

func limitsJSON(l shardq.TenantLimits) map[string]any {
	o := map[string]any{}
	for i, f := range limitFields(&l) {
		o[strings.ReplaceAll(limitFlags[i].name, "-", "_")] = *f
	}
	o["min_retention"] = l.Retention.MinRetention.String()
	o["max_retention"] = l.Retention.MaxRetention.String()
	return o
}

// adminTenantLimits is `admin tenant limits`: read or change a tenant's
// quotas and retention.
func (a *app) adminTenantLimits() *cobra.Command {
	var tenant string
	var clear, asJSON bool
	var vals [5]int64
	var minRet, maxRet time.Duration
	cmd := &cobra.Command{
		Use:     "limits --tenant T [--publish-rate N] [--publish-byte-rate N] [--max-messages N] [--max-bytes N] [--max-partitions N] [--min-retention D] [--max-retention D] [--clear]",
		Aliases: []string{"quota"},
		Short:   "Show or set a tenant's quotas and retention",
		Long: "Without a limit flag, prints the tenant's limits. Each flag given sets that limit (0 removes it) and keeps the\n" +
			"others; --clear removes them all first. Publishing over a quota fails with ErrQuotaExceeded (HTTP 429 for\n" +
			"rates, 409 for what is stored); rates hold per client process, and what is stored is measured at most\n" +
			"TenantUsageInterval (30 s) ago (docs/tenants.md). Retention is the tenant's default, between the cleaner's\n" +
			"default and a topic's own.",
		Args: cobra.NoArgs,
		RunE: run(func(cmd *cobra.Command, _ []string) error {
			if err := ident.Tenant(tenant); err != nil {
				return err
			}
			c, done, err := a.client()
			if err != nil {
				return err
			}
			defer done()
			l, err := c.Admin().TenantLimits(cmd.Context(), tenant)
			if err != nil {
				return err
			}
			changed := clear
			if clear {
				l = shardq.TenantLimits{}
			}
			fl := cmd.Flags()
			for i, f := range limitFields(&l) {
				if fl.Changed(limitFlags[i].name) {
					*f, changed = vals[i], true
				}
			}
			if fl.Changed("min-retention") {
				l.Retention.MinRetention, changed = minRet, true
			}
			if fl.Changed("max-retention") {
				l.Retention.MaxRetention, changed = maxRet, true
			}
			if changed {
				if err := c.Admin().SetTenantLimits(cmd.Context(), tenant, l); err != nil {
					return err
				}
			}
			var rows [][]string
			for i, f := range limitFields(&l) {
				rows = append(rows, []string{limitFlags[i].name, fmt.Sprint(*f)})
			}
			rows = append(rows, []string{"min-retention", l.Retention.MinRetention.String()}, []string{"max-retention", l.Retention.MaxRetention.String()})
			return a.table(asJSON, []string{"LIMIT", "VALUE"}, rows, []any{limitsJSON(l)})
		}),
	}
	fl := cmd.Flags()
	fl.StringVar(&tenant, "tenant", "", "tenant (required)")
	cmd.MarkFlagRequired("tenant")
	for i, f := range limitFlags {
		fl.Int64Var(&vals[i], f.name, 0, f.usage)
	}
	fl.DurationVar(&minRet, "min-retention", 0, "a message every group passed is deleted once this old (0: the cleaner's default)")
	fl.DurationVar(&maxRet, "max-retention", 0, "any message is deleted once this old (0: the cleaner's default)")
	fl.BoolVar(&clear, "clear", false, "remove every limit first")
	fl.BoolVar(&asJSON, "json", false, "print the limits as one JSON object")
	// Without them the command only reads.
	for _, f := range limitFlags {
		cmdLineOnly(fl, f.name)
	}
	cmdLineOnly(fl, "min-retention", "max-retention", "clear")
	return cmd
}

func (a *app) adminTenantExport() *cobra.Command {
	var tenant, after, output string
	var batch int
	cmd := &cobra.Command{
		Use:   "export --tenant T [--output FILE] [--after CURSOR] [--batch N]",
		Short: "Write a tenant's consumer groups, cursors, message-group states and messages as JSON lines",
		Long: "Writes one JSON object a line (docs/tenants.md): the tenant, its consumer groups, cursors and message-group\n" +
			"states, its messages in (topic, partition key, offset) order, and an \"end\" line last. An export cut short\n" +
			"has no end line: run it again with --after set to the \"cursor\" of its last message line to write the rest.\n" +
			"Each statement reads at most --batch rows, routed to the tenant's shard.",
		Args: cobra.NoArgs,
		RunE: run(func(cmd *cobra.Command, _ []string) error {
			if err := ident.Tenant(tenant); err != nil {
				return err
			}
			if batch < 1 || batch > shardq.MaxPageLimit {
				return usagef("--batch %d: must be between 1 and %d", batch, shardq.MaxPageLimit)
			}
			c, done, err := a.client()
			if err != nil {
				return err
			}
			defer done()
			w := a.env.Stdout
			if output != "" && output != "-" {
				// A resumed export appends to the part already written.
				flags := os.O_WRONLY | os.O_CREATE | os.O_TRUNC
				if after != "" {
					flags = os.O_WRONLY | os.O_CREATE | os.O_APPEND
				}
				f, err := os.OpenFile(output, flags, 0o644)
				if err != nil {
					return err
				}
				defer f.Close()
				w = f
			}
			bw := bufio.NewWriter(w)
			p := a.progress("rows exported", false)
			n, err := c.Admin().WithProgress(p.add).ExportTenant(cmd.Context(), tenant, bw, shardq.ExportOptions{After: after, BatchSize: batch})
			if ferr := bw.Flush(); err == nil {
				err = ferr
			}
			p.done(fmt.Sprintf("exported %d messages", n))
			if err != nil {
				return err
			}
			if f, ok := w.(*os.File); ok && w != a.env.Stdout {
				if err := f.Close(); err != nil {
					return err
				}
				fmt.Fprintf(a.env.Stdout, "exported %d messages of tenant %s to %s\n", n, display(tenant), output)
			}
			return nil
		}),
	}
	fl := cmd.Flags()
	fl.StringVar(&tenant, "tenant", "", "tenant (required)")
	fl.StringVar(&output, "output", "", "file to write (default: standard output)")
	fl.StringVar(&after, "after", "", "resume after the message line with this cursor")
	fl.IntVar(&batch, "batch", shardq.DefaultExportBatch, "rows read per statement")
	cmdLineOnly(fl, "output") // it replaces the file
	cmd.MarkFlagRequired("tenant")
	return cmd
}

func (a *app) adminTenantDelete() *cobra.Command {
	var tenant string
	var execute, force, asJSON bool
	var batch int
	var staleAfter time.Duration
	cmd := &cobra.Command{
		Use:   "delete --tenant T [--execute] [--force] [--batch N]",
		Short: "Preview (or, with --execute, make) the deletion of every row a tenant owns, in every table",
		Long: "Counts the tenant's rows in each table (messages, head rows, cursors, leases, members, retry bookkeeping,\n" +
			"ungrouped claims, message-group state, half messages, tokens, the group registry) and changes nothing.\n" +
			"With --execute it deletes them, --batch rows a statement (each routed to the tenant's shard), so that\n" +
			"other tenants keep their latency; run it again after a crash or an interrupt and it deletes the rest.\n" +
			"Refused while a member's heartbeat is within --stale-after or a lease is unexpired, unless --force (their\n" +
			"leases go). Stop the tenant's publishers and members first.",
		Args: cobra.NoArgs,
		RunE: run(func(cmd *cobra.Command, _ []string) error {
			if err := ident.Tenant(tenant); err != nil {
				return err
			}
			if batch < 1 || batch > shardq.MaxPageLimit {
				return usagef("--batch %d: must be between 1 and %d", batch, shardq.MaxPageLimit)
			}
			c, done, err := a.client()
			if err != nil {
				return err
			}
			defer done()
			p := a.progress("rows deleted", asJSON)
			rows, err := c.Admin().WithProgress(p.add).DeleteTenant(cmd.Context(), tenant,
				shardq.DeleteTenantOptions{Apply: execute, Force: force, StaleAfter: staleAfter, BatchSize: batch})
			if execute {
				p.done(fmt.Sprintf("deleted %d rows", p.n))
			}
			if err != nil {
				return err
			}
			var out [][]string
			var objs []any
			var total int64
			for _, r := range rows {
				total += r.Rows
				out = append(out, []string{r.Table, fmt.Sprint(r.Rows)})
				objs = append(objs, map[string]any{"tenant": tenant, "table": r.Table, "rows": r.Rows, "deleted": execute})
			}
			if err := a.table(asJSON, []string{"TABLE", "ROWS"}, out, objs); err != nil || asJSON {
				return err
			}
			if !execute {
				fmt.Fprintf(a.env.Stdout, "preview: nothing changed; run again with --execute to delete the %d rows of tenant %s\n", total, display(tenant))
				return nil
			}
			fmt.Fprintf(a.env.Stdout, "deleted %d rows of tenant %s\n", total, display(tenant))
			return nil
		}),
	}
	fl := cmd.Flags()
	fl.StringVar(&tenant, "tenant", "", "tenant (required)")
	fl.BoolVar(&execute, "execute", false, "delete (without it: a preview that changes nothing)")
	fl.BoolVar(&force, "force", false, "delete even while members are live, voiding their leases")
	fl.IntVar(&batch, "batch", shardq.DefaultTenantBatch, "rows deleted per statement")
	durationFlag(fl, &staleAfter, "stale-after", 9*time.Second, "a heartbeat older than this is not live")
	fl.BoolVar(&asJSON, "json", false, "print one JSON object per table")
	cmdLineOnly(fl, "execute", "force", "stale-after")
	cmd.MarkFlagRequired("tenant")
	return cmd
}
