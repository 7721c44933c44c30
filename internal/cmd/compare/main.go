// Command compare runs one load against several rate limiters, in one
// process and one run, and prints how each fared: headway's token bucket
// (the default bucket), its GCRA, its sliding log, its leased layer over
// the token bucket, go-redis/redis_rate v10, the classic lock-per-call
// token bucket (written here as the baseline), golang.org/x/time/rate (in
// memory, the local baseline), and Gubernator v2 (one daemon, and a
// cluster of three with BATCHING or GLOBAL; token and leaky bucket),
// whose daemons run in this process and are asked over gRPC. Gubernator's
// code is built only when one of its contenders is selected: this program
// then builds itself with -tags gubernator and runs that build in its
// place (see gubernator_contenders.go), so that vetting and testing this
// module need none of Gubernator's dependencies.
//
//	cd internal/cmd/compare && go run . -goroutines 64 -duration 10s
//
// Every contender gets the same load: -goroutines goroutines that each ask
// for a permit, waiting at most one interval, and ask again as soon as
// they have an answer. It runs in two modes, half of -duration each:
//
//   - limit: -limit permits per -interval. Demand far exceeds the limit,
//     so every correct contender grants about the limit; the table shows
//     what granting it costs (store calls per grant, latency) and
//     whether it was kept (violations, and what a provider counting a
//     sliding window of the interval saw) and used (utilization). With
//     -demand, asks instead arrive at that multiple of the limit, evenly,
//     whatever the answers (enough goroutines are started for it).
//   - capacity: a limit no contender reaches (100,000,000 per 100 s, with
//     as big a burst), so every ask is granted at once and grants/s is
//     decision throughput.
//
// Columns: grants/s; p50 and p99 latency of granted acquires (waiting
// included); CPU time per 1,000 grants of the processes involved (this
// one, which holds the callers and any Gubernator daemon, and the
// redis-server for a contender on Redis; read from /proc, Linux only);
// calls per grant (Redis round trips, counted by a go-redis hook on the
// contender's own client, a script run, a lock attempt, a GET each
// counting one, and a pipeline one however many commands it holds; for
// Gubernator, its gRPC calls; in limit mode, over the
// run's steady part, from one interval after its start to its end, when it
// lasts more than two intervals: the start's one-time costs and the asks
// the end cuts short are not what a grant costs); utilization, the grants
// over the most the contender's guarantee allows between the first and
// the last grant; violations, grants the guarantee cannot account for,
// checked on when the grants were decided (the start of the store call
// that made each, timed by the caller; see check.go), allowing as
// tolerance the longest such call: a grant the Limiter held after its
// answer, for its place in the period, is checked when it was decided,
// and the hold widens nothing; in limit mode,
// as a provider counts (at the times the calls are made, no tolerance),
// the most grants in any window of one interval over the limit (and in
// any that opens an interval or more after the first grant: past the
// start's edge), and the grants over the most that window allows between
// the first and the last; refused and failed acquires; and grants/s, p99 and CPU as
// multiples of -base's (redis_rate by default; the first contender that
// runs when it does not). With -rounds, every round runs each contender
// in turn, and a table of medians with their ranges follows.
//
// Without -redis it starts redis-server (which must be installed) on a
// free loopback port and stops it at the end. Everything runs on
// 127.0.0.1; each run is bounded in time, so the whole program takes
// about -duration per contender plus a second or two each (a Gubernator
// daemon whose Close hangs, as after GLOBAL traffic, is given up on after
// 5 s and reported). SIGINT or SIGTERM ends the contender running, and no
// other starts: the tables show the rounds complete by then (or the first
// as far as it went), and the program exits 0.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/headway-go/headway/internal/cli"
)

// The capacity mode's limit: far above any contender's throughput, with a
// burst as large, so that nothing is ever refused. GCRA buckets need at
// most one permit per microsecond of interval; this is exactly that.
const (
	capacityLimit    = 100_000_000
	capacityInterval = 100 * time.Second
)

// maxGrants bounds the grants one run records (memory: 16 bytes each).
const maxGrants = 60_000_000

