package main

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/headway-go/headway/bucket"
	"github.com/headway-go/headway/internal/guarantee"
	"github.com/headway-go/headway/throttle"
	"github.com/redis/go-redis/v9"
)

// instance is one member of the fleet: its own Redis client, its own
// bucket on it, its own
// Limiter (leasing when asked), and, for the counter, its own Resetter.
type instance struct {
	rdb      *redis.Client
	lim      *throttle.Limiter
	resetter *bucket.Resetter
	workers  int          // goroutines driving this instance
	pace     *pacer       // nil: closed loop
	client   *http.Client // -transport: through an httpclient.Transport on lim
	grants   atomic.Int64
}

// maxPool caps an instance's connection pool. Workers beyond it wait for
// a connection; with thousands of workers (the herd mode) most of them
// wait at the Limiter's gate anyway, and Redis accepts 10,000 clients at
// most by default.
const maxPool = 512

// newInstance builds instance i's client and bucket as a separate process
// would.
func newInstance(c loadConfig, i int, hook redis.Hook, t *tally) (*instance, error) {
	in := &instance{workers: c.workersOf(i), pace: c.pacerOf(i)}
	if c.Bucket == "local" {
		// No shared store: each instance gets an even share of the
		// fleet's limit (a "partial limit").
		n := int64(c.Instances)
		b, err := throttle.NewLocal(c.Limit/n, c.Interval, throttle.WithLocalBurst(max(c.Burst/n, 1)))
		if err != nil {
			return nil, err
		}
		return in, in.wrap(c, b, t)
	}
	var rdb *redis.Client
	if c.sentinel != nil {
		// Each instance finds the master through the Sentinel, with
		// short timeouts so that it notices a dead master quickly.
		o := c.sentinel.FailoverOptions()
		o.PoolSize = min(in.workers+4, maxPool)
		o.DialTimeout, o.ReadTimeout, o.WriteTimeout, o.PoolTimeout = 300*time.Millisecond, 300*time.Millisecond, 300*time.Millisecond, 300*time.Millisecond
		rdb = redis.NewFailoverClient(o)
	} else {
		rdb = redis.NewClient(&redis.Options{Addr: c.Redis, PoolSize: min(in.workers+4, maxPool)})
	}
	rdb.AddHook(hook)
	in.rdb = rdb
	var (
		b   throttle.Bucket
		err error
	)
	switch c.Bucket {
	case "tokenbucket":
		b, err = bucket.NewTokenBucket(rdb, c.Key, c.Limit, c.Interval)
	case "fixedwindow":
		b, err = bucket.NewFixedWindow(rdb, c.Key, c.Limit, c.Interval)
	case "slidinglog":
		b, err = bucket.NewSlidingLog(rdb, c.Key, []throttle.Tier{{Limit: c.Limit, Period: c.Interval}}, bucket.WithArrivalMargin(c.ArrivalMargin))
	case "gcra":
		b, err = bucket.NewGCRA(rdb, c.Key, c.Limit, c.Interval, bucket.WithBurst(c.Burst))
	case "counter":
		var ctr *bucket.Counter
		if ctr, err = bucket.NewCounter(rdb, c.Key, c.Limit, c.Interval); err == nil {
			b = ctr
			in.resetter, err = ctr.NewResetter("")
		}
	}
	if err == nil {
		err = in.wrap(c, b, t)
	}
	if err != nil {
		rdb.Close()
		return nil, err
	}
	return in, nil
}

// wrap puts timedBucket around the instance's bucket b and builds the
// Limiter on top, leasing when asked.
func (in *instance) wrap(c loadConfig, b throttle.Bucket, t *tally) error {
	opts := []throttle.LimiterOption{throttle.WithFailurePolicy(failurePolicies[c.Fail]), throttle.WithObserver(degradedCounter{t})}
	if c.Lease {
		opts = append(opts, throttle.WithLeasing(throttle.Leasing{TTL: c.leaseTTL(), Horizon: c.LeaseHorizon}))
	}
	in.lim = throttle.New(timedBucket{b}, opts...)
	return nil
}

// degradedCounter counts the grants of a Limiter's failure policy, and
// the permits its Acquire calls handed over.
type degradedCounter struct{ t *tally }

func (o degradedCounter) Acquired(_ string, n int64, _ time.Duration, err error) {
	if err == nil {
		o.t.handed.Add(n)
	}
}

func (degradedCounter) BucketCall(string, throttle.Decision, time.Duration, error) {}
func (o degradedCounter) Degraded(_ string, _ string, granted bool, _ error) {
	if granted {
		o.t.degraded.Add(1)
	}
}

// close stops the instance's Limiter and closes its client.
func (in *instance) close() {
	if in.lim != nil {
		_ = in.lim.Close()
	}
	if in.rdb != nil {
		in.rdb.Close()
		in.rdb = nil
	}
}

