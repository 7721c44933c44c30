package throttle

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/headway-go/headway/internal/pacenote"
	"github.com/headway-go/headway/internal/waitstop"
)

// The wait.
//
// Acquire, AcquireN and AcquireCost wait in one loop (waitLoop), under one
// deadline fixed when the wait starts (newWaiter: the earlier of maxWait
// and ctx's deadline; a wait stop ends ctx). Each round reads in order,
// one file per stage:
//
//  1. held permits (permit.go): the caller's own, once, before the loop;
//  2. the gate (gate.go): after a refusal, callers of the key queue and
//     are let in a few at a time (not after a refusal beyond the caller's
//     wait from a bucket that places its permits: askPlaced, place.go);
//  3. the pace (adaptive_state.go): while the key adapts, an evenly spaced slot;
//  4. the decision (decide.go): from the key's lease, the bucket (for a
//     Cost, its CostBucket: cost.go), or the failure policy;
//  5. the outcome (here): a grant's time slept out (a bucket that places
//     its permits names it, Decision.Delay), and the permits handed over
//     if still within their margin, else given back and asked anew; a
//     refusal slept out, then another round.
//
// Every bound a stage takes from the wait is derived here, in "The wait's
// bounds" below: no stage reads maxWait, Forever or ctx's deadline itself.
// A cost passes by the gate, the pace and the lease: those count permits
// of one dimension.

// demand is what one wait asks for: n permits of key, or a Cost of a
// CostBucket.
type demand struct {
	key  string
	n    int64      // permits; 0 for a cost
	cost Cost       // nil: n permits
	cb   CostBucket // takes cost
}

// acquire is Acquire and AcquireN of key; on a grant of the bucket's
// store or of the key's lease it sets *from (if from is not nil) to that
// source, and leaves it alone on a grant of the failure policy's or of
// the caller's held permits.
func (l *Limiter) acquire(ctx context.Context, key string, n int64, maxWait time.Duration, from *source) error {
	o := l.cfg.observer
	var start int64
	if o != nil {
		start = l.tb.now()
	}
	_, src, err := l.wait(ctx, demand{key: key, n: n}, maxWait)
	if err == nil && from != nil && (src == fromStore || src == fromLease) {
		*from = src
	}
	if o != nil && src != fromHeld {
		// A held permit was reported when it was granted: one permit,
		// one report, however many calls it passes through.
		o.Acquired(key, n, time.Duration(l.tb.now()-start), err)
	}
	return err
}

// wait is the work of Acquire, AcquireN and AcquireCost: the checks, the
// held permits, then the loop. It returns the grant's decision and where
// it came from.
func (l *Limiter) wait(ctx context.Context, dm demand, maxWait time.Duration) (Decision, source, error) {
	if l.bad != nil {
		return Decision{}, fromStore, l.bad
	}
	if dm.n < 1 && dm.cost == nil {
		return Decision{}, fromStore, invalid("throttle", "n", dm.n, "must be at least 1")
	}
	if maxWait < 0 {
		return Decision{}, fromStore, invalid("throttle", "maxWait", maxWait, "must be 0 (no wait), positive, or throttle.Forever")
	}
	if err := ctx.Err(); err != nil {
		return Decision{}, fromStore, fmt.Errorf("throttle: acquire %s: %w", dm.what(), err)
	}
	if dm.cost == nil && l.useHeld(ctx, dm.key, dm.n) {
		return Decision{Granted: true}, fromHeld, nil // the caller holds them already (ContextWithPermit)
	}
	ctx, cancel := waitstop.Context(ctx)
	defer cancel()
	if ctx.Err() != nil {
		return Decision{}, fromStore, waitErr(ctx) // stopped already
	}
	// One clock reading serves the key's state, the wait's start and the
	// first round's pace: on some hosts a reading costs 100 ns.
	var now int64
	permits := dm.cost == nil
	if permits && (dm.key != "" || l.adapt.ok) || maxWait > 0 && maxWait != Forever {
		now = l.tb.now()
	}
	var st *keyState
	if permits {
		st = l.stateAt(dm.key, now)
		defer l.release(st)
	}
	w := l.newWaiter(ctx, dm, maxWait, now)
	w.st = st
	c, err := l.waitLoop(&w, st)
	return c.Decision, c.src, err
}

