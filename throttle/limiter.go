package throttle

import (
	"context"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/headway-go/headway/internal/nilcheck"
)

// Forever, passed as maxWait, waits for a permit until the context ends.
// It is the right wait for asynchronous pipelines (a Kafka consumer) that
// must process every record and have no caller waiting on the other end.
const Forever time.Duration = math.MaxInt64

// retryFloor is how long a Limiter waits before asking again when a bucket
// refused without saying for how long.
const retryFloor = time.Millisecond

// Limiter hands out permits from a [Bucket] and does the waiting.
//
// Most callers want [Limiter.Acquire]: it returns nil when the caller may
// go ahead, [ErrTimeout] when no permit comes within maxWait, or the
// context's error when the context ends first. A Limiter never polls its
// bucket: when the bucket has nothing to give it names the time something
// may be given (a refill, a window's end, a reservation), and the Limiter
// sleeps until then on its clock. If that time is beyond the caller's wait,
// Acquire fails at once instead of sleeping in vain.
//
// Per-key limits (a tenant, an endpoint) use [Limiter.Key]: one Limiter
// and one bucket serve every key, each key with its own budget. The
// Limiter keeps a little state per key (where its callers queue, its
// adaptive rate, what its failure policy and lease need); a key unused for
// a second (or the bucket's interval, if longer, up to ten minutes) that
// holds nothing in force is forgotten, so memory follows the keys in use.
//
// A Limiter is safe for concurrent use. Its zero value is not usable: build
// one with [New].
type Limiter struct {
	bucket Bucket
	cfg    config
	bad    error // a configuration mistake, returned by every call
	caps   capabilities
	tb     timeBase
	// interval is the bucket's interval (its Fallback), 0 if unknown.
	interval int64

	root    *keyState // key "", never forgotten
	states  keyStates
	outage  outage
	adapt   adapter
	leasing *leaseConfig // nil: no leasing
	bg      background
	gives   giveBacks
	// lateSeen and lateWarned are when a late grant was last seen, and
	// last warned of (lateGrant).
	lateSeen, lateWarned atomic.Int64
}

// capabilities are what the bucket offers beyond Take, each found on the
// first bucket of its Unwrap chain that has it (see [Bucket]).
type capabilities struct {
	refunder   Refunder
	pauser     Pauser
	fallbacker Fallbacker
	adaptive   AdaptiveStore
	checker    Checker
	immediate  bool
}

func findCapabilities(b Bucket) capabilities {
	var c capabilities
	c.refunder, _ = BucketAs[Refunder](b)
	c.pauser, _ = BucketAs[Pauser](b)
	c.fallbacker, _ = BucketAs[Fallbacker](b)
	c.adaptive, _ = BucketAs[AdaptiveStore](b)
	c.checker, _ = BucketAs[Checker](b)
	// Asked of b itself only: behind Unwrap, the wrapper's own Take runs,
	// and what the wrapped bucket says of its Take says nothing of it.
	if im, ok := b.(interface{ Immediate() bool }); ok {
		c.immediate = im.Immediate()
	}
	return c
}

// New returns a Limiter that draws permits from b. Options: [WithClock],
// [WithLogger], [WithObserver], [WithFailurePolicy], [WithStoreTimeout],
// [WithLeasing].
//
// New does not fail: a nil b (or a nil pointer, such as a
// *bucket.TokenBucket whose constructor failed), an unknown
// [FailurePolicy] or a bad [Leasing] gives a Limiter whose every call
// returns an error matching [ErrInvalid] that names the mistake, so that
// it surfaces where the Limiter is used, with a message, instead of as a
// nil-pointer panic or a silent default.
func New(b Bucket, opts ...LimiterOption) *Limiter {
	cfg := newConfig(opts)
	l := &Limiter{bucket: b, cfg: cfg, tb: newTimeBase(cfg.clock)}
	l.bad = l.validate()
	l.caps = findCapabilities(b)
	if fb := l.caps.fallbacker; fb != nil {
		limit, interval, _ := fb.Fallback()
		l.interval = max(int64(interval), 0)
		l.adapt = adapter{ok: limit >= 1 && interval > 0, base: limit, interval: interval, store: l.caps.adaptive}
	}
	if cfg.leasing != nil && l.bad == nil {
		l.leasing = newLeaseConfig(*cfg.leasing)
	}
	l.bg.ctx, l.bg.cancel = context.WithCancel(context.Background())
	l.gives.idle.L = &l.gives.mu
	l.root = &keyState{}
	l.initState(l.root)
	idle := min(max(time.Duration(l.interval), time.Second), 10*time.Minute)
	l.states.setup(idle, &l.tb, func() int64 {
		if fb := l.caps.fallbacker; fb != nil {
			limit, _, _ := fb.Fallback()
			return limit
		}
		return 0
	}, l.initState)
	return l
}

// initState prepares a new key state.
func (l *Limiter) initState(st *keyState) { st.gate.tb, st.gate.st = &l.tb, st }

