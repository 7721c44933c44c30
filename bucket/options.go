package bucket

import (
	"log/slog"
	"time"
)

// Option types: see the package doc ("Options"). A nil option is ignored.

// TokenBucketOption configures [NewTokenBucket]: [WithPrefix],
// [WithHeartbeat], [WithArrivalMargin].
type TokenBucketOption interface {
	apply(*config)
	tokenBucketOption()
}

// BudgetOption configures [NewBudget]: [WithPrefix], [WithHeartbeat],
// [WithArrivalMargin].
type BudgetOption interface {
	apply(*config)
	budgetOption()
}

// GCRAOption configures [NewGCRA]: [WithPrefix], [WithHeartbeat],
// [WithBurst].
type GCRAOption interface {
	apply(*config)
	gcraOption()
}

// CounterOption configures [NewCounter]: [WithPrefix], [WithHeartbeat],
// [WithRetry], and [WithLeaderLease] and [WithLogger], which the Counter's
// resetters inherit.
type CounterOption interface {
	apply(*config)
	counterOption()
}

// ResetterOption configures [Counter.NewResetter]: [WithLeaderLease],
// [WithLogger].
type ResetterOption interface {
	apply(*config)
	resetterOption()
}

// SlidingLogOption configures [NewSlidingLog]: [WithPrefix],
// [WithHeartbeat], [WithArrivalMargin].
type SlidingLogOption interface {
	apply(*config)
	slidingLogOption()
}

// ConcurrencyOption configures [NewConcurrency]: [WithPrefix],
// [WithLease], [WithLogger].
type ConcurrencyOption interface {
	apply(*config)
	concurrencyOption()
}

// PrefixOption is [WithPrefix]'s type: it configures every constructor of
// this package.
type PrefixOption interface {
	CommonOption
	ConcurrencyOption
}

// CommonOption configures every bucket constructor: [WithPrefix],
// [WithHeartbeat]. [NewFixedWindow] and [NewTiers] read no other options,
// [NewSlidingLog] only [WithArrivalMargin] besides.
type CommonOption interface {
	TokenBucketOption
	BudgetOption
	GCRAOption
	CounterOption
	SlidingLogOption
}

// LeaderOption configures a Counter's resetters, given to [NewCounter]
// or to [Counter.NewResetter]: [WithLeaderLease], [WithLogger].
type LeaderOption interface {
	CounterOption
	ResetterOption
}

// LoggerOption is [WithLogger]'s type: it configures a Counter's
// resetters and a Concurrency.
type LoggerOption interface {
	LeaderOption
	ConcurrencyOption
}

// RetryOption configures the bucket that may ask a caller to retry
// shortly, [NewCounter]: [WithRetry].
type RetryOption interface {
	CounterOption
}

// ArrivalMarginOption is [WithArrivalMargin]'s type: it configures
// [NewTokenBucket], [NewBudget] and [NewSlidingLog].
type ArrivalMarginOption interface {
	TokenBucketOption
	BudgetOption
	SlidingLogOption
}

type commonOption func(*config)

func (f commonOption) apply(c *config)  { f(c) }
func (commonOption) tokenBucketOption() {}
func (commonOption) budgetOption()      {}
func (commonOption) gcraOption()        {}
func (commonOption) counterOption()     {}
func (commonOption) slidingLogOption()  {}

// prefixOption is read by every bucket and by a Concurrency.
type prefixOption struct{ commonOption }

func (prefixOption) concurrencyOption() {}

type concurrencyOnly func(*config)

func (f concurrencyOnly) apply(c *config)  { f(c) }
func (concurrencyOnly) concurrencyOption() {}

type leaderOption func(*config)

func (f leaderOption) apply(c *config) { f(c) }
func (leaderOption) counterOption()    {}
func (leaderOption) resetterOption()   {}

// loggerOption is read by a Counter's resetters and by a Concurrency.
type loggerOption struct{ leaderOption }

func (loggerOption) concurrencyOption() {}

