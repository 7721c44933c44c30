package throttle

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"
)

// FailurePolicy says what a [Limiter] decides when its bucket's store (Redis)
// fails: a [*BackendError] from Take, or no answer within the store timeout
// ([WithStoreTimeout]). Set it with [WithFailurePolicy]; the default is
// [FailLocal].
//
// Only store failures are degraded. Errors about the call itself always
// surface unchanged: [ErrInvalid] (bad n, maxWait or key),
// [ErrExceedsLimit] (n can never be granted), and the caller's own context
// ending (cancelled, or its deadline passed).
//
// While the store is failing, one call at a time probes it (asks the
// bucket as usual); the others decide by the policy at once, without a
// round trip, so that a hung store costs each caller nothing but the
// probe's caller at most the store timeout. The first probe that succeeds
// ends the outage: from the next call on, the shared limit decides again.
//
// Every degraded decision is reported to the Observer ([Observer.Degraded])
// with the policy's name and the store's error; the Limiter logs the
// start and the end of an outage (not each decision) on its logger.
type FailurePolicy int

const (
	// FailLocal, the default, limits each instance on its own while the
	// store fails, to its share of the shared limit: limit ÷ live
	// instances per interval, paced evenly (one permit every
	// interval·instances/limit), per key. The bucket must implement
	// Fallback (see [Bucket]; the Redis buckets of package bucket do; they count
	// live instances with heartbeats). With a bucket that does not, before
	// the first live count is known (an instance that started while the
	// store was down), or when the share is below one permit per interval
	// (more instances than the limit), FailLocal refuses as [FailClosed]
	// does, with an error that says why. Waiting for a local permit stays
	// within the caller's wait, as any other.
	//
	// The degraded mode cannot double the fleet at the outage's edges:
	// in the shared period running when the store failed, an instance
	// grants at most its share of what that period had left (the fewest
	// permits its shared decisions of that period reported left, until
	// the period's end); if it knows nothing of that period, it grants
	// nothing until one interval after the failure. A key keeps its own
	// limit (one set live included, as its last shared decision reported
	// it). When the store answers again, the permits granted locally in
	// the last two intervals are taken from the shared bucket before the
	// key's shared grants resume (leased permits owe nothing: see
	// [Leasing]), and until the end of that first shared period the
	// instance takes at most its share less those permits (the other
	// instances may still be granting theirs locally: a failover's
	// clients find the new master one by one). If the store's first
	// answer is a refusal (that period spent, or held because the store
	// lost it: bucket.TokenBucket), the cap goes on through the next
	// period, with the share as its room. The cap costs throughput when
	// demand is uneven: an instance alone in asking gets its share, not
	// the limit, in that period (or two).
	//
	// Bound: while the store fails, the fleet grants at most the shared
	// limit in any span of one interval, when every instance sees the
	// outage (a store down, paused or unreachable for all). An instance
	// cut off alone (a partition) grants its share on top of what the
	// others share: up to limit·(1 + 1/instances).
	FailLocal FailurePolicy = iota
	// FailClosed refuses while the store fails: Acquire returns an error
	// that wraps the store's, a [*BackendError]. If the caller's wait ran out while
	// the store was being asked, the error also matches [ErrTimeout] (and,
	// through the BackendError, context.DeadlineExceeded).
	FailClosed
	// FailOpen grants every call while the store fails. Use it only where
	// exceeding the provider's limit costs less than not calling it. Its
	// grant, as any other, comes within the caller's wait or not at all:
	// a store call that hangs ends a room before the wait's end (see
	// [WithStoreTimeout]) for FailOpen to grant in, and a caller that its
	// process runs again only after its wait has ended (a scheduling stall
	// longer than that room) gets an error matching [ErrTimeout], not a
	// grant, and not the store's error.
	FailOpen
)

// String returns "local", "closed" or "open": the name passed to
// [Observer.Degraded].
func (p FailurePolicy) String() string {
	switch p {
	case FailLocal:
		return "local"
	case FailClosed:
		return "closed"
	case FailOpen:
		return "open"
	}
	return fmt.Sprintf("FailurePolicy(%d)", int(p))
}

// DefaultStoreTimeout is how long a Limiter lets one bucket call take by
// default; see [WithStoreTimeout].
const DefaultStoreTimeout = 100 * time.Millisecond

// WithFailurePolicy sets what a Limiter decides while its bucket's store
// fails. Default: [FailLocal]. A policy other than FailLocal, FailClosed
// and FailOpen makes every call of the Limiter fail with an error matching
// [ErrInvalid].
func WithFailurePolicy(p FailurePolicy) LimiterOption {
	return limiterOnly(func(c *config) { c.policy = p })
}

