package consumer

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/headway-go/headway/internal/errs"
	"github.com/headway-go/headway/internal/nilcheck"
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

// checked is an option that applies set when ok, and otherwise records
// name's value as the first bad option: it must be want.
func checked(name string, value any, ok bool, want string, set func(*config)) Option {
	return optionFunc(func(c *config) {
		if !ok {
			c.invalid(name, value, want)
			return
		}
		set(c)
	})
}

// TimeoutPolicy says what happens to a record that gets no permit within
// the wait set by [WithPermitWait].
type TimeoutPolicy int

const (
	// TimeoutRetry keeps the record: it backs off (the delays of [WithRetry],
	// growing with each timeout in a row, but at most 5 s) and asks for a
	// permit again, for as long as it takes, holding its key (see
	// [WithOrdering]) and its worker ([WithMaxInFlight]). The record's handler
	// attempts are not used up. Each timeout is counted in
	// Stats.PermitTimeouts.
	//
	// A handler error matching [throttle.ErrTimeout] is such a timeout
	// too: the handler's own client (a Transport, AcquireCost) had no
	// permit within the call's deadline, the handler timeout. The call is
	// made again after the same back-off, without using up an attempt,
	// so a handler may wait for a cost the next period grants.
	TimeoutRetry TimeoutPolicy = iota
	// TimeoutFail counts a timeout as a failed attempt of the record, as
	// a handler's [throttle.ErrTimeout] is: it is retried under
	// [WithRetry], then dead-lettered or stops the consumer.
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
	// shaping: "", meaning no record is parked; shapingBound: how long a
	// unit may hold its partition before its records are parked.
	shaping      string
	shapingBound time.Duration
	// handlerTimeout: 10 s.
	handlerTimeout time.Duration
	// ordering: ByKey. maxInFlight: 128 workers per consumer instance.
	ordering    Ordering
	maxInFlight int
	// slots: nil, meaning no cap on handler calls in flight per key.
	slots throttle.Slots
	// fair: nil, meaning records take permits in the order workers reach
	// them (WithFairness).
	fair *fairConfig
	// queueSize: 4096 records per partition; queueBytes: 1 MiB per
	// partition. pollSize: 0, meaning every record the client has
	// fetched.
	queueSize, pollSize int
	queueBytes          int64
	// logger: slog.Default().
	logger *slog.Logger
	// idleFirst, idleAssign: when Run first checks that it owns a
	// partition, and how long it may own none before it warns (tests
	// shorten them).
	idleFirst, idleAssign time.Duration
	// scanWarn: how often a reading of the shaping topic that has not
	// reached the end warns (tests shorten it).
	scanWarn time.Duration

	// err is the first bad option seen.
	err error
}

const (
	defaultAttempts       = 3
	defaultBackoffBase    = 100 * time.Millisecond
	defaultBackoffMax     = 5 * time.Second
	defaultHandlerTimeout = 10 * time.Second
	// defaultCommitTimeout is the least a commit is given, whatever the
	// handler timeout (see Consumer.commitTimeout).
	defaultCommitTimeout = 10 * time.Second
	defaultQueueSize     = 4096
	defaultQueueBytes    = 1 << 20
	defaultMaxInFlight   = 128
	// maxRetryDelay is the longest delay WithRetry accepts.
	maxRetryDelay = time.Hour
	// maxPermitDelay is the longest delay before asking the limiter again
	// after its store failed or a permit wait timed out.
	maxPermitDelay = 5 * time.Second
	// defaultScanWarn is how often a reading of the shaping topic warns
	// while it goes on.
	defaultScanWarn = 30 * time.Second
)

func newConfig(opts []Option) config {
	c := config{
		maxWait:        throttle.Forever,
		onTimeout:      TimeoutRetry,
		attempts:       defaultAttempts,
		backoffBase:    defaultBackoffBase,
		backoffMax:     defaultBackoffMax,
		handlerTimeout: defaultHandlerTimeout,
		ordering:       ByKey,
		maxInFlight:    defaultMaxInFlight,
		queueSize:      defaultQueueSize,
		queueBytes:     defaultQueueBytes,
		logger:         slog.Default(),
		idleFirst:      idleFirst,
		idleAssign:     idleAssign,
		scanWarn:       defaultScanWarn,
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
		c.err = errs.Invalid("consumer", field, value, want)
	}
}

