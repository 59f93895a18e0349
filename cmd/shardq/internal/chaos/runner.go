// SPDX-License-Identifier: Apache-2.0

package chaos

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/cmd/shardq/internal/chaoscheck"
	"github.com/shardq/shardq/driver"
)

// RunConfig shapes a chaos run.
type RunConfig struct {
	// DSN is the database (sqlite:// or mysql://). A MySQL one is reached
	// by the clients through a proxy of the runner's, which cuts, holds
	// and delays their connections.
	DSN string
	// Dir receives the histories, the clients' logs and the summary.
	Dir      string
	Duration time.Duration // the fault phase
	Drain    time.Duration // the drain phase's bound: it ends sooner once nothing moves for DrainQuiet
	Seed     uint64
	// DBRestart, when set, is a shell command that kills the database
	// server hard and starts it again over the same data (the runner
	// never restarts a server it was not told how to).
	DBRestart string
	// Reparent, when set, is a shell command that moves the database's
	// primary to another server that replicates it (a planned reparent).
	// It runs once, halfway through the fault phase: a local Vitess on
	// MariaDB moves a shard's primary once (scripts/vitess-cluster).
	Reparent string
	// FullDisk, when set, is a directory on the database's own small
	// file system (a tmpfs of the run's): the disk-full fault fills it for
	// a few seconds.
	FullDisk string
	// Probe writes to the database and commits: a disk-full fault lasts
	// until it succeeds (MariaDB, its binary log out of space, looks for
	// free space again once a minute, holding every writer meanwhile).
	Probe func(context.Context) error
	// Faults are the kinds to inject [all that apply to the database].
	Faults []string
	// ClockSync is the clients' Config.ClockSync [ClockSync]; negative
	// leaves the clock fault's clients on their own clocks.
	ClockSync time.Duration
	// Tokens stores the token of the run's `shardq serve` processes.
	Tokens driver.Tokens
	// Tenants are the run's [Tenant]: on Vitess, tenants of different
	// shards.
	Tenants []string
	Log     *slog.Logger
	Out     io.Writer // the summary
}

// DrainQuiet ends the drain once no history grew for this long: longer
// than the clients' LargeWriteTimeout, which a write cut off by a kill
// waits for, and than the 10 s a server killed mid-nack holds its group
// (docs/server.md).
const DrainQuiet = LargeWriteTimeout + 5*time.Second

// proc is one client's slot: its process restarts under the next
// incarnation's name after a kill.
type proc struct {
	slot        string
	cfg         ClientConfig
	consumer    bool
	server      bool   // a `shardq serve` process, which the HTTP clients go through
	addr        string // a server's HOST:PORT, the same in every incarnation
	incarnation int
	cmd         *exec.Cmd
	stdin       io.WriteCloser
	exited      chan struct{}
	stopped     bool // SIGSTOPped now
}

func (p *proc) name() string { return fmt.Sprintf("%s.%d", p.slot, p.incarnation) }

type runner struct {
	cfg       RunConfig
	self      string
	clientDSN string
	proxy     *Proxy
	hist      *History
	rng       *rand.Rand
	procs     []*proc
	servers   []string // the serve processes' base URLs
	token     string   // their token, for the HTTP clients
	faultsEnd time.Time
	mu        sync.Mutex
}

