package throttle

import (
	"log/slog"
	"time"

	"github.com/jonboulle/clockwork"
)

// Option configures a [Limiter] or a [Local] bucket. Options that make no
// sense for the thing they are given to are ignored.
type Option interface {
	apply(*config)
}

// config holds every setting an Option can change, with its default.
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

func newConfig(opts []Option) config {
	c := config{clock: clockwork.NewRealClock(), logger: slog.Default(), storeTimeout: DefaultStoreTimeout}
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	return c
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// WithClock sets the clock a Limiter sleeps on and a Local bucket reads.
// Default: the real clock. Tests pass a clockwork.FakeClock so that waiting
// takes no real time. A nil clock keeps the default.
func WithClock(c clockwork.Clock) Option {
	return optionFunc(func(cfg *config) {
		if c != nil {
			cfg.clock = c
		}
	})
}

// WithLogger sets the logger for rare events (a store error, a refund that
// failed). Default: slog.Default(). Nothing is logged per permit. A nil
// logger keeps the default.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(cfg *config) {
		if l != nil {
			cfg.logger = l
		}
	})
}
