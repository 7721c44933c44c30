package throttle

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// source says where a decision came from.
type source uint8

const (
	fromStore  source = iota // the bucket decided (or the key's first-back cap)
	fromLease                // the key's lease, in memory
	fromPolicy               // the failure policy: the store failed
	fromHeld                 // the caller's held permits (ContextWithPermit)
)

// decide makes the decision for n permits of st's key: from its lease
// (with leasing), from the bucket, or, while the bucket's store fails, by
// the failure policy. left is the caller's wait left, noWait that it
// allowed none at all (maxWait 0).
func (l *Limiter) decide(ctx context.Context, st *keyState, n int64, left time.Duration, noWait bool) (Decision, source, error) {
	if l.leasing != nil {
		return l.leased(ctx, st, n, left, noWait)
	}
	d, _, src, err := l.ask(ctx, st, n, 0, left, noWait)
	return d, src, err
}

// ask asks the bucket for n permits of st's key, and up to want more for
// the key's lease, all or nothing; got is how many of want it granted
// (want may be cut to the first-back cap's room). While the store fails,
// the failure policy decides for the n permits instead (fromPolicy).
func (l *Limiter) ask(ctx context.Context, st *keyState, n, want int64, left time.Duration, noWait bool) (d Decision, got int64, src source, err error) {
	// A bucket that can reserve may book up to left ahead; a lease's
	// refill takes only permits free now.
	reserve := left
	if l.leasing != nil {
		reserve = 0
	}
	if l.caps.immediate {
		d, err = l.take(ctx, st.key, n+want, reserve)
		if err == nil {
			st.noteLimit(d)
			if d.Granted {
				got = want
			}
		}
		return d, got, fromStore, err
	}
	o := &l.outage
	probe := false
	if o.since.Load() != 0 {
		if !o.probing.CompareAndSwap(false, true) {
			// Someone is asking the store: decide without it.
			d, err = l.degrade(st, n, o.err(), false)
			return d, 0, fromPolicy, err
		}
		probe = true
		defer o.probing.Store(false)
	}
	local := l.cfg.policy == FailLocal
	var reserved int64
	if local && st.faulted.Load() {
		// (A probe is never capped: it must find out whether the store
		// answers again. Its lease's batch is, as a cap would be.)
		refusal, refused, until, w := st.reserveRecovery(n, want, l.tb.now(), probe)
		if refused {
			return refusal, 0, fromStore, nil
		}
		reserved, want = until, w
	}
	sent := l.tb.now()
	var debt int64
	if local && st.faulted.Load() {
		// The call carries what this instance granted locally for the key
		// (the probe, or the key's first call after it): the first thing
		// the store does for the key when it answers again is to account
		// for those permits, before any shared grant of the key here.
		st.mu.Lock()
		debt = st.claimDebt(sent)
		st.mu.Unlock()
	}
	tctx, cancel, d0, budgetBound := boundStoreCall(ctx, left, noWait, l.cfg.storeTimeout)
	d, err = l.take(tctx, st.key, n+want+debt, reserve)
	if debt > 0 && errors.Is(err, ErrExceedsLimit) {
		st.mu.Lock()
		st.releaseDebt()
		st.mu.Unlock()
		debt = 0 // more than the bucket grants at once: settle it apart
		d, err = l.take(tctx, st.key, n+want, reserve)
	}
	// expired: the call's own deadline, set before the caller's, passed
	// (the caller did not cancel).
	expired := d0 > 0 && !errors.Is(ctx.Err(), context.Canceled) && deadlinePassed(tctx)
	cancel()
	if err == nil {
		if o.end() {
			l.cfg.logger.Info("throttle: bucket store answers again; shared limit resumed", "policy", l.cfg.policy.String())
		}
		if d.Granted {
			got = want
		}
		st.noteLimit(d)
		if local && (st.faulted.Load() || d.Reset > 0 && l.caps.fallbacker != nil) {
			l.afterShared(ctx, st, d, n+got, debt, reserved, n+want, left, noWait, sent)
		}
		return d, got, fromStore, nil
	}
	if debt > 0 || reserved != 0 {
		st.mu.Lock()
		if debt > 0 {
			st.releaseDebt()
		}
		if reserved != 0 && st.recovery != nil {
			st.recovery.unreserve(n+want, reserved)
		}
		st.mu.Unlock()
	}
	if !storeFailure(ctx, expired, err) {
		return d, 0, fromStore, err
	}
	if expired && budgetBound && d0 < l.cfg.storeTimeout/4 && !probe {
		// The caller's wait cut the call short of a fair chance (a
		// quarter of the store timeout): no evidence that the store is
		// down, so no degraded decision either. The wait ran out. (A
		// probe has the evidence already: the store was down before.)
		return Decision{}, 0, fromStore, fmt.Errorf("%w: the bucket store did not answer in the %v left of the wait: %w", ErrTimeout, d0, err)
	}
	if o.begin(sent, err) {
		l.cfg.logger.Warn("throttle: bucket store failed; deciding by the failure policy until it answers", "policy", l.cfg.policy.String(), "what", l.policyNote(), "err", err)
	}
	d, err = l.degrade(st, n, err, budgetBound && expired)
	return d, 0, fromPolicy, err
}