// Run runs the clients for cfg.Duration under faults, drains, dumps what
// the database holds and judges the histories; it fails when the checker
// finds a violation.
func Run(ctx context.Context, c *shardq.Client, cfg RunConfig) (chaoscheck.Report, error) {
	var rep chaoscheck.Report
	self, err := os.Executable()
	if err != nil {
		return rep, err
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return rep, err
	}
	if cfg.FullDisk != "" {
		if err := checkFullDisk(cfg.FullDisk); err != nil {
			return rep, err
		}
	}
	if len(cfg.Tenants) == 0 {
		cfg.Tenants = []string{Tenant}
	}
	r := &runner{cfg: cfg, self: self, clientDSN: cfg.DSN, rng: rand.New(rand.NewPCG(cfg.Seed, 0x5eed))}
	if r.hist, err = OpenHistory(filepath.Join(cfg.Dir, "runner.jsonl")); err != nil {
		return rep, err
	}
	defer r.hist.Close()
	if strings.HasPrefix(cfg.DSN, "mysql://") {
		u, err := url.Parse(cfg.DSN)
		if err != nil {
			return rep, fmt.Errorf("--dsn: %w", err)
		}
		if r.proxy, err = StartProxy(u.Host); err != nil {
			return rep, err
		}
		defer r.proxy.Close(context.WithoutCancel(ctx))
		u.Host = r.proxy.Addr()
		r.clientDSN = u.String()
	}
	if err := r.hist.Record(Event{Op: "config", Proc: "runner", Groups: groupTopics, Ordered: orderedGroups, DLQ: dlqTopics(),
		Grace: (leaseTTL + 2*time.Second).Nanoseconds()}); err != nil {
		return rep, err
	}
	if err := c.Migrate(ctx); err != nil {
		return rep, err
	}
	// Ids repeat from run to run (publishes are idempotent by id), so a
	// run needs a tenant that holds nothing yet.
	for _, t := range cfg.Tenants {
		if info, err := c.Admin().Tenant(ctx, t); err != nil {
			return rep, err
		} else if info.Messages > 0 {
			return rep, fmt.Errorf("chaos: tenant %q already holds %d messages: a run needs a database of its own (a new SQLite file, or a new MySQL database)", t, info.Messages)
		}
	}
	cfg.Log.Info("chaos: starting", "seed", cfg.Seed, "duration", cfg.Duration, "dir", cfg.Dir)
	r.faultsEnd = time.Now().Add(cfg.Duration)
	if err := r.start(ctx); err != nil {
		r.killAll()
		return rep, err
	}
	faultErr := r.faults(ctx)
	cfg.Log.Info("chaos: faults over; publishers stop, consumers drain")
	stopErr := r.stopPublishers(ctx)
	r.recover(ctx)
	r.drain(ctx)
	consumersErr := r.stopConsumers(ctx)
	if err := errors.Join(faultErr, stopErr, consumersErr); err != nil {
		r.killAll()
		return rep, err
	}
	if err := r.dump(ctx, c); err != nil {
		return rep, fmt.Errorf("dump: %w", err)
	}
	evs, err := chaoscheck.ReadDir(cfg.Dir)
	if err != nil {
		return rep, err
	}
	rep = chaoscheck.Check(evs)
	tl := BuildTimeline(evs)
	if err := writeTimeline(cfg, tl); err != nil {
		return rep, err
	}
	if err := writeSummary(cfg, rep, tl); err != nil {
		return rep, err
	}
	var violated error
	if len(rep.Violations) > 0 {
		violated = fmt.Errorf("chaos: %d violations (seed %d); see %s", len(rep.Violations), cfg.Seed, filepath.Join(cfg.Dir, "summary.txt"))
	}
	return rep, errors.Join(violated, panics(cfg.Dir))
}

// panics fails a run whose processes panicked: a server's handler panic
// (which net/http recovers, logging it, and answers by dropping the
// connection, a failure the HTTP clients excuse as no answer) or a
// process's crash (a panic, or the runtime's fatal error), which the
// runner would otherwise restart like a kill.
func panics(dir string) error {
	logs, err := filepath.Glob(filepath.Join(dir, "*.log"))
	if err != nil {
		return err
	}
	var found []string
	for _, name := range logs {
		line, err := firstLine(name, func(head []byte) bool {
			return bytes.HasPrefix(head, []byte("panic: ")) || bytes.HasPrefix(head, []byte("fatal error: ")) ||
				bytes.Contains(head, []byte("http: panic serving"))
		})
		if err != nil {
			return fmt.Errorf("chaos: read %s: %w", name, err)
		}
		if line != "" {
			found = append(found, filepath.Base(name)+": "+line)
		}
	}
	if len(found) > 0 {
		return fmt.Errorf("chaos: processes panicked:\n%s", strings.Join(found, "\n"))
	}
	return nil
}

