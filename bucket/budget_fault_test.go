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
// Limiters acquires estimates, "calls" for a while (often longer than
// what is left of its grant's interval, as an LLM call of seconds does
// against a minute), and settles a real use at most the estimate. A
// counter of its own, as the provider would count, books each call's
// request and real tokens at the time it was sent (when AcquireCost
// returned: at its place, within its margin), and at the place its grant
// had on the server's clock. The guarantee is checked on those times,
// never from the budget's own numbers: exactly on the places (at most the
// limit in any span of one interval and the margin: a call's real tokens
// are at most what its grant held, net of what it gave back), and on the
// send times as the provider sees them (at most the limit in any span of
// one interval, within a tolerance for this machine's scheduling).

const (
	costReqs     = 12  // requests per interval
	costTokens   = 300 // tokens per interval
	costInterval = 400 * time.Millisecond
	// costMargin is the budget's margin (DefaultArrivalMargin).
	costMargin = 5 * time.Millisecond
	// costTol absorbs send times recorded late (the scheduler between the
	// Limiter's check of a grant's margin and the booking), which can make
	// two sends seem closer than they were: up to 53 ms seen under -race
	// on a loaded machine of 2 cores. The places are judged exactly.
	costTol = 60 * time.Millisecond
)

func costDims() []Dimension {
	return []Dimension{{Name: "requests", Limit: costReqs, Interval: costInterval}, {Name: "tokens", Limit: costTokens, Interval: costInterval}}
}

// costCount is the provider's count: per key, the time of each request
// and of each real token, booked when the call was sent, and the calls'
// places (µs on the server's clock).
type costCount struct {
	mu     sync.Mutex
	reqs   map[string][]time.Time
	toks   map[string][]time.Time
	places map[string][]costBooked
	errs   map[string]int // unexpected errors by text
}

// costBooked is one call's place and real tokens.
type costBooked struct{ at, tokens int64 }

func newCostCount() *costCount {
	return &costCount{reqs: map[string][]time.Time{}, toks: map[string][]time.Time{}, places: map[string][]costBooked{}, errs: map[string]int{}}
}

func (c *costCount) book(key string, at time.Time, place, tokens int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reqs[key] = append(c.reqs[key], at)
	for range tokens {
		c.toks[key] = append(c.toks[key], at)
	}
	c.places[key] = append(c.places[key], costBooked{place, tokens})
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

// placesBetween returns key's places in [from, to), as units of requests
// and of tokens.
func (c *costCount) placesBetween(key string, from, to time.Time) (reqs, toks []unit) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.places[key] {
		if p.at >= from.UnixMicro() && p.at < to.UnixMicro() {
			reqs, toks = append(reqs, unit{p.at, 1}), append(toks, unit{p.at, p.tokens})
		}
	}
	return reqs, toks
}