// WithKafka adds options for the Kafka client that [Consumer.Run] builds.
// They must name the brokers (kgo.SeedBrokers), the group
// (kgo.ConsumerGroup) and what to consume (kgo.ConsumeTopics, with
// kgo.ConsumeRegex for patterns); [New] refuses options that miss one.
// WithKafka may be given more than once; the options add up, in order.
//
// The consumer sets, before these options (so they may be overridden):
// kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), so a new group starts
// at the oldest record and a lost offset rewinds rather than skips. After
// them, and not to be overridden: kgo.AutoCommitMarks,
// kgo.BlockRebalanceOnPoll and the OnPartitionsAssigned, Revoked and Lost
// callbacks; and kgo.OnOffsetsFetched, which reads the offset maps (see
// [WithQueueSize]) and then calls the one given here, if any. New refuses options that conflict with these
// (kgo.DisableAutoCommit, kgo.GreedyAutoCommit), a transactional ID, and
// a nil kgo.Opt; it checks the options by building a client that never
// connects. kgo's autocommit interval
// (kgo.AutoCommitInterval, default 5 s) sets how often marked offsets are
// committed between rebalances.
func WithKafka(opts ...kgo.Opt) Option {
	return optionFunc(func(c *config) {
		for i, o := range opts {
			if o == nil {
				c.invalid("WithKafka", fmt.Sprintf("nil kgo.Opt at position %d", i), "must not be nil; leave the option out instead")
				return
			}
		}
		c.kafka = append(c.kafka, opts...)
	})
}

// WithLimiterFor chooses the limiter budget of each record. Default: the
// limiter given to New, for every record. To give every tenant its own
// budget, key by the record key:
//
//	consumer.WithLimiterFor(func(r *kgo.Record) throttle.Keyed {
//		return lim.Key(string(r.Key))
//	})
//
// (a record without a key then draws from the limiter's own budget). The
// budgets are separate, but a tenant whose budget is spent holds its
// partition while its records wait, and the instance's workers
// ([WithMaxInFlight]) while they wait for permits: add [WithShaping] so
// that one hot tenant cannot starve the others. fn is called once per
// attempt, from the record's worker, concurrently with other records',
// and must be fast and safe for concurrent use; a panic in it is a failed
// attempt. A nil fn keeps the default.
func WithLimiterFor(fn func(*kgo.Record) throttle.Keyed) Option {
	return optionFunc(func(c *config) { c.limiterFor = fn })
}