// leaseTTL is how late -lease may record a grant after the bucket placed
// it, which the check then allows as tolerance: none (0) for buckets
// whose Decision.Reset is the end of their period, so that leasing keeps
// their guarantee exactly; a token bucket's margin (a leased permit is
// used until its margin after its place); the lease horizon for the
// others (gcra, slidinglog, local), whose guarantee it loosens by that
// much (see throttle.Leasing).
func (c loadConfig) leaseTTL() time.Duration {
	if !c.Lease {
		return 0
	}
	switch c.Bucket {
	case "tokenbucket":
		// A leased permit is used up to its margin after its place.
		return bucket.DefaultArrivalMargin(c.Interval)
	case "fixedwindow", "counter":
		return 0
	}
	if c.LeaseHorizon > 0 {
		return c.LeaseHorizon
	}
	return defaultLeaseHorizon
}

// defaultLeaseHorizon is throttle's default lease horizon.
const defaultLeaseHorizon = 50 * time.Millisecond

// guarantee checks the guarantee of c's bucket on grant times.
//
// With -lease on a bucket whose leases need a TTL, the tolerance grows by
// that TTL: that is how far leasing may shift a grant (see leaseTTL).
func (c loadConfig) guarantee(times []time.Time) guarantee.Report {
	c.Tolerance += c.leaseTTL()
	// Buckets that count in whole milliseconds round the interval up.
	msInterval := c.Interval.Round(time.Millisecond)
	if msInterval < c.Interval {
		msInterval += time.Millisecond
	}
	perSecond := func(limit int64) float64 { return float64(limit) / c.Interval.Seconds() }
	switch c.Bucket {
	case "tokenbucket":
		// Its places: at most the limit in any span of one interval
		// plus the permits' margin (bucket.TokenBucket's guarantee).
		return guarantee.Sliding(times, c.Limit, c.Interval+bucket.DefaultArrivalMargin(c.Interval), c.Tolerance)
	case "counter":
		return guarantee.Resets(times, c.Limit, msInterval, c.Tolerance)
	case "fixedwindow":
		return guarantee.Aligned(times, c.Limit, c.Interval, 0, c.Tolerance)
	case "slidinglog":
		return guarantee.Sliding(times, c.Limit, c.Interval, c.Tolerance)
	case "gcra":
		return guarantee.GCRA(times, perSecond(c.Limit), c.Burst, c.Tolerance)
	default: // local: the instances' shares together
		n := int64(c.Instances)
		return guarantee.GCRA(times, perSecond(n*(c.Limit/n)), n*max(c.Burst/n, 1), c.Tolerance)
	}
}

// warmUp sends PINGs at once on each instance's client, one per worker
// (up to the pool's size), so that its pool holds a connection per worker.
func warmUp(ctx context.Context, fleet []*instance) error {
	var (
		wg    sync.WaitGroup
		first atomic.Pointer[error]
	)
	for _, in := range fleet {
		if in.rdb == nil {
			continue
		}
		for range min(in.workers, maxPool) {
			wg.Go(func() {
				if err := in.rdb.Ping(ctx).Err(); err != nil {
					first.CompareAndSwap(nil, &err)
				}
			})
		}
	}
	wg.Wait()
	if err := first.Load(); err != nil {
		return fmt.Errorf("reaching Redis: %w", *err)
	}
	return nil
}

// cmdCounter is a go-redis hook that counts commands and round trips.
type cmdCounter struct{ cmds, trips atomic.Int64 }

func (h *cmdCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *cmdCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.cmds.Add(1)
		h.trips.Add(1)
		return next(ctx, cmd)
	}
}

func (h *cmdCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.cmds.Add(int64(len(cmds)))
		h.trips.Add(1)
		return next(ctx, cmds)
	}
}

// timedBucket passes calls to a bucket and notes, for the worker whose
// context carries a grantedKey, when the bucket decided a grant: after the
// Take that granted it began and before it returned (plus the
// reservation's delay; on loopback the Redis server's clock is the
// worker's). The worker records the grant at the Take's return, late by at
// most the Take's duration, not at Acquire's return: a Limiter may hold a
// granted permit for its place in the period (a periodic bucket's grants
// are spread over it), which is no part of the bucket's decision; the
// provider, counting the calls made after Acquire, sees those. The largest
// lateness is the measured tolerance: the checker then holds the bucket to
// its guarantee as tightly as the measurements allow, and no tighter.
type timedBucket struct{ throttle.Bucket }

type grantedKey struct{}

// grantTimes bounds when the bucket decided the worker's last grant.
type grantTimes struct{ since, until time.Time }

func (b timedBucket) Take(ctx context.Context, key string, n int64, maxWait time.Duration) (throttle.Decision, error) {
	begin := time.Now()
	d, err := b.Bucket.Take(ctx, key, n, maxWait)
	if err == nil && d.Granted {
		at := grantTimes{since: begin.Add(d.Delay), until: time.Now().Add(d.Delay)}
		switch gt := ctx.Value(grantedKey{}).(type) {
		case *grantTimes:
			*gt = at
		case *grantLog: // a call through the Transport: each of its grants
			gt.grants = append(gt.grants, at)
		}
	}
	return d, err
}

// Unwrap returns the bucket b times, so that the Limiter finds what it
// offers (its figures for FailLocal, pauses, refunds, the adaptive rate).
func (b timedBucket) Unwrap() throttle.Bucket { return b.Bucket }
