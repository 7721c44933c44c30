package main

import (
	"context"
	"errors"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/headway-go/headway/bucket"
	"github.com/headway-go/headway/throttle"
	"github.com/redis/go-redis/v9"
	"golang.org/x/time/rate"
)

// A contender is one rate limiter under test.
type contender struct {
	name  string
	note  string
	redis bool // needs Redis (and gets a client of its own)
	// gubernator: runs Gubernator (built with -tags gubernator only).
	gubernator bool
	// guarantee returns what the contender promises for limit per interval.
	guarantee func(limit int64, interval time.Duration) guarantee
	// build makes a fresh limiter for one run.
	build func(s setup) (acquirer, error)
}

// setup is what a contender is built with for one run.
type setup struct {
	rdb       *redis.Client // nil for local contenders
	key       string        // fresh for each run
	limit     int64
	interval  time.Duration
	lockRetry time.Duration
	calls     *counter // a contender not on Redis counts its store calls here
}

// An acquirer hands out permits the way its library's users wait for one.
type acquirer interface {
	// acquire waits at most maxWait for one permit. ctx carries decided
	// under decidedKey. It returns whether it was granted and, in
	// decided, when the grant was decided: at the earliest decided.at,
	// the start of the attempt that got it, at the latest decided.by, its
	// answer (zero: when acquire returns); for a reservation, plus the
	// reservation's delay. A grant held after its answer (headway's
	// Limiter holds a crowd's grants for their places in the period) was
	// decided before it was held.
	acquire(ctx context.Context, maxWait time.Duration, decided *decision) (bool, error)
	// close releases what the contender holds; it returns within a
	// bounded time, with an error for what it could not release.
	close() error
}

// A decision is when a grant was decided: at the earliest at, at the
// latest by (zero: when its acquire returned). Zero: not known (a permit
// handed out from a lease made no store call), taken as when its acquire
// returned.
type decision struct{ at, by time.Time }

func periods(limit int64, interval time.Duration) guarantee {
	return guarantee{periods: true, limit: limit, interval: interval}
}

func sliding(limit int64, interval time.Duration) guarantee {
	return guarantee{sliding: true, limit: limit, interval: interval}
}

func gcra(limit int64, interval time.Duration) guarantee {
	return guarantee{limit: limit, interval: interval, burst: limit}
}

// contenders lists every contender, in the order of the tables.
var contenders = []contender{
	{
		name: "headway-tokenbucket", redis: true, guarantee: periods,
		note: "bucket.TokenBucket (refill on demand, the default; concurrent takes coalesced) through throttle.Limiter",
		build: func(s setup) (acquirer, error) {
			b, err := bucket.NewTokenBucket(s.rdb, s.key, s.limit, s.interval)
			return newHeadway(b, nil), err
		},
	},
	{
		name: "headway-gcra", redis: true, guarantee: gcra,
		note: "bucket.GCRA, burst = limit, reserving ahead within maxWait, through throttle.Limiter",
		build: func(s setup) (acquirer, error) {
			b, err := bucket.NewGCRA(s.rdb, s.key, s.limit, s.interval)
			return newHeadway(b, nil), err
		},
	},
	{
		name: "headway-slidinglog", redis: true, guarantee: sliding,
		note: "bucket.SlidingLog, one window of the interval, through throttle.Limiter",
		build: func(s setup) (acquirer, error) {
			b, err := bucket.NewSlidingLog(s.rdb, s.key, []throttle.Tier{{Limit: s.limit, Period: s.interval}})
			return newHeadway(b, nil), err
		},
	},
	{
		name: "headway-leased", redis: true, guarantee: periods,
		note: "bucket.TokenBucket through a throttle.Limiter with leasing (throttle.WithLeasing, default Leasing)",
		build: func(s setup) (acquirer, error) {
			b, err := bucket.NewTokenBucket(s.rdb, s.key, s.limit, s.interval)
			if err != nil {
				return nil, err
			}
			return newHeadway(b, nil, throttle.WithLeasing(throttle.Leasing{})), nil
		},
	},
	{
		name: "redis_rate", redis: true, guarantee: gcra,
		note: "go-redis/redis_rate v10, its default burst (= rate); refused callers sleep RetryAfter and ask again",
		build: func(s setup) (acquirer, error) {
			return &redisRate{
				lim:   redis_rate.NewLimiter(s.rdb),
				key:   s.key,
				limit: redis_rate.Limit{Rate: int(s.limit), Burst: int(s.limit), Period: s.interval},
			}, nil
		},
	},
	{
		name: "lock-per-call", redis: true, guarantee: periods,
		note: "the classic design: Redsync lock, read and refill, unlock, DECR; refused callers ask again after 1 ms",
		build: func(s setup) (acquirer, error) {
			return &lockAcquirer{newLockPerCall(s.rdb, s.key, s.limit, s.interval, s.lockRetry)}, nil
		},
	},
	{
		name: "x/time/rate", guarantee: gcra,
		note: "golang.org/x/time/rate, burst = limit, in memory: the local baseline (Reserve, then sleep, as Wait does)",
		build: func(s setup) (acquirer, error) {
			r := rate.Limit(float64(s.limit) / s.interval.Seconds())
			return &xrate{lim: rate.NewLimiter(r, int(s.limit))}, nil
		},
	},
	gubernatorContender("gubernator",
		"Gubernator v2 (gubernator-io), 1 daemon in this process, TOKEN_BUCKET, default settings, asked over gRPC; refused callers sleep until reset_time and ask again",
		gubernatorOpts{nodes: 1}),
	gubernatorContender("gubernator-leaky",
		"the same daemon with LEAKY_BUCKET (burst = limit, its default)",
		gubernatorOpts{nodes: 1, leaky: true}),
	gubernatorContender("gubernator-batching",
		"3 daemons, peers of each other, TOKEN_BUCKET with BATCHING (the default behaviour): a daemon that does not own the key forwards to its owner in batches; calls round robin over the 3",
		gubernatorOpts{nodes: 3}),
	gubernatorContender("gubernator-global",
		"3 daemons, TOKEN_BUCKET with GLOBAL: every daemon answers from its own copy and sends hits to the owner, which broadcasts its state, every 100 ms (GlobalSyncWait, default)",
		gubernatorOpts{nodes: 3, global: true}),
	gubernatorContender("gubernator-global-leaky",
		"3 daemons, LEAKY_BUCKET with GLOBAL",
		gubernatorOpts{nodes: 3, leaky: true, global: true}),
}

