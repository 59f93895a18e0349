// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/internal/ident"
)

// scopeFlags are --tenant (repeatable) and --all-tenants (exactly one),
// and the page: --limit rows after the sort key --after.
type scopeFlags struct {
	tenants []string
	all     bool
	limit   int
	after   string
}

func (f *scopeFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringArrayVar(&f.tenants, "tenant", nil, "tenant (repeatable)")
	cmd.Flags().BoolVar(&f.all, "all-tenants", false, "every tenant (an explicit fleet-wide read)")
	countFlag(cmd.Flags(), &f.limit, "limit", shardq.DefaultPageLimit, fmt.Sprintf("most rows to list (at most %d)", shardq.MaxPageLimit))
	cmd.Flags().StringVar(&f.after, "after", "", `list after this sort key, a JSON array of strings (printed as "next page" when a page is full)`)
	cmdLineOnly(cmd.Flags(), "all-tenants")
}

func (f scopeFlags) scope() (shardq.Scope, error) {
	if (len(f.tenants) > 0) == f.all {
		return shardq.Scope{}, usagef("give exactly one of --tenant T (repeatable) or --all-tenants")
	}
	if !f.all {
		if err := ident.Tenants("--tenant", f.tenants); err != nil {
			return shardq.Scope{}, err
		}
	}
	if f.limit < 1 || f.limit > shardq.MaxPageLimit {
		return shardq.Scope{}, usagef("--limit %d: want 1 to %d", f.limit, shardq.MaxPageLimit)
	}
	after, err := decodeAfter(f.after)
	if err != nil {
		return shardq.Scope{}, usageError{err}
	}
	return shardq.Scope{Tenants: f.tenants, AllTenants: f.all, Limit: f.limit, After: after}, nil
}

// maxAfterValues is the longest sort key of a listing.
const maxAfterValues = 4

// decodeAfter reads --after: a JSON array of at most four strings ("" for
// none). The values reach SQL as bound parameters only.
func decodeAfter(s string) ([]string, error) {
	if s == "" {
		return nil, nil
	}
	var after []string
	if err := json.Unmarshal([]byte(s), &after); err != nil {
		return nil, fmt.Errorf("--after %s: want a JSON array of strings, like [\"acme\",\"orders\"]", display(s))
	}
	if len(after) == 0 || len(after) > maxAfterValues {
		return nil, fmt.Errorf("--after: %d values, want 1 to %d", len(after), maxAfterValues)
	}
	for i, v := range after {
		if !utf8.ValidString(v) || len(v) > 4*ident.MaxKeyChars {
			return nil, fmt.Errorf("--after: value %d is not a valid identifier", i+1)
		}
	}
	return after, nil
}

// nextPage tells, on stderr, how to read the page after a full one whose
// last row has the sort key last.
func (a *app) nextPage(s shardq.Scope, n int, last ...string) {
	if n < s.Limit || n == 0 {
		return
	}
	b, _ := json.Marshal(last) // strings: cannot fail
	fmt.Fprintf(a.env.Stderr, "next page: --after %s\n", display(string(b)))
}

// refFlags are the four flags of a message's full identity.
func refFlags(cmd *cobra.Command, ref *shardq.MessageRef) {
	fl := cmd.Flags()
	fl.StringVar(&ref.Tenant, "tenant", "", "tenant (required)")
	fl.StringVar(&ref.Topic, "topic", "", "topic (required)")
	fl.StringVar(&ref.PartitionKey, "key", "", "partition key (required; \"\" for ungrouped)")
	fl.StringVar(&ref.ID, "id", "", "message id (required)")
	for _, f := range []string{"tenant", "topic", "key", "id"} {
		cmd.MarkFlagRequired(f)
	}
}

// table prints rows as an aligned table, or as JSON lines with asJSON.
func (a *app) table(asJSON bool, header []string, rows [][]string, objs []any) error {
	if asJSON {
		enc := json.NewEncoder(a.env.Stdout)
		for _, o := range objs {
			if err := enc.Encode(o); err != nil {
				return err
			}
		}
		return nil
	}
	w := tabwriter.NewWriter(a.env.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, strings.Join(header, "\t"))
	for _, r := range rows {
		cells := make([]string, len(r))
		for i, c := range r {
			cells[i] = display(c) // a tab or newline in an identifier would forge a cell or a row
		}
		fmt.Fprintln(w, strings.Join(cells, "\t"))
	}
	return w.Flush()
}

func ts(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func (a *app) adminCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "admin", Short: "Operator commands: listings, messages by identity, offsets (all scoped by tenant)"}
	cmd.AddCommand(a.adminTopics(), a.adminOffsets(), a.adminGroups(), a.adminLeases(false), a.adminLeases(true), a.adminSubscribers(),
		a.adminInspect(), a.adminDelete(), a.adminDLQ(), a.adminReset(), a.adminRetention(), a.adminPause(true), a.adminPause(false), a.adminMessages(), a.adminTenants(), a.adminTenant(), a.adminDeferred())
	return cmd
}

