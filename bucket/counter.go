package bucket

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/headway-go/headway/throttle"
	"github.com/redis/go-redis/v9"
)

// Counter counts calls in a Redis key that a [Resetter] sets back to 0
// every period: the classic INCR counter checked by every caller and
// zeroed every period by one leader-elected resetter. Like [TokenBucket],
// it matches a provider policy of "N calls per period". Prefer
// TokenBucket, which needs no extra process; use Counter when resets must
// come from one place on a steady beat.
//
// Guarantee: at most limit permits per reset, and resets at least one
// period apart on the Redis server's clock, even when two Resetters both
// believe they lead (the reset is fenced by the period). A denied call
// counts nothing: the script checks before it counts, so it never eats into
// the next period, as a bare INCR would.
//
// A Counter grants nothing until a Resetter of its key has run once, and
// stops granting (Decision.Delay = WithRetry, 1 ms) when resets are overdue,
// for example while no Resetter runs. When the limit is reached,
// Decision.Delay is the time until the next reset.
//
// Round trips per grant: 1. A Limiter can pause it for the whole fleet.
// It is safe for concurrent use.
type Counter struct {
	common
	limit    int64
	periodMs int64
}

// NewCounter returns a counter of limit calls per period under key. Run at
// least one [Resetter] for it (see [Counter.NewResetter]); several may run,
// one leads. Each per-call key passed to Take has its own counter and needs
// its own Resetter.
//
// limit must be at least 1 and period at least 1 ms (rounded up to the
// millisecond). Options: [WithPrefix], [WithHeartbeat], [WithRetry], and
// the Resetter's [WithLeaderLease] and [WithLogger], which its resetters inherit.
func NewCounter(rdb redis.UniversalClient, key string, limit int64, period time.Duration, opts ...CounterOption) (*Counter, error) {
	const name = "bucket: NewCounter"
	c, err := newCommon(name, rdb, key, opts)
	if err != nil {
		return nil, err
	}
	if err := checkRate(name, limit, "period", period); err != nil {
		return nil, err
	}
	c.name = "bucket: Counter"
	return &Counter{common: c, limit: limit, periodMs: ceilMs(period)}, nil
}

// Take implements [throttle.Bucket]. It never reserves: maxWait is
// ignored.
func (b *Counter) Take(ctx context.Context, key string, n int64, _ time.Duration) (throttle.Decision, error) {
	return b.takeBy(ctx, key, n, b.limit, 0, b.run)
}

// run is one round trip of counter_take.lua; n < 0 asks for up to -n.
func (b *Counter) run(ctx context.Context, key string, n int64, _ time.Duration, _ []time.Duration) (upTo, error) {
	tag, err := b.ks.tag(b.name, key)
	if err != nil {
		return upTo{}, err
	}
	keys := []string{tag + ":ctr", tag + ":pause"}
	r, _, err := b.eval(ctx, scriptCounterTake, keys, n, b.limit)
	if err := replyErr(err, len(r) == 5, "counter_take.lua"); err != nil {
		return upTo{}, backend("take", keys[0], err)
	}
	// The reset is due 1 ms after PTTL reads 0; the Resetter runs about
	// then.
	refused := throttle.Decision{Delay: ms(r[1] + 1), Limit: b.limit, Remaining: max(r[2], 0), Reset: ms(r[3] + 1)}
	switch r[0] {
	case 1:
		refused.Remaining = 0
		d := throttle.Decision{Granted: true, Limit: b.limit, Remaining: r[2], Reset: ms(r[3])}
		return upTo{granted: d, got: r[4], rest: refused}, nil
	case 0:
		return upTo{granted: refused, rest: refused}, nil
	}
	d := throttle.Decision{Delay: b.cfg.retry, Limit: b.limit, Remaining: 0, Reset: b.cfg.retry}
	return upTo{granted: d, rest: d}, nil
}

// NewResetter returns a Resetter for key's counter ("" for the Counter's
// own key). Options given here override the Counter's: [WithLeaderLease],
// [WithLogger].
func (b *Counter) NewResetter(key string, opts ...ResetterOption) (*Resetter, error) {
	tag, err := b.ks.tag("bucket: Counter.NewResetter", key)
	if err != nil {
		return nil, err
	}
	cfg := b.cfg
	for _, o := range opts {
		if o != nil {
			o.apply(&cfg)
		}
	}
	if err := checkDuration("bucket: Counter.NewResetter", "lease", cfg.lease, 30*time.Millisecond); err != nil {
		return nil, err
	}
	return &Resetter{
		rdb:      b.rdb,
		rs:       redsync.New(goredis.NewPool(b.rdb)),
		counter:  tag + ":ctr",
		lock:     tag + ":ctr:lock",
		periodMs: b.periodMs,
		cfg:      cfg,
	}, nil
}