// firstLine is the first line of the file that match accepts, judged by
// its first 4 KiB (the rest of a longer line is skipped), or "".
func firstLine(name string, match func(head []byte) bool) (string, error) {
	f, err := os.Open(name)
	if err != nil {
		return "", err
	}
	defer f.Close()
	rd := bufio.NewReaderSize(f, 4<<10)
	for start := true; ; {
		frag, err := rd.ReadSlice('\n')
		if start && len(frag) > 0 && match(frag) {
			return string(bytes.TrimRight(frag, "\n")), nil
		}
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			start = false // the same line goes on
		case errors.Is(err, io.EOF):
			return "", nil
		case err != nil:
			return "", err
		default:
			start = true
		}
	}
}

func (r *runner) start(ctx context.Context) error {
	if err := r.startServers(ctx); err != nil {
		return err
	}
	slots := []struct {
		slot string
		cfg  ClientConfig
	}{
		{"pub-0", ClientConfig{Role: RolePublish, Batch: 1, Interval: 50 * time.Millisecond}},
		{"pub-1", ClientConfig{Role: RolePublish, Batch: 1, Interval: 50 * time.Millisecond}},
		{"pub-2", ClientConfig{Role: RolePublish, Batch: 10, Interval: 400 * time.Millisecond}},
		{"large-0", ClientConfig{Role: RoleLarge, Interval: 2 * time.Second}},
		{"sub-0", ClientConfig{Role: RoleSubscribe}},
		{"sub-1", ClientConfig{Role: RoleSubscribe}},
		{"sub-2", ClientConfig{Role: RoleSubscribe}},
		{"ung-0", ClientConfig{Role: RoleUngrouped}},
		{"ung-1", ClientConfig{Role: RoleUngrouped}},
		{"recv-0", ClientConfig{Role: RoleReceive}},
		{"recv-1", ClientConfig{Role: RoleReceive}},
		// Transactional senders stop sending with the faults but stop
		// with the consumers: their check-back resolves what is pending.
		{"tx-0", ClientConfig{Role: RoleTx, Interval: 200 * time.Millisecond, SendUntil: r.faultsEnd}},
		{"tx-1", ClientConfig{Role: RoleTx, Interval: 200 * time.Millisecond, SendUntil: r.faultsEnd}},
		{"http-pub-0", ClientConfig{Role: RoleHTTPPublish, Interval: 100 * time.Millisecond}},
		{"http-recv-0", ClientConfig{Role: RoleHTTPReceive}},
		{"http-recv-1", ClientConfig{Role: RoleHTTPReceive}},
	}
	for _, s := range slots {
		p := &proc{slot: s.slot, cfg: s.cfg, consumer: !slices.Contains([]string{RolePublish, RoleLarge, RoleHTTPPublish}, s.cfg.Role)}
		r.procs = append(r.procs, p)
		if err := r.spawn(ctx, p); err != nil {
			return err
		}
	}
	return nil
}

