// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/net/netutil"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/cmd/shardq/internal/server"
	"github.com/shardq/shardq/driver"
	"github.com/shardq/shardq/internal/receiptkey"
)

type serveFlags struct {
	addr, tlsCert, tlsKey, name string
	rate, authFailRate          float64
	burst                       int
	maxBody, maxResponse        int64
	maxInflightBodyPerTenant    int64
	maxInflightBody             int64
	maxAttempts                 int
	maxHold                     time.Duration
	deadLetterExpired           bool
	maxReceives, maxPerToken    int
	maxConns                    int
	clientAddrHeader            string
	secureCookies, metricsAuth  bool
	readTimeout, writeTimeout   time.Duration
	maxLarge                    int64
	maxLargeTransfers           int
	maxTransfersPerToken        int
	maxTransfersPerTenant       int
	largeTimeout                time.Duration
	minTransferRate             int64
	transferRateWindow          time.Duration
	tokenCache                  time.Duration
	shutdown                    time.Duration
}

// Timeouts of serve's connections besides --read-timeout and
// --write-timeout: headers must arrive within serveReadHeaderTimeout, and
// an idle keep-alive connection is closed after serveIdleTimeout.
const (
	serveReadHeaderTimeout = 10 * time.Second
	serveIdleTimeout       = 2 * time.Minute
)