func (a *app) adminRetention() *cobra.Command {
	cmd := &cobra.Command{Use: "retention", Short: "Delete consumed and expired messages"}
	var cfg shardq.RetentionConfig
	run := a.listing("run", "Run one retention pass and report the rows deleted", func(cmd *cobra.Command) {
		fl := cmd.Flags()
		positiveDurationFlag(fl, &cfg.Default.MinRetention, "min", shardq.DefaultMinRetention, "keep messages every group has passed this long")
		positiveDurationFlag(fl, &cfg.Default.MaxRetention, "max", shardq.DefaultMaxRetention, "delete any message older than this")
		positiveDurationFlag(fl, &cfg.DeadLetters.MaxRetention, "dlq-max", shardq.DefaultDeadLetterRetention, "delete any dead letter older than this")
		countFlag(fl, &cfg.BatchSize, "batch", 1000, "rows per DELETE statement")
		durationFlag(fl, &cfg.PartitionIdle, "partition-idle", time.Hour, "remove a drained partition (no message, no live lease) once no publish touched it this long")
		durationFlag(fl, &cfg.DedupWindow, "dedup-window", shardq.DefaultDedupWindow, "never delete a message younger than this, whatever --min and --max say: its id stays a duplicate (0: none)")
		// What decides which messages are deleted, and the floor under it
		// (invariant 5): never from a stray variable.
		cmdLineOnly(fl, "min", "max", "dlq-max", "partition-idle", "dedup-window")
	}, func(cmd *cobra.Command, s shardq.Scope, admin *shardq.Admin, asJSON bool) error {
		if cfg.DedupWindow == 0 {
			cfg.DedupWindow = -1 // the flag's 0 is none, the library's the default
		}
		prog := a.progress("deleted", asJSON)
		rep, err := admin.WithProgress(prog.add).RunRetention(cmd.Context(), s, cfg)
		prog.done(fmt.Sprintf("deleted %d messages", rep.Deleted))
		if errors.Is(err, shardq.ErrInvalid) {
			return err // refused before any pass: nothing to report
		}
		if asJSON {
			json.NewEncoder(a.env.Stdout).Encode(map[string]any{"deleted": rep.Deleted, "removed_partitions": rep.Removed, "topics": rep.Topics, "skipped": rep.Skipped})
		} else {
			fmt.Fprintf(a.env.Stdout, "deleted %d messages and removed %d drained partitions in %d topics (%d skipped: another cleaner holds them)\n",
				rep.Deleted, rep.Removed, rep.Topics, rep.Skipped)
		}
		return err
	})
	cmd.AddCommand(run)
	return cmd
}

// listing builds a scoped listing command.
func (a *app) listing(use, short string, extra func(*cobra.Command), body func(cmd *cobra.Command, s shardq.Scope, admin *shardq.Admin, asJSON bool) error) *cobra.Command {
	var sf scopeFlags
	var asJSON bool
	cmd := &cobra.Command{Use: use + " (--tenant T ... | --all-tenants)", Short: short, Args: cobra.NoArgs,
		RunE: run(func(cmd *cobra.Command, _ []string) error {
			s, err := sf.scope()
			if err != nil {
				return err
			}
			c, done, err := a.client()
			if err != nil {
				return err
			}
			defer done()
			return body(cmd, s, c.Admin(), asJSON)
		})}
	sf.add(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "one JSON object per line")
	if extra != nil {
		extra(cmd)
	}
	return cmd
}

func (a *app) adminTopics() *cobra.Command {
	return a.listing("topics", "Topics with their partition counts and highest head offset", nil,
		func(cmd *cobra.Command, s shardq.Scope, admin *shardq.Admin, asJSON bool) error {
			topics, err := admin.Topics(cmd.Context(), s)
			if err != nil {
				return err
			}
			var rows [][]string
			var objs []any
			for _, t := range topics {
				rows = append(rows, []string{t.Tenant, t.Topic, fmt.Sprint(t.Partitions), fmt.Sprint(t.HeadOffset)})
				objs = append(objs, map[string]any{"tenant": t.Tenant, "topic": t.Topic, "partitions": t.Partitions, "head_offset": t.HeadOffset})
			}
			if n := len(topics); n > 0 {
				a.nextPage(s, n, topics[n-1].Tenant, topics[n-1].Topic)
			}
			return a.table(asJSON, []string{"TENANT", "TOPIC", "PARTITIONS", "HEAD"}, rows, objs)
		})
}

