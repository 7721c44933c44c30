package bucket

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/headway-go/headway/internal/guarantee"
	"github.com/headway-go/headway/internal/redisenv"
	"github.com/headway-go/headway/throttle"
)

// The Budget's costs through the faults the buckets go through: a fleet of
// Limiters acquires estimates, "calls" for a while (often across a
// period's end, as an LLM call of seconds does against a minute), and
// settles a real use at most the estimate. A counter of its own, as the
// provider would count, books each call's request and real tokens at the
// time it was granted; the guarantee (at most the limit per period,
// periods at least an interval apart) is checked on those times by
// internal/guarantee, never from the budget's own numbers.

const (
	costReqs     = 12  // requests per interval
	costTokens   = 300 // tokens per interval
	costInterval = 400 * time.Millisecond
	// costTol absorbs grant times recorded late on a loaded machine (the
	// reply's way back, the scheduler), which can make two refills seem
	// closer than an interval. Kept small: the checker may place every
	// refill that much early, so over a run of n periods n·costTol must
	// stay well below what a refill inside a period shifts (the faults
	// come a quarter into a period: three quarters of one), or a refill
	// Redis should not have made would pass. 7 periods × 15 ms is about a
	// quarter of one.
	costTol = 15 * time.Millisecond
)

func costDims() []Dimension {
	return []Dimension{{Name: "requests", Limit: costReqs, Interval: costInterval}, {Name: "tokens", Limit: costTokens, Interval: costInterval}}
}

// costCount is the provider's count: per key, the time of each request
// and of each real token, booked when the call was granted.
type costCount struct {
	mu   sync.Mutex
	reqs map[string][]time.Time
	toks map[string][]time.Time
	errs map[string]int // unexpected errors by text
}

func newCostCount() *costCount {
	return &costCount{reqs: map[string][]time.Time{}, toks: map[string][]time.Time{}, errs: map[string]int{}}
}

func (c *costCount) book(key string, at time.Time, tokens int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reqs[key] = append(c.reqs[key], at)
	for range tokens {
		c.toks[key] = append(c.toks[key], at)
	}
}

func (c *costCount) failed(err error) {
	c.mu.Lock()
	c.errs[err.Error()]++
	c.mu.Unlock()
}

// between returns key's request and token times in [from, to).
func (c *costCount) between(key string, from, to time.Time) (reqs, toks []time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	in := func(ts []time.Time) []time.Time {
		var out []time.Time
		for _, t := range ts {
			if !t.Before(from) && t.Before(to) {
				out = append(out, t)
			}
		}
		slices.SortFunc(out, func(a, b time.Time) int { return a.Compare(b) })
		return out
	}
	return in(c.reqs[key]), in(c.toks[key])
}

// check judges key's calls in [from, to) against both dimensions' limits.
func (c *costCount) check(t *testing.T, what, key string, from, to time.Time) {
	t.Helper()
	c.judge(t, what, key, from, to, guarantee.Periods)
}

// checkSliding judges key's calls in [from, to) against both dimensions'
// limits in any span of one interval.
func (c *costCount) checkSliding(t *testing.T, what, key string, from, to time.Time) {
	t.Helper()
	c.judge(t, what, key, from, to, guarantee.Sliding)
}

// judge judges key's calls in [from, to) against both dimensions' limits
// by measure (guarantee.Periods or guarantee.Sliding).
func (c *costCount) judge(t *testing.T, what, key string, from, to time.Time, measure func(times []time.Time, limit int64, interval, tol time.Duration) guarantee.Report) {
	t.Helper()
	reqs, toks := c.between(key, from, to)
	if len(reqs) == 0 {
		t.Errorf("%s, key %q: no call was granted: the check proves nothing", what, key)
		return
	}
	r := measure(reqs, costReqs, costInterval, costTol)
	k := measure(toks, costTokens, costInterval, costTol)
	t.Logf("%s, key %q: requests %v", what, key, r)
	t.Logf("%s, key %q: tokens %v", what, key, k)
	if r.Violations > 0 || k.Violations > 0 {
		t.Errorf("%s, key %q: requests: %s; tokens: %s", what, key, r.Detail, k.Detail)
	}
}