// waitLoop is the wait's rounds (stages 2 to 5 above) for w, of st's key
// (nil for a cost). It returns the decision that granted.
func (l *Limiter) waitLoop(w *waiter, st *keyState) (decision, error) {
	for retry := false; ; retry = true {
		var gated bool
		if st != nil { // permits: a cost passes by the gate and the pace
			var err error
			if gated, err = w.queue(st, retry); err != nil {
				return decision{}, err
			}
			err = w.pace(st)
			if err == nil && w.pacedSleep {
				// A pause reported while the caller slept for its slot
				// holds it at the gate (gate.hold), as anyone else.
				w.pacedSleep = false
				if st.pausedUntil.Load() > l.tb.now() {
					if gated {
						st.gate.leave(true, 0)
					}
					continue
				}
			}
			if err != nil {
				if gated {
					st.gate.leave(true, 0)
				}
				return decision{}, err
			}
		}
		c := w.decide(st)
		w.leaveGate(st, &c, gated)
		switch {
		case c.err != nil:
			return c, w.failed(c.err)
		case c.Granted:
			if c.Delay > 0 {
				if err := w.sleepReservation(&c, w.left()); err != nil {
					return c, err
				}
			}
			if err := w.ended(&c); err != nil {
				w.giveBack(&c)
				return c, err // answered, or its time came, after the wait's end
			}
			if w.usable(st, &c) {
				if c.Margin > 0 && c.answered != 0 {
					pacenote.SetUseBy(w.ctx, l.tb.wall(addSat(addSat(c.answered, c.Delay), c.Margin)))
				}
				return c, nil
			}
		case c.retryIn > w.left():
			return c, w.tb.err(c.retryIn)
		case !c.shared:
			// No herd to protect the store from here: sleep out the
			// delay privately, then ask (or probe) again.
			if err := l.sleep(w.ctx, c.retryIn); err != nil {
				return c, err
			}
		}
	}
}

// lateGrant notes a grant whose time passed more than its margin ago
// (late, on the Limiter's clock) before its caller could have it. One
// alone is a cold start's first connection or a stalled process; a second
// within a minute is a store whose round trip is longer than the margin,
// or a process that stalls often, and each such grant is wasted: warned
// of then, at most once a minute.
func (l *Limiter) lateGrant(late int64) {
	now := l.tb.now()
	if prev := l.lateSeen.Swap(now); prev == 0 || now-prev >= int64(time.Minute) {
		return
	}
	last := l.lateWarned.Load()
	if last != 0 && now-last < int64(time.Minute) || !l.lateWarned.CompareAndSwap(last, now) {
		return
	}
	l.cfg.logger.Warn("throttle: a permit came later than its margin allows and was not used; if this repeats, the bucket's margin (bucket.WithArrivalMargin) is shorter than the store's round trip or this process stalls", "late", time.Duration(late))
}

// usable reports whether the caller may use the grant c now, at its time:
// within its margin (Decision.Margin), and, when it waited for its time,
// with no pause of st's key reported meanwhile (Report with a retry time:
// the caller must not call the provider in the pause it asked for). Else
// the caller asks anew; a grant in a pause is given back first, one past
// its margin is not (it still counts at the bucket). A grant past its
// margin is one whose store answer came late, or whose caller woke late
// or was descheduled after the answer (a stalled process, a starved CPU):
// used now, its call could meet the calls of permits placed an interval
// after its own time in one of the provider's windows.
func (w *waiter) usable(st *keyState, c *decision) bool {
	if c.Delay <= 0 && (c.src == fromLease || c.Margin <= 0) {
		// Served from memory a moment ago, or with no margin to keep:
		// nothing to check, and no clock reading (see wait).
		return true
	}
	l, now := w.l, w.l.tb.now()
	switch {
	case c.Margin > 0 && c.answered != 0 && now > addSat(addSat(c.answered, c.Delay), c.Margin):
		// Not given back: a process late for its permits is short of
		// time already, and a give-back is one more round trip each.
		l.lateGrant(now - c.answered - int64(c.Delay))
		return false
	case c.Delay > 0 && st != nil && st.pausedUntil.Load() > now:
		w.giveBack(c)
		return false
	}
	return true
}

