package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/headway-go/headway/internal/guarantee"
	"github.com/headway-go/headway/internal/provider"
	"github.com/headway-go/headway/throttle"
	"github.com/headway-go/headway/throttle/httpclient"
	"github.com/redis/go-redis/v9"
)

// buckets names the buckets the load test can drive.
var buckets = []string{"tokenbucket", "fixedwindow", "counter", "slidinglog", "gcra", "local"}

// loadConfig describes one load run.
type loadConfig struct {
	Bucket    string        // one of buckets
	Limit     int64         // permits per Interval, for the whole fleet
	Interval  time.Duration // the limit's period
	Burst     int64         // gcra and local: permits at once; 0 means Limit
	Instances int           // independent instances, each with its own Redis client and bucket
	Workers   int           // goroutines per instance
	Duration  time.Duration // how long workers ask for permits
	MaxWait   time.Duration // Acquire's maxWait; 0 means Interval
	Redis     string        // Redis address; not needed for local
	Key       string        // the bucket's key; "" means a fresh random one
	Target    string        // optional URL to GET after each grant
	Tolerance time.Duration // the guarantee checker's tolerance; negative: the measured uncertainty (see timedBucket)
	MaxGrants int           // stop early after this many grants; 0 means 10× what the guarantee allows

	// Lease gives each instance's Limiter throttle.WithLeasing (with
	// LeaseHorizon, 0 meaning throttle's default of 50 ms).
	Lease        bool
	LeaseHorizon time.Duration
	// Demand paces the workers' asks open-loop at Demand × Limit per
	// Interval for the whole fleet; 0 means closed loop: every worker asks
	// again as soon as its Acquire returns.
	Demand float64
	// Skew, in (0, 1), gives instance 0 that share of the fleet's
	// Instances × Workers goroutines and of its Demand; the other
	// instances split the rest evenly. 0 spreads both evenly. Closed-loop
	// workers each want more than any limit they are given, so skewing
	// only goroutines would change nothing; Skew therefore sets Demand to
	// 2 when it is 0.
	Skew float64
	// Ramp starts the workers evenly spread over this time instead of all
	// at once (0). Measurements still start with the first worker.
	Ramp time.Duration

	// Provider, when set, starts a counting provider on 127.0.0.1 that
	// enforces the run's limit per interval the way it names (one of
	// providers) and sends it one GET after each grant, as Target does
	// (the two exclude each other). It counts by arrival time, apart from
	// the harness's own records: its 429s are calls a provider with that
	// limit refused.
	Provider string
	// ProviderLimit is the provider's limit per Interval, when it differs
	// from the fleet's (0: Limit): a provider with more room than the
	// fleet is configured for refuses only the bunching of its grants.
	ProviderLimit int64
	// Report tells each instance's Limiter what the provider answered to
	// each call (httpclient.ReadAnswer, Limiter.Report): a 429 with
	// Retry-After pauses the fleet's bucket and lowers its adaptive rate.
	Report bool
	// ArrivalMargin is bucket.WithArrivalMargin for the slidinglog bucket.
	ArrivalMargin time.Duration
	// Transport sends the calls to the provider (or Target) through an
	// httpclient.Transport on each instance's Limiter, as an application
	// would, instead of a worker's Acquire and a plain GET: each
	// instance's calls arrive at its share of Demand × Limit per
	// Interval (a fixed arrival rate, open loop: a call is started at
	// its time whether or not the earlier ones have returned), and each
	// waits for its permit at most MaxWait (httpclient.WithMaxWait). The
	// Transport reports every answer to the Limiter itself (Report is
	// implied) and waits out, and retries after, a provider's pause.
	// Workers is then unused.
	Transport bool
	// AtOnce, with Transport, sends this many calls at once at the start
	// instead of paced arrivals (Demand), through instance 0's Transport,
	// and lets them finish past Duration: what a burst at an idle bucket
	// costs (loadResult.AtOnceMs).
	AtOnce int
	// PauseAt and PauseFor stop the run's Redis (SIGSTOP) PauseAt after
	// the start, for PauseFor (0: no pause). Only a server the run
	// started itself can be paused: run sets pauser.
	PauseAt, PauseFor time.Duration
	pauser            pauser
	// RestartAt, when set, kills the run's Redis (a server the run started
	// itself: run sets pauser) this long after the start and starts an
	// empty one on the same port at once: Redis restarted without
	// persistence.
	RestartAt time.Duration
	// Fail is each Limiter's failure policy: local (the default), closed
	// or open.
	Fail string
	// FailoverAt, when set, kills the master of the run's Sentinel set
	// (a master, a replica and a Sentinel the run started itself: run
	// sets sentinel) this long after the start; the Sentinel promotes the
	// replica, and each instance's go-redis failover client finds it.
	FailoverAt time.Duration
	sentinel   failoverer
}

// failoverer is a Sentinel set whose master can be killed
// (internal/redisenv.Sentinel).
type failoverer interface {
	FailoverOptions() *redis.FailoverOptions
	KillMaster() error
	ReplicaAddr() string
}

// failurePolicies names the failure policies Fail may give.
var failurePolicies = map[string]throttle.FailurePolicy{
	"":       throttle.FailLocal,
	"local":  throttle.FailLocal,
	"closed": throttle.FailClosed,
	"open":   throttle.FailOpen,
}

// pauser stops, resumes and restarts a Redis server
// (internal/redisenv.Server).
type pauser interface {
	Pause() error
	Resume() error
	Restart() error
}

// providers names the policies of Provider, as internal/provider has them.
var providers = map[string]provider.Policy{
	"sliding": provider.Sliding,
	"periods": provider.Periods,
	"aligned": provider.Aligned,
}

