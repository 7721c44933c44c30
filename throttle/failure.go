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
	// store fails, to its share of the shared limit: limit ÷ live
	// instances per interval, paced evenly (one permit every
	// interval·instances/limit), per key. The bucket must implement
	// [Fallbacker] (the Redis buckets of package bucket do; they count
	// live instances with heartbeats). With a bucket that does not, before
	// the first live count is known (an instance that started while the
	// store was down), or when the share is below one permit per interval
	// (more instances than the limit), FailLocal acts as [FailClosed].
	// Waiting for a local permit stays within the caller's wait, as any
	// other.
	//
	// The degraded mode cannot double the fleet at the outage's edges:
	// in the shared period running when the store failed, an instance
	// grants at most its share of what that period had left (its last
	// shared decision's Remaining, until its Reset); if it knows nothing
	// of that period, it grants nothing until one interval after the
	// failure. A key keeps its own limit (one set live included, as its
	// last shared decision reported it). When the store answers again,
	// the permits granted locally in the last two intervals are taken from
	// the shared bucket before the key's shared grants resume, and until
	// the end of that first shared period the instance takes at most its
	// share less those permits (the other instances may still be granting
	// theirs locally: a failover's clients find the new master one by
	// one). If the store's first answer is a refusal (that period spent,
	// or held because the store lost it: bucket.TokenBucket), the cap
	// goes on through the next period, with the share as its room. The
	// cap costs throughput when demand is uneven: an instance alone in
	// asking gets its share, not the limit, in that period (or two).
	//
	// Bound: while the store fails, the fleet grants at most the shared
	// limit in any span of one interval, when every instance sees the
	// outage (a store down, paused or unreachable for all). An instance
	// cut off alone (a partition) grants its share on top of what the
	// others share: up to limit·(1 + 1/instances).
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
// fails. Default: [FailLocal]. A policy other than FailLocal, FailClosed
// and FailOpen makes every call of the Limiter fail with an error matching
// [ErrInvalid].
func WithFailurePolicy(p FailurePolicy) LimiterOption {
	return limiterOnly(func(c *config) { c.policy = p })
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
func WithStoreTimeout(d time.Duration) StoreOption {
	return storeOption(func(c *config) { c.storeTimeout = d })
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
	// downSince is when the call that began the outage was sent (ns on
	// the Limiter's clock since epoch): no shared grant is assumed after it.
	downSince atomic.Int64

	// seen remembers each key's last shared decision, for FailLocal.
	seen  seenDecisions
	epoch time.Time

	mu    sync.Mutex
	local map[string]*degradedKey // under mu: FailLocal's pacers, by key
	// pending counts the keys in local, so that the hot path skips the
	// lookup when no outage left local grants to account for.
	pending atomic.Int64
	// recovering caps each key's shared grants in its first shared period
	// after it granted locally (see recoveryCap); recoveringN counts its
	// keys, for the hot path.
	recovering  map[string]*recoveryCap // under mu
	recoveryEnd int64                   // under mu: the latest cap's end
	recoveringN atomic.Int64
}

// init sets the failure policy's state for a Limiter built with cfg.
func (f *failover) init(cfg config) {
	f.policy, f.timeout, f.epoch = cfg.policy, cfg.storeTimeout, cfg.clock.Now()
	f.seen.init()
}

// fallbackLimit is the bucket's own limit as [Fallbacker] reports it; 0
// when the bucket is not a Fallbacker.
func (l *Limiter) fallbackLimit() int64 {
	if fb, ok := l.bucket.(Fallbacker); ok {
		limit, _, _ := fb.Fallback()
		return limit
	}
	return 0
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
	// A selfBounded bucket reads maxWait 0 as a caller that may not wait
	// (its store timeout); a wait that has run out gets the last short
	// call here, as any bucket does.
	if _, ok := l.bucket.(selfBounded); !ok || left == 0 && !noWait {
		tctx, cancel, d0, budgetBound = l.storeContext(ctx, left, noWait)
	}
	if f.policy == FailLocal && !probe && f.recoveringN.Load() > 0 {
		// (A probe is never capped: it must find out whether the store
		// answers again.)
		refusal, refused, reserved := l.reserveRecovery(key, n)
		if refused {
			if cancel != nil {
				cancel()
			}
			return refusal, false, nil
		}
		if reserved != 0 {
			defer func() {
				if err != nil || degraded || !d.Granted {
					l.unreserveRecovery(key, n, reserved)
				}
			}()
		}
	}
	sent, callStart := f.now(l), time.Now()
	debt := int64(0)
	if f.policy == FailLocal && f.pending.Load() > 0 {
		// The call carries what this instance granted locally for key
		// (the probe, or the key's first call after it): the first thing
		// the store does for the key when it answers again is to account
		// for those permits, before any shared grant of the key here.
		debt = l.claimDebt(key)
	}
	if debt > 0 {
		d, err = l.take(tctx, key, n+debt, left)
		if errors.Is(err, ErrExceedsLimit) {
			l.releaseDebt(key)
			debt = 0 // more than the bucket grants at once: settle it apart
			d, err = l.take(tctx, key, n, left)
		}
	} else {
		d, err = l.take(tctx, key, n, left)
	}
	expired := tctx != ctx && ctx.Err() == nil && deadlinePassed(tctx)
	if cancel != nil {
		cancel()
	}
	if err == nil {
		if (probe || f.down.Load()) && f.down.CompareAndSwap(true, false) {
			l.cfg.logger.Info("throttle: bucket store answers again; shared limit resumed", "policy", f.policy.String())
		}
		if f.policy == FailLocal {
			f.seen.note(key, d, f.now(l), l.fallbackLimit)
			owed, share, iv, hadLocal := int64(0), int64(0), int64(0), false
			if f.pending.Load() > 0 {
				owed, share, iv, hadLocal = l.localOwed(key)
			}
			switch {
			case debt > 0 && d.Granted:
				l.settled(key) // the debt came with the call's permits
			case debt > 0:
				l.releaseDebt(key)
			}
			if f.pending.Load() > 0 {
				// What is still owed: all of it, or what was granted
				// locally after the claim.
				l.settle(ctx, key, left, noWait, time.Since(callStart))
			}
			if hadLocal {
				took := int64(0)
				if d.Granted {
					took = n
				}
				l.startRecovery(key, d, share, owed, took, iv)
			}
		}
		return d, false, nil
	}
	if debt > 0 {
		l.releaseDebt(key)
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
	// One start per outage, under mu, so that FailLocal's pacers (set
	// under mu too) see one downSince for it and start afresh in the next.
	f.mu.Lock()
	began := !f.down.Load()
	if began {
		f.downSince.Store(sent)
		f.down.Store(true)
	}
	f.mu.Unlock()
	if began {
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
	var d Decision
	var derr error
	if policy == FailLocal {
		// Never reserve: refused, the Limiter waits for the Delay as for
		// any bucket, then asks (or probes) again.
		var ok bool
		var lerr error
		d, ok, lerr = l.localTake(key, n)
		switch {
		case !ok:
			policy = FailClosed // no share known
		case lerr != nil:
			// n above one share: this instance cannot grant it alone.
			policy, d = FailClosed, Decision{}
			derr = fmt.Errorf("%w: %w", lerr, err)
		}
	}
	switch policy {
	case FailOpen:
		d = Decision{Granted: true, Remaining: -1}
	case FailLocal:
	default:
		if derr != nil {
			break
		}
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