// spawn starts p's next incarnation.
func (r *runner) spawn(ctx context.Context, p *proc) error {
	p.incarnation++
	if p.server {
		return r.spawnServer(ctx, p)
	}
	p.cfg.Name = p.name()
	p.cfg.Servers, p.cfg.Tenants = r.servers, r.cfg.Tenants
	p.cfg.History = filepath.Join(r.cfg.Dir, p.name()+".jsonl")
	p.cfg.Seed = r.cfg.Seed
	logf, err := os.OpenFile(filepath.Join(r.cfg.Dir, p.name()+".log"), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	args := []string{"--log-level", "info", "chaos", "client", "--role", p.cfg.Role, "--name", p.cfg.Name, "--history", p.cfg.History,
		"--batch", fmt.Sprint(p.cfg.Batch), "--interval", p.cfg.Interval.String(), "--seed", fmt.Sprint(p.cfg.Seed),
		"--send-until", fmt.Sprint(p.cfg.SendUntil.UnixNano()), "--clock-offset", p.cfg.ClockOffset.String(),
		"--clock-sync", cmp.Or(r.cfg.ClockSync, ClockSync).String(), "--servers", strings.Join(p.cfg.Servers, ","),
		"--tenants", strings.Join(p.cfg.Tenants, ",")}
	return r.exec(p, logf, args, TokenEnv+"="+r.token)
}

// exec runs the binary with args as p's process, its output to logf; the
// DSN and env go through the environment, never the command line.
func (r *runner) exec(p *proc, logf *os.File, args []string, env ...string) error {
	cmd := exec.Command(r.self, args...)
	cmd.Env = append(append(os.Environ(), "SHARDQ_DSN="+r.clientDSN), env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// A client (stopped or not) dies with the runner, whatever ends it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		logf.Close()
		return err
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start %s: %w", p.name(), err)
	}
	p.cmd, p.stdin, p.exited, p.stopped = cmd, stdin, make(chan struct{}), false
	go func(exited chan struct{}) {
		cmd.Wait()
		logf.Close()
		close(exited)
	}(p.exited)
	return nil
}

// through lists the slots whose processes go through p: a server's
// HTTP clients; none for a client.
func (r *runner) through(p *proc) []string {
	if !p.server {
		return nil
	}
	var slots []string
	for _, q := range r.procs {
		if q.cfg.Role == RoleHTTPPublish || q.cfg.Role == RoleHTTPReceive {
			slots = append(slots, q.slot)
		}
	}
	return slots
}

func (r *runner) fault(e Event) {
	e.Op = "fault"
	if e.Proc == "" {
		e.Proc = "runner"
	}
	if err := r.hist.Record(e); err != nil {
		r.cfg.Log.Error("chaos: history write failed", "err", err)
	}
	r.cfg.Log.Info("chaos: fault", "kind", e.Fault, "proc", e.Proc)
}

func (r *runner) allowed(kind string) bool {
	if len(r.cfg.Faults) > 0 && !slices.Contains(r.cfg.Faults, kind) {
		return false
	}
	switch kind {
	case chaoscheck.FaultCut, chaoscheck.FaultBlackhole, chaoscheck.FaultDelay:
		return r.proxy != nil
	case chaoscheck.FaultDBRestart:
		return r.cfg.DBRestart != ""
	case chaoscheck.FaultReparent:
		return r.cfg.Reparent != ""
	case chaoscheck.FaultDiskFull:
		return r.cfg.FullDisk != ""
	}
	return true
}

// faults injects faults on the seed's schedule until the duration ends.
func (r *runner) faults(ctx context.Context) error {
	end := r.faultsEnd
	weights := []struct {
		kind string
		w    int
	}{{chaoscheck.FaultKill, 4}, {chaoscheck.FaultStop, 3}, {chaoscheck.FaultCut, 2}, {chaoscheck.FaultBlackhole, 1},
		{chaoscheck.FaultDelay, 1}, {chaoscheck.FaultDBRestart, 1}, {chaoscheck.FaultDiskFull, 1}, {chaoscheck.FaultClock, 1}}
	var kinds, first []string
	for _, k := range weights {
		if r.allowed(k.kind) {
			first = append(first, k.kind)
			for range k.w {
				kinds = append(kinds, k.kind)
			}
		}
	}
	// Every kind comes once first, in a seeded order, so that a short run
	// has them all; then they come by weight.
	r.rng.Shuffle(len(first), func(i, j int) { first[i], first[j] = first[j], first[i] })
	var timers sync.WaitGroup
	defer timers.Wait()
	half := time.Now().Add(time.Until(end) / 2)
	reparent := r.allowed(chaoscheck.FaultReparent)
	for time.Now().Before(end) {
		wait := time.Duration(500+r.rng.IntN(2000)) * time.Millisecond
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(min(wait, time.Until(end))):
		}
		if !time.Now().Before(end) {
			break
		}
		if reparent && time.Now().After(half) {
			// Once, between the other faults, so never during a restart.
			reparent = false
			if err := r.shell(ctx, chaoscheck.FaultReparent, time.Now().UnixNano(), "move the primary", r.cfg.Reparent); err != nil {
				return err
			}
			continue
		}
		if len(kinds) == 0 {
			continue
		}
		kind := kinds[r.rng.IntN(len(kinds))]
		if len(first) > 0 {
			kind, first = first[0], first[1:]
		}
		if err := r.inject(ctx, kind, &timers); err != nil {
			return err
		}
	}
	return nil
}