// loadResult is what a run measured. Its JSON form is the -json output.
type loadResult struct {
	Bucket      string  `json:"bucket"`
	Redis       string  `json:"redis"`
	Limit       int64   `json:"limit"`
	IntervalMs  float64 `json:"interval_ms"`
	Instances   int     `json:"instances"`
	Workers     int     `json:"workers"`
	DurationS   float64 `json:"duration_s"` // measured, from the first Acquire to the last return
	Grants      int     `json:"grants"`
	GrantsPerS  float64 `json:"grants_per_sec"`
	Utilization float64 `json:"utilization"` // grants ÷ what the guarantee allows over the grants' span
	Allowed     int     `json:"allowed"`
	Violations  int     `json:"violations"`
	Worst       int     `json:"worst"` // fullest window (burst needed, for gcra and local)
	Guarantee   string  `json:"guarantee"`
	// ToleranceMs is the checker's tolerance: -tolerance, or by default
	// MeasuredMs, the most any recorded grant time may be late.
	ToleranceMs float64 `json:"tolerance_ms"`
	MeasuredMs  float64 `json:"tolerance_measured_ms"`
	LateP99Ms   float64 `json:"record_late_p99_ms"`  // how late 99% of grant times were recorded, at most
	NeededMs    float64 `json:"tolerance_needed_ms"` // the least tolerance under which the grants pass

	RedisCmdsPerGrant  float64 `json:"redis_cmds_per_grant"`
	RedisTripsPerGrant float64 `json:"redis_roundtrips_per_grant"`
	AcquireP50us       float64 `json:"acquire_p50_us"` // granted calls only, waiting included
	AcquireP99us       float64 `json:"acquire_p99_us"`
	AcquireMaxUs       float64 `json:"acquire_max_us"`
	// PastWaitMs is the most any Acquire (granted or not, the run's end
	// aside) returned past its maxWait: 0 when every call kept its wait.
	PastWaitMs float64 `json:"acquire_past_wait_ms"`
	// DegradedGrants counts grants no bucket call made (the Limiter's
	// failure policy decided them while the store failed). Their record
	// times are not used to measure the tolerance: the checker's
	// tolerance comes from normal operation only, so a fault cannot widen
	// it until its own over-admission fits; Violations then counts what
	// the fault let through.
	DegradedGrants int64  `json:"degraded_grants"`
	Timeouts       int64  `json:"timeouts"` // Acquire calls that ended with ErrTimeout
	Errors         int64  `json:"errors"`   // Acquire calls that failed otherwise
	FirstError     string `json:"first_error,omitempty"`
	StoppedEarly   bool   `json:"stopped_early"` // MaxGrants was reached

	Lease  bool    `json:"lease"`
	Skew   float64 `json:"skew"`
	Demand float64 `json:"demand"` // offered load ÷ the limit, paced; 0: closed loop
	RampS  float64 `json:"ramp_s"` // workers' start spread over this many seconds
	// InstanceWorkers and InstanceGrants are per instance, instance 0 first.
	InstanceWorkers []int `json:"instance_workers"`
	InstanceGrants  []int `json:"instance_grants"`
	// MaxTenth is the most grants recorded in any span of a tenth of the
	// interval (on the recorded times, no tolerance); compare it with
	// limit/10. It is what smoothing keeps down.
	MaxTenth int `json:"max_tenth"`
	// RedisCmds is every command the fleet sent during the run;
	// CmdsBeyondGrants is commands less grants, per interval, from the
	// end of the first interval after the ramp on (the first holds the start-up rush,
	// before any refusal has closed a Limiter's gate; runs shorter than
	// two intervals count from the start): what asking cost beyond one
	// command per grant. With thousands of waiters on one key it shows
	// whether they poll (it grows with the waiters) or queue (it stays a
	// small constant). Negative with -lease, where grants cost less.
	RedisCmds        int64   `json:"redis_cmds"`
	CmdsBeyondGrants float64 `json:"redis_cmds_beyond_grants_per_interval"`

	TargetOK     int64 `json:"target_ok,omitempty"`
	Target429    int64 `json:"target_429,omitempty"`
	TargetErrors int64 `json:"target_errors,omitempty"`
	// With -transport: GrantsUnsent is the grants made for calls that then
	// failed (the Limiter gave up the wait after taking a permit, or the
	// call failed) while the run went on: permits spent and never sent.
	// GrantsCutAtEnd is the grants held by calls the run's end cancelled
	// (waiting for their place in the period when it ended): what the
	// run's cut, not the Limiter, left unsent.
	GrantsUnsent   int64 `json:"grants_unsent"`
	GrantsCutAtEnd int64 `json:"grants_cut_at_end"`
	// Handed is the permits the Limiters' Acquire calls handed over:
	// Grants less those the Limiters did not use because they came later
	// than their margin allows (a stalled or starved process).
	Handed int64 `json:"handed"`

	// What the counting provider (-provider) saw, by arrival time:
	// requests it accepted and refused (429), the most that arrived in any
	// span of one interval, and the arrivals per interval from the first.
	Provider            string `json:"provider,omitempty"`
	ProviderAccepted    int    `json:"provider_accepted,omitempty"`
	ProviderRefused     int    `json:"provider_refused,omitempty"`
	ProviderWorst       int    `json:"provider_worst_interval,omitempty"`
	ProviderPerInterval []int  `json:"provider_per_interval,omitempty"`
	// ProviderLimit is the provider's limit per interval;
	// ProviderRefusedPerInterval its refusals per interval from the
	// first arrival, by arrival time.
	ProviderLimit              int64 `json:"provider_limit,omitempty"`
	ProviderRefusedPerInterval []int `json:"provider_refused_per_interval,omitempty"`
	Report                     bool  `json:"report,omitempty"`
	// ProviderRefusedAfterFirst is the provider's refusals from one
	// interval after the run's start on; ProviderUseAfterFirst the calls
	// it accepted from then to the run's end, as a share of the fleet's
	// limit (-limit) over that span: how much of its configured limit
	// the fleet used once the first interval was over.
	ProviderRefusedAfterFirst int     `json:"provider_refused_after_first_interval,omitempty"`
	ProviderUseAfterFirst     float64 `json:"provider_use_after_first_interval,omitempty"`
	// Transport: the calls went through an httpclient.Transport at a
	// fixed arrival rate (-transport).
	Transport bool `json:"transport,omitempty"`
	// AtOnceMs is how long the -at-once calls took, from the first sent to
	// the last answered.
	AtOnceMs        float64 `json:"at_once_ms,omitempty"`
	ArrivalMarginMs float64 `json:"arrival_margin_ms,omitempty"`
	// PausedAtS and PausedForS: when the run's Redis was stopped, from
	// the start, and for how long (0: no pause).
	PausedAtS  float64 `json:"paused_at_s,omitempty"`
	PausedForS float64 `json:"paused_for_s,omitempty"`
	// FailoverAtS is when the master was killed (-failover-at), from the
	// start; PromotedAfterS how long the Sentinel then took to promote
	// the replica.
	FailoverAtS    float64 `json:"failover_at_s,omitempty"`
	PromotedAfterS float64 `json:"promoted_after_s,omitempty"`
	// RestartedAtS is when the run's Redis was killed and started again
	// empty (-restart-at), from the start; RestartTookS how long it was
	// gone.
	RestartedAtS float64 `json:"restarted_at_s,omitempty"`
	RestartTookS float64 `json:"restart_took_s,omitempty"`
	Fail         string  `json:"failure_policy"`
}

