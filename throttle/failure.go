package throttle

import (
	"context"
	"errors"
	"fmt"
	"sync"
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
	// store fails: the instance's share of the shared limit, limit ÷ live
	// instances per interval, in memory (a [Local] bucket of that rate
	// and a burst of one share). The bucket must implement [Fallbacker]
	// (the Redis buckets of package bucket do; they count live instances
	// with heartbeats and remember the count while Redis is down). With a
	// bucket that does not, or before the first live count is known (an
	// instance that started while the store was down), FailLocal acts as
	// [FailClosed]. Waiting for a local permit stays within the caller's
	// wait, as any other.
	//
	// Bound: while the store fails, the fleet grants at most about the
	// shared limit per interval (each live instance its share; a local
	// bucket starts full, so up to two shares in the first interval),
	// on top of what the store granted in the interval it failed in.
	FailLocal FailurePolicy = iota
	// FailClosed refuses while the store fails: Acquire returns the
	// store's error, a [*BackendError]. If the caller's wait ran out while
	// the store was being asked, the error also matches [ErrTimeout] (and,
	// through the BackendError, context.DeadlineExceeded).
	FailClosed
	// FailOpen grants every call while the store fails. Use it only where
	// exceeding the provider's limit costs less than not calling it.
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
// fails. Default: [FailLocal]. An unknown policy keeps the default.
func WithFailurePolicy(p FailurePolicy) Option {
	return optionFunc(func(c *config) {
		if p >= FailLocal && p <= FailOpen {
			c.policy = p
		}
	})
}

// WithStoreTimeout bounds the bucket calls of Acquire with maxWait 0 (and
// no earlier ctx deadline): Take gets a context that ends d after the call.
// Other calls get the end of the caller's wait (maxWait or ctx's deadline,
// the earlier) as the deadline of each bucket call, so a hung store never
// keeps Acquire past it; [Forever] without a ctx deadline gets none, and
// relies on the store client's own timeouts (go-redis: ReadTimeout, 3 s
// by default). A bucket call cut by its deadline while the caller's
// context is alive counts as a store failure and goes through the
// [FailurePolicy].
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
func WithStoreTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) { c.storeTimeout = d })
}

// Fallbacker is implemented by buckets whose limit a fleet of instances
// shares, so that a Limiter under [FailLocal] can limit this instance on
// its own while the store is down. The Redis buckets of package bucket
// implement it.
type Fallbacker interface {
	// Fallback returns the bucket's limit per interval and the number of
	// live instances sharing it, as last seen while the store answered;
	// instances is 0 when never seen (an instance that started while the
	// store was down cannot know its share, and the Limiter then fails
	// closed). It must not block: it is called while the store is down.
	Fallback() (limit int64, interval time.Duration, instances int64)
}

// failover is a Limiter's state for its failure policy.
type failover struct {
	policy  FailurePolicy
	timeout time.Duration

	down    atomic.Bool // the last store call failed
	probing atomic.Bool // a call is asking the store during an outage
	lastErr atomic.Pointer[error]

	mu    sync.Mutex
	local *fallbackLocal // under mu
}

// fallbackLocal is the in-memory bucket FailLocal uses, with the share it
// was built for.
type fallbackLocal struct {
	limit     int64
	interval  time.Duration
	instances int64
	b         *Local
}

// share returns one instance's share of limit per interval among
// instances, as a rate (permits per period): limit/instances per interval,
// rounded down, or, when that is below 1, one permit per
// interval·instances/limit, rounded up. It never exceeds the exact share.
func share(limit int64, interval time.Duration, instances int64) (int64, time.Duration) {
	instances = max(instances, 1)
	if limit >= instances {
		return limit / instances, interval
	}
	// limit < instances: at most one permit per period of
	// interval·instances/limit. Guard against overflow.
	per := interval / time.Duration(limit)
	if per > time.Duration(1<<62)/time.Duration(instances) {
		return 1, time.Duration(1 << 62)
	}
	return 1, per*time.Duration(instances) + time.Duration(limit-1) // round up
}

