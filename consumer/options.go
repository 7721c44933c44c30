package consumer

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/headway-go/headway/throttle"
)

// Option configures a [Consumer]. Build options with the With functions of
// this package; New checks them and refuses bad values with an error
// matching [throttle.ErrInvalid] that names the option.
type Option interface {
	apply(*config)
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// TimeoutPolicy says what a partition does when no permit comes within the
// wait set by [WithMaxWait].
type TimeoutPolicy int

const (
	// TimeoutRetry keeps the record: the partition backs off (the delays
	// of [WithRetry], growing with each timeout in a row) and asks for a
	// permit again, for as long as it takes. The record's handler attempts
	// are not used up. Each timeout is counted in Stats.PermitTimeouts.
	TimeoutRetry TimeoutPolicy = iota
	// TimeoutFail counts a timeout as a failed attempt of the record, as if
	// its handler had returned the [throttle.ErrTimeout]: it is retried
	// under [WithRetry], then dead-lettered or stops the consumer.
	TimeoutFail
)

// config holds every setting, with its default. It is the one place the
// defaults are stated.
type config struct {
	// kafka: the user's kgo options, applied before the consumer's own.
	kafka []kgo.Opt
	// limiterFor: nil, meaning every record draws from the limiter given to
	// New, under its own key ("").
	limiterFor func(*kgo.Record) throttle.Keyed
	// maxWait: throttle.Forever. onTimeout: TimeoutRetry.
	maxWait   time.Duration
	onTimeout TimeoutPolicy
	// attempts: 3 handler calls per record; backoff 100 ms doubling up to
	// 5 s between them.
	attempts                int
	backoffBase, backoffMax time.Duration
	// deadLetter: "", meaning a record that fails all its attempts stops
	// the consumer.
	deadLetter string
	// handlerTimeout: 10 s.
	handlerTimeout time.Duration
	// queueSize: 64 records per partition. pollSize: 64 records per poll.
	queueSize, pollSize int
	// logger: slog.Default().
	logger *slog.Logger

	// err is the first bad option seen.
	err error
}

const (
	defaultAttempts       = 3
	defaultBackoffBase    = 100 * time.Millisecond
	defaultBackoffMax     = 5 * time.Second
	defaultHandlerTimeout = 10 * time.Second
	defaultQueueSize      = 64
	defaultPollSize       = 64
)

func newConfig(opts []Option) config {
	c := config{
		maxWait:        throttle.Forever,
		onTimeout:      TimeoutRetry,
		attempts:       defaultAttempts,
		backoffBase:    defaultBackoffBase,
		backoffMax:     defaultBackoffMax,
		handlerTimeout: defaultHandlerTimeout,
		queueSize:      defaultQueueSize,
		pollSize:       defaultPollSize,
		logger:         slog.Default(),
	}
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	return c
}

// invalid records the first bad option.
func (c *config) invalid(field string, value any, want string) {
	if c.err == nil {
		c.err = throttle.Invalid("consumer", field, value, want)
	}
}

// WithKafka adds options for the Kafka client that [Consumer.Run] builds.
// They must name the brokers (kgo.SeedBrokers), the group
// (kgo.ConsumerGroup) and what to consume (kgo.ConsumeTopics or
// kgo.ConsumeRegex); Run refuses a client with no group. WithKafka may be
// given more than once; the options add up, in order.
//
// The consumer sets, before these options (so they may be overridden):
// kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), so a new group starts
// at the oldest record and a lost offset rewinds rather than skips. After
// them, and not to be overridden: kgo.AutoCommitMarks,
// kgo.BlockRebalanceOnPoll and the OnPartitionsAssigned, Revoked and Lost
// callbacks. Run refuses options that conflict with these
// (kgo.DisableAutoCommit, kgo.GreedyAutoCommit), a share group and a
// transactional ID. kgo's autocommit interval
// (kgo.AutoCommitInterval, default 5 s) sets how often marked offsets are
// committed between rebalances.
func WithKafka(opts ...kgo.Opt) Option {
	return optionFunc(func(c *config) { c.kafka = append(c.kafka, opts...) })
}

// WithLimiterFor chooses the limiter budget of each record. Default: the
// limiter given to New, for every record. To give every tenant its own
// budget, so that one hot tenant cannot starve the others, key by the
// record key:
//
//	consumer.WithLimiterFor(func(r *kgo.Record) throttle.Keyed {
//		return lim.Key(string(r.Key))
//	})
//
// (a record without a key then draws from the limiter's own budget). fn is
// called once per attempt, from the record's partition goroutine, and must
// be fast and safe for concurrent use. A nil fn keeps the default.
func WithLimiterFor(fn func(*kgo.Record) throttle.Keyed) Option {
	return optionFunc(func(c *config) { c.limiterFor = fn })
}

// WithMaxWait bounds how long a record waits for a permit, and says what
// happens when none comes in time (see [TimeoutPolicy]). Default:
// [throttle.Forever]: a record waits until a permit comes, its partition is
// revoked, or the consumer shuts down; no timeout ever happens. d must not
// be negative; 0 asks for a permit only if one is free at once.
func WithMaxWait(d time.Duration, onTimeout TimeoutPolicy) Option {
	return optionFunc(func(c *config) {
		if d < 0 {
			c.invalid("WithMaxWait", d, "must be 0, positive or throttle.Forever")
			return
		}
		if onTimeout != TimeoutRetry && onTimeout != TimeoutFail {
			c.invalid("WithMaxWait policy", int(onTimeout), "must be TimeoutRetry or TimeoutFail")
			return
		}
		c.maxWait, c.onTimeout = d, onTimeout
	})
}

// WithRetry sets how often a record's handler is tried and the delay
// between tries. Default: 3 attempts, 100 ms before the second, doubling
// up to 5 s. attempts counts every call, the first included: 1 means no
// retry. Every attempt takes a permit of its own. The delays are exact (no
// jitter): the permits, not the retries, pace the provider. attempts must
// be at least 1, base positive and max at least base.
//
// When every attempt has failed, the record goes to the dead-letter topic
// of [WithDeadLetter] if there is one; otherwise the consumer stops and
// [Consumer.Run] returns a [*HandlerError].
func WithRetry(attempts int, base, max time.Duration) Option {
	return optionFunc(func(c *config) {
		switch {
		case attempts < 1:
			c.invalid("WithRetry attempts", attempts, "must be at least 1")
		case base <= 0:
			c.invalid("WithRetry base", base, "must be positive")
		case max < base:
			c.invalid("WithRetry max", max, fmt.Sprintf("must be at least base (%v)", base))
		default:
			c.attempts, c.backoffBase, c.backoffMax = attempts, base, max
		}
	})
}

// WithDeadLetter sends a record whose every attempt failed to topic, and
// moves on. Default: none, and such a record stops the consumer instead.
//
// The dead-letter record keeps the original key, value, headers and
// timestamp, and adds the headers [HeaderTopic], [HeaderPartition],
// [HeaderOffset], [HeaderError] and [HeaderAttempts]. The original offset
// is marked for commit only once the broker has acknowledged the
// dead-letter record; if producing fails, the consumer stops with that
// error. The topic must exist (or the cluster must create topics on use).
func WithDeadLetter(topic string) Option {
	return optionFunc(func(c *config) {
		if topic == "" {
			c.invalid("WithDeadLetter", `""`, "must name a topic")
			return
		}
		c.deadLetter = topic
	})
}

// WithHandlerTimeout bounds each handler call: its context ends after d.
// It also bounds how long a revoked partition, or a shutdown, waits for an
// in-flight call to return; a call still running after that is abandoned
// (its result is never committed) and Run waits for it before returning.
// Default: 10 s. d must be positive and, since a rebalance waits for it, at
// most half the group's rebalance timeout (kgo.RebalanceTimeout, 60 s by
// default); Run checks the latter.
func WithHandlerTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) {
		if d <= 0 {
			c.invalid("WithHandlerTimeout", d, "must be positive")
			return
		}
		c.handlerTimeout = d
	})
}

