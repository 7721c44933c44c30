package throttle

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/jonboulle/clockwork"
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
	// interval is the bucket's interval ([Fallbacker]), 0 if unknown.
	interval int64

	root    *keyState // key "", never forgotten
	states  keyStates
	outage  outage
	adapt   adapter
	leasing *leaseConfig // nil: no leasing
	bg      background
	gives   giveBacks
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
	periodic   bool
}

func findCapabilities(b Bucket) capabilities {
	var c capabilities
	c.refunder, _ = capability[Refunder](b)
	c.pauser, _ = capability[Pauser](b)
	c.fallbacker, _ = capability[Fallbacker](b)
	c.adaptive, _ = capability[AdaptiveStore](b)
	c.checker, _ = capability[Checker](b)
	if im, ok := capability[Immediate](b); ok {
		c.immediate = im.Immediate()
	}
	if p, ok := capability[Periodic](b); ok {
		c.periodic = p.Periodic()
	}
	return c
}

// New returns a Limiter that draws permits from b. Options: [WithClock],
// [WithLogger], [WithObserver], [WithFailurePolicy], [WithStoreTimeout],
// [WithLeasing].
//
// New does not fail: a nil b, an unknown [FailurePolicy] or a bad
// [Leasing] gives a Limiter whose every call returns an error matching
// [ErrInvalid] that names the mistake, so that it surfaces where the
// Limiter is used, with a message, instead of as a nil-pointer panic or a
// silent default.
func New(b Bucket, opts ...LimiterOption) *Limiter {
	cfg := newConfig(opts)
	l := &Limiter{bucket: b, cfg: cfg, tb: newTimeBase(cfg.clock)}
	l.bad = l.validate()
	l.caps = findCapabilities(b)
	base := int64(0)
	if fb := l.caps.fallbacker; fb != nil {
		limit, interval, _ := fb.Fallback()
		base, l.interval = limit, max(int64(interval), 0)
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
		return base
	}, l.initState)
	return l
}

// initState prepares a new key state.
func (l *Limiter) initState(st *keyState) { st.gate.tb = &l.tb }