// config is the command line.
type config struct {
	limit      int64
	interval   time.Duration
	goroutines int
	duration   time.Duration // per contender, split between the modes run
	modes      []string
	redis      string
	only       []string
	lockRetry  time.Duration
	rounds     int
	base       string  // the contender ratios are to
	demand     float64 // limit mode: asks per interval ÷ limit; 0: closed loop
	redisPID   int     // the redis-server's pid when it runs here, else 0
}

func main() {
	os.Exit(command(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// command is main, returning the exit code (see internal/cli).
func command(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cmd := cli.New("compare", "compare runs headway's buckets and other Go rate limiters under the same load,\nat a binding limit and at capacity, and prints grants/s, latency and Redis calls.")
	fs := cmd.Flags
	var (
		c           config
		modes, only string
	)
	fs.Int64Var(&c.limit, "limit", 1000, "limit mode: permits per interval")
	fs.DurationVar(&c.interval, "interval", time.Second, "limit mode: the limit's interval")
	fs.IntVar(&c.goroutines, "goroutines", 64, "goroutines asking for permits, per contender")
	fs.DurationVar(&c.duration, "duration", 10*time.Second, "time per contender, split evenly between the modes run")
	fs.StringVar(&modes, "mode", "limit,capacity", "modes to run: limit, capacity, or both")
	fs.StringVar(&c.redis, "redis", "", "Redis address (default: start redis-server on a free loopback port)")
	fs.StringVar(&only, "only", "", "comma list of contenders to run (default all): "+strings.Join(names(), ", "))
	fs.IntVar(&c.rounds, "rounds", 1, "rounds per mode; each runs every contender in turn, and the tables show medians with their range")
	fs.DurationVar(&c.lockRetry, "lock-retry", time.Millisecond, "lock-per-call: Redsync's retry delay for a taken lock (Redsync's own default is 50-250ms)")
	fs.StringVar(&c.base, "base", "redis_rate", "the contender that the ratio columns compare with (when it does not run: the first that does)")
	fs.Float64Var(&c.demand, "demand", 0, "limit mode: asks per interval as a multiple of -limit, arriving evenly whatever the answers (enough goroutines are started for that); 0: -goroutines goroutines ask again as soon as they have an answer")
	read := func() error {
		if modes == "both" {
			modes = "limit,capacity"
		}
		c.modes = split(modes)
		c.only = split(only)
		return c.check()
	}
	return cmd.Run(ctx, args, stdout, stderr, read, func(ctx context.Context) error {
		if c.needsGubernatorBuild() {
			return runWithGubernator(ctx, args, stdout, stderr)
		}
		return run(ctx, c, stdout, stderr)
	})
}

func run(ctx context.Context, c config, stdout, stderr io.Writer) error {
	if err := c.check(); err != nil {
		return err
	}
	if c.redis == "" && slices.ContainsFunc(c.selected(), func(ct contender) bool { return ct.redis }) {
		srv, err := startRedis(ctx)
		if err != nil {
			return cli.Usagef("%w", err)
		}
		defer srv.close()
		c.redis = srv.addr
		fmt.Fprintf(stderr, "compare: started redis-server on %s for this run\n", srv.addr)
	}
	if c.redis != "" {
		c.redisPID = redisPID(ctx, c.redis)
	}
	base := c.baseName()
	fmt.Fprintf(stdout, "# %d goroutines per contender, %v per mode; %s\n\n",
		c.goroutines, c.duration/time.Duration(len(c.modes)), machine(ctx, c.redis, c.selected()))
	for _, mode := range c.modes {
		if ctx.Err() != nil {
			break // stopped by a signal: what ran is printed
		}
		limit, interval, demand := c.limit, c.interval, c.demand
		if mode == "capacity" {
			limit, interval, demand = capacityLimit, capacityInterval, 0
		}
		rounds, err := runRounds(ctx, c, mode, limit, interval, demand, stderr)
		if err != nil {
			return err
		}
		if len(rounds) == 0 {
			break
		}
		results := medianRound(rounds)
		switch {
		case mode == "capacity":
			fmt.Fprintf(stdout, "## capacity mode: %d per %v, never reached: grants/s is decision throughput\n\n", limit, interval)
		case demand > 0:
			fmt.Fprintf(stdout, "## limit mode: %d per %v (%.0f/s), asks arriving at %g× that (%d goroutines)\n\n",
				limit, interval, float64(limit)/interval.Seconds(), demand, callers(c.goroutines, demand, limit))
		default:
			fmt.Fprintf(stdout, "## limit mode: %d per %v (%.0f/s), demand far above it\n\n", limit, interval, float64(limit)/interval.Seconds())
		}
		table(stdout, results, base, mode == "limit")
		fmt.Fprintln(stdout)
		if len(rounds) > 1 {
			summary(stdout, rounds, base, mode == "limit")
			fmt.Fprintln(stdout)
		}
	}
	fmt.Fprintln(stdout, "Contenders:")
	for _, ct := range c.selected() {
		fmt.Fprintf(stdout, "- %s: %s\n", ct.name, ct.note)
	}
	return nil
}

// runRounds runs -rounds rounds of every selected contender in turn, in
// one mode. A signal (ctx ending) stops it before the next contender
// starts: it returns the rounds complete by then, or the first round as
// far as it went when none is.
func runRounds(ctx context.Context, c config, mode string, limit int64, interval time.Duration, demand float64, stderr io.Writer) ([][]result, error) {
	var rounds [][]result
	for round := range c.rounds {
		var results []result
		for _, ct := range c.selected() {
			if ctx.Err() != nil {
				break
			}
			fmt.Fprintf(stderr, "compare: %s mode, round %d: %s...\n", mode, round+1, ct.name)
			r, err := runOne(ctx, c, ct, limit, interval, demand, c.duration/time.Duration(len(c.modes)))
			if err != nil {
				if ctx.Err() != nil {
					break // its start was cut short by the signal
				}
				return nil, fmt.Errorf("%s, %s mode: %w", ct.name, mode, err)
			}
			if r.closeErr != "" {
				fmt.Fprintf(stderr, "compare: %s mode, round %d: %s: %s\n", mode, round+1, ct.name, r.closeErr)
			}
			results = append(results, r)
		}
		if len(results) == len(c.selected()) || len(rounds) == 0 && len(results) > 0 {
			rounds = append(rounds, results)
		}
		if ctx.Err() != nil {
			break
		}
	}
	return rounds, nil
}

func (c *config) check() error {
	switch {
	case c.limit < 1:
		return fmt.Errorf("-limit %d: must be at least 1", c.limit)
	case c.interval < time.Millisecond:
		return fmt.Errorf("-interval %v: must be at least 1ms", c.interval)
	case c.limit > c.interval.Microseconds():
		return fmt.Errorf("-limit %d: at most one per microsecond of -interval (headway's GCRA)", c.limit)
	case c.goroutines < 1 || c.goroutines > 10000:
		return fmt.Errorf("-goroutines %d: must be 1 to 10000", c.goroutines)
	case c.duration < 100*time.Millisecond || c.duration > 10*time.Minute:
		return fmt.Errorf("-duration %v: must be 100ms to 10m", c.duration)
	case c.rounds < 1 || c.rounds > 50:
		return fmt.Errorf("-rounds %d: must be 1 to 50", c.rounds)
	case c.lockRetry <= 0:
		return fmt.Errorf("-lock-retry %v: must be positive", c.lockRetry)
	case !(c.demand >= 0 && c.demand <= 1000): // NaN fails both
		return fmt.Errorf("-demand %v: must be 0 to 1000", c.demand)
	case slices.Contains(c.modes, "limit") && callers(c.goroutines, c.demand, c.limit) > 10000:
		return fmt.Errorf("-demand %v × -limit %d: would need %d goroutines; at most 10000", c.demand, c.limit, callers(c.goroutines, c.demand, c.limit))
	case len(c.modes) == 0:
		return errors.New("-mode: name limit, capacity or both")
	}
	for _, m := range c.modes {
		if m != "limit" && m != "capacity" {
			return fmt.Errorf("-mode %q: must be limit or capacity", m)
		}
	}
	for _, n := range c.only {
		if !slices.Contains(names(), n) {
			return fmt.Errorf("-only %q: no such contender; have %s", n, strings.Join(names(), ", "))
		}
	}
	if !slices.Contains(names(), c.base) {
		return fmt.Errorf("-base %q: no such contender; have %s", c.base, strings.Join(names(), ", "))
	}
	return nil
}

// baseName returns the contender the ratios are to: -base if it runs,
// else the first contender that does.
func (c *config) baseName() string {
	sel := c.selected()
	if len(sel) == 0 || slices.ContainsFunc(sel, func(ct contender) bool { return ct.name == c.base }) {
		return c.base
	}
	return sel[0].name
}

// selected returns the contenders -only names, or all.
func (c *config) selected() []contender {
	var out []contender
	for _, ct := range contenders {
		if len(c.only) == 0 || slices.Contains(c.only, ct.name) {
			out = append(out, ct)
		}
	}
	return out
}

// result is what one contender did in one mode.
type result struct {
	name     string
	grants   int
	asks     int64 // acquire calls
	elapsed  time.Duration
	p50, p99 time.Duration
	cmds     int64 // Redis commands, or Gubernator's gRPC calls
	// perGrant is cmds per grant; in limit mode, when the run lasts more
	// than two intervals, over its steady part only: the commands from
	// one interval after the start to the end, over the grants returned
	// in that span. The first interval holds the one-time costs (scripts
	// loaded, a first refill, the crowd's first asks) and the end the
	// asks the run cut short (a placed permit given back), which say
	// nothing of what a grant costs.
	perGrant   float64
	refused    int64
	errors     int64
	firstErr   string
	violations int
	util       float64
	tol        time.Duration
	guarantee  guarantee
	// cpu is the CPU time of the processes involved over the run (this
	// process; the redis-server too for a contender on Redis); cpuOK
	// false when it could not be read.
	cpu   time.Duration
	cpuOK bool
	// Limit mode, counted as a provider counts the calls (at the times
	// the callers were granted, no tolerance): the most grants in any
	// window of one interval, and in any that opens an interval or more
	// after the first grant (past the start's edge); and the most any
	// sliding window of the limit allows between the first and the last
	// grant.
	limit          int64
	maxWindow      int
	maxWindowLater int
	allowed        float64
	closeErr       string // what the contender's close could not release
}

func (r result) perSec() float64 { return float64(r.grants) / r.elapsed.Seconds() }

// cpuPer1k returns the CPU time per 1,000 grants, and false when it is
// not known.
func (r result) cpuPer1k() (time.Duration, bool) {
	if !r.cpuOK || r.grants == 0 {
		return 0, false
	}
	return time.Duration(float64(r.cpu) * 1000 / float64(r.grants)), true
}

// worker is what one goroutine saw.
type worker struct {
	times   []int64 // grant times (when acquire returned), ns since the start
	decided []int64 // when each grant was decided at the earliest, ns since the start
	lats    []int64 // granted acquires' latency, ns
	late    time.Duration
	asks    int64
}

// runOne runs one contender for d under limit per interval. With demand
// > 0 the goroutines' asks are paced to demand × limit per interval in
// all.
func runOne(ctx context.Context, c config, ct contender, limit int64, interval time.Duration, demand float64, d time.Duration) (result, error) {
	var raw [4]byte
	_, _ = rand.Read(raw[:])
	n := c.goroutines
	if demand > 0 {
		n = callers(n, demand, limit)
	}
	hook := &counter{}
	s := setup{key: "compare-" + hex.EncodeToString(raw[:]), limit: limit, interval: interval, lockRetry: c.lockRetry, calls: hook}
	if ct.redis {
		s.rdb = redis.NewClient(&redis.Options{Addr: c.redis, PoolSize: n + 8, ContextTimeoutEnabled: true})
		defer s.rdb.Close()
		s.rdb.AddHook(hook)
		// Setting up is not cut short by a signal: a contender that was
		// announced runs, for as long as is left, and is in the table.
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		err := warmUp(wctx, s.rdb, n)
		cancel()
		if err != nil {
			return result{}, err
		}
	}
	acq, err := ct.build(s)
	if err != nil {
		return result{}, err
	}

	hook.n.Store(0)
	meter := newCPUMeter(ct.redis, c.redisPID)
	run, cancel := context.WithCancel(ctx)
	defer cancel()
	// The commands at the steady part's start and at the run's end
	// (before the asks cut short give their permits back): see perGrant.
	var cmdsFrom, cmdsTo atomic.Int64
	steady := d > 2*interval // never in capacity mode (100 s)
	if steady {
		mark := time.AfterFunc(interval, func() { cmdsFrom.Store(hook.n.Load()) })
		defer mark.Stop()
	}
	end := time.AfterFunc(d, func() {
		cmdsTo.Store(hook.n.Load())
		cancel()
	})
	defer end.Stop()
	var (
		workers          = make([]worker, n)
		refused, failed  atomic.Int64
		firstErr         atomic.Pointer[string]
		wg               sync.WaitGroup
		cpu0, cpuOK      = meter.read()
		start            = time.Now()
		pace             = newPacer(start, interval, limit, demand)
		perWorkerMaxHits = maxGrants / n
	)
	for i := range workers {
		w := &workers[i]
		wg.Go(func() {
			var decided decision
			wctx := context.WithValue(run, decidedKey{}, &decided)
			for run.Err() == nil && len(w.times) < perWorkerMaxHits {
				if at, ok := pace.next(); ok {
					if wait := time.Until(at); wait > 0 && !sleep(run, wait) {
						break
					}
				}
				begin := time.Now()
				decided = decision{}
				w.asks++
				ok, err := acq.acquire(wctx, interval, &decided)
				now := time.Now()
				switch {
				case ok:
					w.times = append(w.times, int64(now.Sub(start)))
					w.lats = append(w.lats, int64(now.Sub(begin)))
					at := now
					if !decided.at.IsZero() {
						// The decision's own span is the tolerance;
						// the time the grant was held after its
						// answer is not. (A permit handed out from a
						// lease made no bucket call: it is checked
						// when it was handed out, and widens no
						// tolerance.)
						by := decided.by
						if by.IsZero() {
							by = now
						}
						at = decided.at
						w.late = max(w.late, by.Sub(at))
					}
					w.decided = append(w.decided, int64(at.Sub(start)))
				case run.Err() != nil:
					// The run ended while it waited.
				case err == nil:
					refused.Add(1)
				default:
					failed.Add(1)
					msg := err.Error()
					firstErr.CompareAndSwap(nil, &msg)
					sleep(run, 10*time.Millisecond) // do not spin on a failing store
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu1, cpuOK1 := meter.read()
	cmds := hook.n.Load()
	closeErr := acq.close()

	var times, decided, lats []int64
	var late time.Duration
	var asks int64
	for _, w := range workers {
		times = append(times, w.times...)
		decided = append(decided, w.decided...)
		lats = append(lats, w.lats...)
		late = max(late, w.late)
		asks += w.asks
	}
	slices.Sort(times)
	slices.Sort(decided)
	slices.Sort(lats)
	g := ct.guarantee(limit, interval)
	viol, allowed := g.check(decided, late)
	r := result{
		name: ct.name, grants: len(times), asks: asks, elapsed: elapsed,
		p50: pct(lats, 0.50), p99: pct(lats, 0.99),
		cmds: cmds, refused: refused.Load(), errors: failed.Load(),
		violations: viol, tol: late, guarantee: g,
		cpu: cpu1 - cpu0, cpuOK: cpuOK && cpuOK1,
		limit: limit, maxWindow: maxInWindow(times, int64(interval), math.MinInt64),
		allowed: windowAllowed(times, limit, interval),
	}
	if len(times) > 0 {
		r.maxWindowLater = maxInWindow(times, int64(interval), times[0]+int64(interval))
	}
	if allowed > 0 {
		r.util = float64(len(times)) / allowed
	}
	if len(times) > 0 {
		r.perGrant = float64(cmds) / float64(len(times))
	}
	if from := int64(interval); steady && cmdsFrom.Load() > 0 {
		i, _ := slices.BinarySearch(times, from)
		j, _ := slices.BinarySearch(times, int64(d))
		if j > i {
			r.perGrant = float64(cmdsTo.Load()-cmdsFrom.Load()) / float64(j-i)
		}
	}
	if p := firstErr.Load(); p != nil {
		r.firstErr = *p
	}
	if closeErr != nil {
		r.closeErr = closeErr.Error()
	}
	return r, nil
}

// callers returns how many goroutines ask: goroutines, or for demand > 0
// enough that the asks keep arriving at demand × limit per interval while
// the earlier ones wait. An ask waits at most one interval, so at most
// demand × limit are waiting at once; a quarter more covers the time of
// the calls themselves.
func callers(goroutines int, demand float64, limit int64) int {
	if demand <= 0 {
		return goroutines
	}
	return max(goroutines, int(math.Ceil(1.25*demand*float64(limit))))
}

// A pacer hands out the times at which asks start: one every
// interval/(demand·limit), from start, in turn to whichever goroutine
// asks next. There are enough goroutines (see callers) that each is free
// before its time comes, so the asks arrive at that rate whatever the
// answers; the table's notes give the rate they reached.
type pacer struct {
	start time.Time
	gap   time.Duration
	n     atomic.Int64
}

// newPacer returns a pacer for demand × limit per interval, or nil (no
// pacing) for demand 0.
func newPacer(start time.Time, interval time.Duration, limit int64, demand float64) *pacer {
	if demand <= 0 {
		return nil
	}
	return &pacer{start: start, gap: max(time.Duration(float64(interval)/(demand*float64(limit))), 1)}
}

// next returns the next ask's time; false for no pacing.
func (p *pacer) next() (time.Time, bool) {
	if p == nil {
		return time.Time{}, false
	}
	return p.start.Add(time.Duration(p.n.Add(1)-1) * p.gap), true
}

// warmUp opens n connections, as a long-running process would have them.
func warmUp(ctx context.Context, rdb *redis.Client, n int) error {
	var (
		wg    sync.WaitGroup
		first atomic.Pointer[error]
	)
	for range n {
		wg.Go(func() {
			if err := rdb.Ping(ctx).Err(); err != nil {
				first.CompareAndSwap(nil, &err)
			}
		})
	}
	wg.Wait()
	if err := first.Load(); err != nil {
		return fmt.Errorf("reaching Redis: %w", *err)
	}
	return nil
}

// counter is a go-redis hook that counts round trips: a command, or a
// pipeline of several (headway's heartbeat rides on a take's trip).
type counter struct{ n atomic.Int64 }

func (h *counter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}

func (h *counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmds)
	}
}

// table prints results as a Markdown table, with ratios to the result
// named base.
func table(w io.Writer, rs []result, base string, limitMode bool) {
	b := slices.IndexFunc(rs, func(r result) bool { return r.name == base })
	head := []string{"contender", "grants/s", "×" + base, "p50", "p99", "p99 ×" + base,
		"CPU/1k grants", "CPU ×" + base, "calls/grant", "utilization", "violations",
		"max in a window ×limit", "after the 1st interval", "total ×allowed", "refused", "errors"}
	rows := [][]string{head}
	for _, r := range rs {
		ratio, p99ratio, cpuRatio := "—", "—", "—"
		if b >= 0 {
			ratio = ratioOf(r.perSec(), rs[b].perSec(), r.grants > 0 && rs[b].grants > 0)
			p99ratio = ratioOf(float64(r.p99), float64(rs[b].p99), r.grants > 0 && rs[b].grants > 0)
			c, ok := r.cpuPer1k()
			cb, okb := rs[b].cpuPer1k()
			cpuRatio = ratioOf(float64(c), float64(cb), ok && okb)
		}
		cpu := "—"
		if c, ok := r.cpuPer1k(); ok {
			cpu = dur(c)
		}
		util, window, later, total := "—", "—", "—", "—"
		if limitMode {
			util = fmt.Sprintf("%.3f", r.util)
			if r.grants > 0 {
				window = fmt.Sprintf("%.2f", float64(r.maxWindow)/float64(r.limit))
				later = fmt.Sprintf("%.2f", float64(r.maxWindowLater)/float64(r.limit))
				total = fmt.Sprintf("%.3f", float64(r.grants)/r.allowed)
			}
		}
		cmds := "—"
		if r.grants > 0 {
			cmds = fmt.Sprintf("%.4g", r.perGrant)
		}
		rows = append(rows, []string{
			r.name, fmt.Sprintf("%.0f", r.perSec()), ratio, dur(r.p50), dur(r.p99), p99ratio,
			cpu, cpuRatio, cmds, util, fmt.Sprint(r.violations), window, later, total,
			fmt.Sprint(r.refused), fmt.Sprint(r.errors),
		})
	}
	widths := make([]int, len(head))
	for _, row := range rows {
		for i, cell := range row {
			widths[i] = max(widths[i], len([]rune(cell)))
		}
	}
	line := func(row []string) {
		for i, cell := range row {
			fmt.Fprintf(w, "| %s%s ", cell, strings.Repeat(" ", widths[i]-len([]rune(cell))))
		}
		fmt.Fprintln(w, "|")
	}
	line(rows[0])
	for i := range head {
		fmt.Fprintf(w, "|%s", strings.Repeat("-", widths[i]+2))
	}
	fmt.Fprintln(w, "|")
	for _, row := range rows[1:] {
		line(row)
	}
	fmt.Fprintln(w)
	for _, r := range rs {
		fmt.Fprintf(w, "- %s: %s, checked at tolerance %v; %.0f asks/s", r.name, r.guarantee, r.tol.Round(time.Microsecond), float64(r.asks)/r.elapsed.Seconds())
		if r.firstErr != "" {
			fmt.Fprintf(w, "; first error: %s", r.firstErr)
		}
		if r.closeErr != "" {
			fmt.Fprintf(w, "; closing: %s", r.closeErr)
		}
		fmt.Fprintln(w)
	}
}

// ratioOf formats a/b, or "—" when !ok or b is 0.
func ratioOf(a, b float64, ok bool) string {
	if !ok || b == 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f", a/b)
}

// medianRound returns, for each contender, its result of the round with
// its median grants/s.
func medianRound(rounds [][]result) []result {
	out := make([]result, len(rounds[0]))
	for i := range out {
		var rs []result
		for _, round := range rounds {
			rs = append(rs, round[i])
		}
		slices.SortFunc(rs, func(a, b result) int { return cmpFloat(a.perSec(), b.perSec()) })
		out[i] = rs[(len(rs)-1)/2]
	}
	return out
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// summary prints, per contender, the median and range over the rounds of
// grants/s, latency, CPU per 1,000 grants, the ratios to the result named
// base of the same round and, in limit mode, what a provider counting a
// sliding window of the interval saw.
func summary(w io.Writer, rounds [][]result, base string, limitMode bool) {
	b := slices.IndexFunc(rounds[0], func(r result) bool { return r.name == base })
	fmt.Fprintf(w, "Over %d rounds (median [min–max]); ratios are to %s in the same round:\n\n", len(rounds), base)
	head := "| contender | grants/s | ×%[1]s | p50 | p99 | p99 ×%[1]s | CPU/1k grants | CPU ×%[1]s | calls/grant |"
	rule := "|---|---|---|---|---|---|---|---|---|"
	if limitMode {
		head += " max in a window ×limit | after the 1st interval | total ×allowed |"
		rule += "---|---|---|"
	}
	fmt.Fprintf(w, head+" violations (sum) |\n", base)
	fmt.Fprintln(w, rule+"---|")
	for i := range rounds[0] {
		var perSec, ratio, p50, p99, p99ratio, cpu, cpuRatio, cmds, window, later, total []float64
		viol := 0
		for _, round := range rounds {
			r := round[i]
			perSec = append(perSec, r.perSec())
			viol += r.violations
			if r.grants == 0 {
				continue
			}
			p50 = append(p50, float64(r.p50))
			p99 = append(p99, float64(r.p99))
			cmds = append(cmds, r.perGrant)
			window = append(window, float64(r.maxWindow)/float64(r.limit))
			later = append(later, float64(r.maxWindowLater)/float64(r.limit))
			total = append(total, float64(r.grants)/r.allowed)
			c, ok := r.cpuPer1k()
			if ok {
				cpu = append(cpu, float64(c))
			}
			if b < 0 || round[b].grants == 0 {
				continue
			}
			ratio = append(ratio, r.perSec()/round[b].perSec())
			if round[b].p99 > 0 {
				p99ratio = append(p99ratio, float64(r.p99)/float64(round[b].p99))
			}
			if cb, okb := round[b].cpuPer1k(); ok && okb && cb > 0 {
				cpuRatio = append(cpuRatio, float64(c)/float64(cb))
			}
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s |", rounds[0][i].name,
			spread(perSec, "%.0f"), spread(ratio, "%.3g"), spreadDur(p50), spreadDur(p99), spread(p99ratio, "%.3g"),
			spreadDur(cpu), spread(cpuRatio, "%.3g"), spread(cmds, "%.3g"))
		if limitMode {
			fmt.Fprintf(w, " %s | %s | %s |", spread(window, "%.2f"), spread(later, "%.2f"), spread(total, "%.3f"))
		}
		fmt.Fprintf(w, " %d |\n", viol)
	}
}

// spread formats the median of xs and its range.
func spread(xs []float64, f string) string {
	if len(xs) == 0 {
		return "—"
	}
	slices.Sort(xs)
	return fmt.Sprintf(f+" ["+f+"–"+f+"]", xs[(len(xs)-1)/2], xs[0], xs[len(xs)-1])
}

// spreadDur formats the median of durations xs (in ns) and their range.
func spreadDur(xs []float64) string {
	if len(xs) == 0 {
		return "—"
	}
	slices.Sort(xs)
	d := func(x float64) string { return dur(time.Duration(x)) }
	return fmt.Sprintf("%s [%s–%s]", d(xs[(len(xs)-1)/2]), d(xs[0]), d(xs[len(xs)-1]))
}

// machine describes where the run happens, and the version of each other
// library that runs.
func machine(ctx context.Context, addr string, cts []contender) string {
	s := fmt.Sprintf("%s, %s/%s, %d CPUs (GOMAXPROCS %d)", runtime.Version(), runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.GOMAXPROCS(0))
	if slices.ContainsFunc(cts, func(ct contender) bool { return ct.gubernator }) {
		s += ", gubernator " + moduleVersion("github.com/gubernator-io/gubernator/v2")
	}
	if addr == "" {
		return s
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	info, err := rdb.Info(ctx, "server").Result()
	if err != nil {
		return s
	}
	for l := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "redis_version:"); ok {
			s += ", redis " + v + " on " + addr
		}
	}
	return s
}

// moduleVersion returns the version of module path this program was built
// with, or "(version unknown)".
func moduleVersion(path string) string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, m := range bi.Deps {
			if m.Path == path {
				return m.Version
			}
		}
	}
	return "(version unknown)"
}

func pct(sorted []int64, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p*float64(len(sorted))+0.999999) - 1
	return time.Duration(sorted[min(max(i, 0), len(sorted)-1)])
}

func dur(d time.Duration) string {
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%.2fs", d.Seconds())
	case d >= time.Millisecond:
		return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%.1fµs", float64(d)/float64(time.Microsecond))
}

func names() []string {
	var out []string
	for _, c := range contenders {
		out = append(out, c.name)
	}
	return out
}

func split(s string) []string {
	var out []string
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
