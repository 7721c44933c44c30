// Command loadtest measures a headway bucket under load: several instances,
// each with its own Redis client, bucket and Limiter (as separate processes
// would have), each running several workers that acquire permits as fast
// as the bucket hands them out. It records every grant's time as the worker
// sees it, checks the bucket's guarantee on those times with an independent
// checker, and reports throughput, utilization, violations, Redis commands
// per grant and Acquire latency.
//
//	go run ./internal/cmd/loadtest -bucket tokenbucket -limit 1000 -interval 1s \
//		-instances 4 -workers 16 -duration 5s -json
//
// Buckets: tokenbucket, fixedwindow, counter (with one Resetter per
// instance; one leads), slidinglog, gcra, and local (throttle.NewLocal: no
// Redis, each instance gets limit/instances). -limit is always the whole
// fleet's limit.
//
// Without -redis, loadtest starts a real redis-server on a free port when
// one is installed, or else an in-process stand-in (miniredis), and says
// which on stderr: numbers from the stand-in say little about Redis.
//
// Layers and load shapes:
//
//   - -lease gives each instance's Limiter leasing (throttle.WithLeasing):
//     permits are taken from the shared bucket in batches sized by the
//     instance's demand and served from memory. Leasing keeps a token
//     bucket's, fixed window's or counter's guarantee exactly (leases
//     expire with the period); for gcra, slidinglog and local it needs a
//     lease TTL and loosens the guarantee by that TTL, which loadtest sets
//     to the lease horizon and adds to the check's tolerance.
//   - -demand X paces the fleet's asks open-loop at X times the limit
//     instead of letting every worker ask again at once (closed loop).
//   - -skew F gives instance 0 the share F of all the workers and of the
//     demand; the other instances split the rest evenly. Closed-loop
//     workers each want more than any limit, so -skew without -demand
//     uses -demand 2: the fleet asks for twice the limit, instance 0 for
//     2F times it, each other instance for 2(1−F)/(instances−1) times it,
//     less than an even share. It is the load that shows whether the
//     fleet's limit follows demand (leasing) or is cut into fixed shares.
//
// Thousands of workers on one instance (-instances 1 -workers 10000) show
// the waiting herd: redis_cmds_beyond_grants_per_interval is what the
// waiters cost beyond one command per grant, per interval, from the end of
// the first interval after -ramp on. Started all at once, 10,000 workers
// first ask together (a start-up rush that the figure leaves out); -ramp
// spreads their start, as a rolling deploy would.
//
// Grant times are measured by the workers, after the fact, so they are a
// little late; by default (-tolerance auto) the check allows exactly the
// most lateness it measured (see timedBucket), and it also reports the
// least tolerance under which the grants would pass. A violation at the
// measured tolerance is a real one.
//
// What a provider sees, and faults:
//
//   - -provider sliding|periods|aligned starts a counting provider on
//     127.0.0.1 that enforces the run's limit per interval that way (a
//     sliding window; an on-demand token bucket's periods; fixed windows
//     on the clock) and sends it one GET after each grant. It counts by
//     arrival time, apart from the harness's own records: its 429s are
//     calls a provider with that limit refused.
//
//     -provider-limit n gives the provider a limit of its own (the
//     fleet's -limit by default); -report tells each instance's Limiter
//     what the provider answered (Limiter.Report): a 429 with Retry-After
//     pauses the fleet and lowers its adaptive rate.
//
//     go run ./internal/cmd/loadtest -limit 40 -provider sliding \
//     -provider-limit 50 -report -instances 1 -workers 16 -duration 20s
//
//     -transport sends the calls through an httpclient.Transport on each
//     instance's Limiter instead, as an application would: calls arrive
//     at -demand × the limit (open loop, a goroutine per call), each
//     waits at most -maxwait (default: the Transport's, Forever; the
//     client's timeout is 10 s), and the Transport reports the answers.
//     The result adds the provider's refusals and its use of the fleet's
//     limit from the end of the first interval on. -at-once n sends n
//     calls at once instead and reports how long they took.
//
//     go run ./internal/cmd/loadtest -limit 40 -provider sliding \
//     -provider-limit 50 -transport -demand 2 -maxwait 1s -instances 1 -duration 20s
//
//   - -arrival-margin d (slidinglog) keeps every window d longer
//     (bucket.WithArrivalMargin), for a provider counting arrivals that
//     come up to d late.
//
//   - -pause-at t -pause-for d stops the run's own redis-server (SIGSTOP)
//     at t for d: the failure policy (-fail local, closed or open)
//     decides meanwhile. -restart-at t instead kills it at t and starts
//     it again at once, empty (Redis without persistence);
//     -failover-at t starts a master, a replica and a Sentinel and kills
//     the master at t.
//
//     go run ./internal/cmd/loadtest -bucket tokenbucket -limit 500 -instances 4 \
//     -workers 16 -duration 10s -provider periods -pause-at 3s -pause-for 2s
//
// With -json the last line of standard output is one JSON object; otherwise
// a readable summary. The exit status is 1 when the guarantee was broken,
// the provider refused a call (the limit was broken where it counts), or
// the run failed (Redis unreachable, a pause that could not be made); 2 on
// a usage error, before anything starts.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/headway-go/headway/internal/cli"
	"github.com/headway-go/headway/internal/redisenv"
)

