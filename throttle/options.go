package throttle

import (
	"log/slog"
	"time"

	"github.com/jonboulle/clockwork"
)

// The option types: see the package doc. A nil option is ignored.

// LimiterOption configures [New]: [WithClock], [WithLogger],
// [WithObserver], [WithFailurePolicy], [WithStoreTimeout], [WithLeasing].
type LimiterOption interface {
	apply(*config)
	limiterOption()
}

// LocalOption configures [NewLocal]: [WithClock], [WithLocalBurst].
type LocalOption interface {
	apply(*config)
	localOption()
}

// ClockOption is [WithClock]'s option: a [LimiterOption] and a
// [LocalOption] at once.
type ClockOption interface {
	LimiterOption
	LocalOption
}

// config holds every setting the options of New and NewLocal can change,
// with its default.
type config struct {
	// clock: clockwork.NewRealClock(). Limiters sleep on it; Local buckets
	// read it.
	clock clockwork.Clock
	// logger: slog.Default(). Used off the hot path only.
	logger *slog.Logger
	// burst: 0, meaning the Local bucket's limit.
	burst int64
	// observer: nil, meaning no reports.
	observer Observer
	// policy: FailLocal. storeTimeout: DefaultStoreTimeout.
	policy       FailurePolicy
	storeTimeout time.Duration
	// leasing: nil, meaning every decision asks the bucket.
	leasing *Leasing
}

func newConfig[O interface{ apply(*config) }](opts []O) config {
	c := config{clock: clockwork.NewRealClock(), logger: slog.Default(), storeTimeout: DefaultStoreTimeout}
	for _, o := range opts {
		if any(o) != nil {
			o.apply(&c)
		}
	}
	return c
}

// clockOption is read by every constructor.
type clockOption func(*config)

func (f clockOption) apply(c *config) { f(c) }
func (clockOption) limiterOption()    {}
func (clockOption) localOption()      {}

// limiterOnly is read by New only.
type limiterOnly func(*config)

func (f limiterOnly) apply(c *config) { f(c) }
func (limiterOnly) limiterOption()    {}

// localOnly is read by NewLocal only.
type localOnly func(*config)

func (f localOnly) apply(c *config) { f(c) }
func (localOnly) localOption()      {}

// WithClock sets the clock a Limiter sleeps on and a bucket of this
// package reads. Default: the real clock. Tests pass a
// clockwork.FakeClock so that waiting takes no real time. A nil clock
// keeps the default.
//
// Only the clock's monotonic readings (Since, timers) are used: a host
// whose wall clock steps (NTP, a VM resumed) changes nothing.
//
// With a fake clock over a Redis bucket, every wait the bucket names (a
// grant's time, the end of a window or a pause, see [Limiter.Acquire]) is
// slept on the fake clock: a test advances it, or asks with maxWait 0.
func WithClock(c clockwork.Clock) ClockOption {
	return clockOption(func(cfg *config) {
		if c != nil {
			cfg.clock = c
		}
	})
}

// WithLogger sets the logger of a Limiter for rare events (the store
// failing and answering again, a refund that failed). Default:
// slog.Default(). Nothing is logged per permit. A nil logger keeps the
// default.
func WithLogger(l *slog.Logger) LimiterOption {
	return limiterOnly(func(cfg *config) {
		if l != nil {
			cfg.logger = l
		}
	})
}