// fallback returns the local bucket for the share the bucket reports now,
// building it when the share changed, or nil when the bucket cannot say.
func (l *Limiter) fallback() *Local {
	fb, ok := l.bucket.(Fallbacker)
	if !ok {
		return nil
	}
	limit, interval, inst := fb.Fallback()
	if limit < 1 || interval <= 0 || inst < 1 {
		return nil // no share known: fail closed
	}
	f := &l.fail
	f.mu.Lock()
	defer f.mu.Unlock()
	if c := f.local; c != nil && c.limit == limit && c.interval == interval && c.instances == inst {
		return c.b
	}
	sl, si := share(limit, interval, inst)
	b, err := NewLocal(sl, si, WithClock(l.cfg.clock))
	if err != nil {
		return nil // a share the Local cannot express (limit above 1/ns): fail closed
	}
	f.local = &fallbackLocal{limit: limit, interval: interval, instances: inst, b: b}
	return b
}

// storeFailure reports whether err, from a Take whose own deadline has
// expired or not, means the store failed (as opposed to an error about the
// call). ctx is the caller's.
func storeFailure(ctx context.Context, expired bool, err error) bool {
	if ctx.Err() != nil || errors.Is(err, ErrInvalid) || errors.Is(err, ErrExceedsLimit) || errors.Is(err, ErrTimeout) {
		return false
	}
	var be *BackendError
	if errors.As(err, &be) {
		return true
	}
	// A bucket of the user's that gives up when our deadline passes.
	return expired && errors.Is(err, context.DeadlineExceeded)
}

// decide asks the bucket for n permits, or, while its store fails, decides
// by the failure policy; degraded reports the latter. left is the caller's
// wait left, noWait that the caller allowed none at all (maxWait 0).
func (l *Limiter) decide(ctx context.Context, key string, n int64, left time.Duration, noWait bool) (d Decision, degraded bool, err error) {
	f := &l.fail
	if _, isLocal := l.bucket.(*Local); isLocal {
		d, err = l.take(ctx, key, n, left)
		return d, false, err
	}
	probe := false
	if f.down.Load() {
		if !f.probing.CompareAndSwap(false, true) {
			// Someone is asking the store: decide without it.
			d, err = l.degrade(ctx, key, n, *f.lastErr.Load(), false)
			return d, true, err
		}
		probe = true
		defer f.probing.Store(false)
	}

	tctx, cancel, d0, budgetBound := ctx, context.CancelFunc(nil), time.Duration(0), false
	if _, ok := l.bucket.(selfBounded); !ok {
		tctx, cancel, d0, budgetBound = l.storeContext(ctx, left, noWait)
	}
	d, err = l.take(tctx, key, n, left)
	expired := tctx != ctx && ctx.Err() == nil && deadlinePassed(tctx)
	if cancel != nil {
		cancel()
	}
	if err == nil {
		if (probe || f.down.Load()) && f.down.CompareAndSwap(true, false) {
			l.cfg.logger.Info("throttle: bucket store answers again; shared limit resumed", "policy", f.policy.String())
		}
		return d, false, nil
	}
	if !storeFailure(ctx, expired, err) {
		return d, false, err
	}
	if expired && budgetBound && d0 < f.timeout/4 && !probe {
		// The caller's wait cut the call short of a fair chance (a
		// quarter of the store timeout): no evidence that the store is
		// down, so no degraded decision either. The wait ran out. (A
		// probe has the evidence already: the store was down before.)
		return Decision{}, false, fmt.Errorf("%w: the bucket store did not answer in the %v left of the wait: %w", ErrTimeout, d0, err)
	}
	e := err
	f.lastErr.Store(&e)
	if f.down.CompareAndSwap(false, true) {
		l.cfg.logger.Warn("throttle: bucket store failed; deciding by the failure policy until it answers", "policy", f.policy.String(), "err", err)
	}
	d, err = l.degrade(ctx, key, n, err, budgetBound && expired)
	return d, true, err
}

// storeContext returns the context for one bucket call, its timeout d (0:
// none of its own), and whether the caller's wait (rather than the store
// timeout) set it. See boundStoreCall.
func (l *Limiter) storeContext(ctx context.Context, left time.Duration, noWait bool) (context.Context, context.CancelFunc, time.Duration, bool) {
	return boundStoreCall(ctx, left, noWait, l.fail.timeout)
}