func (r *runner) inject(ctx context.Context, kind string, timers *sync.WaitGroup) error {
	now := time.Now().UnixNano()
	switch kind {
	case chaoscheck.FaultKill, chaoscheck.FaultClock:
		p := r.procs[r.rng.IntN(len(r.procs))]
		r.mu.Lock()
		defer r.mu.Unlock()
		if p.stopped {
			return nil
		}
		r.fault(Event{Fault: chaoscheck.FaultKill, Proc: p.name(), Start: now, Touches: r.through(p)})
		p.cmd.Process.Signal(syscall.SIGKILL)
		<-p.exited
		if kind == chaoscheck.FaultClock && !p.server { // a server's clock is its own: no flag sets it
			// The slot's host clock is off from now on, behind or ahead,
			// by more than a lease's TTL and the heartbeats' staleness.
			p.cfg.ClockOffset = time.Duration(5+r.rng.IntN(56)) * time.Second
			if r.rng.IntN(2) == 0 {
				p.cfg.ClockOffset = -p.cfg.ClockOffset
			}
		}
		if err := r.spawn(ctx, p); err != nil {
			return err
		}
		if kind == chaoscheck.FaultClock && !p.server {
			r.fault(Event{Fault: kind, Proc: p.name(), Start: time.Now().UnixNano(), Skew: p.cfg.ClockOffset.Nanoseconds()})
		}
	case chaoscheck.FaultStop:
		p := r.procs[r.rng.IntN(len(r.procs))]
		d := time.Duration(500+r.rng.IntN(int(leaseTTL/time.Millisecond)+2000)) * time.Millisecond
		r.mu.Lock()
		defer r.mu.Unlock()
		if p.stopped {
			return nil
		}
		r.fault(Event{Fault: kind, Proc: p.name(), Start: now, End: now + d.Nanoseconds(), Touches: r.through(p)})
		p.cmd.Process.Signal(syscall.SIGSTOP)
		p.stopped = true
		timers.Add(1)
		time.AfterFunc(d, func() {
			defer timers.Done()
			r.cont(p)
		})
	case chaoscheck.FaultCut:
		r.fault(Event{Fault: kind, Start: now})
		r.proxy.Cut()
	case chaoscheck.FaultBlackhole:
		d := time.Duration(500+r.rng.IntN(int(leaseTTL/time.Millisecond)+1000)) * time.Millisecond
		r.fault(Event{Fault: kind, Start: now, End: now + d.Nanoseconds()})
		r.proxy.Blackhole(d)
	case chaoscheck.FaultDelay:
		d := time.Duration(1000+r.rng.IntN(4000)) * time.Millisecond
		r.fault(Event{Fault: kind, Start: now, End: now + d.Nanoseconds()})
		r.proxy.Delay(time.Duration(5+r.rng.IntN(50))*time.Millisecond, d)
	case chaoscheck.FaultDiskFull:
		// Recorded once over: from the fill's start until the database
		// writes again, which may be a minute after the disk is freed.
		d := time.Duration(1000+r.rng.IntN(4000)) * time.Millisecond
		err := fillDisk(ctx, r.cfg.FullDisk, d)
		if err == nil {
			err = r.untilWritable(ctx)
		}
		r.fault(Event{Fault: kind, Start: now, End: time.Now().UnixNano()})
		return err
	case chaoscheck.FaultDBRestart:
		return r.shell(ctx, kind, now, "restart the database", r.cfg.DBRestart)
	}
	return nil
}