// validate returns the configuration mistake every call of l reports.
func (l *Limiter) validate() error {
	if nilcheck.IsNil(l.bucket) {
		var shown any // "<nil>", or the nil pointer's type
		if l.bucket != nil {
			shown = fmt.Sprintf("(%T)(nil)", l.bucket)
		}
		return invalid("throttle", "Bucket", shown, "throttle.New needs a non-nil Bucket, such as throttle.NewLocal or one from package bucket (was its constructor's error checked?)")
	}
	if p := l.cfg.policy; p < FailLocal || p > FailOpen {
		return invalid("throttle", "WithFailurePolicy", p, "must be throttle.FailLocal, FailClosed or FailOpen")
	}
	if c := l.cfg.leasing; c != nil {
		return c.validate()
	}
	return nil
}

// state returns key's state with a reference; release gives it back.
func (l *Limiter) state(key string) *keyState { return l.stateAt(key, l.tb.now()) }

// stateAt is state with the time on the base read already (now).
func (l *Limiter) stateAt(key string, now int64) *keyState {
	if key == "" {
		if l.states.kept.Load() > 0 {
			if now == 0 {
				now = l.tb.now()
			}
			l.states.sweepTurn(nil, now)
		}
		return l.root
	}
	return l.states.acquire(key, now)
}

func (l *Limiter) release(st *keyState) {
	if st != l.root {
		l.states.release(st)
	}
}

// Acquire takes one permit, waiting for it at most maxWait:
//
//   - maxWait == 0: take a permit only if one is free now.
//   - maxWait > 0: wait at most that long.
//   - maxWait == [Forever]: wait until ctx ends.
//
// The earlier of maxWait and ctx's deadline bounds the wait. It returns nil
// when the permit is the caller's; an error matching [ErrTimeout] when none
// comes in time (also matching context.DeadlineExceeded if ctx's deadline
// was the bound); ctx's error, wrapped, when ctx ends first; an error
// matching [ErrInvalid] for a negative maxWait; or the bucket's error.
// When the bucket's store fails (a [*BackendError], or no answer within
// [WithStoreTimeout]), the Limiter's [FailurePolicy] decides instead.
//
// Acquire returns by the end of the wait even when the store hangs: each
// store call on its way gets a context with that deadline, and work that
// may take longer (updating the adaptive rate) runs in the background. A
// call with maxWait 0 may take up to the store timeout
// ([WithStoreTimeout], 100 ms). The end of the wait is fixed when it
// starts (the earlier of maxWait and ctx's deadline, or a stop given with
// [ContextWithWaitStop] when it comes), and Acquire never grants past it:
// a paced slot or a reservation that begins after it is ErrTimeout at
// once, and a grant whose answer comes after it (a slow store) is given
// back and returns ErrTimeout, or the stop's error. Giving permits back
// keeps a caller no later than the end of its wait, and at most the store
// timeout (a caller with maxWait 0, or Forever, or one that leaves
// early): a give-back the store has not answered by then goes on in the
// background ([Limiter.Close] waits for it), unless 64 already do (a
// store that slow keeps each caller for its give-back, up to a second).
//
// When the bucket gives permits a time (package bucket's TokenBucket
// places each permit so that the limit holds when the calls are sent),
// Acquire returns at that time, within the permit's margin
// (Decision.Margin); a permit it could not hand over by then (a stalled
// process) is not used: Acquire asks for another within what is left of
// the wait.
//
// When ctx carries permits of the same budget that the caller acquired
// already ([Keyed.ContextWithPermit]), Acquire uses one of them and
// returns nil at once, unless they are past their margin or a pause
// reported for the key is in force (they are then given up).
func (l *Limiter) Acquire(ctx context.Context, maxWait time.Duration) error {
	return l.acquire(ctx, "", 1, maxWait, nil)
}

// AcquireN is [Limiter.Acquire] for n permits at once, for calls that cost
// more than one (a batch API, a weighted endpoint). The n permits are
// granted together or not at all. n must be at least 1; an n that the
// bucket can never grant at once returns an error matching
// [ErrExceedsLimit] without waiting.
func (l *Limiter) AcquireN(ctx context.Context, n int64, maxWait time.Duration) error {
	return l.acquire(ctx, "", n, maxWait, nil)
}

// Key returns a view of l that draws from the budget of key (a tenant, an
// endpoint, "tenant/endpoint") in the same bucket. It costs nothing: call
// it per request rather than caching one per key. Key("") is l itself.
func (l *Limiter) Key(key string) Keyed { return Keyed{l: l, key: key} }

// Keyed is a [Limiter] bound to one key of its bucket. Build it with
// [Limiter.Key]. The zero Keyed is not usable.
type Keyed struct {
	l   *Limiter
	key string
}

// Acquire is [Limiter.Acquire] for k's key.
func (k Keyed) Acquire(ctx context.Context, maxWait time.Duration) error {
	return k.AcquireN(ctx, 1, maxWait)
}

// AcquireN is [Limiter.AcquireN] for k's key.
func (k Keyed) AcquireN(ctx context.Context, n int64, maxWait time.Duration) error {
	if k.l == nil {
		return fmt.Errorf("throttle: zero Keyed: %w: build it with Limiter.Key", ErrInvalid)
	}
	return k.l.acquire(ctx, k.key, n, maxWait, nil)
}

// Key returns the key k draws from.
func (k Keyed) Key() string { return k.key }
