package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/headway-go/headway/bucket"
	"github.com/headway-go/headway/internal/cli"
	"github.com/headway-go/headway/internal/redisenv"
	"github.com/headway-go/headway/throttle"
)

// config is what a soak runs.
type config struct {
	Duration time.Duration
	Keys     int
	Workers  int
	Bucket   string
	Redis    string // "" starts a redis-server
	Limit    int64
	Period   time.Duration
	MaxWait  time.Duration
	Sample   time.Duration
	// Churn, when positive, makes the keys churn: every Acquire takes the
	// next key of Churn distinct ones (each used Reuse times in a row by
	// the workers together), so the keys in use move on all the time, as
	// tenants come and go; Keys is then unused.
	Churn int
	// Adaptive reports a refusal without a retry hint after one grant in
	// a hundred, so that keys adapt (the fleet's rate, kept in Redis).
	Adaptive bool
	// OutageAt and OutageFor pause the soak's own redis-server (SIGSTOP)
	// OutageAt into the load, for OutageFor; 0: no outage.
	OutageAt, OutageFor time.Duration
}

// reuse is how many Acquires in a row take one key when the keys churn.
const reuse = 2

func defaultConfig() config {
	return config{
		Duration: 60 * time.Second,
		Keys:     1000,
		Workers:  100,
		Bucket:   "tokenbucket",
		Limit:    50,
		Period:   time.Second,
		MaxWait:  10 * time.Millisecond,
		Sample:   5 * time.Second,
	}
}

// Growth thresholds: the mean of the last third of the samples may exceed
// the mean of the first third by at most this factor plus this slack.
const (
	growthFactor  = 1.25
	heapSlack     = 2 << 20 // bytes
	redisMemSlack = 2 << 20 // bytes
	dbSizeSlack   = 100     // keys
	// maxKeysPerKey is the most Redis keys one limiter key holds at once,
	// whatever the bucket (a token bucket's schedule, its live limit and a
	// pause; a GCRA's state, its live rate and a pause), besides the set
	// of live instances.
	maxKeysPerKey = 3
)

// goroutineSlack is how many more goroutines the last third may hold than
// the first, not counting the library's own (see libraryCap): what the
// load may legitimately run at a sample's instant on top of the workers,
// whatever the first third saw: one more per worker (go-redis dials a
// connection on a goroutine of its own, at most one per connection of the
// pool, which has one per worker), and 18 for the clients' own and the
// runtime's (a deadline that fired runs its cancel on a goroutine until
// the scheduler gets to it). A single sample can catch all of them at
// once, so a bound below that failed without a leak. A leak shows after
// the load instead: the count must be back at its level before the load,
// within leakSlack, within settleTime.
func goroutineSlack(workers int) float64 { return 10 + 8 + float64(workers) }

const (
	leakSlack  = 2
	settleTime = 2 * time.Second
)

// libraryCap is the most goroutines the library may run of its own at any
// instant for one Limiter over a Redis bucket whose client honours
// deadlines (as the soak's does): a Limiter's background tasks, at most 8,
// and the give-backs it runs in the background, at most 64 (both
// documented on throttle.Limiter's Acquire and Close). How many there are
// at once depends on how slow Redis and the machine are; more than the
// caps is a defect whatever the machine.
const libraryCap = 8 + 64

// libraryPackages are the packages whose goroutines count against
// libraryCap.
var libraryPackages = [][]byte{
	[]byte("\ncreated by github.com/headway-go/headway/throttle."),
	[]byte("\ncreated by github.com/headway-go/headway/bucket."),
}

// heartbeat is the buckets' heartbeat window: the set of live instances
// expires two windows after the last take, so a short one lets the soak
// see every key gone soon after the load stops.
var heartbeat = bucket.WithHeartbeat(time.Second)

// buckets builds each bucket the soak can run.
var buckets = map[string]func(rdb redis.UniversalClient, limit int64, period time.Duration) (throttle.Bucket, error){
	"tokenbucket": func(rdb redis.UniversalClient, limit int64, period time.Duration) (throttle.Bucket, error) {
		return bucket.NewTokenBucket(rdb, "soak", limit, period, heartbeat)
	},
	"fixedwindow": func(rdb redis.UniversalClient, limit int64, period time.Duration) (throttle.Bucket, error) {
		return bucket.NewFixedWindow(rdb, "soak", limit, period, heartbeat)
	},
	"gcra": func(rdb redis.UniversalClient, limit int64, period time.Duration) (throttle.Bucket, error) {
		return bucket.NewGCRA(rdb, "soak", limit, period, heartbeat)
	},
	"sliding": func(rdb redis.UniversalClient, limit int64, period time.Duration) (throttle.Bucket, error) {
		return bucket.NewSlidingLog(rdb, "soak", []throttle.Tier{{Limit: limit, Period: period}}, heartbeat)
	},
	"tiers": func(rdb redis.UniversalClient, limit int64, period time.Duration) (throttle.Bucket, error) {
		return bucket.NewTiers(rdb, "soak", []throttle.Tier{{Limit: limit, Period: period}, {Limit: 5 * limit, Period: 10 * period}}, heartbeat)
	},
}