// writableWithin bounds the wait for a database to write again after a
// disk-full fault (MariaDB looks again once a minute).
const writableWithin = 3 * time.Minute

// untilWritable waits until the Probe write commits.
func (r *runner) untilWritable(ctx context.Context) error {
	if r.cfg.Probe == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, writableWithin)
	defer cancel()
	for {
		pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
		err := r.cfg.Probe(pctx)
		pcancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("disk-full: the database did not write again within %s: %w", writableWithin, err)
		}
		sleep(ctx, 100*time.Millisecond)
	}
}

// shell runs a fault's command and records the fault over its run.
func (r *runner) shell(ctx context.Context, kind string, start int64, what, command string) error {
	out, err := exec.CommandContext(ctx, "sh", "-c", command).CombinedOutput()
	r.fault(Event{Fault: kind, Start: start, End: time.Now().UnixNano()})
	if err != nil {
		return fmt.Errorf("%s (%s): %w: %s", what, command, err, out)
	}
	return nil
}

// tmpfsMagic is the f_type of a tmpfs (linux/magic.h).
const tmpfsMagic = 0x01021994

// checkFullDisk refuses a --full-disk directory that is not on a tmpfs:
// the fault fills the whole file system.
func checkFullDisk(dir string) error {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return fmt.Errorf("--full-disk: %w", err)
	}
	if st.Type != tmpfsMagic {
		return fmt.Errorf("--full-disk: %s is not on a tmpfs (file system type %#x): the fault fills its whole file system, so it takes only a small tmpfs of the run's own", dir, st.Type)
	}
	return nil
}

// fillDisk fills dir's file system for d, then frees it.
func fillDisk(ctx context.Context, dir string, d time.Duration) error {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return fmt.Errorf("disk-full: %w", err)
	}
	name := filepath.Join(dir, "chaos-filler")
	f, err := os.Create(name)
	if err != nil {
		return fmt.Errorf("disk-full: %w", err)
	}
	defer os.Remove(name)
	chunk := make([]byte, 1<<20)
	// Bounded by the file system's size: it stops at ENOSPC or there.
	for left := int64(st.Blocks) * st.Bsize; left > 0; left -= int64(len(chunk)) {
		if _, err := f.Write(chunk); err != nil {
			break
		}
	}
	sleep(ctx, d)
	return f.Close()
}

func (r *runner) cont(p *proc) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if p.stopped {
		p.cmd.Process.Signal(syscall.SIGCONT)
		p.stopped = false
		r.fault(Event{Fault: chaoscheck.FaultCont, Proc: p.name(), Start: time.Now().UnixNano()})
	}
}

// recover wakes stopped processes and restarts any that died on their own.
func (r *runner) recover(ctx context.Context) {
	for _, p := range r.procs {
		r.cont(p)
		select {
		case <-p.exited:
			if p.consumer || p.server {
				r.cfg.Log.Warn("chaos: a consumer exited on its own; restarting it", "proc", p.name())
				r.mu.Lock()
				if err := r.spawn(ctx, p); err != nil {
					r.cfg.Log.Error("chaos: restart", "proc", p.name(), "err", err)
				}
				r.mu.Unlock()
			}
		default:
		}
	}
}