func (a *app) serveCmd() *cobra.Command {
	var f serveFlags
	cmd := &cobra.Command{
		Use:   "serve [--addr HOST:PORT] [--tls-cert F --tls-key F] [--rate N] [--burst N] [--max-body BYTES] [--max-attempts N]",
		Short: "Serve the HTTP API (/v1, described at /v1/openapi.json), /metrics and the web dashboard",
		Long: "Serves shardq's HTTP/JSON API for any language: publish, receive with receipts (SQS FIFO's\n" +
			"ReceiveMessage), ack and nack, and the admin reads and writes, under /v1/tenants/{tenant}/...; every\n" +
			"request needs a bearer token of its tenant (shardq token create). SHARDQ_TENANTS, when set, limits the\n" +
			"tenants served. / is the dashboard (sign in with an admin token); /healthz, /readyz and /metrics\n" +
			"need no token. Several serve processes on one database share the work: nothing is held between\n" +
			"requests but the database's leases and claims. SIGINT/SIGTERM: waiting receives answer at once,\n" +
			"requests in flight finish (up to --shutdown-timeout), then the process exits. docs/server.md.",
		Args: cobra.NoArgs,
		RunE: run(func(cmd *cobra.Command, _ []string) error { return a.serve(cmd.Context(), f) }),
	}
	fl := cmd.Flags()
	fl.StringVar(&f.addr, "addr", "127.0.0.1:8080", "listen on HOST:PORT (port 0: any free port, printed on stderr)")
	fl.StringVar(&f.tlsCert, "tls-cert", "", "serve HTTPS with this PEM certificate (with --tls-key)")
	fl.StringVar(&f.tlsKey, "tls-key", "", "the PEM private key of --tls-cert")
	fl.StringVar(&f.name, "name", "", "this server's name in lease and claim owners (default serve-HOST-PID)")
	fl.Float64Var(&f.rate, "rate", server.DefaultRate, "requests a second allowed per token")
	fl.IntVar(&f.burst, "burst", server.DefaultBurst, "burst of requests allowed per token above --rate")
	fl.Int64Var(&f.maxBody, "max-body", server.DefaultMaxBodyBytes, "largest request body in bytes")
	fl.Int64Var(&f.maxInflightBody, "max-inflight-body", server.DefaultMaxInflightBodyBytes,
		"memory of the request bodies in flight, server-wide: each holds its bytes as they arrive, then what it decodes into; past it, 429")
	fl.Int64Var(&f.maxInflightBodyPerTenant, "max-inflight-body-per-tenant", 0,
		"what one tenant's requests may hold of --max-inflight-body together (default half of it; past it 429, but one request alone may take all of --max-inflight-body, and one needing more than that gets 413)")
	fl.Int64Var(&f.maxResponse, "max-response-bytes", server.DefaultMaxResponseBytes,
		"byte budget of a response that carries messages (receive, dead letters, browse, dashboard): it stops adding messages there, always carrying one")
	fl.IntVar(&f.maxReceives, "max-receives", server.DefaultMaxReceives, "receives in flight (long polls included) on this server; past it, 429")
	fl.IntVar(&f.maxPerToken, "max-receives-per-token", server.DefaultMaxReceivesPerToken, "receives in flight per token; past it, 429")
	fl.IntVar(&f.maxConns, "max-conns", 1024, "open connections; more wait to be accepted")
	fl.Float64Var(&f.authFailRate, "auth-fail-rate", server.DefaultAuthFailRate,
		"failed authentications a second allowed per client address (bursts of 20); past it, 429 before any token is read")
	fl.StringVar(&f.clientAddrHeader, "client-addr-header", "",
		"behind a trusted reverse proxy: the header holding the client's address (X-Forwarded-For: its last entry); default: the peer address")
	fl.BoolVar(&f.secureCookies, "secure-cookies", false, "mark the dashboard's cookie Secure though TLS ends before this process (at a proxy)")
	fl.BoolVar(&f.metricsAuth, "metrics-auth", false, "/metrics needs an admin token of the tenant named by ?tenant= (or serve it apart with --metrics-addr)")
	fl.IntVar(&f.maxAttempts, "max-attempts", shardq.DefaultMaxAttempts, "failed attempts (nacks) after which a received message is dead-lettered")
	fl.DurationVar(&f.maxHold, "max-hold", shardq.MaxVisibility, "how long visibility changes may hold a received message in all, from its receive (at most 12h)")
	fl.BoolVar(&f.deadLetterExpired, "dead-letter-expired", false, "dead-letter a message a receive finds expired (ttl) instead of passing over it")
	fl.DurationVar(&f.shutdown, "shutdown-timeout", 30*time.Second, "how long a stop waits for requests in flight")
	fl.DurationVar(&f.readTimeout, "read-timeout", 30*time.Second, "a request's headers and body must arrive within this (a body trickled slowly is cut off)")
	fl.DurationVar(&f.writeTimeout, "write-timeout", 60*time.Second, "a response must be sent within this; a long poll has its wait on top")
	fl.Int64Var(&f.maxLarge, "max-large-bytes", server.DefaultMaxLargeBytes, "largest large-message upload (POST …/large) in bytes")
	fl.IntVar(&f.maxLargeTransfers, "max-large-transfers", server.DefaultMaxLargeTransfers,
		"large-message uploads, body downloads and exports in flight on this server (each holds 4 MiB); past it, 429")
	fl.IntVar(&f.maxTransfersPerToken, "max-large-transfers-per-token", 0,
		"of --max-large-transfers, how many one token may hold; past it, 429 (0: half of them, at least 1)")
	fl.IntVar(&f.maxTransfersPerTenant, "max-large-transfers-per-tenant", 0,
		"of --max-large-transfers, how many one tenant's tokens may hold together; past it, 429 (0: half of them, at least 1)")
	fl.Int64Var(&f.minTransferRate, "min-transfer-rate", server.DefaultMinTransferRate,
		"bytes a large-message transfer must move in each --transfer-rate-window, or it is cut and its slot freed (0: no minimum)")
	fl.DurationVar(&f.transferRateWindow, "transfer-rate-window", server.DefaultTransferRateWindow,
		"the window of --min-transfer-rate")
	fl.DurationVar(&f.tokenCache, "token-cache", server.DefaultTokenCacheTTL,
		"how long a token's stored row is reused before it is read again: a revocation reaches this server within it (0: read at every request)")
	fl.DurationVar(&f.largeTimeout, "large-transfer-timeout", server.DefaultLargeTransferTimeout,
		"how long one large-message upload or download may take in all (each read or write gets --read-timeout or --write-timeout)")
	return cmd
}