func (a *app) adminOffsets() *cobra.Command {
	var group string
	return a.listing("offsets", "Per partition and consumer group: head, committed cursor, lag, oldest unconsumed message's age "+
		"(with --group, also the partitions the group has no cursor for yet)",
		func(cmd *cobra.Command) {
			cmd.Flags().StringVar(&group, "group", "", "only this consumer group")
			cmd.PreRunE = func(*cobra.Command, []string) error {
				if group == "" {
					return nil
				}
				return ident.ConsumerGroup(group)
			}
		},
		func(cmd *cobra.Command, s shardq.Scope, admin *shardq.Admin, asJSON bool) error {
			offsets, err := admin.Offsets(cmd.Context(), s, group)
			if err != nil {
				return err
			}
			now := time.Now()
			var rows [][]string
			var objs []any
			for _, o := range offsets {
				age, ageSec := "-", 0.0
				if o.Lag > 0 {
					ageSec = now.Sub(o.OldestUnconsumed).Seconds()
					age = now.Sub(o.OldestUnconsumed).Round(time.Second).String()
				}
				lag := fmt.Sprint(o.Lag)
				if o.LagCapped {
					lag = ">" + lag // counted up to driver.LagCountLimit
				}
				committed := fmt.Sprint(o.CommittedOffset)
				if o.NoCursor {
					committed = "(none, starts after " + committed + ")"
				}
				rows = append(rows, []string{o.Tenant, o.Topic, fmt.Sprintf("%q", o.PartitionKey), o.ConsumerGroup,
					fmt.Sprint(o.HeadOffset), committed, lag, fmt.Sprint(o.Scheduled), fmt.Sprint(o.Deferred), age})
				objs = append(objs, map[string]any{"tenant": o.Tenant, "topic": o.Topic, "partition_key": o.PartitionKey, "group": o.ConsumerGroup,
					"head_offset": o.HeadOffset, "committed_offset": o.CommittedOffset, "no_cursor": o.NoCursor, "lag": o.Lag, "lag_capped": o.LagCapped,
					"scheduled": o.Scheduled, "deferred": o.Deferred, "oldest_unconsumed_age_seconds": ageSec})
			}
			if n := len(offsets); n > 0 && !offsets[n-1].NoCursor { // rows without a cursor end the last page
				o := offsets[n-1]
				a.nextPage(s, n, o.Tenant, o.Topic, o.ConsumerGroup, o.PartitionKey)
			}
			return a.table(asJSON, []string{"TENANT", "TOPIC", "KEY", "GROUP", "HEAD", "COMMITTED", "LAG", "SCHEDULED", "DEFERRED", "OLDEST UNCONSUMED"}, rows, objs)
		})
}

func (a *app) adminGroups() *cobra.Command {
	var topic string
	var staleAfter time.Duration
	cmd := a.listing("groups", "Consumer groups per topic: members, partitions read and unread, lag, last activity",
		func(cmd *cobra.Command) {
			cmd.Flags().StringVar(&topic, "topic", "", "only this topic")
			durationFlag(cmd.Flags(), &staleAfter, "stale-after", 9*time.Second, "a heartbeat older than this is not live")
		},
		func(cmd *cobra.Command, s shardq.Scope, admin *shardq.Admin, asJSON bool) error {
			groups, err := admin.Groups(cmd.Context(), s, topic, staleAfter)
			if err != nil {
				return err
			}
			var rows [][]string
			var objs []any
			for _, g := range groups {
				lag := fmt.Sprint(g.Lag)
				if g.LagCapped {
					lag = ">" + lag
				}
				state := "running"
				if g.Paused {
					state = "paused"
				}
				rows = append(rows, []string{g.Tenant, g.Topic, g.ConsumerGroup, state, fmt.Sprintf("%d/%d", g.Live, g.Members),
					fmt.Sprint(g.Partitions), fmt.Sprint(g.Unread), lag, ts(g.LastActivity)})
				objs = append(objs, map[string]any{"tenant": g.Tenant, "topic": g.Topic, "group": g.ConsumerGroup, "paused": g.Paused, "members": g.Members,
					"live_members": g.Live, "partitions": g.Partitions, "unread_partitions": g.Unread, "lag": g.Lag, "lag_capped": g.LagCapped,
					"last_activity": g.LastActivity})
			}
			return a.table(asJSON, []string{"TENANT", "TOPIC", "GROUP", "STATE", "LIVE/MEMBERS", "PARTITIONS", "UNREAD", "LAG", "LAST ACTIVITY"}, rows, objs)
		})
	cmd.AddCommand(a.adminGroupsDelete())
	return cmd
}