// Resetter zeroes a [Counter] every period. Run several for availability:
// they elect one leader through a Redsync mutex whose lease (WithLeaderLease,
// default 1 s) the leader extends every lease/3 while it is alive. The
// others try to take the mutex every lease/4, so when a leader dies without
// releasing it another takes over within about one lease; a leader whose
// Run ends releases it at once.
//
// The reset itself is fenced: it happens only once the counter's period
// has ended on the server's clock, so a leader that stalled past its lease
// and a new leader can never reset twice in one period. The leader sleeps
// until the next reset is due, as the server says, so resets are on the
// server's beat, not the leader's clock.
//
// A Resetter is safe for concurrent use, but Run must not be called twice
// at once.
type Resetter struct {
	rdb      redis.UniversalClient
	rs       *redsync.Redsync
	counter  string
	lock     string
	periodMs int64
	cfg      config

	running atomic.Bool
	leading atomic.Bool

	// keepLockOnExit, when set (tests only), makes Run end without
	// releasing the mutex, as a crashed leader would.
	keepLockOnExit bool
}

// Run elects and resets until ctx ends, then releases the mutex if it
// leads and returns nil. It starts no goroutine that outlives it. Redis
// errors do not end it: they are logged and Run keeps trying, so the
// Resetter recovers when Redis comes back. It returns an error only when
// the Resetter is already running.
func (r *Resetter) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return errors.New("bucket: Resetter.Run: already running")
	}
	defer r.running.Store(false)
	log := r.cfg.logger.With("counter", r.counter)
	lease := r.cfg.lease
	timer := time.NewTimer(0)
	defer timer.Stop()
	var m *redsync.Mutex
	defer func() {
		r.leading.Store(false)
		if m != nil && !r.keepLockOnExit {
			uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), lease)
			defer cancel()
			_, _ = m.UnlockContext(uctx) // it expires on its own otherwise
		}
	}()
	var extendAt time.Time
	failing := false // log a Redis outage once, not on every retry
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		}
		if m == nil {
			cand := r.rs.NewMutex(r.lock, redsync.WithTries(1), redsync.WithExpiry(lease), redsync.WithTimeoutFactor(0.25))
			if err := cand.TryLockContext(ctx); err != nil {
				var rerr *redsync.RedisError
				if errors.As(err, &rerr) && ctx.Err() == nil && !failing {
					log.Warn("bucket: resetter election: redis error; retrying", "err", err)
					failing = true
				}
				timer.Reset(lease / 4)
				continue
			}
			m = cand
			r.leading.Store(true)
			extendAt = time.Now().Add(lease / 3)
			log.Info("bucket: resetter leads")
		} else if !time.Now().Before(extendAt) {
			ok, err := m.ExtendContext(ctx)
			if !ok || err != nil {
				if ctx.Err() != nil {
					return nil
				}
				log.Warn("bucket: resetter lost its lease", "err", err)
				m = nil
				r.leading.Store(false)
				timer.Reset(lease / 4)
				continue
			}
			extendAt = time.Now().Add(lease / 3)
		}
		if time.Now().After(m.Until()) {
			// The lease may have run out while we were away; the fence
			// would make a reset harmless, but do not act as leader.
			m = nil
			r.leading.Store(false)
			timer.Reset(0)
			continue
		}
		next, err := scriptCounterReset.Run(ctx, r.rdb, []string{r.counter}, r.periodMs).Int64()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if !failing {
				log.Warn("bucket: resetter reset: redis error; retrying", "err", err)
			}
			failing = true
			next = max(1, min(r.periodMs, int64(lease/time.Millisecond)/10))
		} else {
			failing = false
			next++ // the counter expires 1 ms after PTTL reads 0
		}
		timer.Reset(min(ms(next), time.Until(extendAt)))
	}
}

// leader reports whether r leads now; for tests.
func (r *Resetter) leader() bool { return r.leading.Load() }