// tokenCacheTTL is --token-cache as server.Config takes it: 0 there is
// the default, and no cache is negative.
func tokenCacheTTL(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// minTransferRate is --min-transfer-rate as server.Config takes it: 0
// there is the default, and no minimum is negative.
func minTransferRate(n int64) int64 {
	if n == 0 {
		return -1
	}
	return n
}

func (a *app) serve(ctx context.Context, f serveFlags) error {
	if err := firstErr(
		checkAddr("--addr", f.addr),
		func() error {
			if (f.tlsCert == "") != (f.tlsKey == "") {
				return usagef("--tls-cert and --tls-key go together")
			}
			return nil
		}(),
		mustBePositive("--rate", f.rate > 0), mustBePositive("--burst", f.burst > 0), mustBePositive("--max-body", f.maxBody > 0),
		mustBePositive("--max-response-bytes", f.maxResponse > 0), mustBePositive("--max-inflight-body", f.maxInflightBody > 0), mustBePositive("--max-receives", f.maxReceives > 0),
		mustBePositive("--max-receives-per-token", f.maxPerToken > 0), mustBePositive("--max-conns", f.maxConns > 0),
		mustBePositive("--auth-fail-rate", f.authFailRate > 0), mustBePositive("--read-timeout", f.readTimeout > 0),
		mustBePositive("--write-timeout", f.writeTimeout > 0), mustBePositive("--max-large-bytes", f.maxLarge > 0),
		mustBePositive("--max-large-transfers", f.maxLargeTransfers > 0), mustBePositive("--large-transfer-timeout", f.largeTimeout > 0),
		mustBePositive("--transfer-rate-window", f.transferRateWindow > 0),
		func() error {
			switch {
			case f.maxTransfersPerToken < 0 || f.maxTransfersPerToken > f.maxLargeTransfers:
				return usagef("--max-large-transfers-per-token: %d: want 0 (half) to --max-large-transfers (%d)", f.maxTransfersPerToken, f.maxLargeTransfers)
			case f.maxTransfersPerTenant < 0 || f.maxTransfersPerTenant > f.maxLargeTransfers:
				return usagef("--max-large-transfers-per-tenant: %d: want 0 (half) to --max-large-transfers (%d)", f.maxTransfersPerTenant, f.maxLargeTransfers)
			case f.minTransferRate < 0:
				return usagef("--min-transfer-rate: must not be negative (0: no minimum)")
			}
			return nil
		}(),
		mustBePositive("--max-attempts", f.maxAttempts > 0), mustBePositive("--shutdown-timeout", f.shutdown > 0),
		func() error {
			if f.tokenCache < 0 {
				return usagef("--token-cache: must not be negative (0: no cache)")
			}
			return nil
		}(),
	); err != nil {
		return err
	}
	var tlsCfg *tls.Config
	if f.tlsCert != "" {
		cert, err := tls.LoadX509KeyPair(f.tlsCert, f.tlsKey)
		if err != nil {
			return usagef("--tls-cert/--tls-key: %v", err)
		}
		tlsCfg = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	// With --metrics-addr, /metrics is served there only.
	a.serveMetrics = a.metricsAddr == ""
	c, drv, done, err := a.open(false)
	if err != nil {
		return err
	}
	defer done()
	name := f.name
	if name == "" {
		host, _ := os.Hostname()
		name = fmt.Sprintf("serve-%s-%d", host, os.Getpid())
	}
	receipts, err := c.Receipts(&shardq.ReceiptOptions{MessageBytes: server.MessageBytes, Name: name, MaxAttempts: f.maxAttempts, DeadLetterExpired: f.deadLetterExpired,
		MaxHold: f.maxHold})
	if err != nil {
		return usageError{err}
	}
	tenants, err := a.servedTenants()
	if err != nil {
		return usageError{err}
	}
	a.warnSharedTokenIDs(ctx, drv)
	var metrics http.Handler
	if a.metricsAddr == "" {
		metrics = a.metrics
	}
	srv, err := server.New(server.Config{Client: c, Driver: drv, Receipts: receipts, Tenants: tenants, Rate: f.rate, Burst: f.burst,
		AuthFailRate: f.authFailRate, ClientAddrHeader: f.clientAddrHeader, MaxBodyBytes: f.maxBody, MaxInflightBodyBytes: f.maxInflightBody, MaxInflightBodyBytesPerTenant: f.maxInflightBodyPerTenant, MaxResponseBytes: f.maxResponse,
		MaxReceives: f.maxReceives, MaxReceivesPerToken: f.maxPerToken, WriteTimeout: f.writeTimeout, ReadTimeout: f.readTimeout,
		MaxLargeBytes: f.maxLarge, MaxLargeTransfers: f.maxLargeTransfers, MaxLargeTransfersPerToken: f.maxTransfersPerToken,
		MaxLargeTransfersPerTenant: f.maxTransfersPerTenant, MinTransferRate: minTransferRate(f.minTransferRate), TransferRateWindow: f.transferRateWindow,
		LargeTransferTimeout: f.largeTimeout, TokenCacheTTL: tokenCacheTTL(f.tokenCache), Metrics: metrics, MetricsAuth: f.metricsAuth, SecureCookies: f.secureCookies,
		MeterProvider: a.meterProvider, TracerProvider: a.tracerProvider, Logger: a.logger()})
	if err != nil {
		return usageError{err}
	}
	ln, err := net.Listen("tcp", f.addr)
	if err != nil {
		return fmt.Errorf("--addr: %w", err)
	}
	ln = netutil.LimitListener(ln, f.maxConns)
	scheme := "http"
	if tlsCfg != nil {
		ln, scheme = tls.NewListener(ln, tlsCfg), "https"
	}
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: min(serveReadHeaderTimeout, f.readTimeout), ReadTimeout: f.readTimeout,
		WriteTimeout: f.writeTimeout, IdleTimeout: serveIdleTimeout, MaxHeaderBytes: 64 << 10}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	fmt.Fprintf(a.env.Stderr, "shardq serve: listening on %s://%s\n", scheme, ln.Addr())
	select {
	case err := <-served:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	fmt.Fprintln(a.env.Stderr, "shardq serve: stopping")
	srv.Drain()
	sctx, cancel := context.WithTimeout(context.Background(), f.shutdown)
	defer cancel()
	err = hs.Shutdown(sctx)
	if serr := <-served; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	if err != nil {
		return fmt.Errorf("serve: shutdown: %w", err)
	}
	return nil
}

// warnSharedTokenIDs logs, at every start, each token id that several
// tokens hold (stored before ids were checked across tenants): no
// migration can rename an id that people hold, and refusing both tokens
// would lock out the one that owned the id first. Each opens only its own
// tenants, but they share the id's limits and revocation.
func (a *app) warnSharedTokenIDs(ctx context.Context, drv driver.Tokens) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	shared, err := server.SharedTokenIDs(ctx, drv)
	if err != nil {
		a.logger().Warn("shardq serve: could not check token ids for ones several tokens hold", "err", err)
		return
	}
	for _, s := range shared {
		a.logger().Warn("shardq serve: several tokens hold one id; each opens only its own tenants, but they share the id's rate "+
			"and limits, and token revoke revokes them all: revoke it and make new tokens (docs/server.md#tokens)",
			"id", s.ID, "tenants", s.Tenants)
	}
}

func checkAddr(flag, addr string) error {
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return usagef("%s: %q must be HOST:PORT (like 127.0.0.1:8080): %v", flag, addr, err)
	}
	return nil
}