type retryOption func(*config)

func (f retryOption) apply(c *config) { f(c) }
func (retryOption) counterOption()    {}

type marginOption func(*config)

func (f marginOption) apply(c *config)  { f(c) }
func (marginOption) tokenBucketOption() {}
func (marginOption) budgetOption()      {}
func (marginOption) slidingLogOption()  {}

type gcraOnly func(*config)

func (f gcraOnly) apply(c *config) { f(c) }
func (gcraOnly) gcraOption()       {}

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

func newConfig[O interface{ apply(*config) }](opts []O) config {
	c := config{
		prefix:     defaultPrefix,
		logger:     slog.Default(),
		lease:      defaultLease,
		retry:      defaultRetry,
		liveWindow: defaultLiveWindow,
		slotLease:  defaultSlotLease,
	}
	for _, o := range opts {
		if any(o) != nil {
			o.apply(&c)
		}
	}
	return c
}

// WithPrefix sets the first segment of every Redis key the bucket uses, so
// that several applications can share one Redis. Default: "headway". It
// must be non-empty, at most 64 bytes, and contain no '{' or '}' (they would
// change the keys' cluster hash slot); constructors refuse it otherwise.
func WithPrefix(p string) PrefixOption {
	return prefixOption{func(c *config) { c.prefix = p }}
}

// WithLogger sets the logger for rare events: a Resetter's winning or
// losing its leadership and a Redis error in its loop; a [Concurrency]'s
// missing wake-ups (a Redis user without the channel's rights).
// Default: slog.Default(). Nothing is logged per permit or per slot. A
// nil logger keeps the default.
func WithLogger(l *slog.Logger) LoggerOption {
	return loggerOption{func(c *config) {
		if l != nil {
			c.logger = l
		}
	}}
}

// WithBurst sets how many permits a [GCRA] bucket may grant at once after a
// quiet spell. Default: the limit. 1 spaces permits evenly, interval/limit
// apart. It must be at least 1.
func WithBurst(n int64) GCRAOption {
	return gcraOnly(func(c *config) { c.burst = n })
}

// WithLeaderLease sets a [Resetter]'s leadership lease, the Redsync
// mutex's expiry (see Resetter). Default: 1 s. It must be at least 30 ms.
func WithLeaderLease(d time.Duration) LeaderOption {
	return leaderOption(func(c *config) { c.lease = d })
}

// WithRetry sets how long a caller is told to wait (Decision.Delay) in the
// rare moments when the bucket cannot name a time: a [Counter]'s reset is
// due but its Resetter has not run yet. Default: 1 ms. It must be between 100 µs and 1 s.
func WithRetry(d time.Duration) RetryOption {
	return retryOption(func(c *config) { c.retry = d })
}

// WithArrivalMargin sets how late a permit's call may reach the provider
// and still be counted within the limit: network and scheduling delay
// between a permit's time and its call's arrival, including the store's
// answer on its way back. The buckets keep each window d longer than its
// interval, so that calls arriving up to d after their permits' times are
// at most the limit in any span of one interval.
//
// [NewTokenBucket], [NewBudget]: the margin of every permit
// (Decision.Margin); a Limiter that cannot hand a permit to its caller
// within it takes another. Default: [DefaultArrivalMargin] (of the
// shortest dimension's Interval, for a Budget); [NewSlidingLog]: 0.
//
// It costs throughput: at most interval/(interval+d) of the limit is used
// (10 ms on a 1 s interval: 1 %). Set it above the store's round trip and
// the delay between a permit and the provider's arrival at a high
// percentile. It must be at least 0 and below the interval (every
// window's Period, for a SlidingLog; every dimension's Interval, for a
// Budget); for a TokenBucket and a Budget, 0 is the default (a margin of
// 0 would leave a permit no time to be used in).
func WithArrivalMargin(d time.Duration) ArrivalMarginOption {
	return marginOption(func(c *config) { c.margin = d })
}