func bucketNames() string {
	names := make([]string, 0, len(buckets))
	for n := range buckets {
		names = append(names, n)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

// sample is one row of the table.
type sample struct {
	At         time.Duration
	Heap       uint64 // live heap after a GC, bytes
	Goroutines int
	Library    int   // of Goroutines, those the library started (libraryCap)
	RedisMem   int64 // INFO memory used_memory, bytes
	DBSize     int64
	Acquires   int64 // so far
}

// report is what a soak saw.
type report struct {
	Samples                          []sample
	Workers                          int
	Keys                             int  // limiter keys in use
	Churn                            bool // the keys churned: Redis holds the recent ones
	Granted, Timeouts, Errors        int64
	BucketCalls                      int64 // Redis round trips (Take calls)
	FirstErr                         error
	BaselineGoroutines, EndGoroutine int
}

// thirds returns the means of the first and last thirds of the samples of
// f; ok is false with fewer than three samples.
func (r report) thirds(f func(sample) float64) (first, last float64, ok bool) {
	n := len(r.Samples) / 3
	if n == 0 {
		return 0, 0, false
	}
	mean := func(s []sample) float64 {
		var sum float64
		for _, x := range s {
			sum += f(x)
		}
		return sum / float64(len(s))
	}
	return mean(r.Samples[:n]), mean(r.Samples[len(r.Samples)-n:]), true
}

// middle returns the mean of the middle third of the samples of f.
func (r report) middle(f func(sample) float64) float64 {
	n := len(r.Samples) / 3
	var sum float64
	for _, x := range r.Samples[n : len(r.Samples)-n] {
		sum += f(x)
	}
	return sum / float64(max(len(r.Samples)-2*n, 1))
}

// Failures names every figure that grew beyond its threshold, and Acquire
// errors.
func (r report) Failures() []string {
	var out []string
	if r.Errors > 0 {
		out = append(out, fmt.Sprintf("%d Acquire calls failed; first: %v", r.Errors, r.FirstErr))
	}
	if len(r.Samples) < 3 {
		return append(out, fmt.Sprintf("%d samples: too few to compare thirds (run longer than 3 × -sample)", len(r.Samples)))
	}
	// check compares the last third of the samples with the first (from
	// 0) or the middle (from 1) one.
	check := func(name string, f func(sample) float64, factor, slack float64, from int) {
		first, last, _ := r.thirds(f)
		if from == 1 {
			first = r.middle(f)
		}
		if name == "redis DBSIZE" && r.Keys > 0 && last <= float64(maxKeysPerKey*r.Keys+1) {
			// Within what the keys in use can hold (a short soak's first
			// third may be its warm-up, before every key was used): no
			// leak, whatever the growth.
			return
		}
		if limit := first*factor + slack; last > limit {
			out = append(out, fmt.Sprintf("%s grew: last third %.0f > first third %.0f × %.2f + %.0f", name, last, first, factor, slack))
		}
	}
	if r.Churn {
		// Churning keys first fill the Limiter up to the keys of its idle
		// window (the first third is that ramp); after it, memory must not
		// grow: the last third against the middle one.
		check("heap", func(s sample) float64 { return float64(s.Heap) }, growthFactor, heapSlack, 1)
	} else {
		check("heap", func(s sample) float64 { return float64(s.Heap) }, growthFactor, heapSlack, 0)
	}
	if !r.Churn {
		// (Churning keys leave Redis keys that live a while past their
		// last use: a token bucket's period limit, a minute; an adaptive
		// state, ten. Redis then follows the churn's rate, not a leak.)
		check("redis used_memory", func(s sample) float64 { return float64(s.RedisMem) }, growthFactor, redisMemSlack, 0)
		check("redis DBSIZE", func(s sample) float64 { return float64(s.DBSize) }, growthFactor, dbSizeSlack, 0)
	}
	check("goroutines", func(s sample) float64 { return float64(s.Goroutines - s.Library) }, 1, goroutineSlack(r.Workers), 0)
	for _, s := range r.Samples {
		if s.Library > libraryCap {
			out = append(out, fmt.Sprintf("at %v: the library ran %d goroutines of its own, above its caps (%d)", s.At, s.Library, libraryCap))
			break
		}
	}
	if r.EndGoroutine > r.BaselineGoroutines+leakSlack {
		out = append(out, fmt.Sprintf("goroutines leaked: %d %v after the load, %d before it", r.EndGoroutine, settleTime, r.BaselineGoroutines))
	}
	return out
}

// check refuses settings the soak cannot run with.
func (cfg config) check() error {
	switch {
	case buckets[cfg.Bucket] == nil:
		return fmt.Errorf("-bucket %q: want one of %s", cfg.Bucket, bucketNames())
	case cfg.Keys < 1 || cfg.Workers < 1:
		return errors.New("-keys and -workers must be at least 1")
	case cfg.Sample <= 0 || cfg.Duration <= 0:
		return errors.New("-sample and -duration must be positive")
	case cfg.Churn < 0:
		return errors.New("-churn must not be negative")
	case cfg.OutageFor < 0 || cfg.OutageAt < 0:
		return errors.New("-outage-at and -outage-for must not be negative")
	case cfg.OutageFor > 0 && cfg.Redis != "":
		return errors.New("-outage-for pauses the soak's own redis-server: leave -redis empty")
	}
	return nil
}

// run runs the soak and prints its table to w.
func run(ctx context.Context, cfg config, w io.Writer) (report, error) {
	if err := cfg.check(); err != nil {
		return report{}, err
	}
	newBucket := buckets[cfg.Bucket]
	addr := cfg.Redis
	var srv *redisenv.Server
	if addr == "" {
		var err error
		if srv, err = redisenv.Start(); err != nil {
			return report{}, cli.Usagef("%w", err)
		}
		defer func() { _ = srv.Close() }()
		addr = srv.Addr()
		printf(w, "redis: %s at %s\n", srv.Kind(), addr)
		if cfg.OutageFor > 0 && !srv.Real() {
			return report{}, cli.Usagef("-outage-for needs a real redis-server (SIGSTOP); the stand-in cannot pause")
		}
	}
	// ContextTimeoutEnabled, as headway recommends: the buckets then bound
	// each call by its context without a goroutine of their own. The
	// client's connections are all open before the load (MinIdleConns =
	// PoolSize, see fillPool) and pipelines, the buckets' heartbeat, share
	// them (PipelinePoolSize -1; go-redis 9.23 otherwise opens, on demand,
	// a pipeline pool of up to 10 connections with 256 KiB of buffers
	// each). A client's pools fill as the load needs them (a starved
	// process's calls cut by their waits are dialled again, and after a
	// failed heartbeat the next calls pipeline), which a short soak read
	// as the heap growing (2.6 → 6.0 MiB in 5 s, 59 % of the takes timing
	// out): the soak measures the library, against a client whose memory
	// is already at its bound.
	rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: cfg.Workers, MinIdleConns: cfg.Workers, PipelinePoolSize: -1, ContextTimeoutEnabled: true})
	defer func() { _ = rdb.Close() }()
	admin := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 1})
	defer func() { _ = admin.Close() }()
	if err := admin.Ping(ctx).Err(); err != nil {
		return report{}, fmt.Errorf("redis at %s: %w", addr, err)
	}
	b, err := newBucket(rdb, cfg.Limit, cfg.Period)
	if err != nil {
		return report{}, err
	}
	cb := &counted{inner: b}
	lim := throttle.New(cb)
	defer func() { _ = lim.Close() }()
	// As a service's readiness probe would: the store answers, and the
	// Limiter knows this instance's share before the first take (else an
	// outage before any take fails closed, FailLocal not knowing it).
	if err := lim.Check(ctx); err != nil {
		return report{}, err
	}
	if err := fillPool(ctx, rdb, cfg.Workers); err != nil {
		return report{}, err
	}
	keys := make([]string, cfg.Keys)
	for i := range keys {
		keys[i] = "tenant-" + strconv.Itoa(i)
	}
	var next atomic.Int64 // with Churn: the Acquires so far, which pick the key
	key := func(rng *rand.Rand) string {
		if cfg.Churn > 0 {
			return "tenant-" + strconv.FormatInt(next.Add(1)/reuse%int64(cfg.Churn), 10)
		}
		return keys[rng.IntN(len(keys))]
	}

	rep := report{BaselineGoroutines: runtime.NumGoroutine(), Workers: cfg.Workers, Keys: cfg.Keys, Churn: cfg.Churn > 0}
	var outage outage
	if cfg.OutageFor > 0 {
		outage.start(srv, cfg.OutageAt, cfg.OutageFor)
		defer outage.stop()
	}
	var granted, timeouts, acquires atomic.Int64
	var errMu sync.Mutex
	loadCtx, stopLoad := context.WithTimeout(ctx, cfg.Duration)
	defer stopLoad()
	var wg sync.WaitGroup
	for i := range cfg.Workers {
		rng := rand.New(rand.NewPCG(uint64(i), 42))
		wg.Go(func() {
			for loadCtx.Err() == nil {
				k := lim.Key(key(rng))
				err := k.Acquire(loadCtx, cfg.MaxWait)
				acquires.Add(1)
				switch {
				case err == nil:
					if granted.Add(1)%100 == 0 && cfg.Adaptive {
						_ = k.Report(loadCtx, throttle.Answer{Refused: true}) // best effort, as a handler's
					}
				case errors.Is(err, throttle.ErrTimeout), loadCtx.Err() != nil:
					timeouts.Add(1)
				default:
					errMu.Lock()
					rep.Errors++
					if rep.FirstErr == nil {
						rep.FirstErr = err
					}
					errMu.Unlock()
				}
			}
		})
	}

	keysDesc := fmt.Sprintf("%d keys", cfg.Keys)
	if cfg.Churn > 0 {
		keysDesc = fmt.Sprintf("%d keys churning (each %d Acquires in a row)", cfg.Churn, reuse)
	}
	if cfg.Adaptive {
		keysDesc += ", adapting"
	}
	if cfg.OutageFor > 0 {
		keysDesc += fmt.Sprintf(", redis paused at %v for %v", cfg.OutageAt, cfg.OutageFor)
	}
	printf(w, "soak: bucket %s, %s, %d workers, limit %d per %v, maxWait %v, for %v\n",
		cfg.Bucket, keysDesc, cfg.Workers, cfg.Limit, cfg.Period, cfg.MaxWait, cfg.Duration)
	printf(w, "%8s %12s %10s %8s %14s %8s %12s\n", "t", "heap_live", "goroutines", "library", "redis_memory", "dbsize", "acquires")
	start := time.Now()
	tick := time.NewTicker(cfg.Sample)
	defer tick.Stop()
	for done := false; !done; {
		select {
		case <-tick.C:
		case <-loadCtx.Done():
			done = true
			continue
		}
		if loadCtx.Err() != nil {
			break // the load has ended: a sample now would not show it
		}
		s, err := measure(ctx, admin, outage.paused())
		if err != nil && loadCtx.Err() != nil {
			break // a signal ended the load while measuring: report what ran
		}
		if s.RedisMem < 0 && len(rep.Samples) > 0 { // redis paused: its last figures
			last := rep.Samples[len(rep.Samples)-1]
			s.RedisMem, s.DBSize = last.RedisMem, last.DBSize
		}
		if err != nil {
			stopLoad()
			wg.Wait()
			return rep, err
		}
		if loadCtx.Err() != nil {
			break // the load ended while measuring
		}
		s.At = time.Since(start).Round(time.Second)
		s.Acquires = acquires.Load()
		rep.Samples = append(rep.Samples, s)
		printf(w, "%8v %12s %10d %8d %14s %8d %12d\n", s.At, mib(int64(s.Heap)), s.Goroutines, s.Library, mib(s.RedisMem), s.DBSize, s.Acquires)
	}
	wg.Wait()
	rep.Granted, rep.Timeouts = granted.Load(), timeouts.Load()
	// Goroutines back to their level before the load (what finishes
	// after the workers, such as a Redsync unlock abandoned at the end,
	// has settleTime).
	for settle := time.Now().Add(settleTime); ; time.Sleep(10 * time.Millisecond) {
		rep.EndGoroutine = runtime.NumGoroutine()
		if rep.EndGoroutine <= rep.BaselineGoroutines || time.Now().After(settle) {
			break
		}
	}
	printf(w, "goroutines: %d before the load, %d after it\n", rep.BaselineGoroutines, rep.EndGoroutine)
	rep.BucketCalls = cb.calls.Load()
	elapsed := time.Since(start).Seconds()
	printf(w, "acquires: %d granted, %d timed out, %d failed (%.0f/s); bucket (Redis) calls: %d (%.0f/s)\n",
		rep.Granted, rep.Timeouts, rep.Errors, float64(acquires.Load())/elapsed, rep.BucketCalls, float64(rep.BucketCalls)/elapsed)
	if cfg.Churn > 0 {
		printf(w, "distinct keys used: %d\n", min(next.Load()/reuse, int64(cfg.Churn)))
	}
	if len(rep.Samples) >= 3 {
		for _, c := range []struct {
			name string
			f    func(sample) float64
			unit func(float64) string
		}{
			{"heap_live", func(s sample) float64 { return float64(s.Heap) }, func(v float64) string { return mib(int64(v)) }},
			{"goroutines", func(s sample) float64 { return float64(s.Goroutines) }, func(v float64) string { return fmt.Sprintf("%.1f", v) }},
			{"redis_memory", func(s sample) float64 { return float64(s.RedisMem) }, func(v float64) string { return mib(int64(v)) }},
			{"dbsize", func(s sample) float64 { return float64(s.DBSize) }, func(v float64) string { return fmt.Sprintf("%.0f", v) }},
		} {
			first, last, _ := rep.thirds(c.f)
			printf(w, "%-12s first third %10s  last third %10s  (%+.1f%%)\n", c.name, c.unit(first), c.unit(last), 100*(last-first)/max(first, 1))
		}
	}
	return rep, nil
}