// waiter is one wait: what it asks for, its deadline, and how much of it
// is left.
type waiter struct {
	l   *Limiter
	ctx context.Context
	demand
	// budget is the whole wait allowed; measured is false for a wait that
	// cannot run out (none, or Forever), which reads no clock. deadline
	// is the wait's end on the limiter's time base, when measured.
	budget   time.Duration
	deadline int64
	measured bool
	tb       timeoutBound
	// first is the clock reading of the wait's start, for its first
	// round's pace (0 when none was read); later rounds read the clock.
	first int64
	// failedFairly records that a store call of the wait (the adaptive
	// pace's) failed after a fair chance: evidence that the store is
	// down, for a later call that the wait's end cuts short of one.
	failedFairly bool
	// ahead: the wait refills its key's lease from a bucket that places
	// its permits; the refill books ahead within the wait (bookAhead).
	ahead bool
	// st is the state of the wait's key, whose next place and gate a
	// give-back touches; nil for a cost (its give-back looks it up).
	st *keyState
	// pacedSleep: the round's pace slept for its slot (a pause may have
	// been reported meanwhile).
	pacedSleep bool
}

// newWaiter starts a wait for dm at now (0: not read yet): its deadline
// is fixed here, once.
func (l *Limiter) newWaiter(ctx context.Context, dm demand, maxWait time.Duration, now int64) waiter {
	// ctxBound records that ctx's deadline, not maxWait, set the budget.
	budget, ctxBound := maxWait, false
	if dl, ok := ctx.Deadline(); ok {
		if left := time.Until(dl); left < budget {
			budget, ctxBound = max(left, 0), true
		}
	}
	w := waiter{l: l, ctx: ctx, demand: dm, budget: budget, tb: timeoutBound{n: dm.n, cost: dm.cost, maxWait: maxWait, ctxBound: ctxBound}, first: now}
	if w.measured = budget > 0 && budget != Forever; w.measured {
		if now == 0 {
			now = l.tb.now()
		}
		w.deadline = addSat(now, budget)
	}
	return w
}

// The wait's bounds: every bound a stage takes from the caller's wait.
// The wait's end is fixed when it starts (newWaiter): w.deadline on the
// Limiter's clock when measured (maxWait, or ctx's deadline if earlier);
// a wait of none (maxWait 0) has no end but its store calls' share of the
// store timeout; Forever has none but ctx's end. Each bound is a method
// below: left (a grant's time or a refusal's retry time beyond it fails
// fast with ErrTimeout), storeCall (every store call: the bucket's Take,
// the adaptive pace, FailLocal's settle, a cost's settle), bookAhead,
// gateDeadline, paceHorizon and paceCall, refillBound, storeFailure and
// giveBackBound.

// left is what is left of the wait now: to its end when measured, else
// 0 (a wait of none) or Forever.
func (w *waiter) left() time.Duration {
	if !w.measured {
		return w.budget
	}
	return time.Duration(max(w.deadline-w.l.tb.now(), 0))
}

// noWait reports that the caller allowed no wait at all (maxWait 0).
func (w *waiter) noWait() bool { return w.budget == 0 }

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

