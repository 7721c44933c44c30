package bucket

import (
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/headway-go/headway/internal/errs"
)

// Option configures a constructor of this package. Every option's doc
// names the constructors that read it; a constructor given an option it
// does not read refuses it, with an error matching [throttle.ErrInvalid]
// that names the option and the constructor (an option is never silently
// ignored). A nil option is ignored.
type Option interface {
	option() *option
}

// option is an Option: the setting it changes, and the constructors that
// read it (their names, as in "NewTokenBucket").
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

// config holds every setting an option can change. Its defaults are set in
// newConfig, and each is documented on its option.
type config struct {
	prefix     string
	logger     *slog.Logger
	burst      int64
	lease      time.Duration
	retry      time.Duration
	liveWindow time.Duration // WithHeartbeat, in call.go
	margin     time.Duration
	slotLease  time.Duration // WithLease
}

const (
	defaultPrefix = "headway"
	defaultLease  = time.Second
	defaultRetry  = time.Millisecond
)

// newConfig returns the configuration of constructor ctor ("bucket:
// NewTokenBucket") after opts, or the error refusing an option ctor does
// not read.
func newConfig(ctor string, opts []Option) (config, error) {
	c := config{
		prefix:     defaultPrefix,
		logger:     slog.Default(),
		lease:      defaultLease,
		retry:      defaultRetry,
		liveWindow: defaultLiveWindow,
		slotLease:  defaultSlotLease,
	}
	return c, c.apply(ctor, opts)
}

// apply applies opts to c, for constructor ctor ("bucket: NewCounter"),
// and refuses an option ctor does not read.
func (c *config) apply(ctor string, opts []Option) error {
	short := strings.TrimPrefix(ctor, "bucket: ")
	for _, o := range opts {
		if o == nil {
			continue
		}
		op := o.option()
		if op == nil || op.set == nil {
			continue
		}
		if !slices.Contains(op.reads, short) {
			return errs.Invalid(ctor, "option", op.name, fmt.Sprintf("%s does not read %s (read by %s)", short, op.name, strings.Join(op.reads, ", ")))
		}
		op.set(c)
	}
	return nil
}

// WithPrefix sets the first segment of every Redis key the bucket uses, so
// that several applications can share one Redis. Default: "headway". It
// must be non-empty, at most 64 bytes, and contain no '{' or '}' (they would
// change the keys' cluster hash slot); constructors refuse it otherwise.
//
// Read by every constructor.
func WithPrefix(p string) Option {
	return newOption("WithPrefix", func(c *config) { c.prefix = p },
		"NewTokenBucket", "NewGCRA", "NewFixedWindow", "NewTiers", "NewSlidingLog", "NewCounter", "NewBudget", "NewConcurrency")
}

// WithLogger sets the logger for rare events: a Resetter's winning or
// losing its leadership and a Redis error in its loop; a [Concurrency]'s
// missing wake-ups (a Redis user without the channel's rights).
// Default: slog.Default(). Nothing is logged per permit or per slot. A
// nil logger keeps the default.
//
// Read by [NewCounter] (its resetters inherit it), [Counter.NewResetter]
// and [NewConcurrency].
func WithLogger(l *slog.Logger) Option {
	return newOption("WithLogger", func(c *config) {
		if l != nil {
			c.logger = l
		}
	}, "NewCounter", "Counter.NewResetter", "NewConcurrency")
}

// WithBurst sets how many permits a [GCRA] bucket may grant at once after a
// quiet spell. Default: the limit. 1 spaces permits evenly, interval/limit
// apart. It must be at least 1.
//
// Read by [NewGCRA].
func WithBurst(n int64) Option {
	return newOption("WithBurst", func(c *config) { c.burst = n }, "NewGCRA")
}

// WithLeaderLease sets a [Resetter]'s leadership lease: the Redsync mutex's
// expiry, extended every lease/3 while the leader is alive. When the leader
// dies without releasing it, another Resetter takes over within about one
// lease. Default: 1 s. It must be at least 30 ms.
//
// Read by [NewCounter] (its resetters inherit it) and [Counter.NewResetter].
func WithLeaderLease(d time.Duration) Option {
	return newOption("WithLeaderLease", func(c *config) { c.lease = d }, "NewCounter", "Counter.NewResetter")
}

// WithRetry sets how long a caller is told to wait (Decision.Delay) in the
// rare moments when the bucket cannot name a time: another instance is
// refilling a [TokenBucket] right now, or a [Counter]'s reset is due but its
// Resetter has not run yet. Default: 1 ms. It must be between 100 µs and 1 s.
//
// Read by [NewTokenBucket] and [NewCounter].
func WithRetry(d time.Duration) Option {
	return newOption("WithRetry", func(c *config) { c.retry = d }, "NewTokenBucket", "NewCounter")
}

// WithArrivalMargin makes a [SlidingLog] keep each window d longer than its
// Period, so that a provider counting the calls by their arrival sees at
// most Limit in any span of Period even when calls granted together reach
// it up to d apart (network and scheduling jitter between a grant and its
// call). Default: 0. It costs throughput: at most Period/(Period+d) of the
// limit is used (16 ms on a 1 s window: 1.6 %). Set it to the measured
// delay between a grant and the provider's arrival at a high percentile
// (the loadtest reports record_late_p99_ms). It must be at least 0 and
// below every window's Period.
//
// Read by [NewSlidingLog].
func WithArrivalMargin(d time.Duration) Option {
	return newOption("WithArrivalMargin", func(c *config) { c.margin = d }, "NewSlidingLog")
}