// WithStoreTimeout sets d, the store timeout. Each bucket call of an
// Acquire gets the end of the caller's wait (maxWait or ctx's deadline,
// the earlier) less a room of a quarter of the wait left, at most 10 ms,
// as its deadline, so that a hung store never keeps Acquire past it and
// the [FailurePolicy] decides within the wait; [Forever] without a ctx
// deadline gets none, and relies on the store client's own timeouts
// (go-redis: ReadTimeout, 3 s by default). The store calls of an Acquire
// with maxWait 0 (and no earlier ctx deadline) get d together, from the
// first (the adaptive pace's, or Take's): one the earlier ones left less
// than a quarter of d, cut by it, is a wait that ran out ([ErrTimeout]),
// not a store failure, unless the store failed an earlier one (the
// pace's) in time. The adaptive pace's call gets at most d whatever the
// wait: a pace the store does not answer in time is given up for this
// process's share of the rate, and the bucket call still gets its bound.
// A bucket call cut by its deadline while the caller's context is alive
// counts as a store failure and goes through the [FailurePolicy].
//
// Default: [DefaultStoreTimeout] (100 ms): far above a healthy Redis round
// trip (well under 1 ms), short enough that a hung Redis does not stall a
// caller who will not wait. Raise it if your store's round trips can take
// longer: a reply cut off after the store charged it, then decided by
// FailLocal or FailOpen, is admitted twice. d ≤ 0 sets no timeout: a
// maxWait 0 call is then bounded only by ctx and the client's timeouts.
// The in-memory [Local] bucket is called without a deadline.
//
// The buckets of package bucket return by this deadline even when their
// Redis client blocks (go-redis ignores context deadlines unless
// ContextTimeoutEnabled is set); see that package.
func WithStoreTimeout(d time.Duration) LimiterOption {
	return limiterOnly(func(c *config) { c.storeTimeout = d })
}

// outage is a Limiter's view of its store: whether it answers, and who
// probes it while it does not.
type outage struct {
	// since is when the call that began the running outage was sent (on
	// the Limiter's time base); 0 while the store answers.
	since atomic.Int64
	// probing is set while a call asks the store during an outage.
	probing atomic.Bool
	lastErr atomic.Pointer[error]
}

// begin records a store failure of a call sent at sent, and reports
// whether it began an outage.
func (o *outage) begin(sent int64, err error) bool {
	o.lastErr.Store(&err)
	return o.since.CompareAndSwap(0, sent)
}

// end records that the store answered, and reports whether that ended an
// outage.
func (o *outage) end() bool { return o.since.Load() != 0 && o.since.Swap(0) != 0 }

// err is the store's last error.
func (o *outage) err() error {
	if e := o.lastErr.Load(); e != nil {
		return *e
	}
	return errors.New("the bucket store failed")
}

// degrade is the failure policy's decision for n permits of st's key,
// or for w's cost (st nil), when the store failed with err; outOfTime
// reports that the caller's wait ran out while the store was asked. A
// cost has no local share: FailLocal refuses it as FailClosed does.
func (l *Limiter) degrade(w *waiter, st *keyState, n int64, err error, outOfTime bool) (Decision, error) {
	policy, what := l.cfg.policy, whatOf(n, w.cost)
	var d Decision
	var derr error
	switch {
	case policy == FailOpen:
		d = Decision{Granted: true, Remaining: -1}
	case policy == FailLocal && w.cost != nil:
		policy, derr = FailClosed, fmt.Errorf("throttle: acquire %s: bucket store failed, and FailLocal refuses costs as FailClosed does (a budget of several dimensions has no local share): %w", what, err)
	case policy == FailLocal:
		// Never reserve: refused, the Limiter waits for the Delay as for
		// any bucket, then asks (or probes) again.
		var why string
		var lerr error
		d, why, lerr = l.localTake(st, n)
		switch {
		case lerr != nil: // n above one share
			policy, d, derr = FailClosed, Decision{}, fmt.Errorf("%w: %w", lerr, err)
		case why != "":
			policy, d = FailClosed, Decision{}
			derr = fmt.Errorf("throttle: acquire %s: bucket store failed, and FailLocal refuses: %s: %w", what, why, err)
		}
	default:
		derr = fmt.Errorf("throttle: acquire %s: bucket store failed, and FailClosed refuses every call until it answers: %w", what, err)
	}
	if outOfTime && derr != nil {
		derr = w.tb.unanswered(0, derr)
	}
	if o := l.cfg.observer; o != nil {
		o.Degraded(w.key, policy.String(), d.Granted, err)
	}
	return d, derr
}

// policyNote says, for the log at an outage's start, what the failure
// policy will do.
func (l *Limiter) policyNote() string {
	switch l.cfg.policy {
	case FailOpen:
		return "FailOpen: every call is granted until it answers"
	case FailClosed:
		return "FailClosed: every call is refused until it answers"
	}
	limit, interval, inst, why := l.localShareOf(0)
	if why != "" {
		return "FailLocal refuses: " + why
	}
	return fmt.Sprintf("FailLocal: this instance grants its share, %d per %v of each key's limit (%d live instances)", limit/inst, interval, inst)
}