// stopGracefully closes the processes' stdin (a server: SIGTERM) and
// waits for them to exit.
func (r *runner) stopGracefully(ps []*proc, timeout time.Duration) error {
	for _, p := range ps {
		r.cont(p)
		p.stdin.Close()
		if p.server {
			p.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	var errs []error
	deadline := time.After(timeout)
	for _, p := range ps {
		select {
		case <-p.exited:
			if st := p.cmd.ProcessState; st != nil && !st.Success() {
				errs = append(errs, fmt.Errorf("%s exited: %v (log: %s)", p.name(), st, filepath.Join(r.cfg.Dir, p.name()+".log")))
			}
		case <-deadline:
			errs = append(errs, fmt.Errorf("%s did not stop within %v", p.name(), timeout))
			p.cmd.Process.Signal(syscall.SIGKILL)
			<-p.exited
		}
	}
	return errors.Join(errs...)
}

func (r *runner) stopPublishers(ctx context.Context) error {
	var ps []*proc
	for _, p := range r.procs {
		if !p.consumer && !p.server {
			ps = append(ps, p)
		}
	}
	return r.stopGracefully(ps, 60*time.Second)
}

func (r *runner) stopConsumers(ctx context.Context) error {
	var ps []*proc
	for _, p := range r.procs {
		if p.consumer {
			ps = append(ps, p)
		}
	}
	err := r.stopGracefully(ps, 60*time.Second)
	ps = nil
	for _, p := range r.procs {
		if p.server {
			ps = append(ps, p)
		}
	}
	return errors.Join(err, r.stopGracefully(ps, 60*time.Second))
}

func (r *runner) killAll() {
	for _, p := range r.procs {
		if p.cmd != nil {
			p.cmd.Process.Signal(syscall.SIGKILL)
			p.cmd.Process.Signal(syscall.SIGCONT)
			<-p.exited
		}
	}
}

// drain lets the consumers finish: it returns once no history grew for
// DrainQuiet, or after cfg.Drain.
func (r *runner) drain(ctx context.Context) {
	end := time.Now().Add(r.cfg.Drain)
	last, quietSince := int64(-1), time.Now()
	for time.Now().Before(end) && ctx.Err() == nil {
		size := historySize(r.cfg.Dir)
		if size != last {
			last, quietSince = size, time.Now()
		} else if time.Since(quietSince) >= DrainQuiet {
			return
		}
		sleep(ctx, 500*time.Millisecond)
	}
	r.cfg.Log.Warn("chaos: the drain reached its bound while consumers still worked", "drain", r.cfg.Drain)
}

func historySize(dir string) int64 {
	files, _ := filepath.Glob(filepath.Join(dir, "*.jsonl"))
	var n int64
	for _, f := range files {
		if st, err := os.Stat(f); err == nil && !strings.HasSuffix(f, "runner.jsonl") {
			n += st.Size()
		}
	}
	return n
}

// dump records every message the run's tenants still store, from their
// exports, and every half message still pending.
func (r *runner) dump(ctx context.Context, c *shardq.Client) error {
	halves, err := c.Admin().PendingHalves(ctx, shardq.Scope{Tenants: r.cfg.Tenants})
	if err != nil {
		return err
	}
	for _, h := range halves {
		if err := r.hist.Record(Event{Op: "half", Proc: "runner", Tenant: h.Tenant, Topic: h.Topic, Key: h.PartitionKey, ID: h.ID}); err != nil {
			return err
		}
	}
	for _, t := range r.cfg.Tenants {
		if err := r.dumpTenant(ctx, c, t); err != nil {
			return fmt.Errorf("tenant %q: %w", t, err)
		}
	}
	return nil
}

func (r *runner) dumpTenant(ctx context.Context, c *shardq.Client, tenant string) error {
	pr, pw := io.Pipe()
	go func() {
		_, err := c.Admin().ExportTenant(ctx, tenant, pw, shardq.ExportOptions{})
		pw.CloseWithError(err)
	}()
	dec := json.NewDecoder(pr)
	for {
		var l shardq.ExportLine
		if err := dec.Decode(&l); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			pr.CloseWithError(err)
			return err
		}
		var e Event
		switch l.Kind {
		case shardq.ExportKindMessage:
			e = Event{Op: "stored", Proc: "runner", Tenant: tenant, Topic: l.Topic, ID: l.ID, Offset: l.Offset,
				Complete: l.Headers[shardq.HeaderLargeChunks] != "" && l.Headers[shardq.HeaderLargeAborted] != "true"}
		case shardq.ExportKindCursor:
			if l.Committed == nil {
				continue
			}
			e = Event{Op: "cursor", Proc: "runner", Tenant: tenant, Group: l.ConsumerGroup, Topic: l.Topic, Offset: *l.Committed}
		default:
			continue
		}
		if l.PartitionKey != nil {
			e.Key = *l.PartitionKey
		}
		if err := r.hist.Record(e); err != nil {
			return err
		}
	}
}

func writeTimeline(cfg RunConfig, tl Timeline) error {
	f, err := os.Create(filepath.Join(cfg.Dir, "timeline.svg"))
	if err != nil {
		return err
	}
	title := fmt.Sprintf("shardq chaos run: %s, seed %d, %v of faults", dbKind(cfg.DSN), cfg.Seed, cfg.Duration)
	return errors.Join(tl.WriteSVG(f, title), f.Close())
}

func dbKind(dsn string) string { return strings.SplitN(dsn, ":", 2)[0] }

func writeSummary(cfg RunConfig, rep chaoscheck.Report, tl Timeline) error {
	var b strings.Builder
	fmt.Fprintf(&b, "chaos run: seed %d, %v of faults, database %s, tenants %s\n", cfg.Seed, cfg.Duration, dbKind(cfg.DSN), strings.Join(cfg.Tenants, ","))
	fmt.Fprintf(&b, "messages: %d sent, %d acknowledged to publishers, %d stored at the end\n", rep.Sent, rep.Published, rep.Stored)
	fmt.Fprintf(&b, "transactional: %d sent, %d check-backs answered\n", rep.Halves, rep.CheckedBack)
	for _, g := range slices.Sorted(maps.Keys(rep.Handled)) {
		fmt.Fprintf(&b, "group %-5s handled %d, dead-lettered %d, redelivered after a fault %d\n", g, rep.Handled[g], rep.DeadLettered[g], rep.Duplicates[g])
	}
	var fs []string
	for _, k := range slices.Sorted(maps.Keys(rep.Faults)) {
		fs = append(fs, fmt.Sprintf("%s %d", k, rep.Faults[k]))
	}
	fmt.Fprintf(&b, "faults: %s\n", strings.Join(fs, ", "))
	fmt.Fprintf(&b, "publishers: %.0f msg/s acknowledged; group sub, acknowledgement to first delivery: p50 %.1f ms, p99 %.1f ms, max %.0f ms (timeline.svg)\n",
		tl.Rate, tl.AllP50, tl.AllP99, tl.AllMax)
	if len(tl.ByTenant) > 1 {
		for _, tenant := range slices.Sorted(maps.Keys(tl.ByTenant)) {
			l := tl.ByTenant[tenant]
			fmt.Fprintf(&b, "  tenant %s: p50 %.1f ms, p99 %.1f ms, max %.0f ms\n", tenant, l.P50, l.P99, l.Max)
		}
	}
	fmt.Fprintf(&b, "violations: %d\n", len(rep.Violations))
	for _, v := range rep.Violations {
		fmt.Fprintf(&b, "  %s\n", v)
	}
	if err := os.WriteFile(filepath.Join(cfg.Dir, "summary.txt"), []byte(b.String()), 0o644); err != nil {
		return err
	}
	_, err := io.WriteString(cfg.Out, b.String())
	return err
}