// check validates c and fills in its defaults.
func (c *loadConfig) check() error {
	switch {
	case !slices.Contains(buckets, c.Bucket):
		return fmt.Errorf("bucket %q: must be one of %v", c.Bucket, buckets)
	case c.Limit < 1:
		return fmt.Errorf("limit = %d: must be at least 1", c.Limit)
	case c.Interval <= 0:
		return fmt.Errorf("interval = %v: must be positive", c.Interval)
	case c.Burst < 0:
		return fmt.Errorf("burst = %d: must be 0 (the limit) or positive", c.Burst)
	case c.Instances < 1:
		return fmt.Errorf("instances = %d: must be at least 1", c.Instances)
	case c.Workers < 1:
		return fmt.Errorf("workers = %d: must be at least 1", c.Workers)
	case c.Duration <= 0:
		return fmt.Errorf("duration = %v: must be positive", c.Duration)
	case c.MaxWait < 0:
		return fmt.Errorf("maxwait = %v: must not be negative", c.MaxWait)
	case c.Bucket == "local" && c.Limit < int64(c.Instances):
		return fmt.Errorf("limit = %d: the local bucket splits it over %d instances, so it must be at least that", c.Limit, c.Instances)
	case c.Bucket != "local" && c.Redis == "" && c.sentinel == nil:
		return fmt.Errorf("bucket %s needs a Redis address", c.Bucket)
	case c.Ramp < 0 || c.Ramp >= c.Duration:
		return fmt.Errorf("ramp = %v: must be 0 or positive and shorter than the duration", c.Ramp)
	case c.LeaseHorizon < 0:
		return fmt.Errorf("lease-horizon = %v: must not be negative", c.LeaseHorizon)
	case !(c.Demand >= 0 && c.Demand <= 1e6):
		return fmt.Errorf("demand = %v: must be 0 (closed loop) or a positive multiple of the limit up to 1e6", c.Demand)
	case !(c.Skew >= 0 && c.Skew < 1):
		return fmt.Errorf("skew = %v: must be 0 (even) or in (0, 1)", c.Skew)
	case c.Skew > 0 && c.Instances < 2:
		return fmt.Errorf("skew = %v: needs at least 2 instances", c.Skew)
	case c.Provider != "" && !slices.Contains(slices.Collect(maps.Keys(providers)), c.Provider):
		return fmt.Errorf("provider = %q: must be sliding, periods or aligned", c.Provider)
	case c.ProviderLimit < 0:
		return fmt.Errorf("provider-limit = %d: must be 0 (the limit) or positive", c.ProviderLimit)
	case c.ProviderLimit > 0 && c.Provider == "":
		return fmt.Errorf("provider-limit = %d: needs -provider", c.ProviderLimit)
	case c.Report && c.Provider == "" && c.Target == "":
		return fmt.Errorf("report: needs -provider or -target, whose answers it reports")
	case c.Provider != "" && c.Target != "":
		return fmt.Errorf("provider = %q and target = %q: give one of them", c.Provider, c.Target)
	case c.Transport && c.Provider == "" && c.Target == "":
		return fmt.Errorf("transport: needs -provider or -target, which it calls")
	case c.Transport && c.Demand == 0 && c.AtOnce == 0:
		return fmt.Errorf("transport: needs -demand, the calls' arrival rate, or -at-once")
	case c.AtOnce < 0 || c.AtOnce > 0 && !c.Transport:
		return fmt.Errorf("at-once = %d: must be 0, or positive with -transport", c.AtOnce)
	case !slices.Contains(slices.Collect(maps.Keys(failurePolicies)), c.Fail):
		return fmt.Errorf("fail = %q: must be local, closed or open", c.Fail)
	case c.ArrivalMargin < 0:
		return fmt.Errorf("arrival-margin = %v: must not be negative", c.ArrivalMargin)
	case c.ArrivalMargin > 0 && c.Bucket != "slidinglog":
		return fmt.Errorf("arrival-margin = %v: only the slidinglog bucket keeps one", c.ArrivalMargin)
	case c.PauseAt < 0 || c.PauseFor < 0:
		return fmt.Errorf("pause-at = %v, pause-for = %v: must not be negative", c.PauseAt, c.PauseFor)
	case c.PauseFor > 0 && c.Bucket == "local":
		return fmt.Errorf("pause-for = %v: the local bucket has no Redis to pause", c.PauseFor)
	case c.PauseFor > 0 && c.PauseAt+c.PauseFor >= c.Duration:
		return fmt.Errorf("pause-at = %v, pause-for = %v: the pause must end before the run does (duration %v)", c.PauseAt, c.PauseFor, c.Duration)
	case c.FailoverAt < 0:
		return fmt.Errorf("failover-at = %v: must not be negative", c.FailoverAt)
	case c.FailoverAt > 0 && c.Bucket == "local":
		return fmt.Errorf("failover-at = %v: the local bucket has no Redis to fail over", c.FailoverAt)
	case c.FailoverAt > 0 && c.PauseFor > 0:
		return fmt.Errorf("failover-at = %v, pause-for = %v: one fault per run", c.FailoverAt, c.PauseFor)
	case c.FailoverAt > 0 && c.FailoverAt >= c.Duration:
		return fmt.Errorf("failover-at = %v: the master must be killed before the run ends (duration %v)", c.FailoverAt, c.Duration)
	case c.RestartAt < 0:
		return fmt.Errorf("restart-at = %v: must not be negative", c.RestartAt)
	case c.RestartAt > 0 && c.Bucket == "local":
		return fmt.Errorf("restart-at = %v: the local bucket has no Redis to restart", c.RestartAt)
	case c.RestartAt > 0 && (c.PauseFor > 0 || c.FailoverAt > 0):
		return fmt.Errorf("restart-at = %v: one fault per run (not with -pause-for or -failover-at)", c.RestartAt)
	case c.RestartAt > 0 && c.RestartAt >= c.Duration:
		return fmt.Errorf("restart-at = %v: Redis must be restarted before the run ends (duration %v)", c.RestartAt, c.Duration)
	}
	if c.Skew > 0 && c.Demand == 0 {
		c.Demand = 2
	}
	if c.Burst == 0 {
		c.Burst = c.Limit
	}
	if c.Provider != "" && c.ProviderLimit == 0 {
		c.ProviderLimit = c.Limit
	}
	if c.Transport {
		c.Report = true // the Transport reports every answer itself
	}
	if c.MaxWait == 0 {
		c.MaxWait = c.Interval
		if c.Transport {
			c.MaxWait = throttle.Forever // the Transport's default
		}
	}
	if c.Key == "" {
		var raw [6]byte
		_, _ = rand.Read(raw[:])
		c.Key = "loadtest-" + hex.EncodeToString(raw[:])
	}
	if c.MaxGrants == 0 {
		periods := float64(c.Duration)/float64(c.Interval) + 2
		c.MaxGrants = int(min(10*(float64(c.Limit)*periods+float64(c.Burst)), 1e8))
	}
	return nil
}

