// Command compare runs one load against several rate limiters, in one
// process and one run, and prints how each fared: headway's token bucket
// (the default bucket), its GCRA, its leased layer over the token bucket,
// go-redis/redis_rate v10, the classic lock-per-call token bucket
// (written here as the baseline), and golang.org/x/time/rate (in memory, the local
// baseline).
//
//	cd internal/cmd/compare && go run . -goroutines 64 -duration 10s
//
// Every contender gets the same load: -goroutines goroutines that each ask
// for a permit, waiting at most one interval, and ask again as soon as
// they have an answer. It runs in two modes, half of -duration each:
//
//   - limit: -limit permits per -interval. Demand far exceeds the limit,
//     so every correct contender grants about the limit; the table shows
//     what granting it costs (Redis commands per grant, latency) and
//     whether it was kept (violations) and used (utilization).
//   - capacity: a limit no contender reaches (100,000,000 per 100 s, with
//     as big a burst), so every ask is granted at once and grants/s is
//     decision throughput.
//
// Columns: grants/s; p50 and p99 latency of granted acquires (waiting
// included); Redis commands per grant, counted by a go-redis hook on the
// contender's own client (a script run, a lock attempt, a GET each count
// one); utilization, the grants over the most the contender's guarantee
// allows between the first and the last grant; violations, grants the
// guarantee cannot account for, checked on the times the goroutines saw
// the grants (see check.go), allowing as tolerance the most any grant was
// seen late; refused and failed acquires; and each contender's grants/s
// and p99 as a multiple of redis_rate's.
//
// Without -redis it starts redis-server (which must be installed) on a
// free loopback port and stops it at the end. Everything runs on
// 127.0.0.1; each run is bounded in time, so the whole program takes
// about -duration per contender plus a second or two each.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
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
	read := func() error {
		if modes == "both" {
			modes = "limit,capacity"
		}
		c.modes = split(modes)
		c.only = split(only)
		return c.check()
	}
	return cmd.Run(ctx, args, stdout, stderr, read, func(ctx context.Context) error {
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
	fmt.Fprintf(stdout, "# %d goroutines per contender, %v per mode; %s\n\n",
		c.goroutines, c.duration/time.Duration(len(c.modes)), machine(ctx, c.redis))
	for _, mode := range c.modes {
		limit, interval := c.limit, c.interval
		if mode == "capacity" {
			limit, interval = capacityLimit, capacityInterval
		}
		var rounds [][]result
		for round := range c.rounds {
			var results []result
			for _, ct := range c.selected() {
				fmt.Fprintf(stderr, "compare: %s mode, round %d: %s...\n", mode, round+1, ct.name)
				r, err := runOne(ctx, c, ct, limit, interval, c.duration/time.Duration(len(c.modes)))
				if err != nil {
					return fmt.Errorf("%s, %s mode: %w", ct.name, mode, err)
				}
				results = append(results, r)
			}
			rounds = append(rounds, results)
		}
		results := medianRound(rounds)
		if mode == "limit" {
			fmt.Fprintf(stdout, "## limit mode: %d per %v (%.0f/s), demand far above it\n\n", limit, interval, float64(limit)/interval.Seconds())
		} else {
			fmt.Fprintf(stdout, "## capacity mode: %d per %v, never reached: grants/s is decision throughput\n\n", limit, interval)
		}
		table(stdout, results, mode == "limit")
		fmt.Fprintln(stdout)
		if len(rounds) > 1 {
			summary(stdout, rounds)
			fmt.Fprintln(stdout)
		}
	}
	fmt.Fprintln(stdout, "Contenders:")
	for _, ct := range c.selected() {
		fmt.Fprintf(stdout, "- %s: %s\n", ct.name, ct.note)
	}
	return nil
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
	return nil
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
	name       string
	grants     int
	elapsed    time.Duration
	p50, p99   time.Duration
	cmds       int64
	refused    int64
	errors     int64
	firstErr   string
	violations int
	util       float64
	tol        time.Duration
	guarantee  guarantee
}

func (r result) perSec() float64 { return float64(r.grants) / r.elapsed.Seconds() }

// worker is what one goroutine saw.
type worker struct {
	times []int64 // grant times, ns since the start
	lats  []int64 // granted acquires' latency, ns
	late  time.Duration
}

// runOne runs one contender for d under limit per interval.
func runOne(ctx context.Context, c config, ct contender, limit int64, interval, d time.Duration) (result, error) {
	var raw [4]byte
	_, _ = rand.Read(raw[:])
	s := setup{key: "compare-" + hex.EncodeToString(raw[:]), limit: limit, interval: interval, lockRetry: c.lockRetry}
	hook := &counter{}
	if ct.redis {
		s.rdb = redis.NewClient(&redis.Options{Addr: c.redis, PoolSize: c.goroutines + 8, ContextTimeoutEnabled: true})
		defer s.rdb.Close()
		s.rdb.AddHook(hook)
		if err := warmUp(ctx, s.rdb, c.goroutines); err != nil {
			return result{}, err
		}
	}
	acq, err := ct.build(s)
	if err != nil {
		return result{}, err
	}
	defer acq.close()

	hook.n.Store(0)
	run, cancel := context.WithCancel(ctx)
	defer cancel()
	end := time.AfterFunc(d, cancel)
	defer end.Stop()
	var (
		workers          = make([]worker, c.goroutines)
		refused, failed  atomic.Int64
		firstErr         atomic.Pointer[string]
		wg               sync.WaitGroup
		start            = time.Now()
		perWorkerMaxHits = maxGrants / c.goroutines
	)
	for i := range workers {
		w := &workers[i]
		wg.Go(func() {
			var decided time.Time
			wctx := context.WithValue(run, decidedKey{}, &decided)
			for run.Err() == nil && len(w.times) < perWorkerMaxHits {
				begin := time.Now()
				decided = time.Time{}
				ok, err := acq.acquire(wctx, interval, &decided)
				now := time.Now()
				switch {
				case ok:
					w.times = append(w.times, int64(now.Sub(start)))
					w.lats = append(w.lats, int64(now.Sub(begin)))
					if !decided.IsZero() {
						// (A permit handed out from a lease made no
						// bucket call: it widens no tolerance.)
						w.late = max(w.late, now.Sub(decided))
					}
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
	cmds := hook.n.Load()

	var times, lats []int64
	var late time.Duration
	for _, w := range workers {
		times = append(times, w.times...)
		lats = append(lats, w.lats...)
		late = max(late, w.late)
	}
	slices.Sort(times)
	slices.Sort(lats)
	g := ct.guarantee(limit, interval)
	viol, allowed := g.check(times, late)
	r := result{
		name: ct.name, grants: len(times), elapsed: elapsed,
		p50: pct(lats, 0.50), p99: pct(lats, 0.99),
		cmds: cmds, refused: refused.Load(), errors: failed.Load(),
		violations: viol, tol: late, guarantee: g,
	}
	if allowed > 0 {
		r.util = float64(len(times)) / allowed
	}
	if p := firstErr.Load(); p != nil {
		r.firstErr = *p
	}
	return r, nil
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

// counter is a go-redis hook that counts commands (a pipeline counts each
// of its commands).
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
		h.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// table prints results as a Markdown table.
func table(w io.Writer, rs []result, limitMode bool) {
	var base *result
	for i := range rs {
		if rs[i].name == "redis_rate" {
			base = &rs[i]
		}
	}
	head := []string{"contender", "grants/s", "×redis_rate", "p50", "p99", "p99 ×redis_rate", "cmds/grant", "utilization", "violations", "refused", "errors"}
	rows := [][]string{head}
	for _, r := range rs {
		ratio, p99ratio := "—", "—"
		if base != nil && base.grants > 0 && r.grants > 0 {
			ratio = fmt.Sprintf("%.2f", r.perSec()/base.perSec())
			if base.p99 > 0 {
				p99ratio = fmt.Sprintf("%.2f", float64(r.p99)/float64(base.p99))
			}
		}
		util := "—"
		if limitMode {
			util = fmt.Sprintf("%.3f", r.util)
		}
		cmds := "—"
		if r.grants > 0 {
			cmds = fmt.Sprintf("%.4g", float64(r.cmds)/float64(r.grants))
		}
		rows = append(rows, []string{
			r.name, fmt.Sprintf("%.0f", r.perSec()), ratio, dur(r.p50), dur(r.p99), p99ratio,
			cmds, util, fmt.Sprint(r.violations), fmt.Sprint(r.refused), fmt.Sprint(r.errors),
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
		fmt.Fprintf(w, "- %s: %s, checked at tolerance %v", r.name, r.guarantee, r.tol.Round(time.Microsecond))
		if r.firstErr != "" {
			fmt.Fprintf(w, "; first error: %s", r.firstErr)
		}
		fmt.Fprintln(w)
	}
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
// grants/s and of the ratios to redis_rate of the same round.
func summary(w io.Writer, rounds [][]result) {
	base := slices.IndexFunc(rounds[0], func(r result) bool { return r.name == "redis_rate" })
	fmt.Fprintf(w, "Over %d rounds (median [min–max]); ratios are to redis_rate in the same round:\n\n", len(rounds))
	fmt.Fprintln(w, "| contender | grants/s | ×redis_rate | p99 ×redis_rate | cmds/grant | violations (sum) |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	for i := range rounds[0] {
		var perSec, ratio, p99, cmds []float64
		viol := 0
		for _, round := range rounds {
			r := round[i]
			perSec = append(perSec, r.perSec())
			if r.grants > 0 {
				cmds = append(cmds, float64(r.cmds)/float64(r.grants))
			}
			viol += r.violations
			if base >= 0 && round[base].grants > 0 && r.grants > 0 {
				ratio = append(ratio, r.perSec()/round[base].perSec())
				if round[base].p99 > 0 {
					p99 = append(p99, float64(r.p99)/float64(round[base].p99))
				}
			}
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %d |\n", rounds[0][i].name,
			spread(perSec, "%.0f"), spread(ratio, "%.2f"), spread(p99, "%.2f"), spread(cmds, "%.3g"), viol)
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

// machine describes where the run happens.
func machine(ctx context.Context, addr string) string {
	s := fmt.Sprintf("%s, %s/%s, %d CPUs (GOMAXPROCS %d)", runtime.Version(), runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.GOMAXPROCS(0))
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