// adminPause is `admin pause` (paused true) or `admin resume`.
func (a *app) adminPause(paused bool) *cobra.Command {
	use, short := "resume", "Resume a paused consumer group on a topic: its members go on where they stopped, in order"
	if paused {
		use, short = "pause", "Pause a consumer group on a topic: within one discovery interval its members deliver nothing more, keeping their leases; messages keep arriving"
	}
	sf := scopeFlags{limit: shardq.DefaultPageLimit}
	var topic, group string
	cmd := &cobra.Command{Use: use + " (--tenant T ... | --all-tenants) --topic X --group G", Short: short, Args: cobra.NoArgs,
		RunE: run(func(cmd *cobra.Command, _ []string) error {
			s, err := sf.scope()
			if err != nil {
				return err
			}
			if err := firstErr(ident.Topic(topic), ident.ConsumerGroup(group)); err != nil {
				return err
			}
			c, done, err := a.client()
			if err != nil {
				return err
			}
			defer done()
			admin := c.Admin()
			set := admin.ResumeGroup
			if paused {
				set = admin.PauseGroup
			}
			tenants, err := set(cmd.Context(), shardq.PauseRequest{Scope: s, Topic: topic, ConsumerGroup: group})
			if err != nil {
				return err
			}
			for _, t := range tenants {
				fmt.Fprintf(a.env.Stdout, "%sd group %s on topic %s of tenant %s\n", use, display(group), display(topic), display(t))
			}
			return nil
		})}
	cmd.Flags().StringArrayVar(&sf.tenants, "tenant", nil, "tenant (repeatable)")
	cmd.Flags().BoolVar(&sf.all, "all-tenants", false, "every tenant with the topic")
	cmd.Flags().StringVar(&topic, "topic", "", "topic (required)")
	cmd.Flags().StringVar(&group, "group", "", "consumer group (required)")
	cmdLineOnly(cmd.Flags(), "all-tenants")
	cmd.MarkFlagRequired("topic")
	cmd.MarkFlagRequired("group")
	return cmd
}

func (a *app) adminGroupsDelete() *cobra.Command {
	var tenant, topic, group string
	var force bool
	var staleAfter time.Duration
	cmd := &cobra.Command{
		Use:   "delete --tenant T --topic X --group G [--force]",
		Short: "Delete a consumer group's cursors, leases, bookkeeping and state in one tenant's topic",
		Long: "Removes the group so that it no longer holds back retention. Refused while a member's heartbeat is\n" +
			"within --stale-after or a lease is unexpired; --force deletes anyway and voids every lease the members\n" +
			"hold (their commits fail). A member still running starts the group anew from its start position: stop them first.",
		Args: cobra.NoArgs,
		RunE: run(func(cmd *cobra.Command, _ []string) error {
			c, done, err := a.client()
			if err != nil {
				return err
			}
			defer done()
			if err := c.Admin().DeleteGroup(cmd.Context(), shardq.GroupRef{Tenant: tenant, Topic: topic, ConsumerGroup: group}, shardq.DeleteGroupOptions{StaleAfter: staleAfter, Force: force}); err != nil {
				return err
			}
			fmt.Fprintf(a.env.Stdout, "deleted consumer group %q of tenant %q topic %q\n", group, tenant, topic)
			return nil
		}),
	}
	fl := cmd.Flags()
	fl.StringVar(&tenant, "tenant", "", "tenant (required)")
	fl.StringVar(&topic, "topic", "", "topic (required)")
	fl.StringVar(&group, "group", "", "consumer group (required)")
	fl.BoolVar(&force, "force", false, "delete even while members are live, voiding their leases")
	durationFlag(fl, &staleAfter, "stale-after", 9*time.Second, "a heartbeat older than this is not live")
	// --stale-after decides which members are live, and so whether the
	// delete needs --force.
	cmdLineOnly(fl, "force", "stale-after")
	for _, f := range []string{"tenant", "topic", "group"} {
		cmd.MarkFlagRequired(f)
	}
	return cmd
}

func (a *app) adminLeases(staleOnly bool) *cobra.Command {
	use, short := "leases", "Partition leases: owner, token, expiry"
	var staleAfter time.Duration
	extra := func(*cobra.Command) {}
	if staleOnly {
		use, short = "stale-leases", "Leases past expiry or whose holder's heartbeat is stale"
		extra = func(cmd *cobra.Command) {
			durationFlag(cmd.Flags(), &staleAfter, "stale-after", 9*time.Second, "a heartbeat older than this is stale")
		}
	}
	return a.listing(use, short, extra, func(cmd *cobra.Command, s shardq.Scope, admin *shardq.Admin, asJSON bool) error {
		var ls []shardq.Lease
		var err error
		if staleOnly {
			ls, err = admin.StaleLeases(cmd.Context(), s, staleAfter)
		} else {
			ls, err = admin.Leases(cmd.Context(), s)
		}
		if err != nil {
			return err
		}
		if n := len(ls); n > 0 && !staleOnly { // stale-leases filters a page: its count says nothing of fullness
			a.nextPage(s, n, ls[n-1].Tenant, ls[n-1].ConsumerGroup, ls[n-1].Topic, ls[n-1].PartitionKey)
		}
		var rows [][]string
		var objs []any
		for _, l := range ls {
			owner := l.Owner
			if owner == "" {
				owner = "(free)"
			}
			rows = append(rows, []string{l.Tenant, l.ConsumerGroup, l.Topic, fmt.Sprintf("%q", l.PartitionKey), owner, fmt.Sprint(l.Token), ts(l.ExpiresAt)})
			objs = append(objs, map[string]any{"tenant": l.Tenant, "group": l.ConsumerGroup, "topic": l.Topic, "partition_key": l.PartitionKey,
				"owner": l.Owner, "token": l.Token, "expires_at": l.ExpiresAt})
		}
		return a.table(asJSON, []string{"TENANT", "GROUP", "TOPIC", "KEY", "OWNER", "TOKEN", "EXPIRES"}, rows, objs)
	})
}

