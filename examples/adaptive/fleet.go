package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/headway-go/headway/bucket"
	"github.com/headway-go/headway/internal/provider"
	"github.com/headway-go/headway/throttle"
	"github.com/headway-go/headway/throttle/httpclient"
)

// config is one run's settings; see the flags in main.go.
type config struct {
	Provider    string
	Bucket      string
	Limit       int64
	Interval    time.Duration
	Burst       int64
	ClientBurst int64
	Instances   int
	Workers     int
	Duration    time.Duration
	Adaptive    bool
	MaxRefused  float64
	MinUse      float64
	Redis       string
	Key         string
}

// result is what one run measured, at the provider, per interval.
type result struct {
	Tallies []provider.Tally
	Limits  []int64   // the provider's limit in each interval
	Rates   []float64 // the fleet's adaptive rate sampled at each interval's end (0: not adapting)

	Accepted, Refused int64
	RefusedShare      float64
	// ConvergedAt is the first interval from which every later one (in
	// the same phase, for halving) was within the bounds; -1 if none.
	ConvergedAt int
	// After convergence: share refused, mean accepted per interval as a
	// share of the limit, the worst interval's share refused.
	RefusedAfter, UseAfter, WorstAfter float64
	// FollowDown and FollowUp: intervals from the halving (the recovery)
	// until every later interval of that phase was within the bounds; -1
	// if never.
	FollowDown, FollowUp int
	// Stopped reports a run cut short by a signal: the figures cover the
	// whole intervals before it.
	Stopped bool
}

// providerConfig is the provider each -provider name stands for.
func providerConfig(c config) provider.Config {
	pc := provider.Config{Limit: c.Limit, Interval: c.Interval, NoHint: true, Burst: c.Burst}
	switch c.Provider {
	case "leaky":
		pc.Policy = provider.Leaky
	case "sliding":
		pc.Policy = provider.Sliding
	case "fixed":
		pc.Policy = provider.Aligned
	case "halving":
		pc.Policy = provider.Leaky
		third := c.Duration / 3 / c.Interval * c.Interval
		pc.Phases = []provider.Phase{{At: third, Limit: max(c.Limit/2, 1)}, {At: 2 * third, Limit: c.Limit}}
	}
	return pc
}

// plain hides a bucket's limit and adaptive store from the Limiter: the
// fleet then reacts only to explicit retry times (-adaptive=false).
type plain struct{ b throttle.Bucket }

func (p plain) Take(ctx context.Context, key string, n int64, maxWait time.Duration) (throttle.Decision, error) {
	return p.b.Take(ctx, key, n, maxWait)
}

func (p plain) Pause(ctx context.Context, key string, d time.Duration) error {
	if ps, ok := throttle.BucketAs[throttle.Pauser](p.b); ok {
		return ps.Pause(ctx, key, d)
	}
	return nil
}

func newBucket(c config, rdb redis.UniversalClient) (throttle.Bucket, error) {
	switch c.Bucket {
	case "tokenbucket":
		return bucket.NewTokenBucket(rdb, c.Key, c.Limit, c.Interval)
	case "slidinglog":
		return bucket.NewSlidingLog(rdb, c.Key, []throttle.Tier{{Limit: c.Limit, Period: c.Interval}})
	case "gcra":
		var opts []bucket.GCRAOption
		if c.ClientBurst > 0 {
			opts = append(opts, bucket.WithBurst(c.ClientBurst))
		}
		return bucket.NewGCRA(rdb, c.Key, c.Limit, c.Interval, opts...)
	case "fixedwindow":
		return bucket.NewFixedWindow(rdb, c.Key, c.Limit, c.Interval)
	}
	return nil, fmt.Errorf("-bucket %q: want tokenbucket, slidinglog, gcra or fixedwindow", c.Bucket)
}

// instance is one member of the fleet.
type instance struct {
	rdb    *redis.Client
	lim    *throttle.Limiter
	client *http.Client
	base   *http.Transport
}

func newInstance(c config) (*instance, error) {
	rdb := redis.NewClient(&redis.Options{Addr: c.Redis, PoolSize: c.Workers + 4, ContextTimeoutEnabled: true})
	b, err := newBucket(c, rdb)
	if err != nil {
		rdb.Close()
		return nil, err
	}
	if !c.Adaptive {
		b = plain{b}
	}
	lim := throttle.New(b)
	base := &http.Transport{MaxIdleConnsPerHost: c.Workers}
	tr, err := httpclient.NewTransport(lim, httpclient.WithBase(base), httpclient.WithRetries(0))
	if err != nil {
		rdb.Close()
		return nil, err
	}
	return &instance{rdb: rdb, lim: lim, client: &http.Client{Transport: tr}, base: base}, nil
}

func (in *instance) close() {
	in.base.CloseIdleConnections()
	in.rdb.Close()
}