func mustBePositive(flag string, ok bool) error {
	if !ok {
		return usagef("%s must be more than 0", flag)
	}
	return nil
}

func (a *app) tokenCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "token", Short: "Create, list and revoke the bearer tokens of shardq serve"}
	var tenants []string
	var roles []string
	var expires time.Duration
	var fromEnv string
	create := &cobra.Command{
		Use:   "create --tenant T [--tenant T2 ...] --role publish|consume|admin|operator [--role R2 ...] [--expires D] [--from-env NAME]",
		Short: "Create a token and print it once (only its hash is stored)",
		Long: "Creates a token for the tenants with the roles and prints it once; only its hash is stored.\n" +
			"With --from-env NAME it stores instead the token that variable holds (made by `shardq token new`,\n" +
			"kept in a secret store: a deployment's bootstrap) and prints only its id; storing the same token\n" +
			"with the same role and tenants again changes nothing, another token of its id is refused.",
		Args: cobra.NoArgs,
		RunE: run(func(cmd *cobra.Command, _ []string) error {
			if len(tenants) == 0 {
				return usagef("--tenant is required")
			}
			var split []string
			for _, r := range roles {
				split = append(split, strings.Split(r, ",")...)
			}
			if len(split) == 0 {
				return usagef("--role is required: %s", strings.Join(server.Roles, ", "))
			}
			for _, r := range split {
				if err := oneOf("--role", server.Roles...)(cmd, []string{r}); err != nil {
					return err
				}
			}
			role, _ := server.JoinRoles(split)
			if expires < 0 {
				return usagef("--expires must not be negative")
			}
			var given string
			if fromEnv != "" {
				if given = a.env.Getenv(fromEnv); given == "" {
					return usagef("--from-env: %s is empty or unset", fromEnv)
				}
			}
			_, drv, done, err := a.open(false)
			if err != nil {
				return err
			}
			defer done()
			if given != "" {
				id, err := server.StoreToken(cmd.Context(), drv, given, tenants, split, expires, time.Now())
				if err != nil {
					return err
				}
				fmt.Fprintf(a.env.Stdout, "token %s (%s of %s) stored from %s; shardq token revoke %s revokes it\n", id, role, strings.Join(tenants, ", "), fromEnv, id)
				return nil
			}
			tok, id, err := server.NewToken(cmd.Context(), drv, tenants, split, expires, time.Now())
			if err != nil {
				return err
			}
			fmt.Fprintln(a.env.Stdout, tok)
			fmt.Fprintf(a.env.Stderr, "token %s (%s of %s): shown once; shardq token revoke %s revokes it\n", id, role, strings.Join(tenants, ", "), id)
			return nil
		}),
	}
	create.Flags().StringArrayVar(&tenants, "tenant", nil, "a tenant the token may use (repeatable)")
	create.Flags().StringArrayVar(&roles, "role", nil, "publish, consume, admin or operator, repeatable or comma-separated (admin may do everything in its tenants but suspend, resume and set limits; operator everything)")
	create.Flags().DurationVar(&expires, "expires", 0, "the token expires this long from now (0: never)")
	create.Flags().StringVar(&fromEnv, "from-env", "", "store the token this environment variable holds (made by shardq token new) instead of a new one")
	newTok := &cobra.Command{
		Use:   "new",
		Short: "Print a new random token without storing it (for a secret store; token create --from-env stores it)",
		Args:  cobra.NoArgs,
		RunE: run(func(*cobra.Command, []string) error {
			fmt.Fprintln(a.env.Stdout, server.MakeToken())
			return nil
		}),
	}
	var listTenants []string
	list := &cobra.Command{
		Use:   "list [--tenant T ...]",
		Short: "List tokens: id, role, tenants, created, expires, revoked (every tenant unless --tenant)",
		Args:  cobra.NoArgs,
		RunE: run(func(cmd *cobra.Command, _ []string) error {
			_, drv, done, err := a.open(false)
			if err != nil {
				return err
			}
			defer done()
			scope := driver.Scope{Tenants: listTenants, AllTenants: len(listTenants) == 0}
			toks, err := drv.ListTokens(cmd.Context(), scope)
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(a.env.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tROLE\tTENANTS\tCREATED\tEXPIRES\tREVOKED")
			for _, t := range toks {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", t.ID, t.Role, display(strings.Join(t.Tenants, ",")), stamp(t.CreatedAt), stamp(t.ExpiresAt), stamp(t.RevokedAt))
			}
			return tw.Flush()
		}),
	}
	revoke := &cobra.Command{
		Use:   "revoke ID",
		Short: "Revoke a token in every tenant: its next request is refused",
		Args:  cobra.ExactArgs(1),
		RunE: run(func(cmd *cobra.Command, args []string) error {
			_, drv, done, err := a.open(false)
			if err != nil {
				return err
			}
			defer done()
			// A token's rows live in its tenants' shards: find them, then
			// revoke there (a scoped write, never a scatter).
			toks, err := drv.ListTokens(cmd.Context(), driver.Scope{AllTenants: true})
			if err != nil {
				return err
			}
			var n int64
			for _, t := range toks { // several, when tokens share the id
				if t.ID == args[0] {
					k, err := drv.RevokeToken(cmd.Context(), t.Tenants, t.ID, time.Now())
					if err != nil {
						return err
					}
					n += k
				}
			}
			if n == 0 {
				return fmt.Errorf("no live token %q", display(args[0]))
			}
			fmt.Fprintf(a.env.Stdout, "revoked %s in %d tenants\n", display(args[0]), n)
			return nil
		}),
	}
	list.Flags().StringArrayVar(&listTenants, "tenant", nil, "list the tokens of this tenant (repeatable)")
	cmd.AddCommand(create, newTok, list, revoke)
	return cmd
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func (a *app) receiptKeyCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "receipt-key", Short: "List and rotate the key that signs shardq serve's receipts and dashboard sessions"}
	list := &cobra.Command{
		Use:   "list",
		Short: "List the receipt keys: id, created, and until when each verifies (secrets are never shown)",
		Args:  cobra.NoArgs,
		RunE: run(func(cmd *cobra.Command, _ []string) error {
			_, drv, done, err := a.open(false)
			if err != nil {
				return err
			}
			defer done()
			keys, err := drv.ReceiptKeys(cmd.Context())
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(a.env.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tCREATED\tVERIFIES UNTIL")
			for i, k := range keys {
				until := "signs"
				if i+1 < len(keys) {
					until = stamp(keys[i+1].CreatedAt.Add(shardq.MaxVisibility))
				}
				fmt.Fprintf(tw, "%d\t%s\t%s\n", k.ID, stamp(k.CreatedAt), until)
			}
			return tw.Flush()
		}),
	}
	var dropPrevious bool
	rotate := &cobra.Command{
		Use:   "rotate [--drop-previous]",
		Short: "Add a key that signs from now on; the previous verifies for one longest visibility timeout, then goes",
		Long: "Every serve process of the database signs with the newest key within a minute and verifies with any key\n" +
			"replaced less than " + shardq.MaxVisibility.String() + " ago (the longest visibility timeout: no receipt signed before can be\n" +
			"live after it); keys older than that are deleted. --drop-previous deletes every older key at once, for a key\n" +
			"that leaked: every server refuses receipts and dashboard sessions signed with it within a minute, when it\n" +
			"next reads the keys (their messages are delivered again after their visibility timeout; people sign in again).",
		Args: cobra.NoArgs,
		RunE: run(func(cmd *cobra.Command, _ []string) error {
			_, drv, done, err := a.open(false)
			if err != nil {
				return err
			}
			defer done()
			k, dropped, err := receiptkey.Rotate(cmd.Context(), drv, shardq.MaxVisibility, dropPrevious, time.Now())
			if err != nil {
				return err
			}
			fmt.Fprintf(a.env.Stdout, "receipt key %d signs from now on; deleted keys %v\n", k.ID, dropped)
			return nil
		}),
	}
	rotate.Flags().BoolVar(&dropPrevious, "drop-previous", false, "delete every older key now (a leaked key)")
	cmdLineOnly(rotate.Flags(), "drop-previous")
	cmd.AddCommand(list, rotate)
	return cmd
}