// check judges key's calls in [from, to) against both dimensions'
// limits: their places (µs on the server's clock) in any span of one
// interval and the margin, exactly; their send times in any span of one
// interval.
func (c *costCount) check(t *testing.T, what, key string, from, to time.Time) {
	t.Helper()
	pr, pt := c.placesBetween(key, from, to)
	judgeUnits(t, what+": requests' places", pr, costReqs, costInterval+costMargin)
	judgeUnits(t, what+": tokens' places", pt, costTokens, costInterval+costMargin)
	reqs, toks := c.between(key, from, to)
	if len(reqs) == 0 {
		t.Errorf("%s, key %q: no call was granted: the check proves nothing", what, key)
		return
	}
	r := guarantee.Sliding(reqs, costReqs, costInterval, costTol)
	k := guarantee.Sliding(toks, costTokens, costInterval, costTol)
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
// after its entry has stopped counting: a give-back granted to later calls
// shows at the provider. Half the callers wait up to an interval for
// their cost (they sleep until their place); the others do not wait and
// ask again 20 ms after a refusal, so that someone asks all the time.
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
					var place int64
					g, err := lim.Key(key).AcquireCost(context.WithValue(ctx, placeKey{}, &place), throttle.Cost{"requests": 1, "tokens": est}, maxWait)
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
					count.book(key, guarantee.Now(), place, used)
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

// placeKey keys, in an AcquireCost's context, where placing puts the
// place of the grant.
type placeKey struct{}

// placing is a Budget that tells the callers of AcquireCost the place of
// their grant: a Limiter that gives a grant back asks again, so the last
// place is the one its caller used.
type placing struct{ *Budget }

func (p placing) TakeCost(ctx context.Context, key string, c throttle.Cost, maxWait time.Duration) (throttle.Decision, error) {
	d, u, err := p.take(ctx, key, c, maxWait)
	if at, ok := ctx.Value(placeKey{}).(*int64); ok && err == nil && d.Granted {
		*at = u.now + u.delay // the place the script chose (d.Delay counts from Take's return)
	}
	return d, err
}

// costLimiters builds n instances of one Budget, each on its own client.
func costLimiters(t *testing.T, name string, n int, client func() redis.UniversalClient) ([]*throttle.Limiter, []*common) {
	t.Helper()
	var lims []*throttle.Limiter
	var cs []*common
	for range n {
		b, err := NewBudget(client(), name, costDims(), WithHeartbeat(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		lim := throttle.New(placing{b}, throttle.WithFailurePolicy(throttle.FailClosed))
		t.Cleanup(func() { lim.Close() })
		lims = append(lims, lim)
		cs = append(cs, &b.common)
	}
	return lims, cs
}

// checkTwice judges key's calls in [from, to) as check does, against
// twice the limits: what Redis lost, at most an interval's grants once,
// on top of the limits.
func (c *costCount) checkTwice(t *testing.T, what, key string, from, to time.Time) {
	t.Helper()
	pr, pt := c.placesBetween(key, from, to)
	judgeUnits(t, what+": requests' places", pr, 2*costReqs, costInterval+costMargin)
	judgeUnits(t, what+": tokens' places", pt, 2*costTokens, costInterval+costMargin)
	reqs, toks := c.between(key, from, to)
	if r := guarantee.Sliding(reqs, 2*costReqs, costInterval, costTol); r.Violations > 0 {
		t.Errorf("%s: requests beyond one lost interval: %s", what, r.Detail)
	}
	if k := guarantee.Sliding(toks, 2*costTokens, costInterval, costTol); k.Violations > 0 {
		t.Errorf("%s: tokens beyond one lost interval: %s", what, k.Detail)
	}
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
// dimensions' limits in any span of one interval, counted by the
// provider's count, through each fault: none, a Redis pause (SIGSTOP) of
// 1.5 intervals, an empty restart, the data lost at once (FLUSHALL).
// Calls outlast their grants' entries, so late give-backs are frequent.
// Where Redis lost the schedules, the instances count each dimension's
// limit at the latest end they know, which holds the places the first of
// them knew of; the places another instance was given after those are
// lost (as a TokenBucket's, at most an interval of grants once per loss,
// some of them placed up to an interval ahead): across such a fault, at
// most twice the limits in a span.
func TestBudgetFaults(t *testing.T) {
	t.Parallel()
	srv := redisenv.New(t)
	redisenv.NeedReal(t, srv, "pausing and restarting")
	faults := []struct {
		name  string
		fault func() error
		loses bool
	}{
		{"none", nil, false},
		{"pause", func() error {
			if err := srv.Pause(); err != nil {
				return err
			}
			time.Sleep(3 * costInterval / 2) // the pause
			return srv.Resume()
		}, false},
		{"restarted empty", srv.Restart, true},
		// What an empty restart leaves, without the downtime that lets
		// the lost places stop counting before anyone can ask.
		{"emptied", func() error { return srv.Client().FlushAll(context.Background()).Err() }, true},
	}
	for _, f := range faults {
		t.Run(f.name, func(t *testing.T) {
			lims, cs := costLimiters(t, "faults-"+f.name, 2, func() redis.UniversalClient { return shortClient(t, srv.Addr()) })
			count := newCostCount()
			stop := make(chan struct{})
			start := time.Now()
			wg := costFleet(lims, []string{""}, 4, stop, count)
			// Steady intervals, then the fault, then intervals after it.
			time.Sleep(3*costInterval + costInterval/4)
			faultAt := time.Now()
			if f.fault != nil {
				if err := f.fault(); err != nil {
					t.Fatal(err)
				}
			}
			// The places lost (up to an interval ahead) stop counting an
			// interval and the margin after their ends.
			over := time.Now().Add(2*costInterval + 2*costMargin)
			time.Sleep(3 * costInterval)
			close(stop)
			wg.Wait()
			waitInflight(t, cs...)
			end := time.Now()
			if !f.loses {
				count.check(t, f.name, "", start, end)
			} else {
				count.check(t, f.name+", before", "", start, faultAt)
				count.check(t, f.name+", after", "", over, end)
				count.checkTwice(t, f.name+", across", "", faultAt.Add(-costInterval), over)
			}
			count.logErrors(t)
		})
	}
}

// TestBudgetCluster: the fleet on eight tenants of one Budget over a
// three-master Cluster (each tenant's keys in its own slot): every tenant
// keeps both limits.
func TestBudgetCluster(t *testing.T) {
	t.Parallel()
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
// answers again), both limits hold in any span of one interval. Between
// them, what asynchronous replication lost (the places that had not
// reached the replica) may be given again, at most one interval's limits:
// any span of one interval holds at most twice the limits.
func TestBudgetSentinelFailover(t *testing.T) {
	t.Parallel()
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
	// Across it: at most one interval's limits lost by replication on top.
	count.checkTwice(t, "across the failover", "", killedAt.Add(-costInterval), back.Add(costInterval))
	count.logErrors(t)
}