// tally holds the counts the workers share.
type tally struct {
	grants                         atomic.Int64
	degraded                       atomic.Int64 // grants of the failure policy (the Limiter's observer counts them)
	timeouts, errors               atomic.Int64
	targetOK, target429, targetErr atomic.Int64
	pastWait                       atomic.Int64 // the most any Acquire returned past its maxWait, ns
	unsent, cutAtEnd               atomic.Int64 // -transport: grants of calls that failed, during the run and at its end
	handed                         atomic.Int64 // permits Acquire handed over (fewer than granted: a permit come too late is not)
	firstErr                       sync.Once
	firstError                     string
}

// runLoad drives c.Instances × c.Workers goroutines against the bucket for
// c.Duration (or until ctx ends, or MaxGrants are granted), records every
// grant's time as its worker sees it, and checks the bucket's guarantee on
// those times.
func runLoad(ctx context.Context, c loadConfig) (loadResult, error) {
	if err := c.check(); err != nil {
		return loadResult{}, err
	}
	hook := &cmdCounter{}
	t := new(tally)
	fleet := make([]*instance, 0, c.Instances)
	defer func() {
		for _, in := range fleet {
			in.close()
		}
	}()
	for i := range c.Instances {
		in, err := newInstance(c, i, hook, t)
		if err != nil {
			return loadResult{}, fmt.Errorf("building the %s bucket: %w", c.Bucket, err)
		}
		fleet = append(fleet, in)
	}

	// Open each instance's connections before the clock starts, as a
	// long-running process would have them, and count commands from then.
	if err := warmUp(ctx, fleet); err != nil {
		return loadResult{}, err
	}
	hook.cmds.Store(0)
	hook.trips.Store(0)

	var prov *provider.Provider
	if c.Provider != "" {
		p, err := provider.Start(provider.Config{Limit: c.ProviderLimit, Interval: c.Interval, Policy: providers[c.Provider]})
		if err != nil {
			return loadResult{}, err
		}
		defer p.Close()
		prov, c.Target = p, p.URL()
	}
	var httpc *http.Client
	if c.Target != "" {
		tr := &http.Transport{MaxIdleConnsPerHost: min(c.Instances*c.Workers, 1024)}
		defer tr.CloseIdleConnections()
		httpc = &http.Client{Transport: tr, Timeout: 10 * time.Second}
		if prov != nil {
			// Open the connections the workers will use before the
			// clock starts, as a long-running fleet has them: a dial
			// delays the first calls, which would bunch up the
			// provider's first window with the next period's calls.
			// Its health path is not counted.
			warmHTTP(ctx, httpc, prov.URL()+provider.HealthPath, min(c.Instances*c.Workers, 1024))
		}
		if c.Transport {
			// Each instance's calls go through a Transport of its own on
			// its Limiter, over the shared (warm) connections.
			for _, in := range fleet {
				ht, err := httpclient.NewTransport(in.lim, httpclient.WithBase(tr), httpclient.WithMaxWait(c.MaxWait))
				if err != nil {
					return loadResult{}, err
				}
				in.client = &http.Client{Transport: ht, Timeout: httpc.Timeout}
			}
		}
	}

	// Resetters run for as long as the workers, and a little before.
	bg, stopBg := context.WithCancel(context.WithoutCancel(ctx))
	var bgDone sync.WaitGroup
	defer func() { stopBg(); bgDone.Wait() }()
	for _, in := range fleet {
		if in.resetter != nil {
			bgDone.Go(func() { _ = in.resetter.Run(bg) })
		}
	}

	// The run ends by cancellation rather than a deadline: a deadline
	// would bound every Acquire's wait, and callers near the end would
	// fail fast and ask again in a loop instead of waiting.
	run, cancel := context.WithCancel(ctx)
	defer cancel()
	end := time.AfterFunc(c.Duration, cancel)
	defer end.Stop()
	var (
		rec   guarantee.Recorder
		mu    sync.Mutex
		waits []time.Duration // granted calls' Acquire latency
		lates []time.Duration // how late each grant may have been recorded
		wg    sync.WaitGroup
	)
	// The first interval (after the ramp) holds the start-up rush (every
	// worker asks before any refusal has closed its Limiter's gate); the
	// herd figure starts after it.
	var steadyCmds, steadyGrants atomic.Int64
	steadyCmds.Store(-1)
	steady := time.AfterFunc(c.Ramp+c.Interval, func() {
		steadyGrants.Store(t.grants.Load())
		steadyCmds.Store(hook.cmds.Load())
	})
	defer steady.Stop()
	start := time.Now()
	total, started := 0, 0
	for _, in := range fleet {
		total += in.workers
	}
	for _, in := range fleet {
		in.pace.start(start)
		if c.Transport {
			if c.AtOnce > 0 && in != fleet[0] {
				continue // a burst comes through instance 0 alone
			}
			wg.Go(func() {
				w, l := arrivals(run, cancel, c, in, &rec, t)
				mu.Lock()
				waits = append(waits, w...)
				lates = append(lates, l...)
				mu.Unlock()
			})
			continue
		}
		for range in.workers {
			delay := c.Ramp * time.Duration(started) / time.Duration(total)
			started++
			wg.Go(func() {
				if delay > 0 && !sleepCtx(run, delay) {
					return
				}
				w, l := worker(run, cancel, c, in, httpc, &rec, t)
				mu.Lock()
				waits = append(waits, w...)
				lates = append(lates, l...)
				mu.Unlock()
			})
		}
	}
	var (
		pausedAt, pausedFor   time.Duration
		killedAt, promotedAft time.Duration
		restartAt, restartFor time.Duration
		faultErr              error // written before faultDone closes
	)
	faultDone := make(chan struct{})
	go func() {
		defer close(faultDone)
		if c.FailoverAt > 0 && c.sentinel != nil {
			killedAt, promotedAft, faultErr = failOver(run, c.sentinel, c.FailoverAt, start)
			return
		}
		if c.RestartAt > 0 && c.pauser != nil {
			if !sleepCtx(run, c.RestartAt-time.Since(start)) {
				return
			}
			at := time.Since(start)
			if err := c.pauser.Restart(); err != nil {
				faultErr = fmt.Errorf("restarting redis: %w", err)
				return
			}
			restartAt, restartFor = at, time.Since(start)-at
			return
		}
		if c.PauseFor <= 0 || c.pauser == nil || !sleepCtx(run, c.PauseAt) {
			return
		}
		at := time.Since(start)
		if err := c.pauser.Pause(); err != nil {
			// The signal may have stopped it all the same.
			faultErr = errors.Join(fmt.Errorf("pausing redis: %w", err), c.pauser.Resume())
			return
		}
		sleepCtx(run, c.PauseFor) // resumes early if the run ends first
		if err := c.pauser.Resume(); err != nil {
			faultErr = fmt.Errorf("resuming redis: %w", err)
		}
		pausedAt, pausedFor = at, time.Since(start)-at
	}()
	wg.Wait()
	elapsed := time.Since(start)
	cmds := hook.cmds.Load()
	cancel()
	<-faultDone
	if faultErr != nil {
		return loadResult{}, fmt.Errorf("the fault could not be made: %w", faultErr)
	}

	times := rec.Times()
	slices.Sort(lates)
	measured := percentile(lates, 1)
	if c.Tolerance < 0 {
		c.Tolerance = measured
	}
	rep := c.guarantee(times)
	slices.Sort(waits)
	grants := int(t.grants.Load())
	res := loadResult{
		Bucket:         c.Bucket,
		Limit:          c.Limit,
		IntervalMs:     float64(c.Interval) / float64(time.Millisecond),
		Instances:      c.Instances,
		Workers:        c.Workers,
		DurationS:      elapsed.Seconds(),
		Grants:         grants,
		GrantsPerS:     float64(grants) / elapsed.Seconds(),
		Utilization:    rep.Utilization,
		Allowed:        rep.Allowed,
		Violations:     rep.Violations,
		Worst:          rep.Worst,
		Guarantee:      rep.Detail,
		ToleranceMs:    millis(c.Tolerance),
		MeasuredMs:     millis(measured),
		LateP99Ms:      millis(percentile(lates, 0.99)),
		NeededMs:       millis(c.needed(times)),
		AcquireP50us:   micros(percentile(waits, 0.50)),
		AcquireP99us:   micros(percentile(waits, 0.99)),
		DegradedGrants: t.degraded.Load(),
		PastWaitMs:     millis(max(time.Duration(t.pastWait.Load()), 0)),
		Timeouts:       t.timeouts.Load(),
		Errors:         t.errors.Load(),
		FirstError:     t.firstError,
		StoppedEarly:   grants >= c.MaxGrants,
		Lease:          c.Lease,
		Skew:           c.Skew,
		Demand:         c.Demand,
		RampS:          c.Ramp.Seconds(),
		MaxTenth:       maxIn(times, c.Interval/10),
		RedisCmds:      cmds,
		TargetOK:       t.targetOK.Load(),
		Target429:      t.target429.Load(),
		TargetErrors:   t.targetErr.Load(),
		GrantsUnsent:   t.unsent.Load(),
		GrantsCutAtEnd: t.cutAtEnd.Load(),
		Handed:         t.handed.Load(),
	}
	if len(waits) > 0 {
		res.AcquireMaxUs = micros(waits[len(waits)-1])
	}
	res.PausedAtS, res.PausedForS = pausedAt.Seconds(), pausedFor.Seconds()
	res.FailoverAtS, res.PromotedAfterS = killedAt.Seconds(), promotedAft.Seconds()
	res.RestartedAtS, res.RestartTookS = restartAt.Seconds(), restartFor.Seconds()
	res.Fail = failurePolicies[c.Fail].String()
	res.ArrivalMarginMs = millis(c.ArrivalMargin)
	res.Report = c.Report
	res.Transport = c.Transport
	if c.AtOnce > 0 {
		res.AtOnceMs = millis(elapsed)
	}
	if prov != nil {
		accepted, refused := prov.Arrivals(), prov.Refusals()
		all := slices.SortedFunc(slices.Values(slices.Concat(accepted, refused)), time.Time.Compare)
		res.Provider = providers[c.Provider].String()
		res.ProviderAccepted, res.ProviderRefused = len(accepted), len(refused)
		res.ProviderWorst = maxIn(all, c.Interval)
		res.ProviderLimit = c.ProviderLimit
		if len(all) > 0 {
			perInterval := func(times []time.Time) []int {
				out := make([]int, int(all[len(all)-1].Sub(all[0])/c.Interval)+1)
				for _, a := range times {
					out[int(a.Sub(all[0])/c.Interval)]++
				}
				return out
			}
			res.ProviderPerInterval = perInterval(all)
			if len(refused) > 0 {
				res.ProviderRefusedPerInterval = perInterval(refused)
			}
		}
		res.ProviderRefusedAfterFirst, res.ProviderUseAfterFirst = afterFirst(accepted, refused, start, elapsed, c)
	}
	for _, in := range fleet {
		res.InstanceWorkers = append(res.InstanceWorkers, in.workers)
		res.InstanceGrants = append(res.InstanceGrants, int(in.grants.Load()))
	}
	if c.Bucket != "local" {
		beyond, span := cmds-int64(grants), elapsed
		if sc := steadyCmds.Load(); sc >= 0 && elapsed >= c.Ramp+2*c.Interval {
			beyond, span = beyond-(sc-steadyGrants.Load()), elapsed-c.Ramp-c.Interval
		}
		res.CmdsBeyondGrants = float64(beyond) / (float64(span) / float64(c.Interval))
	}
	if grants > 0 {
		res.RedisCmdsPerGrant = float64(cmds) / float64(grants)
		res.RedisTripsPerGrant = float64(hook.trips.Load()) / float64(grants)
	}
	return res, nil
}