// counted counts the Limiter's calls to its bucket: the Redis round
// trips, as the local gates answer most refusals without one.
type counted struct {
	inner throttle.Bucket
	calls atomic.Int64
}

// Unwrap returns the bucket c counts the calls of, so that the Limiter
// finds what it offers (the adaptive rate in Redis, FailLocal's share).
func (c *counted) Unwrap() throttle.Bucket { return c.inner }

// outage pauses a redis-server for a while during the load.
type outage struct {
	mu     sync.Mutex
	on     bool
	timers []*time.Timer
	srv    *redisenv.Server
}

func (o *outage) start(srv *redisenv.Server, at, d time.Duration) {
	o.srv = srv
	o.timers = append(o.timers, time.AfterFunc(at, func() {
		o.mu.Lock()
		defer o.mu.Unlock()
		if o.srv != nil && srv.Pause() == nil {
			o.on = true
		}
	}), time.AfterFunc(at+d, o.resume))
}

func (o *outage) resume() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.on {
		_ = o.srv.Resume()
		o.on = false
	}
}

func (o *outage) paused() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.on
}

// stop ends the outage now (and keeps one from starting).
func (o *outage) stop() {
	for _, t := range o.timers {
		t.Stop()
	}
	o.resume()
	o.mu.Lock()
	o.srv = nil
	o.mu.Unlock()
}