// WithQueueSize sets how many records a partition queues before its
// fetching is paused; it is resumed when the queue is down to half. Default:
// 64. n must be at least 1. See the package documentation for the bound on
// buffered records.
func WithQueueSize(n int) Option {
	return optionFunc(func(c *config) {
		if n < 1 {
			c.invalid("WithQueueSize", n, "must be at least 1")
			return
		}
		c.queueSize = n
	})
}

// WithPollSize sets the most records taken from the Kafka client at once
// (kgo's PollRecords), over all partitions. Default: 64, the default queue
// size, so that one poll cannot overfill a partition's queue many times
// over (a paused partition's fetched records are dropped and fetched
// again). n must be at least 1. See the package documentation for the bound on buffered
// records.
func WithPollSize(n int) Option {
	return optionFunc(func(c *config) {
		if n < 1 {
			c.invalid("WithPollSize", n, "must be at least 1")
			return
		}
		c.pollSize = n
	})
}

// WithLogger sets the logger. Default: slog.Default(). The consumer logs
// assignments, revocations and shutdown at Info, dead-lettered records and
// limiter failures at Warn, the error that stops it at Error, and retries
// at Debug; nothing per handled record. A nil logger keeps the default.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(c *config) {
		if l != nil {
			c.logger = l
		}
	})
}