func main() {
	os.Exit(command(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// command is main, returning the exit code (see internal/cli): 1 when the
// guarantee was broken.
func command(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cmd := cli.New("loadtest", "loadtest runs -instances × -workers goroutines acquiring from one bucket for\n-duration, checks the guarantee independently and prints grants, utilization and latency.")
	fs := cmd.Flags
	var (
		c      loadConfig
		asJSON bool
	)
	fs.StringVar(&c.Bucket, "bucket", "tokenbucket", "bucket to load: "+strings.Join(buckets, ", "))
	fs.Int64Var(&c.Limit, "limit", 1000, "permits per interval, for the whole fleet")
	fs.DurationVar(&c.Interval, "interval", time.Second, "the limit's interval")
	fs.Int64Var(&c.Burst, "burst", 0, "gcra and local: permits at once after a quiet spell (0: the limit)")
	fs.IntVar(&c.Instances, "instances", 4, "independent instances, each with its own Redis client and bucket")
	fs.IntVar(&c.Workers, "workers", 16, "goroutines per instance")
	fs.DurationVar(&c.Duration, "duration", 5*time.Second, "how long to run")
	fs.DurationVar(&c.MaxWait, "maxwait", 0, "Acquire's maxWait (0: one interval); with -transport the Transport's (httpclient.WithMaxWait; 0: its default, throttle.Forever)")
	fs.StringVar(&c.Redis, "redis", "", "Redis address (default: start a redis-server on a free port, or the in-process stand-in)")
	fs.StringVar(&c.Key, "key", "", "the bucket's Redis key (default: a fresh random one)")
	fs.StringVar(&c.Target, "target", "", "optional URL to GET once after each grant")
	c.Tolerance = -1
	fs.Var((*tolerance)(&c.Tolerance), "tolerance", "how late a recorded grant time may be, for the guarantee check: a duration, or auto for the measured bound")
	fs.IntVar(&c.MaxGrants, "max-grants", 0, "stop after this many grants (0: ten times what the limit allows)")
	fs.BoolVar(&c.Lease, "lease", false, "lease permits from each instance's bucket (throttle.WithLeasing): permits leased in demand-sized batches, served from memory")
	fs.DurationVar(&c.LeaseHorizon, "lease-horizon", 0, "with -lease: how far ahead an instance leases (0: throttle's default, 50ms)")
	fs.Float64Var(&c.Demand, "demand", 0, "pace the fleet's asks at this multiple of the limit (0: closed loop, every worker asks again at once)")
	fs.Float64Var(&c.Skew, "skew", 0, "give instance 0 this share (0 to 1) of all workers and of the demand; the rest is split evenly (sets -demand 2 if not given)")
	fs.DurationVar(&c.Ramp, "ramp", 0, "start the workers spread evenly over this time instead of all at once")
	fs.StringVar(&c.Provider, "provider", "", "start a counting provider on 127.0.0.1 that enforces the limit per interval as sliding, periods (an on-demand token bucket's guarantee) or aligned (fixed windows), and GET it once after each grant; its 429s are calls it refused")
	fs.Int64Var(&c.ProviderLimit, "provider-limit", 0, "with -provider: the provider's limit per interval (0: -limit)")
	fs.BoolVar(&c.Report, "report", false, "tell each instance's Limiter what the provider answered to each call (Limiter.Report): a 429 with Retry-After pauses the fleet and lowers its adaptive rate")
	fs.BoolVar(&c.Transport, "transport", false, "send the calls to -provider or -target through an httpclient.Transport on each instance's Limiter, arriving at -demand × the limit (open loop: one goroutine per call, -workers unused); the Transport reports the answers itself (implies -report)")
	fs.IntVar(&c.AtOnce, "at-once", 0, "with -transport: send this many calls at once at the start instead of -demand's arrivals, let them finish past -duration, and report how long they took (a burst at an idle bucket)")
	fs.DurationVar(&c.ArrivalMargin, "arrival-margin", 0, "slidinglog: keep every window this much longer (bucket.WithArrivalMargin), so that a provider counting arrivals that come up to this late sees at most the limit")
	fs.DurationVar(&c.PauseAt, "pause-at", 0, "with -pause-for: when to stop the run's own redis-server (SIGSTOP), from the start")
	fs.DurationVar(&c.PauseFor, "pause-for", 0, "stop the run's own redis-server this long (0: no pause); not with -redis")
	fs.DurationVar(&c.RestartAt, "restart-at", 0, "kill the run's own redis-server this long after the start and start it again at once, empty (0: no restart); not with -redis")
	fs.DurationVar(&c.FailoverAt, "failover-at", 0, "start a Sentinel set (master, replica, Sentinel; each instance on its own go-redis failover client) and kill its master this long after the start (0: no failover); not with -redis")
	fs.StringVar(&c.Fail, "fail", "local", "the Limiters' failure policy while Redis fails: local (each instance its share), closed (refuse) or open (grant)")
	fs.BoolVar(&asJSON, "json", false, "print one JSON object on the last line instead of a summary")
	validate := func() error {
		cc := c // check fills in defaults; run checks its own copy again
		if cc.PauseFor > 0 && cc.Redis != "" {
			return fmt.Errorf("pause-for = %v: only a redis-server the run starts itself can be paused; drop -redis", cc.PauseFor)
		}
		if cc.RestartAt > 0 && cc.Redis != "" {
			return fmt.Errorf("restart-at = %v: only a redis-server the run starts itself can be restarted; drop -redis", cc.RestartAt)
		}
		if cc.FailoverAt > 0 && cc.Redis != "" {
			return fmt.Errorf("failover-at = %v: only a Sentinel set the run starts itself can fail over; drop -redis", cc.FailoverAt)
		}
		if cc.Redis == "" {
			cc.Redis = "127.0.0.1:6379" // run starts one; only its presence is checked here
		}
		return cc.check()
	}
	return cmd.Run(ctx, args, stdout, stderr, validate, func(ctx context.Context) error {
		return run(ctx, c, asJSON, stdout, stderr)
	})
}

// tolerance is the -tolerance flag: a duration, or "auto" (stored as -1).
type tolerance time.Duration

func (t *tolerance) String() string {
	if t == nil || *t < 0 {
		return "auto"
	}
	return time.Duration(*t).String()
}

func (t *tolerance) Set(s string) error {
	if s == "auto" {
		*t = -1
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return fmt.Errorf("want a non-negative duration or auto, got %q", s)
	}
	*t = tolerance(d)
	return nil
}

// errBroken reports that the guarantee did not hold.
type errBroken struct{ violations int }

func (e errBroken) Error() string {
	return fmt.Sprintf("the guarantee was broken: %d violations", e.violations)
}

func run(ctx context.Context, c loadConfig, asJSON bool, stdout, stderr io.Writer) error {
	redisKind := "none"
	if c.Bucket != "local" {
		redisKind = "external " + c.Redis
		if c.FailoverAt > 0 && c.Redis == "" {
			sen, err := redisenv.StartSentinel()
			if err != nil {
				return cli.Usagef("failover-at needs a real redis-server (apt-get install -y redis-server): %w", err)
			}
			defer sen.Close()
			c.sentinel = sen
			redisKind = "Sentinel set (master " + sen.Master().Addr() + ", replica " + sen.ReplicaAddr() + ")"
			fmt.Fprintf(stderr, "loadtest: started a master, a replica and a Sentinel (%s) for this run\n", sen.Addr())
		} else if c.Redis == "" {
			srv, err := redisenv.Start()
			if err != nil {
				return cli.Usagef("%w", err)
			}
			defer srv.Close()
			c.Redis, redisKind, c.pauser = srv.Addr(), srv.Kind(), srv
			if srv.Real() {
				fmt.Fprintf(stderr, "loadtest: started %s on %s for this run (pass -redis to use your own)\n", srv.Kind(), srv.Addr())
			} else {
				fmt.Fprintf(stderr, "loadtest: WARNING: redis-server is not installed; running against the %s on %s, NOT a real Redis\n", srv.Kind(), srv.Addr())
			}
		}
	} else {
		fmt.Fprintln(stderr, "loadtest: bucket local is in memory; no Redis")
	}

	res, err := runLoad(ctx, c)
	if err != nil {
		return err
	}
	res.Redis = redisKind
	if asJSON {
		b, err := json.Marshal(res)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s\n", b)
	} else {
		summarize(stdout, res)
	}
	if res.Violations > 0 {
		return cli.Failedf("%w", errBroken{res.Violations})
	}
	if res.ProviderRefused > 0 {
		return cli.Failedf("the provider (%s, %d per %v) refused %d calls: it saw more than its limit", res.Provider, res.ProviderLimit, c.Interval, res.ProviderRefused)
	}
	return nil
}

func summarize(w io.Writer, r loadResult) {
	var layers []string
	if r.Lease {
		layers = append(layers, "leased")
	}
	name := strings.Join(append(layers, r.Bucket), " over ")
	fmt.Fprintf(w, "%s: %d per %v, %d instances × %d workers, %.1fs, redis: %s\n",
		name, r.Limit, time.Duration(r.IntervalMs*float64(time.Millisecond)), r.Instances, r.Workers, r.DurationS, r.Redis)
	if r.Demand > 0 {
		fmt.Fprintf(w, "  demand       %.2f × the limit, paced; skew %.2f\n", r.Demand, r.Skew)
	}
	if r.Instances > 1 {
		fmt.Fprintf(w, "  instances    workers %v, grants %v\n", r.InstanceWorkers, r.InstanceGrants)
	}
	fmt.Fprintf(w, "  grants       %d (%.0f/s)%s\n", r.Grants, r.GrantsPerS, map[bool]string{true: ", stopped early at -max-grants"}[r.StoppedEarly])
	verdict := "kept"
	if r.Violations > 0 {
		verdict = fmt.Sprintf("BROKEN: %d violations", r.Violations)
	}
	fmt.Fprintf(w, "  guarantee    %s at tolerance %.3fms\n               %s\n", verdict, r.ToleranceMs, r.Guarantee)
	fmt.Fprintf(w, "  grant times  recorded late by at most %.3fms (99%%: %.3fms); the grants pass from a tolerance of %.3fms\n",
		r.MeasuredMs, r.LateP99Ms, r.NeededMs)
	fmt.Fprintf(w, "  utilization  %.3f of %d allowed over the grants' span\n", r.Utilization, r.Allowed)
	fmt.Fprintf(w, "  max tenth    %d grants in one tenth of the interval (limit/10 = %.1f)\n", r.MaxTenth, float64(r.Limit)/10)
	if r.Redis != "none" {
		fmt.Fprintf(w, "  redis        %.4g commands, %.4g round trips per grant; %.1f commands per interval beyond one per grant\n",
			r.RedisCmdsPerGrant, r.RedisTripsPerGrant, r.CmdsBeyondGrants)
	}
	fmt.Fprintf(w, "  acquire      p50 %v, p99 %v, max %v (granted calls, waiting included); any call at most %.3fms past its maxWait\n",
		us(r.AcquireP50us), us(r.AcquireP99us), us(r.AcquireMaxUs), r.PastWaitMs)
	fmt.Fprintf(w, "  refused      %d timeouts, %d errors", r.Timeouts, r.Errors)
	if r.FirstError != "" {
		fmt.Fprintf(w, " (first: %s)", r.FirstError)
	}
	fmt.Fprintln(w)
	if r.TargetOK+r.Target429+r.TargetErrors > 0 {
		fmt.Fprintf(w, "  target       %d ok, %d 429, %d errors\n", r.TargetOK, r.Target429, r.TargetErrors)
	}
	if r.Transport {
		fmt.Fprintf(w, "  unsent       %d grants of calls that failed during the run, %d held by calls the run's end cut\n", r.GrantsUnsent, r.GrantsCutAtEnd)
	}
	if r.PausedForS > 0 {
		fmt.Fprintf(w, "  fault        redis stopped (SIGSTOP) at %.2fs for %.2fs; failure policy %s: %d grants it decided\n", r.PausedAtS, r.PausedForS, r.Fail, r.DegradedGrants)
	}
	if r.RestartedAtS > 0 {
		fmt.Fprintf(w, "  fault        redis killed at %.2fs and started again empty, gone %.0f ms; failure policy %s: %d grants it decided\n", r.RestartedAtS, 1000*r.RestartTookS, r.Fail, r.DegradedGrants)
	}
	if r.FailoverAtS > 0 {
		fmt.Fprintf(w, "  fault        master killed at %.2fs, replica promoted %.2fs later; failure policy %s: %d grants it decided\n", r.FailoverAtS, r.PromotedAfterS, r.Fail, r.DegradedGrants)
	}
	if r.AtOnceMs > 0 {
		fmt.Fprintf(w, "  at once      the calls sent at once took %.0f ms, the first sent to the last answered\n", r.AtOnceMs)
	}
	if r.Provider != "" {
		margin := ""
		if r.ArrivalMarginMs > 0 {
			margin = fmt.Sprintf(", arrival margin %.1fms", r.ArrivalMarginMs)
		}
		reported := ""
		if r.Report {
			reported = "; its answers reported to the Limiters"
		}
		fmt.Fprintf(w, "  provider     %s: %d accepted, %d refused; most arrivals in any interval %d (limit %d)%s%s\n               arrivals per interval from the first: %v\n",
			r.Provider, r.ProviderAccepted, r.ProviderRefused, r.ProviderWorst, r.ProviderLimit, margin, reported, r.ProviderPerInterval)
		if len(r.ProviderRefusedPerInterval) > 0 {
			fmt.Fprintf(w, "               refused per interval from the first: %v\n", r.ProviderRefusedPerInterval)
		}
	}
}

func us(v float64) time.Duration {
	return time.Duration(v * float64(time.Microsecond)).Round(time.Microsecond)
}