// validate returns the configuration mistake every call of l reports.
func (l *Limiter) validate() error {
	if l.bucket == nil {
		return invalid("throttle", "Bucket", nil, "throttle.New needs a non-nil Bucket, such as throttle.NewLocal or one from package bucket")
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

// Bucket returns the bucket l draws from.
func (l *Limiter) Bucket() Bucket { return l.bucket }

// Clock returns the clock l sleeps on ([WithClock]), so that code waiting
// alongside l (an HTTP client honouring a provider's pause) measures time
// the same way.
func (l *Limiter) Clock() clockwork.Clock { return l.cfg.clock }

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
// keeps a caller at most the store timeout past the end of its wait: a
// give-back the store has not answered by then goes on in the background
// ([Limiter.Close] waits for it), unless 64 already do (a store that
// slow keeps each caller for its give-back, up to a second).
//
// Over a [Periodic] bucket (the token bucket, fixed window and counter of
// package bucket), a crowd does not take a period all at its start: each
// grant waits for its place in the period (the k-th of a limit of N, k/N
// of 95 % of the interval in), so that a provider counting a sliding window sees
// the limit's even pace rather than two periods' bursts in one window.
// That holds for callers whose wait is at least the interval (two
// intervals when ctx's deadline bounds it); those with shorter waits get
// their permits as the bucket grants them. A caller refused for the rest
// of a period asks again a hundredth of the interval after its end (at
// most 10 ms), so that a call delayed on its way by less than that does
// not meet the previous period's calls in the provider's window.
//
// A stop given to ctx with [ContextWithWaitStop] ends the wait as ctx's
// end would, without ending ctx.
//
// When ctx carries permits of the same budget that the caller acquired
// already ([Keyed.ContextWithPermit]), Acquire uses one of them and
// returns nil at once.
func (l *Limiter) Acquire(ctx context.Context, maxWait time.Duration) error {
	return l.acquire(ctx, "", 1, maxWait)
}

// AcquireN is [Limiter.Acquire] for n permits at once, for calls that cost
// more than one (a batch API, a weighted endpoint). The n permits are
// granted together or not at all. n must be at least 1; an n that the
// bucket can never grant at once returns an error matching
// [ErrExceedsLimit] without waiting.
func (l *Limiter) AcquireN(ctx context.Context, n int64, maxWait time.Duration) error {
	return l.acquire(ctx, "", n, maxWait)
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
	return k.l.acquire(ctx, k.key, n, maxWait)
}

// Key returns the key k draws from.
func (k Keyed) Key() string { return k.key }

// Limiter returns the Limiter k belongs to.
func (k Keyed) Limiter() *Limiter { return k.l }

func (l *Limiter) acquire(ctx context.Context, key string, n int64, maxWait time.Duration) error {
	return l.acquireFrom(ctx, key, n, maxWait, nil)
}

// acquireFrom is acquire; on a grant of the bucket's store or of the
// key's lease it sets *from (if from is not nil) to that source, and
// leaves it alone on a grant of the failure policy's or of the caller's
// held permits.
func (l *Limiter) acquireFrom(ctx context.Context, key string, n int64, maxWait time.Duration, from *source) error {
	o := l.cfg.observer
	if o == nil {
		_, err := l.wait(ctx, key, n, maxWait, from)
		return err
	}
	start := l.tb.now()
	held, err := l.wait(ctx, key, n, maxWait, from)
	if !held {
		// A held permit was reported when it was granted: one permit,
		// one report, however many calls it passes through.
		o.Acquired(key, n, time.Duration(l.tb.now()-start), err)
	}
	return err
}

// take asks the bucket once, reporting the call to the observer.
func (l *Limiter) take(ctx context.Context, key string, n int64, maxWait time.Duration) (Decision, error) {
	o := l.cfg.observer
	if o == nil {
		return l.bucket.Take(ctx, key, n, maxWait)
	}
	start := l.tb.now()
	d, err := l.bucket.Take(ctx, key, n, maxWait)
	o.BucketCall(key, d, time.Duration(l.tb.now()-start), err)
	return d, err
}

// wait is Acquire's work. After the checks, each round reads in order:
//
//  1. the held permits of ctx (ContextWithPermit), once;
//  2. the gate: after a refusal, callers of the key queue until the time
//     the bucket named, and are let in a few at a time;
//  3. the pace: while the key adapts, an evenly spaced slot first;
//  4. the decision: from the key's lease, the bucket, or the failure
//     policy (decide);
//  5. the outcome: granted now (after the grant's place in its period,
//     for a periodic bucket: spread.go); a reservation slept out
//     (and given back if the caller leaves); a refusal slept out, then
//     another round.
//
// held reports that the caller's held permits served the call. from is
// as for acquireFrom.
func (l *Limiter) wait(ctx context.Context, key string, n int64, maxWait time.Duration, from *source) (held bool, err error) {
	if l.bad != nil {
		return false, l.bad
	}
	if n < 1 {
		return false, invalid("throttle", "n", n, "must be at least 1")
	}
	if maxWait < 0 {
		return false, invalid("throttle", "maxWait", maxWait, "must be 0 (no wait), positive, or throttle.Forever")
	}
	if err := ctx.Err(); err != nil {
		return false, fmt.Errorf("throttle: acquire %d permit(s): %w", n, err)
	}
	if l.useHeld(ctx, key, n) {
		return true, nil // the caller holds them already (ContextWithPermit)
	}
	ctx, cancel := WaitContext(ctx)
	defer cancel()
	if ctx.Err() != nil {
		return false, waitErr(ctx) // stopped already
	}
	return false, l.waitForPermits(ctx, key, n, maxWait, from)
}

// waitForPermits is wait's work after the checks and the held permits:
// rounds 2 to 5 above. from is as for acquireFrom.
func (l *Limiter) waitForPermits(ctx context.Context, key string, n int64, maxWait time.Duration, from *source) error {
	// One clock reading serves the key's state, the wait's start and the
	// first round's pace: on some hosts a reading costs 100 ns.
	var now int64
	if key != "" || l.adapt.ok || maxWait > 0 && maxWait != Forever {
		now = l.tb.now()
	}
	st := l.stateAt(key, now)
	defer l.release(st)
	w := l.newWaiter(ctx, n, maxWait, now)
	for retry := false; ; retry = true {
		gated, err := w.queue(st, retry)
		if err != nil {
			return err
		}
		if err := w.pace(st); err != nil {
			if gated {
				st.gate.leave(false, 0, 0)
			}
			return err
		}
		var asked int64 // when the bucket was asked, for a grant's place
		spread := l.spreads() && w.canSpread(time.Duration(l.interval))
		if spread {
			asked = l.tb.now()
		}
		d, src, err := l.decide(ctx, st, n, w.left(), w.noWait())
		left := w.left()
		refused := err == nil && !d.Granted
		delay := d.Delay
		if refused && delay <= 0 {
			delay = retryFloor
		}
		// After the period's end, a gap for the callers that can wait
		// for it (spread.go).
		var gap time.Duration
		if refused && src == fromStore && l.spreads() {
			gap = l.periodGap(d)
		}
		// A refusal closes the key's gate for everyone only when it says
		// something about one permit from the shared bucket: not one of
		// the failure policy (the bucket may answer at the next call),
		// nor one for n > 1 (a single permit may come sooner).
		shared := src != fromPolicy && n == 1
		if gated {
			st.gate.leave(refused && shared, delay, gap)
		} else if refused && shared {
			st.gate.closeFor(delay, gap)
		}
		switch {
		case err != nil:
			return w.failed(err)
		case d.Granted && d.Delay <= 0:
			if err := w.keep(st, d, src, false, from); err != nil {
				return err // answered after the wait's end
			}
			if spread && src == fromStore {
				// A place beyond the wait left: the caller goes at once.
				if s := l.spreadDelay(n, d, time.Duration(l.tb.now()-asked)); s > 0 && s < left {
					again, err := l.spreadOut(ctx, st, n, s)
					if again {
						continue // a pause came first: ask anew
					}
					if err != nil {
						return err
					}
					return w.keep(st, d, src, true, from)
				}
			}
			return nil
		case d.Granted:
			if err := l.sleepReservation(ctx, st.key, n, d, left, w.tb); err != nil {
				return err
			}
			return w.keep(st, d, src, true, from)
		case delay > left:
			return w.tb.err(delay)
		case !shared:
			// No herd to protect the store from here: sleep out the
			// delay privately (and the gap, if the wait allows), then
			// ask (or probe) again.
			if gap <= left-delay { // delay <= left here; delay+gap may overflow
				delay += gap
			}
			if err := l.sleep(ctx, delay); err != nil {
				return err
			}
		}
	}
}

// waiter is one Acquire's wait: its bounds and how much of it is left.
type waiter struct {
	l   *Limiter
	ctx context.Context
	n   int64
	// budget is the whole wait allowed, measured on the limiter's time
	// base from start; measured is false for a wait that cannot run out
	// (none, or Forever), which reads no clock.
	budget   time.Duration
	start    int64
	measured bool
	tb       timeoutBound
	// first is the clock reading of the wait's start, for its first
	// round's pace (0 when none was read); later rounds read the clock.
	first int64
}

// newWaiter starts a wait at now (0: not read yet).
func (l *Limiter) newWaiter(ctx context.Context, n int64, maxWait time.Duration, now int64) waiter {
	// ctxBound records that ctx's deadline, not maxWait, set the budget.
	budget, ctxBound := maxWait, false
	if dl, ok := ctx.Deadline(); ok {
		if left := time.Until(dl); left < budget {
			budget, ctxBound = max(left, 0), true
		}
	}
	w := waiter{l: l, ctx: ctx, n: n, budget: budget, tb: timeoutBound{n: n, maxWait: maxWait, ctxBound: ctxBound}, first: now}
	if w.measured = budget > 0 && budget != Forever; w.measured {
		if now == 0 {
			now = l.tb.now()
		}
		w.start = now
	}
	return w
}

// keep returns nil when the caller may keep the permits of d (from src),
// granted now: its wait has not ended (its deadline passed, ctx ended or
// its wait stopped) while the bucket was asked. Else it gives them back,
// as for a reservation the caller leaves, and returns why the wait ended:
// a grant's answer may come after the wait's end (a store call is bounded
// a little past it, minStoreCall, and a store may answer late), and a
// caller must never be granted after it. A caller that allowed no wait
// (maxWait 0) has no deadline here (its store call is bounded by the
// store timeout): only its ctx is looked at. sleptOut reports that the
// grant's time (a reservation's slot, a place in the period) was slept
// out, and came within what was left of the wait when the answer came:
// only ctx's end counts then, not a timer that woke the caller late. On a
// grant kept, it sets *from (if from is not nil) to src unless the
// failure policy granted.
func (w *waiter) keep(st *keyState, d Decision, src source, sleptOut bool, from *source) error {
	err := w.ended(sleptOut)
	if err == nil {
		if from != nil && src != fromPolicy {
			*from = src
		}
		return nil
	}
	l := w.l
	switch src {
	case fromStore:
		l.cancelReservation(w.ctx, st.key, w.n, d)
	case fromLease:
		l.giveBack(w.ctx, st.key, w.n)
	}
	// (A permit of the failure policy was granted in this process alone:
	// it stays counted in the local share, which only slows this process.)
	return err
}

// ended returns why w's wait has ended, or nil while it runs; with
// ctxOnly, only ctx's end counts, not the time measured on the Limiter's
// clock.
func (w *waiter) ended(ctxOnly bool) error {
	err := w.ctx.Err()
	switch {
	case err != nil && !errors.Is(err, context.DeadlineExceeded):
		return waitErr(w.ctx) // cancelled or stopped
	case err == nil && (ctxOnly || !(w.measured && w.l.tb.now()-w.start > int64(w.budget))):
		return nil
	case err != nil || w.tb.ctxBound:
		return fmt.Errorf("%w: %d permit(s) granted only after the context's deadline, given back (%w)", ErrTimeout, w.n, context.DeadlineExceeded)
	}
	return fmt.Errorf("%w: %d permit(s) granted only after maxWait %v ran out, given back", ErrTimeout, w.n, w.tb.maxWait)
}

// left is what is left of the wait now.
func (w *waiter) left() time.Duration {
	if !w.measured {
		return w.budget
	}
	return max(w.budget-time.Duration(w.l.tb.now()-w.start), 0)
}

// ranOut is the ErrTimeout of a wait that ran out before what (a stage of
// it) could be asked.
func (w *waiter) ranOut(what string) error {
	if w.tb.ctxBound {
		return fmt.Errorf("%w: the context's deadline came before %s was asked for %d permit(s) (%w)", ErrTimeout, what, w.n, context.DeadlineExceeded)
	}
	return fmt.Errorf("%w: maxWait %v ran out before %s was asked for %d permit(s)", ErrTimeout, w.tb.maxWait, what, w.n)
}

// noWait reports that the caller allowed no wait at all (maxWait 0).
func (w *waiter) noWait() bool { return w.budget == 0 }

// canSpread reports whether the caller's wait is long enough to wait for
// its place in a period of interval (spread.go): a whole interval, or two
// when its context's deadline bounds it, so that the call made with that
// context still has time. A caller with a shorter wait is not spread: had
// it to go at once whenever its place lay beyond its wait, a period's
// spread grants would meet the next period's burst.
func (w *waiter) canSpread(interval time.Duration) bool {
	if w.tb.ctxBound {
		return w.budget >= 2*interval
	}
	return w.budget >= interval
}

// queue is the gate's stage: it returns at once while the key's gate is
// open; after a refusal, it queues the caller (first in line on a retry)
// until the gate lets it in. gated reports that the caller holds an
// admission, to end with gate.leave.
func (w *waiter) queue(st *keyState, retry bool) (gated bool, err error) {
	if st.gate.open() {
		return false, nil
	}
	if err := st.gate.enter(w.ctx, retry, w.left(), w.tb); err != nil {
		return false, err
	}
	return true, nil
}

// pace is the adaptive rate's stage: while the key adapts, the caller
// waits for an evenly spaced slot (adapt.go); free otherwise.
func (w *waiter) pace(st *keyState) error {
	now := w.first
	w.first = 0
	return w.l.pace(w.ctx, st, w, now)
}

// failed maps a decision's error to Acquire's: a deadline that passed
// while the bucket was asked is a wait that ran out (ErrTimeout).
func (w *waiter) failed(err error) error {
	ctxErr := w.ctx.Err()
	if ctxErr == nil || errors.Is(err, ErrTimeout) || errors.Is(err, ErrInvalid) || errors.Is(err, ErrExceedsLimit) {
		return err
	}
	if errors.Is(ctxErr, context.DeadlineExceeded) {
		// The deadline ran out while the bucket was asked (its error may
		// wrap the deadline or not): a wait that ran out, as the doc
		// says, ErrTimeout.
		return expiredWhileAsking(w.n, "the bucket", err)
	}
	if cause := context.Cause(w.ctx); cause != ctxErr || !errors.Is(err, ctxErr) {
		// Name what ended the wait (a stop's cause, say), not only the
		// bucket's view of it.
		return fmt.Errorf("%w (bucket: %v)", waitErr(w.ctx), err)
	}
	return err
}

// sleepReservation sleeps until a reservation's permits are the caller's,
// giving them back if they come too late (the bucket call itself ate into
// the wait) or the caller leaves first.
func (l *Limiter) sleepReservation(ctx context.Context, key string, n int64, d Decision, left time.Duration, tb timeoutBound) error {
	if d.Delay > left {
		l.cancelReservation(ctx, key, n, d)
		return tb.err(d.Delay)
	}
	if err := l.sleep(ctx, d.Delay); err != nil {
		l.cancelReservation(ctx, key, n, d)
		return err
	}
	return nil
}

// cancelReservation gives back an abandoned reservation d: exactly, by its
// Cancel, when the bucket said how; else through the bucket's Refunder
// (handBack: the caller waits for it at most the store timeout).
func (l *Limiter) cancelReservation(ctx context.Context, key string, n int64, d Decision) {
	if d.Cancel == nil && l.caps.refunder == nil {
		return
	}
	l.handBack(ctx, func(rctx context.Context) {
		var err error
		if d.Cancel != nil {
			err = d.Cancel(rctx)
		} else {
			err = l.caps.refunder.Refund(rctx, key, n)
		}
		if err != nil {
			l.cfg.logger.Warn("throttle: giving back an abandoned reservation failed", "key", key, "n", n, "err", err)
		}
	})
}

// sleep waits d on the limiter's clock, or until ctx ends.
func (l *Limiter) sleep(ctx context.Context, d time.Duration) error {
	t := l.cfg.clock.NewTimer(d)
	select {
	case <-t.Chan():
		return nil
	case <-ctx.Done():
		t.Stop()
		return waitErr(ctx)
	}
}

// timeoutBound is what an ErrTimeout of one Acquire says: how many
// permits, the maxWait, and whether ctx's deadline was the bound.
type timeoutBound struct {
	n        int64
	maxWait  time.Duration
	ctxBound bool
}

// err is the ErrTimeout for a permit that comes only after next.
func (b timeoutBound) err(next time.Duration) error {
	return timeout(b.n, b.maxWait, next, b.ctxBound)
}

// expiredWhileAsking is the ErrTimeout of a call whose context's deadline
// passed while what (the bucket, the adaptive pace) was being asked; err
// is what that call returned.
func expiredWhileAsking(n int64, what string, err error) error {
	return fmt.Errorf("%w: the context's deadline passed while %s was asked for %d permit(s) (%w; %s: %v)", ErrTimeout, what, n, context.DeadlineExceeded, what, err)
}

func timeout(n int64, maxWait, next time.Duration, ctxBound bool) error {
	if ctxBound {
		return fmt.Errorf("%w: %d permit(s) not free for %v, beyond the context's deadline (%w)", ErrTimeout, n, next, context.DeadlineExceeded)
	}
	if maxWait == 0 {
		return fmt.Errorf("%w: %d permit(s) not free now (next in %v) and maxWait is 0", ErrTimeout, n, next)
	}
	return fmt.Errorf("%w: %d permit(s) not free for %v, beyond maxWait %v", ErrTimeout, n, next, maxWait)
}