func (a *app) adminSubscribers() *cobra.Command {
	return a.listing("subscribers", "Consumer group members and their last heartbeat", nil,
		func(cmd *cobra.Command, s shardq.Scope, admin *shardq.Admin, asJSON bool) error {
			subs, err := admin.Subscribers(cmd.Context(), s)
			if err != nil {
				return err
			}
			var rows [][]string
			var objs []any
			if n := len(subs); n > 0 {
				l := subs[n-1]
				a.nextPage(s, n, l.Tenant, l.ConsumerGroup, l.Topic, l.ID)
			}
			for _, sub := range subs {
				rows = append(rows, []string{sub.Tenant, sub.ConsumerGroup, sub.Topic, sub.ID, ts(sub.StartedAt), ts(sub.HeartbeatAt)})
				objs = append(objs, map[string]any{"tenant": sub.Tenant, "group": sub.ConsumerGroup, "topic": sub.Topic, "name": sub.ID,
					"started_at": sub.StartedAt, "heartbeat_at": sub.HeartbeatAt})
			}
			return a.table(asJSON, []string{"TENANT", "GROUP", "TOPIC", "SUBSCRIBER", "STARTED", "HEARTBEAT"}, rows, objs)
		})
}

func (a *app) adminInspect() *cobra.Command {
	var ref shardq.MessageRef
	var asJSON bool
	cmd := &cobra.Command{Use: "inspect --tenant T --topic X --key K --id ID [--json]",
		Short: "Print one message and, per consumer group, whether it consumed it, is retrying it, or has not reached it",
		Args:  cobra.NoArgs, RunE: run(func(cmd *cobra.Command, _ []string) error {
			if err := refErr(ref); err != nil {
				return err
			}
			c, done, err := a.client()
			if err != nil {
				return err
			}
			defer done()
			m, groups, err := c.Admin().MessageStatus(cmd.Context(), ref)
			if err != nil {
				return err
			}
			if asJSON {
				return a.inspectJSON(m, groups)
			}
			scheduled := ""
			if !m.NotBefore.IsZero() {
				scheduled = "  scheduled " + ts(m.NotBefore)
			}
			fmt.Fprintf(a.env.Stdout, "tenant %s  topic %s  partition %q  id %q  offset %d  created %s%s\n", display(m.Tenant), display(m.Topic),
				m.PartitionKey, m.ID, m.Offset, ts(m.CreatedAt), scheduled)
			keys := slices.Sorted(maps.Keys(m.Headers))
			for _, k := range keys {
				fmt.Fprintf(a.env.Stdout, "header %q: %q\n", k, m.Headers[k])
			}
			if utf8.Valid(m.Payload) {
				fmt.Fprintf(a.env.Stdout, "payload (%d bytes): %q\n\n", len(m.Payload), m.Payload)
			} else {
				fmt.Fprintf(a.env.Stdout, "payload (%d bytes, not UTF-8; --json has it in base64)\n\n", len(m.Payload))
			}
			var rows [][]string
			for _, g := range groups {
				next, attempts, lastErr := "-", "-", "-"
				if g.State.Attempts > 0 {
					next, attempts, lastErr = ts(g.State.NextAttemptAt), fmt.Sprint(g.State.Attempts), g.State.LastError
				}
				rows = append(rows, []string{g.ConsumerGroup, g.Status, fmt.Sprint(g.Cursor), attempts, next, lastErr})
			}
			if len(rows) == 0 {
				fmt.Fprintln(a.env.Stdout, "no consumer group reads this topic")
				return nil
			}
			return a.table(false, []string{"GROUP", "STATUS", "CURSOR", "ATTEMPTS", "NEXT ATTEMPT", "LAST ERROR"}, rows, nil)
		})}
	refFlags(cmd, &ref)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object")
	return cmd
}