// headway acquires through a throttle.Limiter. A timed layer directly
// under the Limiter notes when the granting Take began.
type headway struct {
	lim    *throttle.Limiter
	closer func() error
}

func newHeadway(b throttle.Bucket, closer func() error, opts ...throttle.LimiterOption) *headway {
	lim := throttle.New(timed{b}, opts...)
	if closer == nil {
		closer = lim.Close
	}
	return &headway{lim: lim, closer: closer}
}

// acquire calls Acquire; the timed layer sets the *time.Time that ctx
// carries under decidedKey (the caller's decided).
func (h *headway) acquire(ctx context.Context, maxWait time.Duration, _ *decision) (bool, error) {
	err := h.lim.Acquire(ctx, maxWait)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, throttle.ErrTimeout):
		return false, nil
	}
	return false, err
}

// timed passes Takes on and records, in the *decision the context
// carries, when a granting Take began and when it was answered (plus a
// reservation's delay).
type timed struct{ throttle.Bucket }

type decidedKey struct{}

func (b timed) Take(ctx context.Context, key string, n int64, maxWait time.Duration) (throttle.Decision, error) {
	begin := time.Now()
	d, err := b.Bucket.Take(ctx, key, n, maxWait)
	if err == nil && d.Granted {
		noteDecision(ctx, begin.Add(d.Delay), time.Now().Add(d.Delay))
	}
	return d, err
}

// noteDecision records, in the decision that ctx carries under
// decidedKey, that a grant was decided at the earliest at (the start of
// the store call that made it) and at the latest by (its answer); a
// reservation's delay is added to both.
func noteDecision(ctx context.Context, at, by time.Time) {
	if p, ok := ctx.Value(decidedKey{}).(*decision); ok {
		*p = decision{at: at, by: by}
	}
}

// Unwrap returns the bucket b times, so that the Limiter finds what it
// offers (refunds, its figures for the failure policy).
func (b timed) Unwrap() throttle.Bucket { return b.Bucket }

// redisRate waits the way redis_rate's users must: it has no wait of its
// own, so a refused caller sleeps the RetryAfter it was told and asks
// again, and gives up at once when that is beyond its wait.
type redisRate struct {
	lim   *redis_rate.Limiter
	key   string
	limit redis_rate.Limit
}

func (r *redisRate) acquire(ctx context.Context, maxWait time.Duration, decided *decision) (bool, error) {
	deadline := time.Now().Add(maxWait)
	for {
		at := time.Now()
		res, err := r.lim.Allow(ctx, r.key, r.limit)
		if err != nil {
			return false, err
		}
		if res.Allowed > 0 {
			decided.at = at
			return true, nil
		}
		if res.RetryAfter < 0 || time.Now().Add(res.RetryAfter).After(deadline) {
			return false, nil
		}
		if !sleep(ctx, res.RetryAfter) {
			return false, ctx.Err()
		}
	}
}

// lockAcquirer waits for the lock-per-call design: it cannot tell when a
// token will come, so a refused caller asks again after a millisecond.
type lockAcquirer struct{ b *lockPerCall }

// lockPoll is how long a refused lock-per-call caller sleeps.
const lockPoll = time.Millisecond

func (l *lockAcquirer) acquire(ctx context.Context, maxWait time.Duration, decided *decision) (bool, error) {
	deadline := time.Now().Add(maxWait)
	for {
		at := time.Now()
		lctx, cancel := context.WithDeadline(ctx, deadline)
		ok, err := l.b.take(lctx)
		cancel()
		if ok {
			decided.at = at
			return true, nil
		}
		if err != nil {
			if ctx.Err() != nil || time.Now().After(deadline) {
				return false, nil // the lock's wait ran out: a timeout
			}
			return false, err
		}
		if time.Now().Add(lockPoll).After(deadline) {
			return false, nil
		}
		if !sleep(ctx, lockPoll) {
			return false, ctx.Err()
		}
	}
}

// xrate is golang.org/x/time/rate, acquired as its Wait does: reserve,
// give the reservation back if it is beyond the wait, else sleep until it.
type xrate struct{ lim *rate.Limiter }

func (x *xrate) acquire(ctx context.Context, maxWait time.Duration, decided *decision) (bool, error) {
	now := time.Now()
	r := x.lim.ReserveN(now, 1)
	d := r.DelayFrom(now)
	if !r.OK() || d > maxWait {
		r.CancelAt(now)
		return false, nil
	}
	if d > 0 && !sleep(ctx, d) {
		r.Cancel()
		return false, ctx.Err()
	}
	decided.at = now.Add(d)
	return true, nil
}

func (h *headway) close() error    { return h.closer() }
func (*redisRate) close() error    { return nil }
func (*lockAcquirer) close() error { return nil }
func (*xrate) close() error        { return nil }

// sleep waits d or until ctx ends, reporting whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