// costFleet runs workers goroutines per Limiter over keys until stop:
// each acquires an estimate of 1 request and 5–25 tokens and "calls"
// (the requests bind: every period's grants are its limit, so a period
// refilled twice shows at once; the tokens bind at times).
// Five calls in six use their whole estimate and take 20–100 ms; the
// sixth uses nothing and takes 400–800 ms, so it gives its estimate back
// after its period's end: a period's own calls fill it, and a give-back
// granted in a later period shows at the provider. Half the callers wait
// up to an interval for their cost (they sleep until the refill the
// budget names); the others do not wait and ask again 20 ms after a
// refusal, so that someone asks all through every period.
func costFleet(lims []*throttle.Limiter, keys []string, workers int, stop <-chan struct{}, count *costCount) *sync.WaitGroup {
	var wg sync.WaitGroup
	for li, lim := range lims {
		for w := range workers {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(li), uint64(w)))
				maxWait := costInterval
				if w%2 == 1 {
					maxWait = 0
				}
				pause := func(d time.Duration) {
					select {
					case <-stop:
					case <-time.After(d):
					}
				}
				for {
					select {
					case <-stop:
						return
					default:
					}
					key := keys[rng.IntN(len(keys))]
					est := 5 + rng.Int64N(21)
					ctx, cancel := context.WithTimeout(context.Background(), 2*costInterval)
					g, err := lim.Key(key).AcquireCost(ctx, throttle.Cost{"requests": 1, "tokens": est}, maxWait)
					cancel()
					if err != nil {
						var be *throttle.BackendError
						switch {
						case errors.Is(err, throttle.ErrTimeout):
							pause(20 * time.Millisecond) // the caller does something else
						case errors.As(err, &be):
							pause(5 * time.Millisecond) // a store error: back off as a caller would
						default:
							count.failed(err)
							pause(5 * time.Millisecond)
						}
						continue
					}
					used, call := est, time.Duration(20+rng.IntN(81))*time.Millisecond
					if rng.IntN(6) == 0 {
						used, call = 0, time.Duration(400+rng.IntN(401))*time.Millisecond
					}
					count.book(key, time.Now(), used)
					pause(call)
					sctx, cancel := context.WithTimeout(context.Background(), time.Second)
					_ = g.Settle(sctx, throttle.Cost{"requests": 1, "tokens": used}) // best effort, as in a handler
					cancel()
				}
			})
		}
	}
	return &wg
}

// costLimiters builds n instances of one Budget, each on its own client.
func costLimiters(t *testing.T, name string, n int, client func() redis.UniversalClient) ([]*throttle.Limiter, []*common) {
	t.Helper()
	return costLimitersOf(t, name, n, costDims(), client)
}

