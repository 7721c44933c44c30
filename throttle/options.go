package throttle

import (
	"log/slog"
	"time"

	"github.com/jonboulle/clockwork"
)

// Each constructor has its own option type, so that an option given to a
// constructor that does not read it fails to compile. An option that
// several constructors read ([WithClock], [WithLogger], [WithStoreTimeout])
// implements several of these interfaces. A nil option is ignored.

// LimiterOption configures [New]: [WithClock], [WithLogger],
// [WithObserver], [WithFailurePolicy], [WithStoreTimeout].
type LimiterOption interface {
	apply(*config)
	limiterOption()
}

// LocalOption configures [NewLocal]: [WithClock], [WithBurst].
type LocalOption interface {
	apply(*config)
	localOption()
}

// LeasedOption configures [NewLeased]: [WithClock], [WithLogger],
// [WithStoreTimeout], [WithLeaseHorizon], [WithLeaseTTL], [WithLeaseShare].
type LeasedOption interface {
	apply(*config)
	leasedOption()
}

// SmoothOption configures [NewSmooth]: [WithClock], [WithSmoothInstances].
type SmoothOption interface {
	apply(*config)
	smoothOption()
}

// CommonOption configures every constructor of this package: [WithClock].
type CommonOption interface {
	LimiterOption
	LocalOption
	LeasedOption
	SmoothOption
}

// StoreOption configures the constructors whose values call a bucket's
// store, [New] and [NewLeased]: [WithLogger], [WithStoreTimeout].
type StoreOption interface {
	LimiterOption
	LeasedOption
}

// config holds every setting the options of New, NewLocal, NewLeased and
// NewSmooth can change, with its default.
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
func (clockOption) leasedOption()     {}
func (clockOption) smoothOption()     {}

// storeOption is read by the constructors that call a bucket's store: New
// and NewLeased.
type storeOption func(*config)

func (f storeOption) apply(c *config) { f(c) }
func (storeOption) limiterOption()    {}
func (storeOption) leasedOption()     {}

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
func WithClock(c clockwork.Clock) CommonOption {
	return clockOption(func(cfg *config) {
		if c != nil {
			cfg.clock = c
		}
	})
}

// WithLogger sets the logger of a Limiter or a [Leased] bucket for rare
// events (a store error, a refund that failed). Default: slog.Default().
// Nothing is logged per permit. A nil logger keeps the default.
func WithLogger(l *slog.Logger) StoreOption {
	return storeOption(func(cfg *config) {
		if l != nil {
			cfg.logger = l
		}
	})
}