// WithPermitWait bounds how long a record waits for a permit, and says
// what happens when none comes in time (see [TimeoutPolicy]). Default:
// [throttle.Forever]: a record waits until a permit comes, its partition
// is revoked, the consumer shuts down, or [WithShaping] parks it. A
// waiting record holds one of the [WithMaxInFlight] workers. d must not be
// negative; 0 asks for a permit only if one is free at once. d bounds each
// ask: a concurrency slot ([WithConcurrency]) and the permit share it,
// and an ask after a timeout (TimeoutRetry) or a permit dropped unused
// has d again. Under [WithFairness] a record waits in its tenant's queue
// without a bound of its own: d bounds the scheduler's permit requests,
// and a request that times out is the permit timeout of the record whose
// turn it was (see WithFairness); [WithShaping] bounds a record's wait
// in every case.
func WithPermitWait(d time.Duration, onTimeout TimeoutPolicy) Option {
	return optionFunc(func(c *config) {
		if d < 0 {
			c.invalid("WithPermitWait", d, "must be 0, positive or throttle.Forever")
			return
		}
		if onTimeout != TimeoutRetry && onTimeout != TimeoutFail {
			c.invalid("WithPermitWait policy", int(onTimeout), "must be TimeoutRetry or TimeoutFail")
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
// be at least 1, base positive, and max at least base and at most an hour.
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
		case max > maxRetryDelay:
			c.invalid("WithRetry max", max, fmt.Sprintf("must be at most %v: a record holds its key between retries", maxRetryDelay))
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
// [HeaderOffset], [HeaderError] and [HeaderAttempts]. A record too large
// for topic (its max.message.bytes, checked by the broker after
// compression) goes without its value and original headers, then without
// its key, with [HeaderDropped] saying so. The original offset is marked
// for commit only once the broker has acknowledged the dead-letter record;
// if writing fails otherwise, the consumer stops with that error. The
// topic must exist (or the cluster must create topics on use), and must
// not be one the consumer consumes: New refuses a topic that WithKafka's
// kgo.ConsumeTopics names, and under kgo.ConsumeRegex the consumer leaves
// topic out of what the patterns match (kgo.ConsumeExcludeTopics).
//
// Dead letters (and parked records, [WithShaping]) are written by a
// producer built from the options of [WithKafka] without the consumer and
// group ones. A write waits for the broker's acknowledgement for as long
// as kgo keeps trying (kgo.RecordDeliveryTimeout and kgo.RecordRetries; by
// default without end), holding its record's key and worker; a
// revocation waits for it like for a handler call, up to the handler
// timeout.
func WithDeadLetter(topic string) Option {
	return checked("WithDeadLetter", `""`, topic != "", "must name a topic",
		func(c *config) { c.deadLetter = topic })
}

// WithShaping parks the records of a key that holds its partition longer
// than bound in topic, so that the partition goes on: per-tenant budgets
// ([WithLimiterFor]) then cannot let one tenant starve the others of its
// partition, nor can a key with many records. Default: off, and a key
// holds its partition for as long as its records wait (see the package
// documentation). Recommended for per-key budgets, with a bound of about a
// second.
//
// A key holds its partition from the moment a worker takes the first of a
// run of its records (under ByPartition the partition is the key; under
// Unordered each record is its own). Once that has lasted bound, its
// record in work is written to topic instead of waiting longer for its
// permit or a retry, together with the key's records queued behind it, and
// they are finished, so the watermark passes them; later records of the
// key follow them to topic as their turn comes, until the last one parked
// has been handled, so the key's order holds. Nothing is parked while the
// limiter's store fails.
//
// The consumer consumes topic in the same group (it is added to the
// topics of WithKafka) and hands its records to the handler as they were
// consumed from their own topic (same topic, partition, offset, key,
// value, headers), each after its permit, without a bound: a key parked
// there waits in place, in order, and holds that partition of topic. A
// parked record carries [HeaderTopic], [HeaderPartition], [HeaderOffset]
// and [HeaderAttempts] as its last headers.
//
// topic must exist, serve this consumer group alone, accept records as
// large as the consumed topics do (max.message.bytes: a record it refuses
// as too large is handled in place, and holds its partition as without
// shaping), and keep its number of partitions: the records of one key go
// to one partition of it. New
// refuses a topic that WithKafka consumes or that dead letters go to.
// bound must be positive and at most an hour.
func WithShaping(topic string, bound time.Duration) Option {
	return optionFunc(func(c *config) {
		switch {
		case topic == "":
			c.invalid("WithShaping topic", `""`, "must name a topic")
		case bound <= 0 || bound > time.Hour:
			c.invalid("WithShaping bound", bound, "must be positive and at most an hour")
		default:
			c.shaping, c.shapingBound = topic, bound
		}
	})
}

// WithHandlerTimeout bounds each handler call: its context ends after d.
// It also bounds how long a revoked partition, or a shutdown, waits for an
// in-flight call to return; a call still running after that is abandoned
// (its result is never committed) and Run waits for it before returning.
// Default: 10 s. d must be positive and, since a rebalance waits for it, at
// most half the group's rebalance timeout (kgo.RebalanceTimeout, 60 s by
// default); Run checks the latter. Commits (on revocation and at shutdown)
// are not bounded by d: each gets the larger of d and 10 s, at most the
// rebalance timeout less d.
func WithHandlerTimeout(d time.Duration) Option {
	return checked("WithHandlerTimeout", d, d > 0, "must be positive",
		func(c *config) { c.handlerTimeout = d })
}

// WithQueueSize sets how many records a partition may hold before its
// fetching is paused: records queued, in work, and finished but not yet
// committable (behind an unfinished one), which is the span of offsets a
// restart would read again. Fetching resumes when the partition holds
// half as many (and half its bytes, [WithQueueBytes]). A record stuck in
// its handler or its permit wait thus stops its partition at this bound,
// until the handler timeout, retries, the dead-letter topic or
// [WithShaping] deal with it. When the partition stops here (revocation,
// shutdown), the commit carries the offsets finished past the watermark
// (a bounded offset map), and the next owner does not handle them again
// ([Stats] Restored). Default: 4096. n must be at least 1. See the
// package documentation for the bounds this gives.
func WithQueueSize(n int) Option {
	return checked("WithQueueSize", n, n >= 1, "must be at least 1",
		func(c *config) { c.queueSize = n })
}

// WithQueueBytes sets how many bytes a partition may hold before its
// fetching is paused, as for [WithQueueSize]: the key, value and headers
// of each unfinished record plus [RecordOverhead], and 16 bytes for each
// finished record behind an unfinished one (the consumer keeps its offset
// only). Default: 1 MiB. n must be at least 1 KiB.
//
// The consumer copies each record it takes from the Kafka client, so what
// it holds does not keep the client's fetched batches alive. It also
// lowers kgo.FetchMaxPartitionBytes (1 MiB by default) to a quarter of n
// when that is less, so that one fetch overfills a partition by little.
func WithQueueBytes(n int64) Option {
	return checked("WithQueueBytes", n, n >= 1<<10, "must be at least 1024",
		func(c *config) { c.queueBytes = n })
}

// WithPollSize sets the most records taken from the Kafka client at once
// (kgo's PollRecords), over all partitions. Default: every record the
// client has fetched, which is best: a partition is paused only once the
// records it was sent are taken, and what the client fetched for it
// otherwise would be dropped (and fetched and decoded again after the
// resume). n must be at least 1. See the package documentation for the
// bounds this gives.
func WithPollSize(n int) Option {
	return checked("WithPollSize", n, n >= 1, "must be at least 1",
		func(c *config) { c.pollSize = n })
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

// Ordering says which records of a partition must be handled one after
// the other, in offset order; see [WithOrdering].
type Ordering int

const (
	// ByKey handles records with the same Kafka key one at a time, in
	// offset order (retries included); records with different keys run
	// concurrently. Records without a key (nil or empty) share one key:
	// they keep their offset order among themselves. This is the default:
	// what a pipeline calling an API usually needs (per-entity order,
	// concurrency across entities).
	ByKey Ordering = iota
	// ByPartition handles a partition's records one at a time, in offset
	// order; partitions run concurrently. A partition's throughput is then
	// at most one record per handler latency.
	ByPartition
	// Unordered handles any records concurrently, up to the in-flight
	// bound; a record's retries still never overlap each other.
	Unordered
)

// String names the ordering.
func (o Ordering) String() string {
	switch o {
	case ByKey:
		return "by key"
	case ByPartition:
		return "by partition"
	case Unordered:
		return "unordered"
	}
	return fmt.Sprintf("Ordering(%d)", int(o))
}

// WithOrdering sets which records are handled in order; see [Ordering].
// Default: [ByKey]. Whatever the ordering, offsets are committed only up
// to the first record of each partition not yet finished (see the package
// documentation).
func WithOrdering(o Ordering) Option {
	return checked("WithOrdering", int(o), o == ByKey || o == ByPartition || o == Unordered, "must be ByKey, ByPartition or Unordered",
		func(c *config) { c.ordering = o })
}

// WithMaxInFlight bounds the records one consumer instance works on at
// once, over all its partitions: a record takes one of n workers
// (goroutines, started as needed) before it waits for its permit and keeps
// it through its handler calls, retry delays and writes to Kafka
// (dead-lettering, parking). Partitions with records ready take turns for
// the workers. Default: 128. n must be at least 1.
//
// To reach a limit of R calls per second with handlers that take L, the
// fleet needs about R·L workers in all (500/s at 100 ms: 50), more when
// permits come in bursts (a token bucket at an idle key grants its whole
// limit at once); the default
// leaves room for a few hundred calls per second per instance at 100 ms
// to 500 ms of latency. A partition's records in flight are also bounded
// by [WithQueueSize].
func WithMaxInFlight(n int) Option {
	return checked("WithMaxInFlight", n, n >= 1, "must be at least 1",
		func(c *config) { c.maxInFlight = n })
}

// WithConcurrency caps the handler calls in flight: each attempt holds a
// slot of s for its record's key (the key of the budget [WithLimiterFor]
// chooses, "" by default) from before its permit until the handler call
// returns. The slot comes first: a record never holds a permit while it
// waits for a slot, and its call starts right after its permit, so the
// rate's pacing holds. The slot's wait and the permit's share
// [WithPermitWait]'s wait, and a slot that comes without its permit is
// given back; no slot in time counts as a permit timeout. With a
// bucket.Concurrency, the cap holds across every consumer instance.
// Default (and nil): no cap. A nil pointer (a constructor's error not
// checked) is refused.
//
// Give the cap to the consumer or to an httpclient.Transport the handler
// sends through, not to both: the handler's request would wait for a
// second slot of the cap its record already holds, and with every slot
// held by records, wait forever.
func WithConcurrency(s throttle.Slots) Option {
	return checked("WithConcurrency", fmt.Sprintf("(%T)(nil)", s), s == nil || !nilcheck.IsNil(s), "must be a cap (was its constructor's error checked?), or nil for none",
		func(c *config) { c.slots = s })
}