// costLimitersOf builds n instances of one Budget of dims, each on its
// own client.
func costLimitersOf(t *testing.T, name string, n int, dims []Dimension, client func() redis.UniversalClient) ([]*throttle.Limiter, []*common) {
	t.Helper()
	var lims []*throttle.Limiter
	var cs []*common
	for range n {
		b, err := NewBudget(client(), name, dims, WithHeartbeat(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		lim := throttle.New(b, throttle.WithFailurePolicy(throttle.FailClosed))
		t.Cleanup(func() { lim.Close() })
		lims = append(lims, lim)
		cs = append(cs, &b.common)
	}
	return lims, cs
}

func (c *costCount) logErrors(t *testing.T) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	for e, n := range c.errs {
		t.Errorf("%d× unexpected error: %s", n, e)
	}
}

// TestBudgetFaults: two instances × 4 callers on one Budget key keep both
// dimensions' limits per period, counted by the provider's count, through
// each fault: none, a Redis pause (SIGSTOP) of 1.5 intervals, an empty
// restart, the data lost at once (FLUSHALL). Calls straddle period ends,
// so late give-backs are frequent.
func TestBudgetFaults(t *testing.T) {
	checkCostFleetThroughFaults(t, "faults-", costDims(), func(t *testing.T, count *costCount, fault string, start, end time.Time) {
		count.check(t, fault, "", start, end)
	})
}

// checkCostFleetThroughFaults runs, for each fault of TestBudgetFaults
// (none, a Redis pause (SIGSTOP) of 1.5 intervals, an empty restart, the
// data lost at once (FLUSHALL)), in a subtest named after it, two
// instances × 4 callers on one key of a Budget of dims named prefix and
// the fault's name: steady periods, the fault, periods after it. Then
// check judges the provider's count from the start to the end.
func checkCostFleetThroughFaults(t *testing.T, prefix string, dims []Dimension, check func(t *testing.T, count *costCount, fault string, start, end time.Time)) {
	t.Helper()
	srv := redisenv.New(t)
	redisenv.NeedReal(t, srv, "pausing and restarting")
	faults := []struct {
		name  string
		fault func() error
	}{
		{"none", nil},
		{"pause", func() error {
			if err := srv.Pause(); err != nil {
				return err
			}
			time.Sleep(3 * costInterval / 2) // the pause
			return srv.Resume()
		}},
		{"restarted empty", srv.Restart},
		// What an empty restart leaves, without the downtime that lets
		// the lost period end before anyone can ask.
		{"emptied", func() error { return srv.Client().FlushAll(context.Background()).Err() }},
	}
	for _, f := range faults {
		t.Run(f.name, func(t *testing.T) {
			lims, cs := costLimitersOf(t, prefix+f.name, 2, dims, func() redis.UniversalClient { return shortClient(t, srv.Addr()) })
			count := newCostCount()
			stop := make(chan struct{})
			start := time.Now()
			wg := costFleet(lims, []string{""}, 4, stop, count)
			// Steady periods, then the fault a quarter into one (the
			// periods begin with the first grant, a few ms from start).
			time.Sleep(3*costInterval + costInterval/4)
			if f.fault != nil {
				if err := f.fault(); err != nil {
					t.Fatal(err)
				}
			}
			time.Sleep(3 * costInterval) // periods after it
			close(stop)
			wg.Wait()
			waitInflight(t, cs...)
			check(t, count, f.name, start, time.Now())
			count.logErrors(t)
		})
	}
}

// TestBudgetCluster: the fleet on eight tenants of one Budget over a
// three-master Cluster (each tenant's hash in its own slot): every tenant
// keeps both limits.
func TestBudgetCluster(t *testing.T) {
	cl := redisenv.NewCluster(t)
	lims, cs := costLimiters(t, "cluster-costs", 2, func() redis.UniversalClient { return cl.Client() })
	var keys []string
	for i := range 8 {
		keys = append(keys, fmt.Sprintf("tenant-%d", i))
	}
	count := newCostCount()
	stop := make(chan struct{})
	start := time.Now()
	wg := costFleet(lims, keys, 6, stop, count)
	time.Sleep(5 * costInterval)
	close(stop)
	wg.Wait()
	waitInflight(t, cs...)
	for _, k := range keys {
		count.check(t, "cluster", k, start, time.Now())
	}
	count.logErrors(t)
}

// TestBudgetSentinelFailover: the fleet on one Budget key while the master
// is killed and the Sentinel promotes the replica. Before the kill, and
// from one interval after the failover is over (the last instance's store
// answers again), both limits hold per period. Between them, what
// asynchronous replication lost (the takes of the running period that
// had not reached the replica) may be granted again, at most one period's
// limits: the grants of any two consecutive intervals stay within twice
// the limits, plus that period's.
func TestBudgetSentinelFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("real-time fault test")
	}
	sen := redisenv.NewSentinel(t)
	lims, cs := costLimiters(t, "failover-costs", 2, func() redis.UniversalClient {
		o := sen.FailoverOptions()
		o.ReadTimeout, o.WriteTimeout, o.DialTimeout, o.PoolTimeout = 300*time.Millisecond, 300*time.Millisecond, 300*time.Millisecond, 300*time.Millisecond
		rdb := redis.NewFailoverClient(o)
		t.Cleanup(func() { rdb.Close() })
		return rdb
	})
	count := newCostCount()
	stop := make(chan struct{})
	start := time.Now()
	wg := costFleet(lims, []string{""}, 4, stop, count)
	time.Sleep(3 * costInterval)
	killedAt := time.Now()
	if err := sen.KillMaster(); err != nil {
		t.Fatal(err)
	}
	rc := redis.NewClient(&redis.Options{Addr: sen.ReplicaAddr()})
	defer rc.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		role, err := rc.Do(context.Background(), "ROLE").Slice()
		if err == nil && len(role) > 0 && role[0] == "master" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replica was not promoted within 10 s")
		}
		time.Sleep(20 * time.Millisecond) // polls an outcome, bounded
	}
	promotedAt := time.Now()
	// The clients find the new master about a second later; the store
	// answers again when an instance's call is granted or refused by it.
	var back time.Time
	for back.IsZero() {
		if time.Since(promotedAt) > 10*time.Second {
			t.Fatalf("no call was granted within 10 s of the promotion")
		}
		time.Sleep(20 * time.Millisecond) // polls an outcome, bounded
		if reqs, _ := count.between("", promotedAt, time.Now()); len(reqs) > 0 {
			back = reqs[0]
		}
	}
	time.Sleep(4 * costInterval)
	close(stop)
	wg.Wait()
	waitInflight(t, cs...)
	end := time.Now()
	t.Logf("promoted %v after the kill; first grant %v after the promotion", promotedAt.Sub(killedAt).Round(time.Millisecond), back.Sub(promotedAt).Round(time.Millisecond))
	count.check(t, "before the kill", "", start, killedAt)
	count.check(t, "after the failover", "", back.Add(costInterval), end)
	// Across it: at most one period's limits lost by replication on top.
	reqs, toks := count.between("", killedAt.Add(-costInterval), back.Add(costInterval))
	if r := guarantee.Periods(reqs, 2*costReqs, costInterval, costTol); r.Violations > 0 {
		t.Errorf("across the failover, requests beyond one lost period: %s", r.Detail)
	}
	if k := guarantee.Periods(toks, 2*costTokens, costInterval, costTol); k.Violations > 0 {
		t.Errorf("across the failover, tokens beyond one lost period: %s", k.Detail)
	}
	count.logErrors(t)
}

// TestBudgetSlidingFaults: the fleet of TestBudgetFaults on a Budget whose
// dimensions count a sliding window keeps both limits in any span of one
// interval, by the provider's count, through the same faults.
func TestBudgetSlidingFaults(t *testing.T) {
	dims := costDims()
	for i := range dims {
		dims[i].Sliding = true
	}
	checkCostFleetThroughFaults(t, "sliding-faults-", dims, func(t *testing.T, count *costCount, fault string, start, end time.Time) {
		count.checkSliding(t, fault, "", start, end)
	})
}