// runFleet runs one fleet against a fresh provider for c.Duration.
func runFleet(ctx context.Context, c config) (result, error) {
	if c.Limit < 1 || c.Interval <= 0 || c.Instances < 1 || c.Workers < 1 || c.Duration < c.Interval {
		return result{}, fmt.Errorf("need -limit ≥ 1, -interval > 0, -instances ≥ 1, -workers ≥ 1 and -duration ≥ -interval")
	}
	fleet := make([]*instance, 0, c.Instances)
	defer func() {
		for _, in := range fleet {
			in.close()
		}
	}()
	for range c.Instances {
		in, err := newInstance(c)
		if err != nil {
			return result{}, err
		}
		fleet = append(fleet, in)
	}
	pc := providerConfig(c)
	prov, err := provider.Start(pc)
	if err != nil {
		return result{}, err
	}
	defer prov.Close()

	n := int(c.Duration / c.Interval)
	// The run ends after n intervals: cancelled then, with no deadline, so
	// that the calls' waits are not bounded by the run's end (a deadline a
	// few seconds off would make the last seconds' calls skip their place
	// in the period, as a caller with a short wait does).
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	stopRun := time.AfterFunc(time.Duration(n)*c.Interval, cancel)
	defer stopRun.Stop()
	var wg sync.WaitGroup
	for _, in := range fleet {
		for range c.Workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for runCtx.Err() == nil {
					req, err := http.NewRequestWithContext(runCtx, http.MethodGet, prov.URL()+"/call", nil)
					if err != nil {
						return
					}
					resp, err := in.client.Do(req)
					if err != nil {
						continue // the run ended, or a transient error
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}()
		}
	}
	// Sample the fleet's adaptive rate at each interval's end, as an
	// operator would see it (one instance's view, read from Redis).
	rates := make([]float64, 0, n)
	tick := time.NewTicker(c.Interval)
	for len(rates) < n {
		select {
		case <-tick.C:
		case <-runCtx.Done():
		}
		s, _ := fleet[0].lim.Key("").AdaptiveState(context.Background())
		rates = append(rates, s.Rate)
		if runCtx.Err() != nil {
			break
		}
	}
	tick.Stop()
	wg.Wait()
	if ctx.Err() != nil {
		// Stopped (a signal): score the whole intervals run so far.
		n = max(len(rates)-1, 0)
		rates = rates[:n]
		r := result{Tallies: prov.Tallies(c.Interval), Rates: rates, Stopped: true}
		if len(r.Tallies) > n {
			r.Tallies = r.Tallies[:n]
		}
		n = len(r.Tallies)
		r.Rates = r.Rates[:min(n, len(r.Rates))]
		r.Limits = limits(c, pc, n)
		r.score(c, pc)
		return r, nil
	}
	for len(rates) < n {
		rates = append(rates, rates[len(rates)-1])
	}

	r := result{Tallies: prov.Tallies(c.Interval), Rates: rates}
	for len(r.Tallies) < n {
		r.Tallies = append(r.Tallies, provider.Tally{})
	}
	r.Tallies = r.Tallies[:n] // calls that arrived after the run's end
	r.Limits = limits(c, pc, n)
	r.score(c, pc)
	return r, nil
}

// limits is the provider's limit in each of the first n intervals.
func limits(c config, pc provider.Config, n int) []int64 {
	ls := make([]int64, 0, n)
	for i := range n {
		limit := c.Limit
		for _, ph := range pc.Phases {
			if time.Duration(i)*c.Interval >= ph.At {
				limit = ph.Limit
			}
		}
		ls = append(ls, limit)
	}
	return ls
}

// score computes the summary figures from the tallies.
func (r *result) score(c config, pc provider.Config) {
	n := len(r.Tallies)
	ok := make([]bool, n)
	for i, t := range r.Tallies {
		r.Accepted += t.Accepted
		r.Refused += t.Refused
		total := t.Accepted + t.Refused
		ok[i] = float64(t.Refused) <= c.MaxRefused*float64(total) && float64(t.Accepted) >= c.MinUse*float64(r.Limits[i])
	}
	if all := r.Accepted + r.Refused; all > 0 {
		r.RefusedShare = float64(r.Refused) / float64(all)
	}
	// settled is the first interval in [from, to) from which every later
	// one in it is within the bounds, or -1.
	settled := func(from, to int) int {
		s := to
		for s > from && ok[s-1] {
			s--
		}
		if s == to {
			return -1
		}
		return s
	}
	phases := []int{0}
	for _, ph := range pc.Phases {
		phases = append(phases, min(int(ph.At/c.Interval), n)) // a stopped run may end before a phase
	}
	phases = append(phases, n)
	r.ConvergedAt = settled(0, phases[1])
	r.FollowDown, r.FollowUp = -1, -1
	if len(phases) == 4 {
		if s := settled(phases[1], phases[2]); s >= 0 {
			r.FollowDown = s - phases[1]
		}
		if s := settled(phases[2], phases[3]); s >= 0 {
			r.FollowUp = s - phases[2]
		}
	}
	if r.ConvergedAt < 0 {
		return
	}
	var acc, ref int64
	var use float64
	for i := r.ConvergedAt; i < n; i++ {
		t := r.Tallies[i]
		acc += t.Accepted
		ref += t.Refused
		use += float64(t.Accepted) / float64(r.Limits[i])
		if total := t.Accepted + t.Refused; total > 0 {
			r.WorstAfter = max(r.WorstAfter, float64(t.Refused)/float64(total))
		}
	}
	if acc+ref > 0 {
		r.RefusedAfter = float64(ref) / float64(acc+ref)
	}
	r.UseAfter = use / float64(n-r.ConvergedAt)
}

// span sums intervals [from, to): the share of calls refused, and the
// accepted calls as a share of the limits in force.
func (r result) span(from, to int) (refused, use float64) {
	var acc, ref, lim int64
	for i := from; i < to && i < len(r.Tallies); i++ {
		acc += r.Tallies[i].Accepted
		ref += r.Tallies[i].Refused
		lim += r.Limits[i]
	}
	if acc+ref > 0 {
		refused = float64(ref) / float64(acc+ref)
	}
	if lim > 0 {
		use = float64(acc) / float64(lim)
	}
	return refused, use
}