// worker asks for permits until run ends and records each grant. It
// returns, for each grant, how long Acquire took and how late the grant's
// time may have been recorded.
func worker(run context.Context, stop context.CancelFunc, c loadConfig, in *instance, httpc *http.Client, rec *guarantee.Recorder, t *tally) (waits, lates []time.Duration) {
	var gt grantTimes // when the last grant was decided, set by timedBucket
	ctx := context.WithValue(run, grantedKey{}, &gt)
	for run.Err() == nil {
		if !in.pace.wait(run) {
			break
		}
		begin := time.Now()
		err := in.lim.Acquire(ctx, c.MaxWait)
		now := time.Now()
		if run.Err() == nil {
			for past := int64(now.Sub(begin) - c.MaxWait); ; {
				old := t.pastWait.Load()
				if past <= old || t.pastWait.CompareAndSwap(old, past) {
					break
				}
			}
		}
		switch {
		case err == nil:
			// The grant as the bucket decided it: by the granting Take's
			// return, when this Acquire made one (not from a lease or
			// the failure policy).
			at := now
			if !gt.since.Before(begin) && gt.until.Before(now) {
				at = gt.until
			}
			rec.RecordAt(at)
			waits = append(waits, now.Sub(begin))
			if late, ok := lateness(begin, gt.since, at); ok {
				lates = append(lates, late)
			}
			in.grants.Add(1)
			if t.grants.Add(1) >= int64(c.MaxGrants) {
				stop()
			}
			if httpc != nil {
				// A permit taken is a call made, even as the run ends.
				a := call(context.WithoutCancel(run), httpc, c.Target, t)
				if c.Report {
					if err := in.lim.Report(context.WithoutCancel(run), a); err != nil {
						t.errors.Add(1)
						t.firstErr.Do(func() { t.firstError = err.Error() })
					}
				}
			}
		case errors.Is(err, throttle.ErrTimeout):
			t.timeouts.Add(1)
			// A caller refused at once (its wait cannot be met) does
			// something else for a moment rather than spin: 64 workers
			// asking again without a pause starve a small machine.
			select {
			case <-run.Done():
			case <-time.After(time.Millisecond):
			}
		case run.Err() != nil:
			// The run ended while we waited.
		default:
			t.errors.Add(1)
			t.firstErr.Do(func() { t.firstError = err.Error() })
			// Do not spin on a failing store.
			select {
			case <-run.Done():
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	return waits, lates
}

// arrivals starts in's calls at its pace (a fixed arrival rate, open loop)
// until run ends, each through in's Transport (-transport), and records
// each grant. It returns, for each call that was granted and answered,
// how long it took (its wait for a permit, the call and any retry), and
// for each grant how late its time may have been recorded.
func arrivals(run context.Context, stop context.CancelFunc, c loadConfig, in *instance, rec *guarantee.Recorder, t *tally) (waits, lates []time.Duration) {
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	call := func(ctx context.Context) {
		w, l, ok := transportCall(ctx, stop, c, in, rec, t)
		mu.Lock()
		defer mu.Unlock()
		if ok {
			waits = append(waits, w)
		}
		lates = append(lates, l...)
	}
	if c.AtOnce > 0 {
		// A burst: the calls are not cut at the run's end.
		for range c.AtOnce {
			wg.Go(func() { call(context.WithoutCancel(run)) })
		}
		wg.Wait()
		return waits, lates
	}
	for run.Err() == nil && in.pace.wait(run) {
		wg.Go(func() { call(run) })
	}
	wg.Wait()
	return waits, lates
}

// transportCall makes one call through in's Transport and tallies it. It
// records every grant a bucket call made for it (a retry after the
// provider's pause takes a permit of its own); grants of the failure
// policy, which no bucket call made, are not recorded. ok reports a call
// that was answered; took is how long it took.
func transportCall(run context.Context, stop context.CancelFunc, c loadConfig, in *instance, rec *guarantee.Recorder, t *tally) (took time.Duration, lates []time.Duration, ok bool) {
	var log grantLog
	ctx := context.WithValue(run, grantedKey{}, &log)
	begin := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.Target, nil)
	if err != nil {
		t.targetErr.Add(1)
		return 0, nil, false
	}
	resp, err := in.client.Do(req)
	now := time.Now()
	for _, gt := range log.grants {
		rec.RecordAt(gt.until)
		lates = append(lates, gt.until.Sub(gt.since))
		in.grants.Add(1)
		if t.grants.Add(1) >= int64(c.MaxGrants) {
			stop()
		}
	}
	if err != nil && len(log.grants) > 0 {
		if run.Err() != nil && !errors.Is(err, throttle.ErrTimeout) {
			t.cutAtEnd.Add(int64(len(log.grants)))
		} else {
			t.unsent.Add(int64(len(log.grants)))
		}
	}
	switch {
	case err == nil:
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		tallyStatus(t, resp.StatusCode)
		return now.Sub(begin), lates, true
	case errors.Is(err, throttle.ErrTimeout):
		t.timeouts.Add(1)
		if run.Err() == nil && c.MaxWait != throttle.Forever {
			storeMax(&t.pastWait, int64(now.Sub(begin)-c.MaxWait))
		}
	case run.Err() != nil:
		// The run ended while the call waited.
	default:
		t.errors.Add(1)
		t.firstErr.Do(func() { t.firstError = err.Error() })
	}
	return 0, lates, false
}

// grantLog collects, for one call through the Transport, when the bucket
// decided each of its grants (set by timedBucket).
type grantLog struct{ grants []grantTimes }

// tallyStatus counts a provider's answer by its status.
func tallyStatus(t *tally, code int) {
	switch {
	case code == http.StatusTooManyRequests:
		t.target429.Add(1)
	case code < 300:
		t.targetOK.Add(1)
	default:
		t.targetErr.Add(1)
	}
}

// afterFirst returns the provider's refusals from one interval after
// start on, and the calls it accepted from then to start+elapsed as a
// share of c.Limit over that span (0 when the run was not longer than an
// interval).
func afterFirst(accepted, refused []time.Time, start time.Time, elapsed time.Duration, c loadConfig) (refusals int, use float64) {
	from := start.Add(c.Interval)
	for _, a := range refused {
		if !a.Before(from) {
			refusals++
		}
	}
	span := elapsed - c.Interval
	if span <= 0 {
		return refusals, 0
	}
	n := 0
	for _, a := range accepted {
		if !a.Before(from) {
			n++
		}
	}
	return refusals, float64(n) / (float64(c.Limit) * float64(span) / float64(c.Interval))
}

// lateness is how late a grant recorded at now may be: the time since the
// granting bucket call began (since). A grant no bucket call of this
// Acquire made (the call began before begin: a lease's permit, or the
// failure policy's) has no lateness to measure: ok is false, and it does
// not widen the checker's tolerance.
func lateness(begin, since, now time.Time) (late time.Duration, ok bool) {
	if since.Before(begin) {
		return 0, false
	}
	return now.Sub(since), true
}

// warmHTTP opens n connections to url's host at once (n concurrent GETs
// of url), and leaves them idle in httpc's pool.
func warmHTTP(ctx context.Context, httpc *http.Client, url string, n int) {
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			if err != nil {
				return
			}
			if resp, err := httpc.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	wg.Wait()
}

// call sends one GET to the target, as a worker would call its provider,
// and returns what the provider's answer says about its limit.
func call(ctx context.Context, httpc *http.Client, url string, t *tally) throttle.Answer {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.targetErr.Add(1)
		return throttle.Answer{}
	}
	resp, err := httpc.Do(req)
	if err != nil {
		if ctx.Err() == nil {
			t.targetErr.Add(1)
		}
		return throttle.Answer{}
	}
	a := httpclient.ReadAnswer(resp, time.Now())
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	tallyStatus(t, resp.StatusCode)
	return a
}

// needed returns the least tolerance under which the grants pass, to
// within 10 µs: 0 if they pass without one, the interval if not even then.
func (c loadConfig) needed(times []time.Time) time.Duration {
	pass := func(tol time.Duration) bool {
		c.Tolerance = tol
		return c.guarantee(times).Violations == 0
	}
	if pass(0) {
		return 0
	}
	lo, hi := time.Duration(0), c.Interval
	if !pass(hi) {
		return hi
	}
	for hi-lo > 10*time.Microsecond {
		if mid := lo + (hi-lo)/2; pass(mid) {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi
}

// workersOf returns how many goroutines instance i runs: Workers each, or
// with Skew, instance 0 that share of them all (at least 1, and leaving
// at least 1 to each other instance) and the others the rest, evenly.
func (c loadConfig) workersOf(i int) int {
	if c.Skew == 0 {
		return c.Workers
	}
	total, others := c.Instances*c.Workers, c.Instances-1
	first := min(max(int(math.Round(c.Skew*float64(total))), 1), total-others)
	if i == 0 {
		return first
	}
	rest := total - first
	n := rest / others
	if i <= rest%others {
		n++
	}
	return n
}

// pacerOf returns instance i's pacer: nil (closed loop) without Demand;
// with it, the instance's share of Demand × Limit per Interval (Skew for
// instance 0, the rest split evenly; 1/Instances each without Skew).
func (c loadConfig) pacerOf(i int) *pacer {
	if c.Demand == 0 {
		return nil
	}
	share := 1 / float64(c.Instances)
	if c.Skew > 0 {
		share = (1 - c.Skew) / float64(c.Instances-1)
		if i == 0 {
			share = c.Skew
		}
	}
	perNs := c.Demand * share * float64(c.Limit) / float64(c.Interval)
	return &pacer{gap: max(int64(1/perNs), 1)}
}

// pacer hands an instance's workers evenly spaced times at which to ask:
// an open-loop demand. A worker that finds its time passed asks at once,
// so an instance whose asks are refused falls behind its schedule and
// then asks as fast as its workers can until it catches up: its demand
// is kept, only delayed.
type pacer struct {
	base time.Time
	gap  int64 // ns between asks
	next atomic.Int64
}

func (p *pacer) start(t time.Time) {
	if p != nil {
		p.base = t
	}
}

// wait sleeps until the worker's next ask is due. It returns false if
// ctx ends first. A nil pacer never waits.
func (p *pacer) wait(ctx context.Context) bool {
	if p == nil {
		return true
	}
	due := p.base.Add(time.Duration(p.next.Add(p.gap) - p.gap))
	d := time.Until(due)
	if d <= 0 {
		return true
	}
	return sleepCtx(ctx, d)
}

// sleepCtx sleeps d or until ctx ends, reporting whether d passed.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// maxIn returns the most of the sorted times that fall in any half-open
// span [t, t+w).
func maxIn(times []time.Time, w time.Duration) int {
	most, lo := 0, 0
	for hi, t := range times {
		for t.Sub(times[lo]) >= w {
			lo++
		}
		most = max(most, hi-lo+1)
	}
	return most
}

func storeMax(a *atomic.Int64, v int64) {
	for old := a.Load(); v > old && !a.CompareAndSwap(old, v); old = a.Load() {
	}
}

func millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// percentile returns the nearest-rank p-quantile of sorted d.
func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	i := int(p*float64(len(d))+0.999999) - 1
	return d[min(max(i, 0), len(d)-1)]
}

func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// failOver kills sen's master at (from start), unless run ends first, and
// waits (up to 10 s) until the replica answers as a master. It returns
// when the master was killed and how long the promotion took.
func failOver(run context.Context, sen failoverer, at time.Duration, start time.Time) (killed, promoted time.Duration, err error) {
	if !sleepCtx(run, at-time.Since(start)) {
		return 0, 0, nil
	}
	killed = time.Since(start)
	if err := sen.KillMaster(); err != nil {
		return 0, 0, fmt.Errorf("killing the master: %w", err)
	}
	rc := redis.NewClient(&redis.Options{Addr: sen.ReplicaAddr(), DialTimeout: 300 * time.Millisecond, ReadTimeout: 300 * time.Millisecond})
	defer rc.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		role, err := rc.Do(run, "ROLE").Slice()
		if err == nil && len(role) > 0 && role[0] == "master" {
			return killed, time.Since(start) - killed, nil
		}
		if time.Now().After(deadline) {
			return killed, 0, errors.New("the replica was not promoted within 10 s")
		}
		if !sleepCtx(run, 20*time.Millisecond) {
			return killed, 0, nil
		}
	}
}