// noteLimit records the key's limit a shared decision reported.
func (st *keyState) noteLimit(d Decision) {
	if d.Limit > 0 && st.limit.Load() != d.Limit {
		st.limit.Store(d.Limit)
	}
}

// reserveRecovery reserves n permits, and up to want more, of the key's
// room in its first shared period after an outage, before its store call
// at now. It returns the period's end when it reserved (until, 0 when no
// cap applies) and the want that fits, or a refusal until the period's
// end when the room is spent. A probe reserves nothing; the key's first
// call back (no cap yet, a local share owing) gets a want that fits the
// cap it will start: the share less what the key owes and n.
func (st *keyState) reserveRecovery(n, want, now int64, probe bool) (refusal Decision, refused bool, until, fit int64) {
	st.mu.Lock()
	defer st.mu.Unlock()
	rc := st.recovery
	if rc == nil || probe {
		if k := st.local; k != nil && want > 0 {
			want = min(want, max(k.share-k.owed(now)-n, 0))
		}
		return Decision{}, false, 0, want
	}
	refusal, refused, until = rc.reserve(n, now)
	switch {
	case refused:
		return refusal, true, 0, 0
	case until == 0: // the cap has ended
		st.recovery = nil
		if st.local == nil {
			st.faulted.Store(false)
		}
		return Decision{}, false, 0, want
	}
	fit = min(want, rc.room)
	rc.room -= fit
	return Decision{}, false, until, fit
}

// afterShared does FailLocal's accounting after a shared decision d of st's
// key, sent at sent, that took took permits from the store (n and a lease's
// batch) and carried debt: the ledger notes the period, a carried debt is
// settled, what is still owed is taken from the store, and a key that
// granted locally in the outage is capped for its first shared period.
// reserved and asked are what reserveRecovery reserved, to give back when
// d granted nothing.
func (l *Limiter) afterShared(ctx context.Context, st *keyState, d Decision, took, debt, reserved, asked int64, left time.Duration, noWait bool, sent int64) {
	now := l.tb.now()
	if d.Reset > 0 {
		// The period ends Reset after the store decided, which was after
		// the call was sent: counted from then, as a lease's batch is,
		// the ledger's end is never later than the store's, however long
		// the answer took to come back.
		end, tol := addSat(sent, d.Reset), l.interval/2
		if !st.ledger.note(end, d.Remaining, tol) {
			st.mu.Lock()
			st.ledger.start(end, d.Remaining, tol)
			st.mu.Unlock()
		}
	}
	if !st.faulted.Load() {
		return
	}
	st.mu.Lock()
	if reserved != 0 && !d.Granted && st.recovery != nil {
		st.recovery.unreserve(asked, reserved)
	}
	k := st.local
	var owed, share, interval int64
	if k != nil {
		owed, share, interval = k.owed(now), k.share, k.interval
	}
	switch {
	case debt > 0 && d.Granted:
		st.settled() // the debt came with the call's permits
	case debt > 0:
		st.releaseDebt()
	}
	still := st.takeOwed(now) // all of it, or what was granted locally after the claim
	if k != nil && (st.recovery == nil || !st.recovery.holds(now)) {
		if !d.Granted {
			took = 0
		}
		st.recovery = newRecoveryCap(d, now, share, owed, took, interval)
	}
	if st.local == nil && st.recovery == nil {
		st.faulted.Store(false)
	}
	st.mu.Unlock()
	if still > 0 {
		l.settle(ctx, st.key, still, left, noWait, time.Duration(now-sent))
	}
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