// inspectJSON prints a message and its groups' standing as one JSON object.
func (a *app) inspectJSON(m *shardq.StoredMessage, groups []shardq.GroupStatus) error {
	var gs []map[string]any
	states := map[string]shardq.DeliveryState{}
	for _, g := range groups {
		o := map[string]any{"group": g.ConsumerGroup, "status": g.Status, "cursor": g.Cursor}
		if g.State.Attempts > 0 {
			o["attempts"], o["next_attempt_at"], o["last_error"] = g.State.Attempts, g.State.NextAttemptAt, g.State.LastError
			states[g.ConsumerGroup] = g.State
		}
		gs = append(gs, o)
	}
	out := map[string]any{"tenant": m.Tenant, "topic": m.Topic, "partition_key": m.PartitionKey, "id": m.ID, "offset": m.Offset,
		"created_at": m.CreatedAt, "headers": m.Headers, "delivery_state": states, "groups": gs}
	if !m.NotBefore.IsZero() {
		out["scheduled"] = m.NotBefore // delivered no earlier
	}
	if utf8.Valid(m.Payload) {
		out["payload"] = string(m.Payload)
	} else {
		out["payload_base64"] = m.Payload
	}
	enc := json.NewEncoder(a.env.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

func (a *app) adminDelete() *cobra.Command {
	var ref shardq.MessageRef
	cmd := &cobra.Command{Use: "delete --tenant T --topic X --key K --id ID", Short: "Delete exactly one message, named by its full identity",
		Args: cobra.NoArgs, RunE: run(func(cmd *cobra.Command, _ []string) error {
			if err := refErr(ref); err != nil {
				return err
			}
			c, done, err := a.client()
			if err != nil {
				return err
			}
			defer done()
			deleted, err := c.Admin().Delete(cmd.Context(), ref)
			if err != nil {
				return err
			}
			if deleted {
				fmt.Fprintln(a.env.Stdout, "deleted 1 message")
			} else {
				fmt.Fprintln(a.env.Stdout, "deleted nothing: no message has that identity")
			}
			return nil
		})}
	refFlags(cmd, &ref)
	return cmd
}

func (a *app) adminDLQ() *cobra.Command {
	cmd := &cobra.Command{Use: "dlq", Short: "Dead letters: list and requeue"}
	var topic, suffix string
	list := a.listing("list", "List the dead letters of a topic (sort key: tenant, offset)", func(cmd *cobra.Command) {
		cmd.Flags().StringVar(&topic, "topic", "", "original topic (required)")
		cmd.Flags().StringVar(&suffix, "suffix", shardq.DefaultDLQSuffix, "dead-letter topic suffix")
		cmd.MarkFlagRequired("topic")
		cmd.PreRunE = func(*cobra.Command, []string) error { return firstErr(ident.Topic(topic), ident.Topic(topic+suffix)) }
	}, func(cmd *cobra.Command, s shardq.Scope, admin *shardq.Admin, asJSON bool) error {
		ms, err := admin.DeadLetters(cmd.Context(), shardq.DeadLetterRequest{Scope: s, Topic: topic, Suffix: suffix})
		if err != nil {
			return err
		}
		if n := len(ms); n > 0 {
			a.nextPage(s, n, ms[n-1].Tenant, fmt.Sprint(ms[n-1].Offset))
		}
		var rows [][]string
		var objs []any
		for _, m := range ms {
			h := m.Headers
			size := strconv.Itoa(len(m.Payload))
			if n, ok := h[shardq.HeaderLargeBytes]; ok {
				size = n // a large dead letter: its chunks are not listed
			}
			rows = append(rows, []string{m.Tenant, fmt.Sprintf("%q", m.PartitionKey), m.ID, size, h[shardq.HeaderDLQOriginalOffset], h[shardq.HeaderDLQAttempts], h[shardq.HeaderDLQLastError]})
			objs = append(objs, map[string]any{"tenant": m.Tenant, "topic": topic, "partition_key": m.PartitionKey, "id": m.ID, "dlq_offset": m.Offset,
				"size": number(size), "large": h[shardq.HeaderLargeBytes] != "",
				"original_offset": number(h[shardq.HeaderDLQOriginalOffset]), "attempts": number(h[shardq.HeaderDLQAttempts]),
				"last_error": h[shardq.HeaderDLQLastError]})
		}
		return a.table(asJSON, []string{"TENANT", "KEY", "ID", "SIZE", "ORIGINAL OFFSET", "ATTEMPTS", "LAST ERROR"}, rows, objs)
	})
	var ref shardq.MessageRef
	var all bool
	requeue := &cobra.Command{Use: "requeue --tenant T --topic X (--key K --id ID | --all)",
		Short: "Move a dead letter (or, with --all, every dead letter of the topic, in offset order) back to its partition",
		Args:  cobra.NoArgs, RunE: run(func(cmd *cobra.Command, _ []string) error {
			keyed := cmd.Flags().Changed("key") || cmd.Flags().Changed("id")
			if all == keyed {
				return usagef("give either --key and --id, or --all")
			}
			check := refErr(ref)
			if all {
				check = firstErr(ident.Tenant(ref.Tenant), ident.Topic(ref.Topic))
			}
			if err := firstErr(check, ident.Topic(ref.Topic+suffix)); err != nil {
				return err
			}
			c, done, err := a.client()
			if err != nil {
				return err
			}
			defer done()
			if all {
				prog := a.progress("requeued", false)
				n, err := c.Admin().WithProgress(prog.add).RequeueAll(cmd.Context(), shardq.TopicRef{Tenant: ref.Tenant, Topic: ref.Topic}, suffix)
				prog.done(fmt.Sprintf("requeued %d dead letters", n))
				fmt.Fprintf(a.env.Stdout, "requeued %d dead letters\n", n)
				return err
			}
			res, err := c.Admin().Requeue(cmd.Context(), ref, suffix)
			if err != nil {
				return err
			}
			fmt.Fprintf(a.env.Stdout, "requeued offset=%d tenant=%s topic=%s key=%q id=%s\n", res.Offset, display(res.Tenant), display(res.Topic), res.PartitionKey, display(res.ID))
			return nil
		})}
	fl := requeue.Flags()
	fl.StringVar(&ref.Tenant, "tenant", "", "tenant (required)")
	fl.StringVar(&ref.Topic, "topic", "", "original topic (required)")
	fl.StringVar(&ref.PartitionKey, "key", "", "partition key")
	fl.StringVar(&ref.ID, "id", "", "message id")
	fl.BoolVar(&all, "all", false, "requeue every dead letter of the topic")
	fl.StringVar(&suffix, "suffix", shardq.DefaultDLQSuffix, "dead-letter topic suffix")
	cmdLineOnly(fl, "all")
	requeue.MarkFlagRequired("tenant")
	requeue.MarkFlagRequired("topic")
	cmd.AddCommand(list, requeue)
	return cmd
}

func (a *app) adminReset() *cobra.Command {
	var r shardq.ResetRequest
	var earliest, latest bool
	var toOffset int64
	var toTime string
	var execute, asJSON bool
	cmd := &cobra.Command{
		Use:   "reset-offsets --tenant T --topic X --group G (--to-earliest | --to-latest | --to-offset N --key K | --to-time RFC3339) [--execute] [--create] [--force]",
		Short: "Preview (or, with --execute, make) a move of a consumer group's cursors",
		Long: "Shows each partition's current and new cursor and how many messages the group would read again (REPLAY)\n" +
			"or never read (SKIP), and changes nothing, as Kafka's kafka-consumer-groups --reset-offsets does without\n" +
			"--execute. With --execute it moves them. A group that has never read the topic is refused unless --create\n" +
			"(a typo would otherwise start a new group); a live subscriber's lease on an affected partition refuses it\n" +
			"unless --force.",
		Args: cobra.NoArgs,
		RunE: run(func(cmd *cobra.Command, _ []string) error {
			n := 0
			for _, set := range []bool{earliest, latest, cmd.Flags().Changed("to-offset"), toTime != ""} {
				if set {
					n++
				}
			}
			if n != 1 {
				return usagef("give exactly one of --to-earliest, --to-latest, --to-offset (with --key), --to-time")
			}
			switch {
			case earliest:
				r.To = shardq.ResetToEarliest
			case latest:
				r.To = shardq.ResetToLatest
			case toTime != "":
				t, err := time.Parse(time.RFC3339, toTime)
				if err != nil {
					return usagef("--to-time %q: want RFC 3339, like 2026-11-30T12:00:00Z", toTime)
				}
				r.To, r.Time = shardq.ResetToTime, t
			default:
				if !cmd.Flags().Changed("key") {
					return usagef("--to-offset needs --key: an offset means something in one partition only")
				}
				if toOffset < 0 {
					return usagef("--to-offset %d: must not be negative (0 is before the first message)", toOffset)
				}
				r.To, r.Offset = shardq.ResetToOffset, toOffset
			}
			keyErr := error(nil)
			if r.To == shardq.ResetToOffset {
				keyErr = ident.PartitionKey(r.Key)
			}
			if err := firstErr(ident.Tenant(r.Tenant), ident.Topic(r.Topic), ident.ConsumerGroup(r.ConsumerGroup), keyErr); err != nil {
				return err
			}
			c, done, err := a.client()
			if err != nil {
				return err
			}
			defer done()
			r.DryRun = !execute
			changes, err := c.Admin().ResetOffsets(cmd.Context(), r)
			if err != nil {
				return err
			}
			var rows [][]string
			var objs []any
			count := func(n int64, capped bool) string {
				if capped && n > 0 {
					return fmt.Sprintf("%d+", n)
				}
				return fmt.Sprint(n)
			}
			for _, ch := range changes {
				rows = append(rows, []string{fmt.Sprintf("%q", ch.PartitionKey), fmt.Sprint(ch.From), fmt.Sprint(ch.To),
					count(ch.Replay, ch.Capped), count(ch.Skip, ch.Capped)})
				objs = append(objs, map[string]any{"partition_key": ch.PartitionKey, "current": ch.From, "new": ch.To,
					"replay": ch.Replay, "skip": ch.Skip, "capped": ch.Capped, "executed": execute})
			}
			if err := a.table(asJSON, []string{"PARTITION", "CURRENT", "NEW", "REPLAY", "SKIP"}, rows, objs); err != nil || asJSON {
				return err
			}
			if !execute {
				fmt.Fprintf(a.env.Stdout, "preview: nothing changed; run again with --execute to move %d cursors of group %s (tenant %s topic %s)\n",
					len(changes), display(r.ConsumerGroup), display(r.Tenant), display(r.Topic))
				return nil
			}
			fmt.Fprintf(a.env.Stdout, "reset %d partitions of tenant %s topic %s for group %s\n", len(changes), display(r.Tenant), display(r.Topic), display(r.ConsumerGroup))
			return nil
		}),
	}
	fl := cmd.Flags()
	fl.StringVar(&r.Tenant, "tenant", "", "tenant (required)")
	fl.StringVar(&r.Topic, "topic", "", "topic (required)")
	fl.StringVar(&r.ConsumerGroup, "group", "", "consumer group (required)")
	fl.BoolVar(&earliest, "to-earliest", false, "before the first message")
	fl.BoolVar(&latest, "to-latest", false, "at the head")
	fl.Int64Var(&toOffset, "to-offset", 0, "this offset (with --key)")
	fl.StringVar(&r.Key, "key", "", "partition for --to-offset")
	fl.StringVar(&toTime, "to-time", "", "before the first message created at or after this RFC 3339 time")
	fl.BoolVar(&r.Force, "force", false, "reset even while a live subscriber holds an affected lease")
	fl.BoolVar(&execute, "execute", false, "move the cursors (without it: a preview that changes nothing)")
	fl.BoolVar(&r.Create, "create", false, "allow a group that has never read the topic")
	fl.BoolVar(&asJSON, "json", false, "print one JSON object per partition")
	cmdLineOnly(fl, "execute", "create", "force")
	for _, f := range []string{"tenant", "topic", "group"} {
		cmd.MarkFlagRequired(f)
	}
	return cmd
}

// number is a header that holds a count as a JSON number; a header that
// does not (set by hand) stays the text it is, and a missing one is null.
func number(h string) any {
	if h == "" {
		return nil
	}
	if n, err := strconv.ParseInt(h, 10, 64); err == nil {
		return n
	}
	return h
}

// adminMessages is `admin messages`: browse a topic without a group.
func (a *app) adminMessages() *cobra.Command {
	var r shardq.BrowseRequest
	var fromTime string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "messages --tenant T --topic X [--key K] [--from-offset N | --from-time RFC3339] [--limit N] [--json]",
		Short: "Print a topic's (or one partition's) messages as stored, moving no cursor",
		Long: "Reads messages without a consumer group: no cursor moves, no lease or claim is taken. Without --key,\n" +
			"every partition of the topic in offset order; --key K (\"\" for ungrouped messages) one partition, where\n" +
			"--from-time finds the first message created at or after a time. --json prints one JSON line per message,\n" +
			"as consume does.",
		Args: cobra.NoArgs,
		RunE: run(func(cmd *cobra.Command, _ []string) error {
			r.OnePartition = cmd.Flags().Changed("key")
			if fromTime != "" {
				t, err := time.Parse(time.RFC3339Nano, fromTime)
				if err != nil {
					return usagef("--from-time %q: want RFC 3339, like 2026-11-30T12:00:00Z", fromTime)
				}
				r.FromTime = t
			}
			if r.Limit < 1 || r.Limit > shardq.MaxPageLimit {
				return usagef("--limit %d: want 1 to %d", r.Limit, shardq.MaxPageLimit)
			}
			c, done, err := a.client()
			if err != nil {
				return err
			}
			defer done()
			ms, err := c.Admin().Messages(cmd.Context(), r)
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(a.env.Stdout)
				for _, m := range ms {
					d := &shardq.Delivery{Tenant: m.Tenant, Topic: m.Topic, PartitionKey: m.PartitionKey, ID: m.ID, Offset: m.Offset,
						Headers: m.Headers, Payload: m.Payload, CreatedAt: m.CreatedAt, NotBefore: m.NotBefore}
					if err := enc.Encode(newConsumeLine(d)); err != nil {
						return err
					}
				}
				return nil
			}
			var rows [][]string
			for _, m := range ms {
				payload := fmt.Sprintf("(%d bytes, not UTF-8)", len(m.Payload))
				if utf8.Valid(m.Payload) {
					payload = fmt.Sprintf("%q", truncate(string(m.Payload), 60))
				}
				rows = append(rows, []string{fmt.Sprint(m.Offset), fmt.Sprintf("%q", m.PartitionKey), m.ID, ts(m.CreatedAt), ts(m.NotBefore), payload})
			}
			return a.table(false, []string{"OFFSET", "KEY", "ID", "CREATED", "SCHEDULED", "PAYLOAD"}, rows, nil)
		}),
	}
	fl := cmd.Flags()
	fl.StringVar(&r.Tenant, "tenant", "", "tenant (required)")
	fl.StringVar(&r.Topic, "topic", "", "topic (required)")
	fl.StringVar(&r.PartitionKey, "key", "", "only this partition (\"\" for ungrouped messages)")
	fl.Int64Var(&r.AfterOffset, "from-offset", 0, "messages after this offset")
	fl.StringVar(&fromTime, "from-time", "", "with --key: from the first message created at or after this RFC 3339 time")
	countFlag(fl, &r.Limit, "limit", shardq.DefaultPageLimit, fmt.Sprintf("most messages to print (at most %d)", shardq.MaxPageLimit))
	fl.BoolVar(&asJSON, "json", false, "print one JSON line per message")
	cmd.MarkFlagRequired("tenant")
	cmd.MarkFlagRequired("topic")
	return cmd
}

// truncate shortens s to at most n runes, marking the cut.
func truncate(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	return string([]rune(s)[:n]) + "…"
}
