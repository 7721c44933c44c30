package bucket

import (
	"log/slog"
	"time"
)

// Option configures a bucket or a [Resetter]. Options that make no sense
// for what they are given to are ignored. A nil Option is ignored.
type Option interface {
	apply(*config)
}

// config holds every setting an Option can change. Its defaults are set in
// newConfig, and each is documented on its option.
type config struct {
	prefix     string
	logger     *slog.Logger
	burst      int64
	lockExpiry time.Duration
	lease      time.Duration
	retry      time.Duration
	liveWindow time.Duration // WithHeartbeat, in call.go
}

const (
	defaultPrefix     = "headway"
	defaultLockExpiry = 200 * time.Millisecond
	defaultLease      = time.Second
	defaultRetry      = time.Millisecond
)

func newConfig(opts []Option) config {
	c := config{
		prefix:     defaultPrefix,
		logger:     slog.Default(),
		lockExpiry: defaultLockExpiry,
		lease:      defaultLease,
		retry:      defaultRetry,
		liveWindow: defaultLiveWindow,
	}
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	return c
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// WithPrefix sets the first segment of every Redis key the bucket uses, so
// that several applications can share one Redis. Default: "headway". It
// must be non-empty, at most 64 bytes, and contain no '{' or '}' (they would
// change the keys' cluster hash slot); constructors refuse it otherwise.
func WithPrefix(p string) Option {
	return optionFunc(func(c *config) { c.prefix = p })
}

// WithLogger sets the logger for rare events: a Resetter winning or losing
// its leadership, a Redis error in a Resetter's loop. Default:
// slog.Default(). Nothing is logged per permit. A nil logger keeps the
// default.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(c *config) {
		if l != nil {
			c.logger = l
		}
	})
}

// WithBurst sets how many permits a [GCRA] bucket may grant at once after a
// quiet spell. Default: the limit. 1 spaces permits evenly, interval/limit
// apart. It must be at least 1. Ignored by other buckets.
func WithBurst(n int64) Option {
	return optionFunc(func(c *config) { c.burst = n })
}

// WithLockExpiry sets how long a [TokenBucket]'s refill mutex is held at
// most before Redis drops it, should its holder stall or die. Default:
// 200 ms. A refill takes one round trip, so the default is ample; a longer
// expiry only delays the refill after a holder dies. It must be at least
// 10 ms. Correctness never depends on it: the refill is fenced by the
// period itself. Ignored by other buckets.
func WithLockExpiry(d time.Duration) Option {
	return optionFunc(func(c *config) { c.lockExpiry = d })
}

// WithLease sets a [Resetter]'s leadership lease: the Redsync mutex's
// expiry, extended every lease/3 while the leader is alive. When the leader
// dies without releasing it, another Resetter takes over within about one
// lease. Default: 1 s. It must be at least 30 ms. Ignored by buckets.
func WithLease(d time.Duration) Option {
	return optionFunc(func(c *config) { c.lease = d })
}

// WithRetry sets how long a caller is told to wait (Decision.Delay) in the
// rare moments when the bucket cannot name a time: another instance is
// refilling a [TokenBucket] right now, or a [Counter]'s reset is due but its
// Resetter has not run yet. Default: 1 ms. It must be between 100 µs and 1 s.
func WithRetry(d time.Duration) Option {
	return optionFunc(func(c *config) { c.retry = d })
}