// storeCall returns the context of one store call of w's wait (left of
// it: w.left(), read by the caller), its bound d (0: none of its own), and
// whether the wait's end set d (budgetBound: maxWait or ctx's deadline,
// rather than the store timeout).
//
// A wait that can run out gives each call what is left of it, less a
// margin of a quarter, at most storeMargin, so that the failure policy can
// still decide before the wait ends; at least minStoreCall. A wait of none
// gives its store calls together the store timeout (noWaitLeft): a call
// that the earlier ones left less than the whole of it is bounded by the
// wait's end (budgetBound), so that one cut before the store had a fair
// chance is a wait that ran out, not a store failure. A wait of Forever
// gives none. ctx's deadline bounds every call too: it is on the real
// clock, the wait's deadline on the Limiter's.
func (w *waiter) storeCall(left time.Duration) (ctx context.Context, cancel context.CancelFunc, d time.Duration, budgetBound bool) {
	var shared bool // a call of a wait of none that earlier calls left less than the store timeout
	switch {
	case w.measured:
		d, budgetBound = left, true
	case w.noWait():
		d = w.noWaitLeft()
		shared = d > 0 && d < w.l.cfg.storeTimeout
	}
	if dl, ok := w.ctx.Deadline(); ok {
		if until := time.Until(dl); !budgetBound && d <= 0 || until <= d {
			d, budgetBound = until, true
		}
	}
	if budgetBound {
		d = max(d-min(d/4, storeMargin), minStoreCall)
	}
	if d <= 0 {
		return w.ctx, func() {}, 0, false
	}
	ctx, cancel = context.WithTimeout(w.ctx, d)
	return ctx, cancel, d, budgetBound || shared
}

// noWaitLeft is what is left of the store timeout ([WithStoreTimeout])
// that a wait of none gives its store calls together, counted from the
// first, at least minStoreCall; 0 when no store timeout is set.
func (w *waiter) noWaitLeft() time.Duration {
	if w.l.cfg.storeTimeout <= 0 {
		return 0
	}
	now := w.l.tb.now()
	if w.deadline == 0 {
		w.deadline = addSat(now, w.l.cfg.storeTimeout)
	}
	return max(time.Duration(w.deadline-now), minStoreCall)
}

// storeBound is the bound of one store call that no caller's wait bounds
// (a background task, the adaptive pace's call within a long wait): the
// store timeout, or its default when none is set.
func (l *Limiter) storeBound() time.Duration {
	if d := l.cfg.storeTimeout; d > 0 {
		return d
	}
	return DefaultStoreTimeout
}

// storeCut says how a store call of a wait ended: whether its own
// deadline passed while the caller did not cancel (expired), whether the
// wait's end set that deadline (waitEnd, rather than the store timeout),
// and how long the call had.
type storeCut struct {
	expired, waitEnd bool
	had              time.Duration
}

// outOfTime reports that the wait's end cut the call off.
func (s storeCut) outOfTime() bool { return s.expired && s.waitEnd }

// unfair reports that the wait's end cut the call off before the store
// had a fair chance to answer (a quarter of the store timeout): no
// evidence that the store is down.
func (s storeCut) unfair(timeout time.Duration) bool {
	return s.outOfTime() && s.had < timeout/4
}

// callStore runs f, one store call of w's wait, under storeCall's bound;
// ahead is how far ahead it may book (bookAhead), from the same reading
// of what is left of the wait.
func (w *waiter) callStore(f func(ctx context.Context, ahead time.Duration) error) (storeCut, error) {
	left := w.left()
	ctx, cancel, d, waitEnd := w.storeCall(left)
	defer cancel()
	err := f(ctx, w.bookAhead(left))
	cut := storeCut{waitEnd: waitEnd, had: d}
	cut.expired = d > 0 && !errors.Is(w.ctx.Err(), context.Canceled) && deadlinePassed(ctx)
	return cut, err
}