func (c *counted) Take(ctx context.Context, key string, n int64, maxWait time.Duration) (throttle.Decision, error) {
	c.calls.Add(1)
	return c.inner.Take(ctx, key, n, maxWait)
}

// measure reads the process's and Redis's figures.
// While Redis is paused, its figures are -1.
func measure(ctx context.Context, admin *redis.Client, paused bool) (sample, error) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	s := sample{Heap: ms.HeapAlloc, Goroutines: runtime.NumGoroutine(), Library: libraryGoroutines()}
	if paused {
		s.RedisMem, s.DBSize = -1, -1
		return s, nil
	}
	info, err := admin.Info(ctx, "memory").Result()
	if err != nil {
		return s, fmt.Errorf("redis INFO memory: %w", err)
	}
	s.RedisMem, err = infoInt(info, "used_memory")
	if err != nil {
		return s, err
	}
	if s.DBSize, err = admin.DBSize(ctx).Result(); err != nil {
		return s, fmt.Errorf("redis DBSIZE: %w", err)
	}
	return s, nil
}

// infoInt reads an integer field of INFO's output.
func infoInt(info, field string) (int64, error) {
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("redis INFO: no %s", field)
}

func mib(b int64) string { return fmt.Sprintf("%.2f MiB", float64(b)/(1<<20)) }

// libraryGoroutines counts the goroutines that functions of libraryPackages
// started, from a dump of every goroutine's stack ("created by" lines).
func libraryGoroutines() int {
	buf := make([]byte, 256<<10)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var n int
	for _, p := range libraryPackages {
		n += bytes.Count(buf, p)
	}
	return n
}

// fillPool waits until rdb holds n connections (its MinIdleConns, which
// go-redis dials in the background), at most 10 s.
func fillPool(ctx context.Context, rdb *redis.Client, n int) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for int(rdb.PoolStats().TotalConns) < n {
		select {
		case <-ctx.Done():
			return fmt.Errorf("redis: %d of %d connections open before the load: %w", rdb.PoolStats().TotalConns, n, ctx.Err())
		case <-tick.C:
		}
	}
	return nil
}