// boundStoreCall bounds one call to a bucket's store. A call that waits
// gets the end of its wait (left, or ctx's deadline), less a margin of a
// quarter, at most storeMargin, so that the failure policy can still decide
// before the caller's ctx ends; at least minStoreCall. A call that does not
// wait (maxWait 0) gets timeout. [Forever] without a ctx deadline gets
// none. It returns the context, its cancel, its timeout d (0: none of its
// own) and whether the caller's wait set it.
func boundStoreCall(ctx context.Context, left time.Duration, noWait bool, timeout time.Duration) (context.Context, context.CancelFunc, time.Duration, bool) {
	var d time.Duration
	budgetBound := false
	switch {
	case left == Forever:
	case noWait:
		d = timeout
	default:
		d, budgetBound = left, true
	}
	if dl, ok := ctx.Deadline(); ok {
		if until := time.Until(dl); d <= 0 || until <= d {
			d, budgetBound = until, true
		}
	}
	if budgetBound {
		d = max(d-min(d/4, storeMargin), minStoreCall)
	}
	if d <= 0 {
		return ctx, func() {}, 0, false
	}
	tctx, cancel := context.WithTimeout(ctx, d)
	return tctx, cancel, d, budgetBound
}

// deadlinePassed reports whether ctx's deadline has come: its Err says so,
// or the clock does (a client that sets its socket deadlines from ctx, such
// as go-redis with ContextTimeoutEnabled, can fail at the deadline an
// instant before ctx's own timer fires).
func deadlinePassed(ctx context.Context) bool {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return true
	}
	dl, ok := ctx.Deadline()
	return ok && !time.Now().Before(dl)
}

// selfBounded is implemented by [Leased]: it answers from memory most of
// the time and bounds its own calls to the inner bucket's store, so a
// Limiter need not build a store context for every call to it.
type selfBounded interface {
	boundsStoreCalls()
}

const (
	// minStoreCall is the least time a Limiter gives a bucket call of a
	// caller whose wait has (all but) run out.
	minStoreCall = time.Millisecond
	// storeMargin is the most a Limiter keeps back from the end of a
	// caller's wait (at most a quarter of it), to decide by the failure
	// policy if the store has not answered by then: enough for a busy
	// machine to schedule the caller again before its own deadline.
	storeMargin = 10 * time.Millisecond
)

// degrade makes the decision of the failure policy for a store that failed
// with err. outOfTime reports that the caller's wait ran out while the
// store was asked.
func (l *Limiter) degrade(ctx context.Context, key string, n int64, err error, outOfTime bool) (Decision, error) {
	policy := l.fail.policy
	var b *Local
	if policy == FailLocal {
		if b = l.fallback(); b == nil {
			policy = FailClosed
		}
	}
	var d Decision
	var derr error
	switch policy {
	case FailOpen:
		d = Decision{Granted: true, Remaining: -1}
	case FailLocal:
		// Never reserve: a reservation would have to be refunded to the
		// local bucket, not to the Limiter's. Refused, the Limiter waits
		// for the Delay as for any bucket, then asks (or probes) again.
		var lerr error
		if d, lerr = b.Take(ctx, key, n, 0); lerr != nil {
			// n above one share: this instance cannot grant it alone.
			policy, d = FailClosed, Decision{}
			derr = fmt.Errorf("throttle: acquire %d permit(s): bucket store failed and %d permit(s) exceed this instance's local share: %w", n, n, err)
			break
		}
		d.Limit, d.Remaining = 0, -1 // the shared figures are unknown
	default:
		if outOfTime {
			derr = fmt.Errorf("%w: the bucket store did not answer within the wait: %w", ErrTimeout, err)
		} else {
			derr = fmt.Errorf("throttle: acquire %d permit(s): bucket store failed and the failure policy is closed: %w", n, err)
		}
	}
	if o := l.cfg.observer; o != nil {
		o.Degraded(key, policy.String(), d.Granted, err)
	}
	return d, derr
}
