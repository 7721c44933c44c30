package throttle

import (
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/jonboulle/clockwork"
)

// Option configures a constructor of this package: [New], [NewLocal] or
// [NewSmooth]. Each option's doc names the constructors that read it. A
// constructor given an option it does not read refuses it with an error
// matching [ErrInvalid] that names the option and the constructor:
// NewLocal and NewSmooth return it; New, which does not fail, returns a
// Limiter whose every call returns it (as for its other configuration
// mistakes). An option is never silently ignored. A nil option is
// ignored.
type Option interface {
	option() *option
}

// option is an Option: the setting it changes and the constructors that
// read it ("New", "NewLocal", "NewSmooth").
type option struct {
	name  string
	reads []string
	set   func(*config)
}

func (o *option) option() *option { return o }

// newOption returns the option name that sets set, for the constructors
// reads.
func newOption(name string, set func(*config), reads ...string) Option {
	return &option{name: name, reads: reads, set: set}
}

// config holds every setting the options of New, NewLocal and NewSmooth
// can change, with its default.
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
	// instances: 1 (NewSmooth).
	instances int
}

// newConfig returns the configuration of constructor ctor ("New") after
// opts, and the error refusing an option ctor does not read (the options
// before it applied).
func newConfig(ctor string, opts []Option) (config, error) {
	c := config{clock: clockwork.NewRealClock(), logger: slog.Default(), storeTimeout: DefaultStoreTimeout, instances: 1}
	for _, o := range opts {
		if o == nil {
			continue
		}
		op := o.option()
		if op == nil || op.set == nil {
			continue
		}
		if !slices.Contains(op.reads, ctor) {
			return c, invalid("throttle: "+ctor, "option", op.name,
				fmt.Sprintf("%s does not read %s (read by %s)", ctor, op.name, strings.Join(op.reads, ", ")))
		}
		op.set(&c)
	}
	return c, nil
}

// WithClock sets the clock a Limiter sleeps on and a bucket of this
// package reads. Default: the real clock. Tests pass a
// clockwork.FakeClock so that waiting takes no real time. A nil clock
// keeps the default.
//
// Only the clock's monotonic readings (Since, timers) are used: a host
// whose wall clock steps (NTP, a VM resumed) changes nothing.
//
// With a fake clock over a Redis bucket, every wait the bucket names (a
// refill, a grant's place in its period, see [Limiter.Acquire]) is slept
// on the fake clock: a test advances it, or asks with maxWait 0.
//
// Read by [New], [NewLocal] and [NewSmooth].
func WithClock(c clockwork.Clock) Option {
	return newOption("WithClock", func(cfg *config) {
		if c != nil {
			cfg.clock = c
		}
	}, "New", "NewLocal", "NewSmooth")
}

// WithLogger sets the logger of a Limiter for rare events (the store
// failing and answering again, a refund that failed). Default:
// slog.Default(). Nothing is logged per permit. A nil logger keeps the
// default.
//
// Read by [New].
func WithLogger(l *slog.Logger) Option {
	return newOption("WithLogger", func(cfg *config) {
		if l != nil {
			cfg.logger = l
		}
	}, "New")
}