// isStoreFailure reports whether err, from a store call whose own
// deadline has expired or not, means the store failed (as opposed to an
// error about the call). ctx is the caller's. A call cut by its own
// deadline (which comes before the caller's) is the store's failure even
// when the caller's deadline has passed too by the time it is looked at
// (a busy machine can take that long to run the caller again): the store
// had its chance.
func isStoreFailure(ctx context.Context, expired bool, err error) bool {
	if ctx.Err() != nil && !expired || errors.Is(err, ErrInvalid) || errors.Is(err, ErrExceedsLimit) || errors.Is(err, ErrTimeout) {
		return false
	}
	var be *BackendError
	if errors.As(err, &be) {
		return true
	}
	// A bucket of the user's that gives up when our deadline passes.
	return expired && errors.Is(err, context.DeadlineExceeded)
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

// storeFailure finishes c, the decision of a store call of w's wait (for
// st's key; nil for a cost) that failed with err, cut as cut says (probe:
// the call probed a store that failed before). The caller waits no longer
// for it:
//
//   - an error about the call, not the store's failure (isStoreFailure),
//     stands;
//   - a call the wait cut short of a fair chance (storeCut.unfair), with
//     no evidence that the store is down (not a probe, and the store did
//     not fail the wait's pace in time), is a wait that ran out: ErrTimeout;
//   - else the failure policy answers at once, as a bucket would
//     (degrade): a refusal's Delay is slept out as any within the wait,
//     and an error also matches ErrTimeout when the call took the rest
//     of the wait.
//
// A cost's store call neither probes nor begins an outage.
func (w *waiter) storeFailure(c *decision, st *keyState, cut storeCut, probe bool, err error) {
	l := w.l
	if !isStoreFailure(w.ctx, cut.expired, err) {
		c.err = err
		return
	}
	if cut.unfair(l.cfg.storeTimeout) && !probe && !w.failedFairly {
		c.Decision, c.err = Decision{}, w.tb.unanswered(cut.had, err)
		return
	}
	if st != nil && l.outage.begin(c.sent, err) {
		l.cfg.logger.Warn("throttle: bucket store failed; deciding by the failure policy until it answers", "policy", l.cfg.policy.String(), "what", l.policyNote(), "err", err)
	}
	c.src = fromPolicy
	c.Decision, c.err = l.degrade(w, st, c.n, err, cut.outOfTime())
}

// bookAhead is how far ahead a bucket that can reserve may book for w
// (Take's maxWait), left being what is left of the wait: all of it; with
// leasing, only for a lease whose bucket places its permits (w.ahead),
// else 0 (the refill takes only permits free now; a cost passes by the
// lease).
func (w *waiter) bookAhead(left time.Duration) time.Duration {
	if w.l.leasing != nil && w.cost == nil && !w.ahead {
		return 0
	}
	return left
}

// gateDeadline is when w stops queueing at its key's closed gate (and
// is turned away at once when the gate reopens only after it): the
// wait's end; noDeadline for Forever; 0 for a wait of none, which passes
// an open gate and is refused at a closed one.
func (w *waiter) gateDeadline() int64 {
	switch {
	case w.measured:
		return w.deadline
	case w.noWait():
		return 0
	}
	return noDeadline
}

// paceAhead is how far ahead, as a share of the interval, a caller may
// reserve a paced slot. Callers further back sleep and ask again, so that
// a change of rate reaches the queue within a quarter interval.
const paceAhead = 4

// paceHorizon is how far ahead w may reserve a paced slot: a paceAhead-th
// of the interval, at most what is left of the wait; ErrTimeout when
// nothing is left of a wait that can run out.
func (w *waiter) paceHorizon() (time.Duration, error) {
	left := w.left()
	if left <= 0 && !w.noWait() {
		return 0, w.ranOut("the adaptive pace")
	}
	return min(w.l.adapt.interval/paceAhead, left), nil
}

// paceCall runs f, the adaptive pace's store call, bounded as a bucket
// call is (callStore), and by the store timeout whatever the wait
// (storeBound): a pace the store does not answer in it is given up for
// this process's share (paceLocal), and the bucket call that follows
// still has the wait's time. timedOut reports that the store timeout cut
// it.
func (w *waiter) paceCall(f func(ctx context.Context) error) (cut storeCut, timedOut bool, err error) {
	cut, err = w.callStore(func(ctx context.Context, _ time.Duration) error {
		ctx, cancel := context.WithTimeout(ctx, w.l.storeBound())
		defer cancel()
		err := f(ctx)
		timedOut = err != nil && deadlinePassed(ctx)
		return err
	})
	return cut, timedOut, err
}

// refillBound is how long w waits for another caller's refill of its
// key's lease, on the Limiter's clock (ok false: only ctx's end bounds
// it): to the wait's end, not storeMargin before it (the refiller's own
// store call keeps that back, and the refill's outcome is what the waiter
// needs); for a wait of none, the rest of its store timeout (noWaitLeft).
func (w *waiter) refillBound() (d time.Duration, ok bool) {
	switch {
	case w.measured:
		return w.left(), true
	case w.noWait():
		d = w.noWaitLeft()
		return d, d > 0
	}
	return 0, false
}

// giveBackBound is how long the caller waits for a give-back of its wait
// (handBack): until the wait's end, however near (never past it); a wait
// of none until the end of its store timeout; a wait that cannot run out
// the store timeout. Never more than the store timeout: a caller that
// leaves long before its wait's end (cancelled, or its wait stopped) is
// not kept for a store that does not answer.
func (w *waiter) giveBackBound() time.Duration {
	bound := w.l.storeBound()
	if w.measured || w.noWait() && w.deadline != 0 {
		bound = min(bound, time.Duration(max(w.deadline-w.l.tb.now(), 0)))
	}
	return bound
}

// giveBack gives back the grant c that the caller leaves: into the key's
// lease batch it came from while that can still be used, else to the
// bucket if it came from the bucket's store or the key's lease.
// (A grant of the failure policy was made in this process alone: it
// stays counted in the local share, which only slows this process.)
func (w *waiter) giveBack(c *decision) {
	if c.batch != nil && c.batch.back(w.n, w.l.tb.now()) {
		return // for the next caller of the lease
	}
	if c.src == fromStore || c.src == fromLease {
		st := w.st
		if st == nil {
			// A cost's: the key's permits are in the same bucket.
			st = w.l.state(w.key)
			defer w.l.release(st)
		}
		w.l.giveBack(w.ctx, w.giveBackBound(), st, w.key, w.n, w.cost, c.Decision)
	}
}

// ended returns why w's wait has ended, or nil while it runs, once the
// grant c came. A grant answered after its end (a store call is bounded a
// little past it, minStoreCall, and a store may answer late) is given
// back: a caller is never granted after it. When the grant's time was
// slept out (it came within what was left of the wait when the answer
// came), only ctx's end counts, not a timer that woke the caller late. A
// wait of none has no deadline here: only its ctx is looked at.
func (w *waiter) ended(c *decision) error {
	err := w.ctx.Err()
	switch {
	case err != nil && !errors.Is(err, context.DeadlineExceeded):
		return waitErr(w.ctx) // cancelled or stopped
	case err == nil && (c.Delay > 0 || !(w.measured && w.answeredAt(c) > w.deadline)):
		return nil
	case err != nil || w.tb.ctxBound:
		return fmt.Errorf("%w: %s granted only after the context's deadline, given back (%w)", ErrTimeout, w.what(), context.DeadlineExceeded)
	}
	return fmt.Errorf("%w: %s granted only after maxWait %v ran out, given back", ErrTimeout, w.what(), w.tb.maxWait)
}

// answeredAt is when c's answer came, or now when that is not known.
func (w *waiter) answeredAt(c *decision) int64 {
	if c.answered != 0 {
		return c.answered
	}
	return w.l.tb.now()
}

// ranOut is the ErrTimeout of a wait that ran out before what (a stage of
// it) could be asked.
func (w *waiter) ranOut(what string) error {
	if w.tb.ctxBound {
		return fmt.Errorf("%w: the context's deadline came before %s was asked for %s (%w)", ErrTimeout, what, w.what(), context.DeadlineExceeded)
	}
	return fmt.Errorf("%w: maxWait %v ran out before %s was asked for %s", ErrTimeout, w.tb.maxWait, what, w.what())
}

// failed maps a decision's error to Acquire's: a deadline that passed
// while the bucket was asked is a wait that ran out (ErrTimeout).
func (w *waiter) failed(err error) error {
	ctxErr := w.ctx.Err()
	if ctxErr == nil || errors.Is(err, ErrTimeout) || errors.Is(err, ErrInvalid) || errors.Is(err, ErrExceedsLimit) {
		return err
	}
	if errors.Is(ctxErr, context.DeadlineExceeded) {
		// The bucket's error may wrap the deadline or not.
		return fmt.Errorf("%w: the context's deadline passed while the bucket was asked for %s (%w; the bucket: %v)", ErrTimeout, w.what(), context.DeadlineExceeded, err)
	}
	if cause := context.Cause(w.ctx); cause != ctxErr || !errors.Is(err, ctxErr) {
		// Name what ended the wait (a stop's cause, say), not only the
		// bucket's view of it.
		return fmt.Errorf("%w (bucket: %v)", waitErr(w.ctx), err)
	}
	return err
}

// sleepReservation sleeps until a reservation's grant c is the caller's,
// giving it back if it comes too late (the bucket call itself ate into
// the wait: left is what it left) or the caller leaves first.
func (w *waiter) sleepReservation(c *decision, left time.Duration) error {
	if c.Delay > left {
		w.giveBack(c)
		return w.tb.err(c.Delay)
	}
	d := c.Delay // from when the answer came
	if c.answered != 0 {
		d -= time.Duration(w.l.tb.now() - c.answered)
	}
	if err := w.l.sleep(w.ctx, max(d, 0)); err != nil {
		w.giveBack(c)
		return err
	}
	return nil
}

// sleep waits d on the limiter's clock, or until ctx ends. Every sleep of
// a wait is for the bucket's pace (a grant's time, a refusal's retry
// time, the adaptive pace): ctx's PaceNote learns it.
func (l *Limiter) sleep(ctx context.Context, d time.Duration) error {
	pacenote.MarkPaced(ctx)
	t := l.cfg.clock.NewTimer(d)
	select {
	case <-t.Chan():
		return nil
	case <-ctx.Done():
		t.Stop()
		return waitErr(ctx)
	}
}

// what names the demand in errors: "3 permit(s)", "cost tokens=800".
func (dm demand) what() string { return whatOf(dm.n, dm.cost) }

func whatOf(n int64, cost Cost) string {
	if cost != nil {
		return "cost " + cost.String()
	}
	return fmt.Sprintf("%d permit(s)", n)
}

// timeoutBound is what an ErrTimeout of one wait says: what it asked for,
// the maxWait, and whether ctx's deadline was the bound.
type timeoutBound struct {
	n        int64
	cost     Cost // nil: n permits
	maxWait  time.Duration
	ctxBound bool
}

// err is the ErrTimeout for a grant that comes only after next.
func (b timeoutBound) err(next time.Duration) error {
	what := whatOf(b.n, b.cost)
	switch {
	case b.ctxBound:
		return fmt.Errorf("%w: %s not free for %v, beyond the context's deadline (%w)", ErrTimeout, what, next, context.DeadlineExceeded)
	case b.maxWait == 0:
		return fmt.Errorf("%w: %s not free now (next in %v) and maxWait is 0", ErrTimeout, what, next)
	}
	return fmt.Errorf("%w: %s not free for %v, beyond maxWait %v", ErrTimeout, what, next, b.maxWait)
}

// unanswered is the ErrTimeout of a wait that ran out while the store
// was asked (in the had left of it; 0: not known); err is what the call
// returned.
func (b timeoutBound) unanswered(had time.Duration, err error) error {
	within := "within the wait"
	if had > 0 {
		within = fmt.Sprintf("in the %v left of the wait", had)
	}
	switch {
	case b.cost == nil:
		return fmt.Errorf("%w: the bucket store did not answer %s: %w", ErrTimeout, within, err)
	case b.ctxBound:
		return fmt.Errorf("%w: cost %v: the bucket store did not answer %s, which ends at the context's deadline (%w): %w", ErrTimeout, b.cost, within, context.DeadlineExceeded, err)
	}
	return fmt.Errorf("%w: cost %v: the bucket store did not answer %s: %w", ErrTimeout, b.cost, within, err)
}
